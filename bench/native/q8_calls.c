/* Calls models/kernels/int8_vnni.c's GEMV (ei_q8_gemv: decode rows, one pass or two) or prompt GEMM (ei_q8_mm) CALLS
 * times on fixed, already quantized inputs, one thread: bench/arm64_instructions.py runs it under qemu-user with
 * CALLS 1 and 3 and takes half the difference of the instructions executed as one call's. Prints an output so the
 * calls cannot be dropped. Usage: q8_calls LIBRARY gemv|two_pass|mm R N K CALLS */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*gemv_fn)(int, int, int, int, const int8_t *, const float *, const int8_t *, const float *,
                        const int32_t *, float *, int);
typedef int (*mm_fn)(int, int, int, const int8_t *, const int8_t *, int32_t *, int);

int main(int argc, char **argv) {
    if (argc != 7) return fprintf(stderr, "usage: %s LIBRARY gemv|two_pass|mm R N K CALLS\n", argv[0]), 2;
    const char *mode = argv[2];
    int R = atoi(argv[3]), N = atoi(argv[4]), K = atoi(argv[5]), calls = atoi(argv[6]);
    int two_pass = !strcmp(mode, "two_pass"), rows = two_pass ? 2 * R : R;
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) return fprintf(stderr, "%s\n", dlerror()), 2;
    gemv_fn gemv = (gemv_fn)dlsym(lib, "ei_q8_gemv");
    mm_fn mm = (mm_fn)dlsym(lib, "ei_q8_mm");
    int8_t *x = malloc((size_t)rows * K), *w = malloc((size_t)N * K);
    float *xs = malloc(sizeof(float) * rows), *ws = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * R * N);
    int32_t *wsum = calloc(N, sizeof(int32_t)), *acc = malloc(sizeof(int32_t) * R * N);
    for (size_t i = 0; i < (size_t)rows * K; i++) x[i] = (int8_t)((i * 37 + 3) % 255 - 127); /* +-127 */
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = (int8_t)((i * 131 + 7) % 255 - 127);
    for (int r = 0; r < rows; r++) xs[r] = 0.01f;
    for (int n = 0; n < N; n++) ws[n] = 0.01f;
    for (int c = 0; c < calls; c++)
        if (!strcmp(mode, "mm")) {
            if (mm(R, N, K, x, w, acc, 1)) return fprintf(stderr, "ei_q8_mm failed\n"), 3;
        } else
            gemv(R, N, K, two_pass, x, xs, w, ws, wsum, y, 1);
    printf("%g\n", !strcmp(mode, "mm") ? (double)acc[0] + acc[R * N - 1] : (double)y[0]);
    return 0;
}
