/* The "vnni" int8 linear of models/quant.py: y[R, N] = x[R, K] @ (W[N, K] * ws[N])^T, int8 weights row-major.
 *
 * Built and loaded at run time by models/kernels/__init__.py (ctypes), like decode_attention.c.
 *
 * ei_q8_prep quantizes each activation row symmetrically to int8 (s = absmax / 127, round half to even of x * 1/s);
 * with two_pass, rows R..2R-1 hold each row's rounding residual on a grid 254x finer (|residual| <= s / 2), so the
 * two passes together carry ~15 bits. Decode rows then go to ei_q8_gemv: VNNI's vpdpbusd multiplies unsigned bytes
 * by signed ones in int32, so the activations are read as unsigned (q + 128, one xor per load) and 128 * rowsum(W)
 * is taken off after. Weights are read from memory once per block of 4 output rows for all activation rows, two
 * activation rows per read of a weight row (a two-pass row and its residual, as in the down projection, cost one
 * pass over the block, not two), each row to its end before the next: one sequential stream per thread, with
 * software prefetch into L2 (AVX-512: 2 KiB ahead). On a Zen 5 EPYC (1.3B shapes, 1.44 GB, 2 threads, against a
 * four-accumulator AVX-512 sum of as many bytes just before each round) that took 1.00-1.02x the sum's time while
 * memory read at 40-50 GB/s and 1.15-1.3x at 60-75 GB/s (prefetch into L1 2 KiB ahead; two streams per thread,
 * prefetch distances 0-8 KiB, hints, dynamic chunks: none closed that); the block's four rows read side by side
 * (four streams per thread, the previous form) were slower at every speed, fbgemm's packed GEMV slower still. On a
 * Zen 4 EPYC (memory at 28-40 GB/s) prefetching into L1 2 KiB ahead took 1.52-1.75x the sum's time and into L2 8 KiB
 * ahead 1.05-1.13x (medians of 21-31 interleaved rounds; T2 alike, L1 at 8-32 KiB 1.45x). On that Zen 4 later (1.3B
 * decode shapes as one chain, 75-150 interleaved rounds against the sum) into L2 2-4 KiB ahead took 0.98-0.99x the
 * sum's time while memory read at 30-38 GB/s and 1.01x at 38-60 GB/s, 8 KiB 1.05x and 1.24-1.26x, 6 KiB 1.02x and
 * 1.19x, 16 KiB 1.05x, none 1.03x and 1.18x, L1 (T0) 4 KiB 1.08x and 1.34x; a whole int8 decode step at depth 974
 * (both builds in one process, interleaved) went from 1.42x its read bound to 1.29x at 40-60 GB/s and from 1.12x to
 * 1.09x below 40. bench/prefetch_sweep.py repeats the chain per distance: 2 KiB measured 0.996-1.041x at 52 GB/s
 * where 4 KiB took 1.065-1.093x, and in two later runs at 56 GB/s 0.926x and 0.962x where 4 KiB took 1.009x and
 * 1.043x (1-1.5 KiB as 2 KiB); in the slow bucket all alike. So 2 KiB, as the int4/int6 loop.
 * Long prompts go to torch._int_mm (oneDNN) over the same weights instead (on AVX2 without VNNI, and on arm64, to
 * ei_q8_mm below), and ei_q8_finish applies the scales to its int32 output.
 *
 * On arm64 the GEMV's dots and the prompt GEMM's tiles are NEON (sdot with ARMv8.2 dot products, else widening
 * multiplies), the same exact int32 sums as every x86 path. Counted under qemu (bench/arm64_instructions.py), they
 * execute 1.6-3.3x fewer instructions than GCC's own vectorization of the plain loops; no ARM box was at hand to
 * time them or tune a prefetch distance.
 *
 * With `rotate` = B (a power of two, 16..512), a row is multiplied by the B x B Hadamard matrix block by block before
 * it is quantized (the weights were stored rotated the same way, models/quant.py, so the product is unchanged): an
 * orthogonal mix that spreads a heavy-tailed row (the down projection's silu(gate) * up) into a near-Gaussian one,
 * whose absmax, and so its rounding step, is several times smaller. H_B is applied unnormalized and its
 * 1/sqrt(B) folded into the row's scales.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NBLOCK 4 /* output rows per weight block */
/* Bytes ahead of the weight stream that are prefetched, into L2 (see the top: the distance and the level). The
 * AVX2 GEMV has its own: on an AVX2 Zen 3 EPYC (1.3B decode shapes as separate calls, 1.44 GB, 20 interleaved
 * rounds against a sum) 8 KiB ahead took 1.25x the sum's time, 1 KiB 1.15-1.19x, 512 B 1.23x, 2 KiB 1.20x, 4 KiB
 * 1.27x; a whole 1.3B stage's decode step at depth 974 went from 1.21-1.22x its read bound to 1.17-1.20x. */
#ifndef PREFETCH /* -DPREFETCH=bytes overrides it (bench/prefetch_sweep.py builds one library per distance) */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define PREFETCH 2048
#else
#define PREFETCH 1024
#endif
#endif

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
/* The AVX2 forms of the activation preparation (rotation, quantization): the same operations lane for lane as the
 * AVX-512 and plain forms, so all three give the same bits; plain C there ran at ~0.5 G floats/s and took ~5% of an
 * int8 prompt on an AVX2 Zen 3. */
#if defined(__AVX2__) && defined(__FMA__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
#define EI_PREP_AVX2 1
#else
#define EI_PREP_AVX2 0
#endif

/* x[0, K) times H_B block by block (Sylvester order, unnormalized), in place: the butterflies of stride 1-8 inside
 * each 16-float vector (lane i takes lane i ^ h), the longer ones between vectors; the plain loop does the same
 * additions on the same operands, so both paths give the same bits. */
