/* Calls one of models/kernels/int4_gemm.c's entry points CALLS times on a decode row (R = 1) of fixed inputs, one
 * thread: bench/arm64_instructions.py runs it under qemu-user with CALLS 1 and 3 and takes half the difference
 * of the instructions executed as one call's. Prints y[0] so the call cannot be dropped.
 * Usage: int4_calls LIBRARY 4|6 N K CALLS */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*gemm_fn)(int, int, int, const float *, int64_t, const uint8_t *, const uint16_t *, float *, int64_t,
                       int);

int main(int argc, char **argv) {
    if (argc != 6) return fprintf(stderr, "usage: %s LIBRARY 4|6 N K CALLS\n", argv[0]), 2;
    int bits = atoi(argv[2]), N = atoi(argv[3]), K = atoi(argv[4]), calls = atoi(argv[5]);
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fprintf(stderr, "%s\n", dlerror()), 2;
    gemm_fn f = (gemm_fn)dlsym(lib, bits == 6 ? "ei_int6_gemm" : "ei_int4_gemm");
    float *x = malloc(sizeof(float) * K), *y = malloc(sizeof(float) * N);
    size_t bytes = (size_t)N * K / 64 * (bits == 6 ? 48 : 32);
    uint8_t *qw = malloc(bytes);
    uint16_t *wd = malloc(sizeof(uint16_t) * N * K / 32);
    for (int i = 0; i < K; i++) x[i] = (float)((i * 37) % 101 - 50) / 50.f;
    for (size_t i = 0; i < bytes; i++) qw[i] = (uint8_t)(i * 131 + 7);
    for (int i = 0; i < N * K / 32; i++) wd[i] = 0x2E66; /* fp16 0.1 */
    for (int c = 0; c < calls; c++)
        if (f(1, N, K, x, K, qw, wd, y, N, 1)) return fprintf(stderr, "gemm failed\n"), 3;
    printf("%g\n", y[0]);
    return 0;
}
