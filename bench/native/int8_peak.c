/* The exact int8 multiply rate this CPU sustains, from registers: AVX2's routes (the ceiling for an int8 GEMM without
 * VNNI) and, where the CPU has it, AVX512-VNNI's vpdpbusd (the ceiling with it).
 *
 * Each OpenMP thread runs `iterations` loops of 12 independent accumulations (so no dependence chain limits them)
 * written in inline assembly (a C loop of the same intrinsics is hoisted or spilled by the compiler):
 *   madd:    vpmaddwd (int16 pairs -> int32, 16 products) + vpaddd: what ei_q8_mm (models/kernels/int8_vnni.c) does;
 *   maddubs: vpmaddubsw (u8 x s8 -> int16 pairs, 32 products) + vpmaddwd by ones + vpaddd: fbgemm's AVX2 route,
 *            exact only for 7-bit unsigned activations (a pair of 8-bit ones can overflow its int16 sum);
 *   signed:  vpsignb + the maddubs route (11 accumulators: the sign needs a register): |x| times w carrying x's
 *            sign, the exact route for symmetric int8 activations like ours;
 *   vnni:    vpdpbusd on zmm (u8 x s8, four products summed into each int32 lane, 64 products): exact for
 *            symmetric int8 activations too, shifted by +128 to u8 with the weight row's sum x 128 taken off
 *            afterwards (oneDNN's s8s8 route, once per output, not per product). AVX512-VNNI CPUs only.
 * Prints one JSON line: {"route", "threads", "seconds", "products_per_s_per_core"}.
 * Usage: int8_peak madd|maddubs|signed|vnni ITERATIONS THREADS */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MADD(acc) "vpmaddwd %%ymm12, %%ymm13, %%ymm14\n\tvpaddd %%ymm14, %%ymm" #acc ", %%ymm" #acc "\n\t"
#define MADDUBS(acc)                                                                                                   \
    "vpmaddubsw %%ymm12, %%ymm13, %%ymm14\n\tvpmaddwd %%ymm14, %%ymm15, %%ymm14\n\tvpaddd %%ymm14, %%ymm" #acc          \
    ", %%ymm" #acc "\n\t"
#define SIGNED(acc) "vpsignb %%ymm12, %%ymm13, %%ymm11\n\t" MADDUBS_OF(acc, 11)
#define MADDUBS_OF(acc, w)                                                                                             \
    "vpmaddubsw %%ymm" #w ", %%ymm12, %%ymm14\n\tvpmaddwd %%ymm14, %%ymm15, %%ymm14\n\tvpaddd %%ymm14, %%ymm" #acc         \
    ", %%ymm" #acc "\n\t"
#define VNNI(acc) "vpdpbusd %%zmm12, %%zmm13, %%zmm" #acc "\n\t"
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm14"

static void madd(long n) {
    for (long i = 0; i < n; i++)
        __asm__ volatile(MADD(0) MADD(1) MADD(2) MADD(3) MADD(4) MADD(5) MADD(6) MADD(7) MADD(8) MADD(9) MADD(10)
                             MADD(11)::: CLOBBERS);
}

static void maddubs(long n) {
    for (long i = 0; i < n; i++)
        __asm__ volatile(MADDUBS(0) MADDUBS(1) MADDUBS(2) MADDUBS(3) MADDUBS(4) MADDUBS(5) MADDUBS(6) MADDUBS(7)
                             MADDUBS(8) MADDUBS(9) MADDUBS(10) MADDUBS(11)::: CLOBBERS);
}

static void signed_maddubs(long n) {
    for (long i = 0; i < n; i++)
        __asm__ volatile(SIGNED(0) SIGNED(1) SIGNED(2) SIGNED(3) SIGNED(4) SIGNED(5) SIGNED(6) SIGNED(7) SIGNED(8)
                             SIGNED(9) SIGNED(10)::: CLOBBERS);
}

static void vnni(long n) {
    for (long i = 0; i < n; i++)
        __asm__ volatile(VNNI(0) VNNI(1) VNNI(2) VNNI(3) VNNI(4) VNNI(5) VNNI(6) VNNI(7) VNNI(8) VNNI(9) VNNI(10)
                             VNNI(11)::: CLOBBERS);
}

int main(int argc, char **argv) {
    static const char *routes[] = {"madd", "maddubs", "signed", "vnni"};
    int route = -1;
    for (int r = 0; argc == 4 && r < 4; r++)
        if (!strcmp(argv[1], routes[r])) route = r;
    if (route < 0) {
        fprintf(stderr, "usage: %s madd|maddubs|signed|vnni ITERATIONS THREADS\n", argv[0]);
        return 2;
    }
    long n = atol(argv[2]);
    int threads = atoi(argv[3]);
    double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads)
    {
        if (route == 0)
            madd(n);
        else if (route == 1)
            maddubs(n);
        else if (route == 2)
            signed_maddubs(n);
        else
            vnni(n);
    }
    double t = omp_get_wtime() - t0;
    static const double per_loop[] = {12 * 16, 12 * 32, 11 * 32, 12 * 64};
    double products = (double)n * per_loop[route];
    printf("{\"route\": \"%s\", \"threads\": %d, \"seconds\": %.6f, \"products_per_s_per_core\": %.6e}\n", argv[1],
           threads, t, products / t);
    return 0;
}