static void hadamard_blocks(float *x, int K, int B) {
    for (int b0 = 0; b0 + B <= K; b0 += B) {
        float *v = x + b0;
        int h = 1;
#if defined(__AVX512F__) && defined(__AVX512BW__)
        for (int i = 0; i < B; i += 16) {
            __m512 a = _mm512_loadu_ps(v + i), p;
            p = _mm512_permute_ps(a, 0xB1); /* lanes i ^ 1 */
            a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xAAAA, p, a);
            p = _mm512_permute_ps(a, 0x4E); /* i ^ 2 */
            a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xCCCC, p, a);
            p = _mm512_shuffle_f32x4(a, a, 0xB1); /* i ^ 4 */
            a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xF0F0, p, a);
            p = _mm512_shuffle_f32x4(a, a, 0x4E); /* i ^ 8 */
            a = _mm512_mask_sub_ps(_mm512_add_ps(a, p), 0xFF00, p, a);
            _mm512_storeu_ps(v + i, a);
        }
        for (h = 16; h < B; h *= 2)
            for (int i = 0; i < B; i += 2 * h)
                for (int j = i; j < i + h; j += 16) {
                    __m512 a = _mm512_loadu_ps(v + j), c = _mm512_loadu_ps(v + j + h);
                    _mm512_storeu_ps(v + j, _mm512_add_ps(a, c));
                    _mm512_storeu_ps(v + j + h, _mm512_sub_ps(a, c));
                }
#elif EI_PREP_AVX2
        for (int i = 0; i + 8 <= B; i += 8) { /* lane i takes a[i] + a[i ^ h] below h, a[i ^ h] - a[i] above */
            __m256 a = _mm256_loadu_ps(v + i), p;
            p = _mm256_permute_ps(a, 0xB1); /* lanes i ^ 1 */
            a = _mm256_blend_ps(_mm256_add_ps(a, p), _mm256_sub_ps(p, a), 0xAA);
            p = _mm256_permute_ps(a, 0x4E); /* i ^ 2 */
            a = _mm256_blend_ps(_mm256_add_ps(a, p), _mm256_sub_ps(p, a), 0xCC);
            p = _mm256_permute2f128_ps(a, a, 0x01); /* i ^ 4 */
            a = _mm256_blend_ps(_mm256_add_ps(a, p), _mm256_sub_ps(p, a), 0xF0);
            _mm256_storeu_ps(v + i, a);
        }
        for (h = 8; h < B; h *= 2)
            for (int i = 0; i < B; i += 2 * h)
                for (int j = i; j < i + h; j += 8) {
                    __m256 a = _mm256_loadu_ps(v + j), c = _mm256_loadu_ps(v + j + h);
                    _mm256_storeu_ps(v + j, _mm256_add_ps(a, c));
                    _mm256_storeu_ps(v + j + h, _mm256_sub_ps(a, c));
                }
#endif
        for (; h < B; h *= 2)
            for (int i = 0; i < B; i += 2 * h)
                for (int j = i; j < i + h; j++) {
                    float a = v[j], c = v[j + h];
                    v[j] = a + c;
                    v[j + h] = a - c;
                }
    }
}

/* One row: q1 = round-half-even(x * 1/s1), s1 = absmax / 127; with two_pass also q2 = round-half-even((x - q1 s1)
 * * 1/s2), s2 = s1 / 254 (the residual as one fused multiply-add, in both code paths, so they agree exactly).
 * With rotate, x is first copied to buf (K floats) and rotated there (see the top). */
static void quantize_row(int K, const float *src, int two_pass, int rotate, float *buf, int8_t *q1, int8_t *q2,
                         float *s1_out, float *s2_out) {
    if (rotate) {
        memcpy(buf, src, (size_t)K * sizeof(float));
        hadamard_blocks(buf, K, rotate);
        src = buf;
    }
    int k = 0;
    float amax = 0.f;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    __m512 m = _mm512_setzero_ps();
    for (; k + 16 <= K; k += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(src + k)));
    amax = _mm512_reduce_max_ps(m);
#elif EI_PREP_AVX2
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (; k + 8 <= K; k += 8) m = _mm256_max_ps(m, _mm256_and_ps(magnitude, _mm256_loadu_ps(src + k)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
#endif
    for (; k < K; k++) amax = fmaxf(amax, fabsf(src[k]));
    float s1 = amax / 127.f, inv1 = s1 > 0.f ? 1.f / s1 : 0.f;
    float s2 = s1 / 254.f, inv2 = s2 > 0.f ? 1.f / s2 : 0.f;
    k = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (; k + 16 <= K; k += 16) {
        __m512 x = _mm512_loadu_ps(src + k);
        __m512 v = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(inv1)), rnd)));
        _mm_storeu_si128((__m128i *)(q1 + k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
        if (two_pass) {
            __m512 r = _mm512_fnmadd_ps(v, _mm512_set1_ps(s1), x); /* x - v * s1 */
            __m512 w = _mm512_roundscale_ps(_mm512_mul_ps(r, _mm512_set1_ps(inv2)), rnd);
            w = _mm512_min_ps(hi, _mm512_max_ps(lo, w));
            _mm_storeu_si128((__m128i *)(q2 + k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(w)));
        }
    }
#elif EI_PREP_AVX2
    const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undoes the packs' per-lane interleave */
    const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (; k + 32 <= K; k += 32) { /* 32 values -> 4 x 8 int32 -> 32 int8 (already in [-127, 127]: packs exact) */
        __m256i q[4], r[4];
        for (int j = 0; j < 4; j++) {
            __m256 x = _mm256_loadu_ps(src + k + 8 * j);
            __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(inv1)), rnd)));
            q[j] = _mm256_cvtps_epi32(v);
            if (two_pass) {
                __m256 e = _mm256_fnmadd_ps(v, _mm256_set1_ps(s1), x); /* x - v * s1 */
                __m256 w = _mm256_round_ps(_mm256_mul_ps(e, _mm256_set1_ps(inv2)), rnd);
                r[j] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, w)));
            }
        }
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256((__m256i *)(q1 + k), _mm256_permutevar8x32_epi32(b, order));
        if (two_pass) {
            b = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
            _mm256_storeu_si256((__m256i *)(q2 + k), _mm256_permutevar8x32_epi32(b, order));
        }
    }
#endif
    for (; k < K; k++) {
        float v = nearbyintf(src[k] * inv1);
        v = v > 127.f ? 127.f : v < -127.f ? -127.f : v;
        q1[k] = (int8_t)v;
        if (two_pass) {
            float w = nearbyintf(fmaf(-v, s1, src[k]) * inv2);
            q2[k] = (int8_t)(w > 127.f ? 127.f : w < -127.f ? -127.f : w);
        }
    }
    float norm = rotate ? 1.f / sqrtf((float)rotate) : 1.f; /* H_B / sqrt(B) is orthogonal */
    *s1_out = s1 * norm;
    if (two_pass) *s2_out = s2 * norm;
}

/* Quantizes R rows (see quantize_row); returns 0, or -1 where a rotation buffer could not be allocated. */
int ei_q8_prep(int R, int K, const float *x, int64_t x_row, int two_pass, int rotate, int8_t *xq, float *xs,
               int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads) if (R > 1)
    {
        float *buf = rotate ? malloc((size_t)K * sizeof(float)) : NULL;
        if (rotate && !buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++)
            if (!rotate || buf)
                quantize_row(K, x + r * x_row, two_pass, rotate, buf, xq + (int64_t)r * K, xq + (int64_t)(R + r) * K,
                             xs + r, xs + R + r);
        free(buf);
    }
    return failed ? -1 : 0;
}

#if defined(__AVX2__) && defined(__FMA__)
#include "simd8.h"
#endif

/* GELU in its tanh form (transformers' gelu_pytorch_tanh, SigLIP's MLP) in place: x * sigmoid(2u) with
 * u = sqrt(2/pi) (x + 0.044715 x^3), which is x * (1 + tanh u) / 2; the exponential is taken of -|2u| only (exp8's
 * domain), the sigmoid of a negative 2u then being e / (1 + e). A separate torch gelu took ~7% of an int8 encode. */
static void gelu_tanh_row(float *y, int64_t n) {
    int64_t j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 c = _mm256_set1_ps(0.7978845608f), c3 = _mm256_set1_ps(0.044715f), one = _mm256_set1_ps(1.f);
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_loadu_ps(y + j);
        __m256 u = _mm256_mul_ps(c, _mm256_fmadd_ps(_mm256_mul_ps(c3, x), _mm256_mul_ps(x, x), x));
        __m256 e = exp8(_mm256_or_ps(_mm256_add_ps(u, u), _mm256_set1_ps(-0.f))); /* e^-|2u| */
        __m256 num = _mm256_blendv_ps(one, e, u);                              /* u < 0: e, else 1 */
        _mm256_storeu_ps(y + j, _mm256_mul_ps(x, _mm256_div_ps(num, _mm256_add_ps(one, e))));
    }
#endif
    for (; j < n; j++) {
        float x = y[j], u = 0.7978845608f * (x + 0.044715f * x * x * x), e = expf(-2.f * fabsf(u));
        y[j] = x * (u < 0.f ? e : 1.f) / (1.f + e);
    }
}

/* y[r, n] = ws[n] * sum over passes p of xs[p * R + r] * (int32 dot of activation row p * R + r with weight row n)
 * (+ bias[n] where bias is not NULL: a separate torch add took 9% of a vision tower's encode), then GELU (tanh form)
 * where gelu is set: the MLP's first linear hands its activation over already applied. */
void ei_q8_finish(int R, int N, int two_pass, const int32_t *acc, const float *xs, const float *ws,
                  const float *bias, int gelu, float *y, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int r = 0; r < R; r++) {
        const int32_t *a1 = acc + (int64_t)r * N, *a2 = acc + (int64_t)(R + r) * N;
        float *out = y + (int64_t)r * N, s1 = xs[r], s2 = two_pass ? xs[R + r] : 0.f;
        if (two_pass)
            for (int n = 0; n < N; n++) out[n] = ws[n] * (s1 * (float)a1[n] + s2 * (float)a2[n]);
        else
            for (int n = 0; n < N; n++) out[n] = ws[n] * s1 * (float)a1[n];
        if (bias)
            for (int n = 0; n < N; n++) out[n] += bias[n];
        if (gelu) gelu_tanh_row(out, N);
    }
}

/* GELU (tanh form) over n floats in place: decode rows of a linear whose finish would have applied it. */
void ei_gelu_tanh(int64_t n, float *y) { gelu_tanh_row(y, n); }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define EI_Q8_SIMD 1

/* int32 dot of activation row xr (K int8) with weight row w: four accumulators over 256-byte steps. */
static inline int32_t dot1(const int8_t *xr, const int8_t *w, int K) {
    const __m512i flip = _mm512_set1_epi8((char)0x80); /* q + 128 as unsigned */
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k + 256 <= K; k += 256) {
        for (int c = 0; c < 256; c += 64) _mm_prefetch((const char *)(w + k + c + PREFETCH), _MM_HINT_T1);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_xor_si512(_mm512_loadu_si512(xr + k), flip), _mm512_loadu_si512(w + k));
        a1 = _mm512_dpbusd_epi32(a1, _mm512_xor_si512(_mm512_loadu_si512(xr + k + 64), flip),
                                 _mm512_loadu_si512(w + k + 64));
        a2 = _mm512_dpbusd_epi32(a2, _mm512_xor_si512(_mm512_loadu_si512(xr + k + 128), flip),
                                 _mm512_loadu_si512(w + k + 128));
        a3 = _mm512_dpbusd_epi32(a3, _mm512_xor_si512(_mm512_loadu_si512(xr + k + 192), flip),
                                 _mm512_loadu_si512(w + k + 192));
    }
    for (; k + 64 <= K; k += 64)
        a0 = _mm512_dpbusd_epi32(a0, _mm512_xor_si512(_mm512_loadu_si512(xr + k), flip), _mm512_loadu_si512(w + k));
    int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
    for (; k < K; k++) s += ((int32_t)xr[k] + 128) * (int32_t)w[k]; /* the tail, in the same unsigned form */
    return s;
}

/* dot1 for two activation rows xa, xb over one read of the weight row: their int32 dots in sa, sb. */
static inline void dot2(const int8_t *xa, const int8_t *xb, const int8_t *w, int K, int32_t *sa, int32_t *sb) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int k = 0;
#define EI_DOT2_STEP(acc_a, acc_b, off)                                                                  \
    do {                                                                                                  \
        __m512i wv = _mm512_loadu_si512(w + k + (off));                                                  \
        acc_a = _mm512_dpbusd_epi32(acc_a, _mm512_xor_si512(_mm512_loadu_si512(xa + k + (off)), flip), wv); \
        acc_b = _mm512_dpbusd_epi32(acc_b, _mm512_xor_si512(_mm512_loadu_si512(xb + k + (off)), flip), wv); \
    } while (0)
    for (; k + 256 <= K; k += 256) {
        for (int c = 0; c < 256; c += 64) _mm_prefetch((const char *)(w + k + c + PREFETCH), _MM_HINT_T1);
        EI_DOT2_STEP(a0, b0, 0);
        EI_DOT2_STEP(a1, b1, 64);
        EI_DOT2_STEP(a2, b2, 128);
        EI_DOT2_STEP(a3, b3, 192);
    }
    for (; k + 64 <= K; k += 64) EI_DOT2_STEP(a0, b0, 0);
#undef EI_DOT2_STEP
    int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)));
    int32_t t = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(b0, b1), _mm512_add_epi32(b2, b3)));
    for (; k < K; k++) {
        s += ((int32_t)xa[k] + 128) * (int32_t)w[k];
        t += ((int32_t)xb[k] + 128) * (int32_t)w[k];
    }
    *sa = s;
    *sb = t;
}

#define Q8_BIAS 128 /* what dot1/dot2 add to each activation byte: 128 * rowsum(w) is taken off after */

#elif defined(__AVX2__)
#include <immintrin.h>
#define EI_Q8_SIMD 1
#define Q8_BIAS 0 /* the sign trick below gives the signed dot itself */

/* AVX2 has no VNNI. vpmaddubsw multiplies unsigned by signed bytes into saturating int16 pairs; with |x| as the
 * unsigned side and w carrying x's sign as the signed one (llama.cpp's trick) a pair is at most 2 * 127 * 127 <
 * 32768, as neither activations nor weights ever hold -128 (both are clamped to +-127), so the int16 sums are exact;
 * vpmaddwd by ones then adds pairs of pairs into int32 lanes. Eight int32 lanes per 32 bytes, all exact: the dots
 * are the VNNI path's to the bit. */
static inline __m256i dot32(__m256i x, __m256i w) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

#define LD(p) _mm256_loadu_si256((const __m256i *)(p))

/* int32 dot of activation row xr (K int8) with weight row w: four accumulators over 128-byte steps. */
static inline int32_t dot1(const int8_t *xr, const int8_t *w, int K) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k + 128 <= K; k += 128) {
        _mm_prefetch((const char *)(w + k + PREFETCH), _MM_HINT_T1);
        _mm_prefetch((const char *)(w + k + 64 + PREFETCH), _MM_HINT_T1);
        a0 = _mm256_add_epi32(a0, dot32(LD(xr + k), LD(w + k)));
        a1 = _mm256_add_epi32(a1, dot32(LD(xr + k + 32), LD(w + k + 32)));
        a2 = _mm256_add_epi32(a2, dot32(LD(xr + k + 64), LD(w + k + 64)));
        a3 = _mm256_add_epi32(a3, dot32(LD(xr + k + 96), LD(w + k + 96)));
    }
    for (; k + 32 <= K; k += 32) a0 = _mm256_add_epi32(a0, dot32(LD(xr + k), LD(w + k)));
    int32_t s = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)));
    for (; k < K; k++) s += (int32_t)xr[k] * (int32_t)w[k];
    return s;
}

/* dot1 for two activation rows xa, xb over one read of the weight row: their int32 dots in sa, sb. */
static inline void dot2(const int8_t *xa, const int8_t *xb, const int8_t *w, int K, int32_t *sa, int32_t *sb) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, b0 = a0, b1 = a0;
    int k = 0;
    for (; k + 64 <= K; k += 64) {
        _mm_prefetch((const char *)(w + k + PREFETCH), _MM_HINT_T1);
        __m256i w0 = LD(w + k), w1 = LD(w + k + 32);
        a0 = _mm256_add_epi32(a0, dot32(LD(xa + k), w0));
        b0 = _mm256_add_epi32(b0, dot32(LD(xb + k), w0));
        a1 = _mm256_add_epi32(a1, dot32(LD(xa + k + 32), w1));
        b1 = _mm256_add_epi32(b1, dot32(LD(xb + k + 32), w1));
    }
    for (; k + 32 <= K; k += 32) {
        __m256i w0 = LD(w + k);
        a0 = _mm256_add_epi32(a0, dot32(LD(xa + k), w0));
        b0 = _mm256_add_epi32(b0, dot32(LD(xb + k), w0));
    }
    int32_t s = hsum_i32(_mm256_add_epi32(a0, a1)), t = hsum_i32(_mm256_add_epi32(b0, b1));
    for (; k < K; k++) {
        s += (int32_t)xa[k] * (int32_t)w[k];
        t += (int32_t)xb[k] * (int32_t)w[k];
    }
    *sa = s;
    *sb = t;
}

#define MM_ROWS 6  /* activation rows per tile */
#define MM_COLS 16 /* output columns per packed weight panel: two vectors of eight int32 lanes */

/* Weight rows n0..n0 + 15 of w [N, K] as a panel of int16 pairs: panel[p][c] = (w[n0 + c][2p], w[n0 + c][2p + 1]),
 * zeros past N and past K (an odd K gets a zero partner). One vector of the panel then holds 8 columns' pairs, and
 * vpmaddwd of it with an activation pair broadcast to every lane gives those 8 columns' two products summed, in
 * int32 (exact: int16 products need no guard against saturation). */
static void mm_pack(const int8_t *w, int N, int K, int n0, int16_t *restrict panel) {
    const int pairs = (K + 1) / 2;
    int p0 = 0;
    if (n0 + MM_COLS <= N) /* whole panels: 8 pairs x 8 columns at a time, widened and transposed in registers */
        for (; 2 * p0 + 16 <= K; p0 += 8)
            for (int half = 0; half < 2; half++) {
                __m256i r[8];
                for (int c = 0; c < 8; c++) /* row c's 16 bytes from 2 p0: its pairs p0..p0 + 7 as int32 lanes */
                    r[c] = _mm256_cvtepi8_epi16(
                        _mm_loadu_si128((const __m128i *)(w + (int64_t)(n0 + 8 * half + c) * K + 2 * p0)));
                __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
                __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
                __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
                __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
                __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
                __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
                __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
                __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
                __m256i col[8] = { /* col[j]: pair p0 + j of the 8 rows */
                    _mm256_permute2x128_si256(u0, u4, 0x20), _mm256_permute2x128_si256(u1, u5, 0x20),
                    _mm256_permute2x128_si256(u2, u6, 0x20), _mm256_permute2x128_si256(u3, u7, 0x20),
                    _mm256_permute2x128_si256(u0, u4, 0x31), _mm256_permute2x128_si256(u1, u5, 0x31),
                    _mm256_permute2x128_si256(u2, u6, 0x31), _mm256_permute2x128_si256(u3, u7, 0x31)};
                for (int j = 0; j < 8; j++)
                    _mm256_storeu_si256((__m256i *)(panel + (int64_t)(p0 + j) * 2 * MM_COLS + 16 * half), col[j]);
            }
    for (int c = 0; c < MM_COLS; c++) { /* the rest: columns past N as zeros, an odd K's last pair with a zero */
        const int8_t *wr = w + (int64_t)(n0 + c) * K;
        int16_t *out = panel + 2 * c;
        for (int p = p0; p < pairs; p++) {
            int k = 2 * p;
            out[(int64_t)p * 2 * MM_COLS] = n0 + c < N ? wr[k] : 0;
            out[(int64_t)p * 2 * MM_COLS + 1] = n0 + c < N && k + 1 < K ? wr[k + 1] : 0;
        }
    }
}

/* acc rows x[0..5] (int16, rows padded to an even width) times the panel: 6 x 16 int32 sums in 12 accumulators,
 * with the panel's two vectors and the broadcast pair, AVX2's 16 registers. Per pair of depth, 12 vpmaddwd for 192
 * products against 64 bytes of panel (from L2) and 24 of activations (from L1): the old 4 x 2 tile of widened
 * activation vectors read a byte from L2 per product and ran at ~0.6x fbgemm's GEMM (an AVX2 Zen 3 EPYC). Written
 * out row by row: with arrays GCC spilled the accumulators. */
static inline void mm_tile(const int16_t *const x[MM_ROWS], const int16_t *restrict panel, int pairs,
                           int32_t out[MM_ROWS][MM_COLS]) {
    const int16_t *restrict x0 = x[0], *restrict x1 = x[1], *restrict x2 = x[2], *restrict x3 = x[3],
                            *restrict x4 = x[4], *restrict x5 = x[5];
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
            c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define EI_MM_ROW(xp, acc0, acc1)                                                                                   \
    do {                                                                                                            \
        int32_t pair;                                                                                               \
        memcpy(&pair, (xp) + 2 * p, sizeof pair);                                                                   \
        __m256i xv = _mm256_set1_epi32(pair);                                                                       \
        acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(xv, w0));                                                   \
        acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(xv, w1));                                                   \
    } while (0)
    for (int p = 0; p < pairs; p++) {
        const __m256i w0 = LD(panel + (int64_t)p * 2 * MM_COLS), w1 = LD(panel + (int64_t)p * 2 * MM_COLS + 16);
        EI_MM_ROW(x0, c00, c01);
        EI_MM_ROW(x1, c10, c11);
        EI_MM_ROW(x2, c20, c21);
        EI_MM_ROW(x3, c30, c31);
        EI_MM_ROW(x4, c40, c41);
        EI_MM_ROW(x5, c50, c51);
    }
#undef EI_MM_ROW
#define EI_MM_OUT(r, acc0, acc1)                                                                                    \
    do {                                                                                                            \
        _mm256_storeu_si256((__m256i *)out[r], acc0);                                                               \
        _mm256_storeu_si256((__m256i *)(out[r] + 8), acc1);                                                         \
    } while (0)
    EI_MM_OUT(0, c00, c01);
    EI_MM_OUT(1, c10, c11);
    EI_MM_OUT(2, c20, c21);
    EI_MM_OUT(3, c30, c31);
    EI_MM_OUT(4, c40, c41);
    EI_MM_OUT(5, c50, c51);
#undef EI_MM_OUT
}
#undef LD

#elif defined(__aarch64__) && defined(__ARM_NEON) && !defined(EI_Q8_PLAIN) /* -DEI_Q8_PLAIN: the plain loops */
#include <arm_neon.h>
#define EI_Q8_SIMD 1
#define EI_Q8_NEON 1
#define Q8_BIAS 0 /* signed by signed bytes: the dot itself */

/* acc + the 16 products x[i] * w[i], in int32 lanes: sdot where the CPU has ARMv8.2 dot products (a Jetson Orin, a
 * Raspberry Pi 5); else (a Pi 4) a widening multiply of the low halves, one that adds the high halves' products, and
 * a pairwise add into int32: a lane of the int16 sum is x[i] w[i] + x[i + 8] w[i + 8], at most 2 * 127 * 127 < 32768
 * as neither side ever holds -128 (both are clamped to +-127), so it is exact. Either way the sums are the x86
 * paths' to the bit. */
static inline int32x4_t dot16(int32x4_t acc, int8x16_t x, int8x16_t w) {
#ifdef __ARM_FEATURE_DOTPROD
    return vdotq_s32(acc, x, w);
#else
    return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(x), vget_low_s8(w)), x, w));
#endif
}

/* int32 dot of activation row xr (K int8) with weight row w: four accumulators over 64-byte steps. No software
 * prefetch: each thread reads one sequential stream, and no ARM box was at hand to tune a distance on. */
static inline int32_t dot1(const int8_t *xr, const int8_t *w, int K) {
    int32x4_t a0 = vdupq_n_s32(0), a1 = a0, a2 = a0, a3 = a0;
    int k = 0;
    for (; k + 64 <= K; k += 64) {
        a0 = dot16(a0, vld1q_s8(xr + k), vld1q_s8(w + k));
        a1 = dot16(a1, vld1q_s8(xr + k + 16), vld1q_s8(w + k + 16));
        a2 = dot16(a2, vld1q_s8(xr + k + 32), vld1q_s8(w + k + 32));
        a3 = dot16(a3, vld1q_s8(xr + k + 48), vld1q_s8(w + k + 48));
    }
    for (; k + 16 <= K; k += 16) a0 = dot16(a0, vld1q_s8(xr + k), vld1q_s8(w + k));
    int32_t s = vaddvq_s32(vaddq_s32(vaddq_s32(a0, a1), vaddq_s32(a2, a3)));
    for (; k < K; k++) s += (int32_t)xr[k] * (int32_t)w[k];
    return s;
}

/* dot1 for two activation rows xa, xb over one read of the weight row: their int32 dots in sa, sb. */
static inline void dot2(const int8_t *xa, const int8_t *xb, const int8_t *w, int K, int32_t *sa, int32_t *sb) {
    int32x4_t a0 = vdupq_n_s32(0), a1 = a0, b0 = a0, b1 = a0;
    int k = 0;
    for (; k + 32 <= K; k += 32) {
        int8x16_t w0 = vld1q_s8(w + k), w1 = vld1q_s8(w + k + 16);
        a0 = dot16(a0, vld1q_s8(xa + k), w0);
        b0 = dot16(b0, vld1q_s8(xb + k), w0);
        a1 = dot16(a1, vld1q_s8(xa + k + 16), w1);
        b1 = dot16(b1, vld1q_s8(xb + k + 16), w1);
    }
    for (; k + 16 <= K; k += 16) {
        int8x16_t w0 = vld1q_s8(w + k);
        a0 = dot16(a0, vld1q_s8(xa + k), w0);
        b0 = dot16(b0, vld1q_s8(xb + k), w0);
    }
    int32_t s = vaddvq_s32(vaddq_s32(a0, a1)), t = vaddvq_s32(vaddq_s32(b0, b1));
    for (; k < K; k++) {
        s += (int32_t)xa[k] * (int32_t)w[k];
        t += (int32_t)xb[k] * (int32_t)w[k];
    }
    *sa = s;
    *sb = t;
}

#define MM_ROWS 4 /* activation rows per tile, times the NBLOCK weight rows of a block */

/* The 4 x 4 int32 dots of activation rows x[0..3] with the block's weight rows w0..w0 + 3K, for prompts: per 16
 * bytes of depth 8 loads feed 16 dot steps, where dot2 over the same rows would load 12 for 8 (the 16 accumulators
 * and 8 operands take 24 of NEON's 32 registers). The block (4 x K bytes) stays in L1 while every activation row
 * streams past it. */
static inline void mm_tile(const int8_t *const x[MM_ROWS], const int8_t *w0, int K, int32_t out[MM_ROWS][NBLOCK]) {
    const int8_t *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    int32x4_t acc[MM_ROWS][NBLOCK];
    for (int r = 0; r < MM_ROWS; r++)
        for (int i = 0; i < NBLOCK; i++) acc[r][i] = vdupq_n_s32(0);
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        const int8x16_t v0 = vld1q_s8(w0 + k), v1 = vld1q_s8(w1 + k), v2 = vld1q_s8(w2 + k), v3 = vld1q_s8(w3 + k);
        for (int r = 0; r < MM_ROWS; r++) {
            const int8x16_t xv = vld1q_s8(x[r] + k);
            acc[r][0] = dot16(acc[r][0], xv, v0);
            acc[r][1] = dot16(acc[r][1], xv, v1);
            acc[r][2] = dot16(acc[r][2], xv, v2);
            acc[r][3] = dot16(acc[r][3], xv, v3);
        }
    }
    for (int r = 0; r < MM_ROWS; r++)
        for (int i = 0; i < NBLOCK; i++) {
            int32_t s = vaddvq_s32(acc[r][i]);
            for (int j = k; j < K; j++) s += (int32_t)x[r][j] * (int32_t)w0[(int64_t)i * K + j];
            out[r][i] = s;
        }
}

#else
#define EI_Q8_SIMD 0
#define Q8_BIAS 0
static inline int32_t dot1(const int8_t *xr, const int8_t *w, int K) {
    int32_t s = 0;
    for (int k = 0; k < K; k++) s += (int32_t)xr[k] * (int32_t)w[k];
    return s;
}

/* Plain C: one dot after the other (the weight row is read twice; the SIMD paths read it once for both rows). */
static inline void dot2(const int8_t *xa, const int8_t *xb, const int8_t *w, int K, int32_t *sa, int32_t *sb) {
    *sa = dot1(xa, w, K);
    *sb = dot1(xb, w, K);
}
#endif

/* int32 dots of activation row xr with the block's weight rows w0..w0 + 3K, one row after another; with xr2, also
 * of that row, over the same reads (a two-pass row and its residual, or two sessions: the block is read once). */
static inline void dot4(const int8_t *xr, const int8_t *xr2, const int8_t *w0, int K, int32_t out[NBLOCK],
                        int32_t out2[NBLOCK]) {
    for (int i = 0; i < NBLOCK; i++) {
        if (xr2)
            dot2(xr, xr2, w0 + (int64_t)i * K, K, out + i, out2 + i);
        else
            out[i] = dot1(xr, w0 + (int64_t)i * K, K);
    }
}

void ei_q8_gemv(int R, int N, int K, int two_pass, const int8_t *xq, const float *xs, const int8_t *w,
                const float *ws, const int32_t *wsum, float *y, int threads) {
    int rows = two_pass ? 2 * R : R, blocks = (N + NBLOCK - 1) / NBLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        int n0 = b * NBLOCK, nb = N - n0 < NBLOCK ? N - n0 : NBLOCK;
        if (nb < NBLOCK) { /* the last, partial block (N not a multiple of 4): plain loops */
            const int8_t *w_tail = w + (int64_t)n0 * K;
            for (int r = 0; r < rows; r++)
                for (int i = 0; i < nb; i++) {
                    int32_t s = 0;
                    for (int k = 0; k < K; k++) s += (int32_t)xq[(int64_t)r * K + k] * w_tail[(int64_t)i * K + k];
                    float v = xs[r] * (float)s;
                    float *o = y + (int64_t)(r % R) * N + n0 + i;
                    *o = !two_pass ? ws[n0 + i] * v : r < R ? v : ws[n0 + i] * (*o + v);
                }
            continue;
        }
        const int8_t *w0 = w + (int64_t)n0 * K;
        for (int r = 0; r < rows; r += 2) { /* rows in pairs: each pair reads the block once */
            int32_t d[2][NBLOCK];
            int pair = r + 1 < rows;
            dot4(xq + (int64_t)r * K, pair ? xq + (int64_t)(r + 1) * K : NULL, w0, K, d[0], d[1]);
            for (int p = 0; p <= pair; p++) { /* row r, then r + 1: the order one row at a time had */
                float *o = y + (int64_t)((r + p) % R) * N + n0;
                for (int i = 0; i < NBLOCK; i++) {
                    float v = xs[r + p] * (float)(d[p][i] - Q8_BIAS * wsum[n0 + i]);
                    /* one pass: scaled; two: pass 1 is kept unscaled until its residual row adds to it */
                    o[i] = !two_pass ? ws[n0 + i] * v : r + p < R ? v : ws[n0 + i] * (o[i] + v);
                }
            }
        }
    }
}

/* acc[R, N] int32 = xq[R, K] . w[N, K]^T: the int32 product torch._int_mm gives, for prompt rows on CPUs without
 * VNNI, where oneDNN's int8 GEMM falls back to a reference loop (18.6 s for 256 x 2048 x 11264 on an AVX2 EPYC,
 * fbgemm 0.11 s). Activations are widened to int16 once (rows padded to an even width); each thread then packs 16
 * weight rows at a time into an int16 panel (mm_pack: ~K x 64 bytes, in L2) and runs every activation row past it
 * in 6-row tiles. Exact int32 sums, so any split gives the same bits. */
int ei_q8_mm(int R, int N, int K, const int8_t *xq, const int8_t *w, int32_t *acc, int threads) {
    if (R <= 0 || N <= 0) return 0; /* nothing to write (and malloc(0) may answer NULL) */
#if EI_Q8_SIMD && !defined(__AVX512VNNI__) && !defined(EI_Q8_NEON)
    const int pairs = (K + 1) / 2, Kp = 2 * pairs;
    int16_t *x16 = malloc((size_t)R * (Kp > 0 ? Kp : 1) * sizeof(int16_t));
    if (!x16) return -1;
    const int panels = (N + MM_COLS - 1) / MM_COLS;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        int16_t *panel = aligned_alloc(32, ((size_t)pairs * 2 * MM_COLS * sizeof(int16_t) + 63) & ~(size_t)31);
        if (!panel) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            for (int k = 0; k < K; k++) x16[(int64_t)r * Kp + k] = xq[(int64_t)r * K + k];
            if (Kp > K) x16[(int64_t)r * Kp + K] = 0;
        }
        /* the loop's barrier makes every thread's allocation outcome visible here */
        if (!failed) {
#pragma omp for schedule(static)
            for (int t = 0; t < panels; t++) {
                const int n0 = t * MM_COLS, nc = N - n0 < MM_COLS ? N - n0 : MM_COLS;
                mm_pack(w, N, K, n0, panel);
                for (int r0 = 0; r0 < R; r0 += MM_ROWS) {
                    const int16_t *xr[MM_ROWS]; /* a partial tile repeats its last row and drops the extra sums */
                    for (int r = 0; r < MM_ROWS; r++) xr[r] = x16 + (int64_t)(r0 + r < R ? r0 + r : R - 1) * Kp;
                    int32_t d[MM_ROWS][MM_COLS];
                    mm_tile(xr, panel, pairs, d);
                    for (int r = 0; r < MM_ROWS && r0 + r < R; r++)
                        memcpy(acc + (int64_t)(r0 + r) * N + n0, d[r], (size_t)nc * sizeof(int32_t));
                }
            }
        }
        free(panel);
    }
    free(x16);
    if (failed) return -1;
#elif defined(EI_Q8_NEON)
    const int blocks = (N + NBLOCK - 1) / NBLOCK;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        const int n0 = b * NBLOCK, nb = N - n0 < NBLOCK ? N - n0 : NBLOCK;
        const int8_t *w0 = w + (int64_t)n0 * K;
        if (nb < NBLOCK) { /* the last, partial block */
            for (int r = 0; r < R; r++)
                for (int i = 0; i < nb; i++)
                    acc[(int64_t)r * N + n0 + i] = dot1(xq + (int64_t)r * K, w0 + (int64_t)i * K, K);
            continue;
        }
        for (int r0 = 0; r0 < R; r0 += MM_ROWS) {
            const int8_t *xr[MM_ROWS]; /* a partial tile repeats its last row and drops the extra sums */
            for (int r = 0; r < MM_ROWS; r++) xr[r] = xq + (int64_t)(r0 + r < R ? r0 + r : R - 1) * K;
            int32_t d[MM_ROWS][NBLOCK];
            mm_tile(xr, w0, K, d);
            for (int r = 0; r < MM_ROWS && r0 + r < R; r++) memcpy(acc + (int64_t)(r0 + r) * N + n0, d[r], sizeof d[r]);
        }
    }
#else
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int n = 0; n < N; n++)
        for (int r = 0; r < R; r++) {
            int32_t s = 0;
            for (int k = 0; k < K; k++) s += (int32_t)xq[(int64_t)r * K + k] * w[(int64_t)n * K + k];
            acc[(int64_t)r * N + n] = s;
        }
#endif
    return 0;
}

/* ei_q8_prep + ei_q8_gemv in one call for decode rows (<= 16 with the residual rows): x [R, K] fp32 in, y out. */
int ei_q8_gemv_rows(int R, int N, int K, int two_pass, int rotate, const float *x, int64_t x_row, const int8_t *w,
                    const float *ws, const int32_t *wsum, float *y, int threads) {
    int rows = two_pass ? 2 * R : R;
    float xs[32];
    if (rows > 32) return -2;
    int8_t *xq = malloc((size_t)rows * K);
    if (!xq) return -1;
    int rc = ei_q8_prep(R, K, x, x_row, two_pass, rotate, xq, xs, 1);
    if (rc == 0) ei_q8_gemv(R, N, K, two_pass, xq, xs, w, ws, wsum, y, threads);
    free(xq);
    return rc;
}

/* One linear of the layer: vnni int8 (w int8 [N, K], ws float [N], wsum) as this file reads it, or, where int4 is
 * set, int4_gemm.c's ei_int4_gemm over its q4_0 weights (w packed [N, K/2], ws fp16 [N, K/32]; wsum unused). */
typedef struct {
    const void *w;
    const void *ws;
    const int32_t *wsum;
    int32_t n, k, two_pass, rotate;
    int (*int4)(int, int, int, const float *, int64_t, const void *, const void *, float *, int64_t, int);
} ei_q8_weight;

/* The steps of decode_attention.c a layer needs, as pointers (that library is built on its own). */
typedef struct {
    int (*attention)(int, int, const float *, int64_t, const float *, int64_t, const float *, int64_t,
                     void *const *, const int64_t *, const int *, float *, int, int, int, float, int);
    void (*add_rmsnorm)(int, int, const float *, int64_t, const float *, int64_t, float *, const float *, float,
                        float *);
    void (*rope)(int, int, int, int, float *, int64_t, float *, int64_t, const float *, const float *);
    void (*silu_mul)(int, int, const float *, int64_t, float *);
} ei_layer_ops;

typedef struct {
    ei_q8_weight qkv, o, gate_up, down;
    const float *norm1, *norm2;
    float eps1, eps2, scale;
    int32_t layer, heads, kv_heads, head_dim;
} ei_q8_layer;

/* Floats of scratch ei_q8_decode_layer needs for R rows. */
int64_t ei_q8_layer_scratch(const ei_q8_layer *L, int R) {
    int64_t d = L->qkv.k;
    return (int64_t)R * (2 * d + L->qkv.n + (int64_t)L->heads * L->head_dim + L->gate_up.n + L->gate_up.n / 2);
}

static int gemv(const ei_q8_weight *W, int R, const float *x, float *y, int threads) {
    if (W->int4) return W->int4(R, W->n, W->k, x, W->k, W->w, W->ws, y, W->n, threads);
    return ei_q8_gemv_rows(R, W->n, W->k, W->two_pass, W->rotate, x, W->k, W->w, W->ws, W->wsum, y, threads);
}

/* Built with -DEI_PART_TIMES (bench/decode_parts.py), ei_q8_decode_layer adds each part's wall time to a running
 * total that ei_q8_part_times hands out and clears: where a step's time goes against the bytes each part reads.
 * Without it the marks compile to nothing. */
enum { PART_ELEMENTWISE, PART_QKV, PART_ATTENTION, PART_O, PART_GATE_UP, PART_DOWN, PART_COUNT };
#ifdef EI_PART_TIMES
#include <time.h>
static double part_seconds[PART_COUNT];
static double part_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
#define PART_START double part_t0 = part_clock(), part_t1
#define PART_END(part) (part_t1 = part_clock(), part_seconds[part] += part_t1 - part_t0, part_t0 = part_t1)
int ei_q8_part_times(double *out) {
    for (int i = 0; i < PART_COUNT; i++) out[i] = part_seconds[i], part_seconds[i] = 0.0;
    return PART_COUNT;
}
#else
#define PART_START
#define PART_END(part) ((void)0)
int ei_q8_part_times(double *out) {
    (void)out;
    return 0;
}
#endif

/* A whole decode layer in one call, for a step whose R rows are each one session's new row (R <= 8: every linear
 * takes the GEMV path, as q8_linear and Int4Linear would), its linears vnni int8 or int4 (ei_q8_weight). It runs
 * StageExecutor._decode_layer's steps in the same order with the same functions, so its output is bit for bit that
 * of the Python path, without ~20 Python calls per layer (~2 ms of a 1.3B step). The norms, rotary, attention and
 * silu * up are decode_attention.c's, a separately built library: the caller passes them in as function pointers.
 * x [R, D] fp32 contiguous, updated in place; cos/sin [R, head_dim]; caches/capacity/past as the attention takes
 * them (one session per row). Returns 0, or the first failing step's code. */
int ei_q8_decode_layer(const ei_q8_layer *L, const ei_layer_ops *ops, int R, float *x, const float *cos,
                       const float *sin, void *const *cache, const int64_t *capacity, const int *past, float *scratch,
                       int threads) {
    const int D = L->qkv.k, qkv_w = L->qkv.n, q_w = L->heads * L->head_dim, kv_w = L->kv_heads * L->head_dim;
    const int I = L->gate_up.n / 2;
    float *h = scratch, *qkv = h + (int64_t)R * D, *a = qkv + (int64_t)R * qkv_w, *t = a + (int64_t)R * q_w;
    float *gu = t + (int64_t)R * D, *act = gu + (int64_t)R * 2 * I;
    int rc;
    PART_START;
    ops->add_rmsnorm(R, D, x, D, NULL, 0, NULL, L->norm1, L->eps1, h);
    PART_END(PART_ELEMENTWISE);
    if ((rc = gemv(&L->qkv, R, h, qkv, threads))) return rc;
    PART_END(PART_QKV);
    ops->rope(R, L->heads, L->kv_heads, L->head_dim, qkv, qkv_w, qkv + q_w, qkv_w, cos, sin);
    PART_END(PART_ELEMENTWISE);
    rc = ops->attention(R, L->layer, qkv, qkv_w, qkv + q_w, qkv_w, qkv + q_w + kv_w, qkv_w, cache, capacity, past, a,
                        L->heads, L->kv_heads, L->head_dim, L->scale, threads);
    if (rc) return rc;
    PART_END(PART_ATTENTION);
    if ((rc = gemv(&L->o, R, a, t, threads))) return rc;
    PART_END(PART_O);
    ops->add_rmsnorm(R, D, x, D, t, D, x, L->norm2, L->eps2, h); /* x += o_proj(a), h = its norm */
    PART_END(PART_ELEMENTWISE);
    if ((rc = gemv(&L->gate_up, R, h, gu, threads))) return rc;
    PART_END(PART_GATE_UP);
    ops->silu_mul(R, I, gu, 2 * I, act);
    PART_END(PART_ELEMENTWISE);
    if ((rc = gemv(&L->down, R, act, t, threads))) return rc;
    PART_END(PART_DOWN);
    for (int64_t i = 0; i < (int64_t)R * D; i++) x[i] += t[i];
    PART_END(PART_ELEMENTWISE);
    return 0;
}

/* Every layer of a stage, L[0..n), in one call: a ctypes call per layer cost ~17 us of a 1.3B step's 24 layers
 * (0.41 ms between the Python and the C clocks, bench/decode_parts.py's build). Stops at the first failing layer. */
int ei_q8_decode_layers(const ei_q8_layer *L, int n, const ei_layer_ops *ops, int R, float *x, const float *cos,
                        const float *sin, void *const *cache, const int64_t *capacity, const int *past, float *scratch,
                        int threads) {
    for (int j = 0; j < n; j++) {
        int rc = ei_q8_decode_layer(L + j, ops, R, x, cos, sin, cache, capacity, past, scratch, threads);
        if (rc) return rc;
    }
    return 0;
}

/* 2: the AVX512-VNNI path (prompts then run torch._int_mm); 1: the AVX2 or the NEON path (prompts run ei_q8_mm);
 * 0: plain C. */
int ei_q8_simd(void) {
#if EI_Q8_SIMD && defined(__AVX512VNNI__)
    return 2;
#else
    return EI_Q8_SIMD;
#endif
}

int ei_q8_abi_version(void) { return 9; }
