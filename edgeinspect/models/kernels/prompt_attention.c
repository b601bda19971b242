/* Prompt attention of packed stages: causal softmax(q k^T * scale) v for a prompt chunk of T rows over L = past + T
 * keys, with bf16 dot products (AVX512-BF16's vdpbf16ps, fp32 accumulation) and an fp32 softmax; on CPUs with AVX2
 * and FMA but no AVX512-BF16, all in fp32 (see there).
 *
 * Built and loaded at run time by models/kernels/__init__.py (ctypes), like decode_attention.c.
 *
 * Why: a 974-token prompt at 1.3B dimensions spent 0.85 s of its 3.4 s in SDPA's fp32 flash kernel (~115 GFLOP/s on
 * a 2-core Zen 5), where bf16 dot products run at twice fp32's rate and the matmul shapes here are large enough to
 * keep the units busy. Rounding q, k, v and the probabilities to bf16 (8 significant bits, relative error <= 2^-9
 * per value) is finer than the int8 KV rows every later decode step of the same stage attends over; scores, softmax,
 * sums and outputs stay fp32. fp32 stages never come here (SDPA is what generate() runs).
 *
 * Layout: q [T] rows of heads x head_dim, k/v [L] rows of kv_heads x head_dim (strides in floats, each head's
 * head_dim floats contiguous); query t sits at position past + t and sees keys 0..past + t (causal; else all L keys,
 * as a vision encoder's patches do); head h reads kv head h / (heads / kv_heads). out [T] rows of heads x head_dim.
 * head_dim must be a multiple of 16.
 * Keys are packed per kv head in blocks of 16 (lane = key, one bf16 pair of dimensions per 32-bit lane), values per
 * pair of positions (lane = dimension, the two positions' bf16 in one lane), queries as bf16 rows. Work is split
 * into (head, block of QB query rows) tasks; a task scores its rows against every key the last of them sees,
 * takes each row's softmax over its own keys (later keys are zeroed), then accumulates probabilities x values.
 * Returns 0; -1 when buffers cannot be allocated, -2 where the CPU has neither AVX512-BF16 nor AVX2 + FMA, -3 for
 * shapes it does not take (the caller then runs SDPA).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QB 32     /* query rows per task */
#define KBLOCK 16 /* keys per packed block: one zmm of fp32 scores */

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define EI_PA_SIMD 2 /* bf16 dot products */

/* x[0, hd) -> hd / 2 bf16 pairs (dims 2i, 2i + 1 in the low, high half of dst[i]), rounded to nearest even by
 * vcvtne2ps2bf16; zeros where x is NULL. */
static inline void pack_pairs(uint32_t *dst, const float *x, int hd) {
    int d = 0;
    for (; d + 32 <= hd; d += 32)
        _mm512_storeu_si512(dst + d / 2, x ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + d + 16),
                                                                          _mm512_loadu_ps(x + d))
                                           : _mm512_setzero_si512());
    if (d < hd) /* the last 16 dims (hd is a multiple of 16) */
        _mm256_storeu_si256((__m256i *)(dst + d / 2),
                            _mm512_castsi512_si256(x ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_setzero_ps(),
                                                                                    _mm512_loadu_ps(x + d))
                                                     : _mm512_setzero_si512()));
}

static inline __m512 dp(__m512 acc, uint32_t a, const uint32_t *b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)a), (__m512bh)_mm512_loadu_si512(b));
}

/* exp(x) for x <= 0, 16 lanes: 2^n * e^f with f = (x log2 e - n) ln 2, |f| <= 0.35, degree-6 Taylor polynomial. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147181f));
    __m512 p = _mm512_set1_ps(1.f / 720.f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* Scores of 4 query rows (bf16 pairs, h2 per row) x 4 key blocks -> s[row * ld + key], times scale. */
static inline void qk4x4(const uint32_t *q, const uint32_t *kb, int h2, float scale, float *s, int ld) {
    __m512 a[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
    const int64_t block = (int64_t)h2 * KBLOCK; /* uint32 lanes per key block */
    for (int d2 = 0; d2 < h2; d2++) {
        const uint32_t *k = kb + d2 * KBLOCK;
        for (int r = 0; r < 4; r++) {
            uint32_t qv = q[r * h2 + d2];
            for (int c = 0; c < 4; c++) a[r][c] = dp(a[r][c], qv, k + c * block);
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) _mm512_storeu_ps(s + r * ld + c * KBLOCK, _mm512_mul_ps(a[r][c], sc));
}

/* Row softmax over s[0..n), written as bf16 in natural order to p (zeros up to `upto`, a multiple of 32, so the
 * value pass can read whole pairs past n); returns the sum of the fp32 exponentials, added 16 keys at a time in key
 * order. The exponentials go straight to bf16: s is read twice and never written back. */
static inline float softmax_row(const float *s, int n, int upto, uint16_t *p) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + j));
    if (j < n) {
        __mmask16 tail = (__mmask16)((1u << (n - j)) - 1);
        m = _mm512_max_ps(m, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, s + j));
    }
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
    __m512 sum = _mm512_setzero_ps();
    for (j = 0; j < upto; j += 32) {
        __m512 e[2];
        for (int h = 0; h < 2; h++) {
            const int at = j + 16 * h;
            __mmask16 live = at + 16 <= n ? 0xFFFF : at < n ? (__mmask16)((1u << (n - at)) - 1) : 0;
            e[h] = _mm512_maskz_mov_ps(live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, s + at), mx)));
            sum = _mm512_add_ps(sum, e[h]);
        }
        _mm512_storeu_si512(p + j, (__m512i)_mm512_cvtne2ps_pbh(e[1], e[0]));
    }
    return _mm512_reduce_add_ps(sum);
}

/* Probabilities x values for 4 rows and ndb x 16 dims from dim 0 of vp's rows: o[r] = inv[r] x sum over position
 * pairs of p[r] x v (o[r] NULL: not stored). Four rows share each load of values: with two, the loop streamed a
 * head's values from L2 at 32 bytes a cycle and ran the dot products at ~84% of their rate (1.3B, Zen 4). */
static inline __attribute__((always_inline)) void pv4(const uint32_t *const p[4], int pairs, const uint32_t *vp,
                                                      int hd, const int ndb, const float inv[4], float *const o[4]) {
    __m512 a[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < ndb; c++) a[r][c] = _mm512_setzero_ps();
    for (int j2 = 0; j2 < pairs; j2++) {
        const uint32_t *v = vp + (int64_t)j2 * hd;
        __m512i vv[4];
        for (int c = 0; c < ndb; c++) vv[c] = _mm512_loadu_si512(v + c * 16);
        for (int r = 0; r < 4; r++) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)p[r][j2]);
            for (int c = 0; c < ndb; c++) a[r][c] = _mm512_dpbf16_ps(a[r][c], w, (__m512bh)vv[c]);
        }
    }
    for (int r = 0; r < 4; r++)
        if (o[r])
            for (int c = 0; c < ndb; c++) _mm512_storeu_ps(o[r] + c * 16, _mm512_mul_ps(a[r][c], _mm512_set1_ps(inv[r])));
}

int ei_prompt_attention(int T, int past, int heads, int kv_heads, int hd, const float *q, int64_t q_row,
                        int64_t q_head, const float *k, int64_t k_row, int64_t k_head, const float *v, int64_t v_row,
                        int64_t v_head, float *out, int64_t out_row, float scale, int causal, int threads) {
    if (T < 1 || past < 0 || hd % 16 || hd > 1024 || kv_heads < 1 || heads % kv_heads) return -3;
    const int L = past + T, LK = (L + 4 * KBLOCK - 1) / (4 * KBLOCK) * (4 * KBLOCK), TP = (T + 3) / 4 * 4;
    const int h2 = hd / 2, group = heads / kv_heads;
    uint32_t *kp = malloc((size_t)kv_heads * LK * h2 * 4); /* [g][key block][d2][16 keys] */
    uint32_t *vp = malloc((size_t)kv_heads * (LK / 2) * hd * 4); /* [g][position pair][dim] */
    uint32_t *qp = malloc((size_t)heads * TP * h2 * 4);          /* [h][row][d2] */
    int rc = kp && vp && qp ? 0 : -1;
    if (rc == 0) {
        /* Packed in vectors: scalar, the packing took a quarter of a vision tower's attention (576 x 16 x 64). */
        const __m512i lanes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                 _mm512_set1_epi32(h2));
        static const uint16_t zip_order[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                               8,  24, 9,  25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
        const __m512i zip = _mm512_loadu_si512(zip_order); /* bf16 lanes i, 16 + i side by side */
        /* Position-major: a key row's heads are read one after another (a head at a time, the loads strode
         * through the rows and the packing took a tenth of a 1.3B prompt layer's attention). */
#pragma omp parallel num_threads(threads)
        {
            uint32_t rows[KBLOCK * 512]; /* a block's keys as bf16 pairs, row by row (hd <= 1024) */
#pragma omp for schedule(static) nowait
            for (int j0 = 0; j0 < LK; j0 += KBLOCK) /* keys past L: zeros (their scores are never used) */
                for (int g = 0; g < kv_heads; g++) {
                    for (int i = 0; i < KBLOCK; i++)
                        pack_pairs(rows + i * h2, j0 + i < L ? k + (int64_t)(j0 + i) * k_row + g * k_head : NULL, hd);
                    uint32_t *dst = kp + (int64_t)g * LK * h2 + (int64_t)(j0 / KBLOCK) * h2 * KBLOCK; /* [d2][16] */
                    for (int d2 = 0; d2 < h2; d2++) /* one gather a d2 */
                        _mm512_storeu_si512(dst + d2 * KBLOCK, _mm512_i32gather_epi32(lanes, rows + d2, 4));
                }
#pragma omp for schedule(static) nowait
            for (int j = 0; j < LK; j += 2) /* positions j, j + 1 in the low, high half of pair j / 2's lanes */
                for (int g = 0; g < kv_heads; g++) {
                    const float *v0 = j < L ? v + (int64_t)j * v_row + g * v_head : NULL;
                    const float *v1 = j + 1 < L ? v + (int64_t)(j + 1) * v_row + g * v_head : NULL;
                    uint32_t *dst = vp + (int64_t)g * (LK / 2) * hd + (int64_t)(j / 2) * hd;
                    for (int d = 0; d < hd; d += 16) {
                        __m512 lo = v0 ? _mm512_loadu_ps(v0 + d) : _mm512_setzero_ps();
                        __m512 hi = v1 ? _mm512_loadu_ps(v1 + d) : _mm512_setzero_ps();
                        __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* lanes 0-15: j, 16-31: j + 1 */
                        _mm512_storeu_si512(dst + d, _mm512_permutexvar_epi16(zip, both));
                    }
                }
#pragma omp for schedule(static)
            for (int t = 0; t < TP; t++) /* rows past T: zeros (qk4x4 scores four rows at a time) */
                for (int h = 0; h < heads; h++)
                    pack_pairs(qp + ((int64_t)h * TP + t) * h2, t < T ? q + (int64_t)t * q_row + h * q_head : NULL, hd);
        }
        const int blocks = (T + QB - 1) / QB, tasks = heads * blocks;
#pragma omp parallel num_threads(threads)
        {
            float *s = malloc((size_t)QB * LK * sizeof(float));
            uint16_t *p = malloc((size_t)QB * LK * sizeof(uint16_t));
            float sums[QB];
#pragma omp for schedule(dynamic, 1)
            for (int task = 0; task < tasks; task++) {
                if (!s || !p) {
#pragma omp atomic write
                    rc = -1;
                    continue;
                }
                const int h = task / blocks, b = blocks - 1 - task % blocks; /* the longest rows first */
                const int i0 = b * QB, rows = T - i0 < QB ? T - i0 : QB, g = h / group;
                const int keys = causal ? past + i0 + rows : L, kblocks = (keys + 4 * KBLOCK - 1) / (4 * KBLOCK) * 4;
                const int upto = (keys + 31) / 32 * 32;
                const uint32_t *qh = qp + ((int64_t)h * TP + i0) * h2, *kg = kp + (int64_t)g * LK * h2;
                for (int r = 0; r < rows; r += 4)
                    for (int c = 0; c < kblocks; c += 4)
                        qk4x4(qh + (int64_t)r * h2, kg + (int64_t)c * h2 * KBLOCK, h2, scale,
                              s + (int64_t)r * LK + c * KBLOCK, LK);
                for (int r = 0; r < rows; r++)
                    sums[r] = softmax_row(s + (int64_t)r * LK, causal ? past + i0 + r + 1 : L, upto, p + (int64_t)r * LK);
                const uint32_t *vg = vp + (int64_t)g * (LK / 2) * hd;
                for (int r = 0; r < rows; r += 4) { /* rows past the block's: row r's again, not stored */
                    const uint32_t *pr[4];
                    float inv[4], *o[4];
                    for (int i = 0; i < 4; i++) {
                        const int live = r + i < rows, at = live ? r + i : r;
                        pr[i] = (const uint32_t *)(p + (int64_t)at * LK);
                        inv[i] = 1.f / sums[at];
                        o[i] = live ? out + (int64_t)(i0 + at) * out_row + h * hd : NULL;
                    }
                    for (int d = 0; d < hd; d += 64) { /* 64 dims (4 rows x 4 zmm accumulators) at a time */
                        const int ndb = hd - d >= 64 ? 4 : (hd - d) / 16;
                        float *od[4];
                        for (int i = 0; i < 4; i++) od[i] = o[i] ? o[i] + d : NULL;
                        if (ndb == 4) /* the literal lets pv4 keep its accumulators in registers */
                            pv4(pr, upto / 2, vg + d, hd, 4, inv, od);
                        else
                            pv4(pr, upto / 2, vg + d, hd, ndb, inv, od);
                    }
                }
            }
            free(s);
            free(p);
        }
    }
    free(kp);
    free(vp);
    free(qp);
    return rc;
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* On AVX2 in fp32: there are no bf16 dot products, so q, k, v and the probabilities stay fp32 (SDPA's results to
 * ~3e-7 relative) and the gain over SDPA's flash kernel is the blocking. A thread takes whole heads: it packs the
 * head's keys (lane = key, an 8 x 8 transpose per tile) and its values (rows hd floats apart: in the caller's layout
 * they sit heads x hd apart, the same L1 set for every position) into its own buffers, then runs the head's blocks
 * of QB query rows, the longest first: scores in 4-row x 24-key register tiles over a key tile kept in L1 for every
 * row group, each row's softmax, and probabilities x values in 4-row x 24-dim tiles over a slab of values kept in
 * L1/L2. Both tiles issue 12 FMAs per 7 loads. On an AVX2 Zen 3 EPYC (974 positions x 16 heads x 128, 2 threads,
 * 30 interleaved rounds) 29.3 ms a layer (133 GFLOP/s) against SDPA's 38.7 ms with is_causal; a 974-token 1.3B int8
 * prefill's attention 0.98 -> 0.70 s. */
#define KB8 8   /* keys per packed block: one ymm of fp32 scores */
#define KTILE 3 /* key blocks per score tile */
#define EI_PA_SIMD 1 /* fp32 */
/* Holds a loaded vector in its register: otherwise GCC folds the load into each of its four FMAs, and 16 loads per
 * 12 FMAs leave the loop bound by the load ports (a layer took 47.5 ms without it, 42.3 with it, at the time). */
#define KEEP(x) __asm__("" : "+x"(x))

#include "simd8.h"

/* Scores of 4 query rows (q[r]: hd floats each) x KTILE key blocks (kb: [block][d][8 keys]) -> s, times scale. */
static inline void qk4x3(const float *const q[4], const float *kb, int hd, float scale, float *s, int ld) {
    __m256 a[4][KTILE];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < KTILE; c++) a[r][c] = _mm256_setzero_ps();
    const int64_t block = (int64_t)hd * KB8;
    for (int d = 0; d < hd; d++) {
        __m256 k0 = _mm256_loadu_ps(kb + d * KB8), k1 = _mm256_loadu_ps(kb + block + d * KB8);
        __m256 k2 = _mm256_loadu_ps(kb + 2 * block + d * KB8);
        KEEP(k0);
        KEEP(k1);
        KEEP(k2);
        for (int r = 0; r < 4; r++) {
            __m256 qv = _mm256_broadcast_ss(q[r] + d);
            a[r][0] = _mm256_fmadd_ps(qv, k0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(qv, k1, a[r][1]);
            a[r][2] = _mm256_fmadd_ps(qv, k2, a[r][2]);
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < KTILE; c++) _mm256_storeu_ps(s + r * ld + c * KB8, _mm256_mul_ps(a[r][c], sc));
}

/* Row softmax over s[0..n) in place as unnormalized exponentials, zeros from n up to `upto`; returns their sum. */
static inline float softmax_row8(float *s, int n, int upto) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
    float mx = hmax8(m);
    for (; j < n; j++) mx = s[j] > mx ? s[j] : mx;
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(s + j, e);
    }
    if (j < n) { /* the last partial vector: lanes past n are zeroed, not exponentiated */
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256 live = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), lane));
        __m256 e = _mm256_and_ps(live, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx)));
        sum = _mm256_add_ps(sum, e);
        _mm256_storeu_ps(s + j, e);
        j += 8;
    }
    for (; j < upto; j += 8) _mm256_storeu_ps(s + j, _mm256_setzero_ps());
    return hsum8(sum);
}

/* out rows o[0..3] (NULL: not stored) [nv x 8 dims] = sum over positions j < n of p[r][j] x v[j], times inv[r];
 * v's rows are v_row floats apart. */
static inline __attribute__((always_inline)) void pv4(const float *p, int ld, int n, const float *v, int v_row,
                                                      const int nv, const float inv[4], float *const o[4]) {
    __m256 a[4][KTILE];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < nv; c++) a[r][c] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const float *vj = v + (int64_t)j * v_row;
        __m256 v0 = _mm256_loadu_ps(vj), v1 = nv > 1 ? _mm256_loadu_ps(vj + 8) : v0;
        __m256 v2 = nv > 2 ? _mm256_loadu_ps(vj + 16) : v0;
        KEEP(v0);
        KEEP(v1);
        KEEP(v2);
        for (int r = 0; r < 4; r++) {
            __m256 pr = _mm256_broadcast_ss(p + r * ld + j);
            a[r][0] = _mm256_fmadd_ps(pr, v0, a[r][0]);
            if (nv > 1) a[r][1] = _mm256_fmadd_ps(pr, v1, a[r][1]);
            if (nv > 2) a[r][2] = _mm256_fmadd_ps(pr, v2, a[r][2]);
        }
    }
    for (int r = 0; r < 4; r++)
        if (o[r])
            for (int c = 0; c < nv; c++) _mm256_storeu_ps(o[r] + c * 8, _mm256_mul_ps(a[r][c], _mm256_set1_ps(inv[r])));
}

/* Keys k[j * k_row + d] (j < L) -> kg [LK / 8 blocks][hd][8 keys], zeros past L: 8 x 8 tiles transposed in
 * registers (a scalar store per float, 32 bytes apart, took ~5% of the call). */
static void pack_keys(const float *k, int64_t k_row, int L, int LK, int hd, float *kg) {
    for (int j0 = 0; j0 < LK; j0 += KB8) {
        float *blk = kg + (int64_t)j0 * hd;
        if (j0 + KB8 > L) { /* the last, partial block: one float at a time */
            for (int j = j0; j < j0 + KB8; j++)
                for (int d = 0; d < hd; d++) blk[d * KB8 + j - j0] = j < L ? k[(int64_t)j * k_row + d] : 0.f;
            continue;
        }
        for (int d = 0; d < hd; d += 8) {
            __m256 r[8], t[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(k + (int64_t)(j0 + i) * k_row + d);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
                r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
                r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
                r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
            }
            for (int i = 0; i < 4; i++) { /* dims d + i and d + 4 + i, each over the 8 keys */
                _mm256_storeu_ps(blk + (int64_t)(d + i) * KB8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
                _mm256_storeu_ps(blk + (int64_t)(d + i + 4) * KB8, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
            }
        }
    }
}

int ei_prompt_attention(int T, int past, int heads, int kv_heads, int hd, const float *q, int64_t q_row,
                        int64_t q_head, const float *k, int64_t k_row, int64_t k_head, const float *v, int64_t v_row,
                        int64_t v_head, float *out, int64_t out_row, float scale, int causal, int threads) {
    if (T < 1 || past < 0 || hd % 16 || hd > 1024 || kv_heads < 1 || heads % kv_heads) return -3;
    const int tile = KTILE * KB8, L = past + T, LK = (L + tile - 1) / tile * tile;
    const int group = heads / kv_heads, blocks = (T + QB - 1) / QB;
    int rc = 0;
    /* per thread: scores of a block, one head's packed keys and values (~0.5 MiB each at 974 x 128) */
#pragma omp parallel num_threads(threads)
    {
        float *s = malloc((size_t)QB * LK * sizeof(float));
        float *kg = malloc((size_t)LK * hd * sizeof(float)); /* [key block][d][8 keys] */
        float *vg = malloc((size_t)LK * hd * sizeof(float)); /* [position][dim] */
#pragma omp for schedule(dynamic, 1)
        for (int h = 0; h < heads; h++) {
            if (!s || !kg || !vg) {
#pragma omp atomic write
                rc = -1;
                continue;
            }
            const int g = h / group;
            pack_keys(k + g * k_head, k_row, L, LK, hd, kg);
            for (int j = 0; j < L; j++) memcpy(vg + (int64_t)j * hd, v + (int64_t)j * v_row + g * v_head, hd * sizeof(float));
            for (int b = blocks - 1; b >= 0; b--) {
                const int i0 = b * QB, rows = T - i0 < QB ? T - i0 : QB;
                const int keys = causal ? past + i0 + rows : L, ktiles = (keys + tile - 1) / tile, upto = ktiles * tile;
                float sums[QB], inv[QB];
                for (int c = 0; c < ktiles; c++) /* a tile of keys (12 KiB at hd 128) stays in L1 for every row */
                    for (int r = 0; r < rows; r += 4) {
                        const float *qr[4]; /* rows past the block's last score its last again (then zeroed) */
                        for (int i = 0; i < 4; i++)
                            qr[i] = q + (int64_t)(i0 + (r + i < rows ? r + i : rows - 1)) * q_row + h * q_head;
                        qk4x3(qr, kg + (int64_t)c * KTILE * KB8 * hd, hd, scale, s + (int64_t)r * LK + c * tile, LK);
                    }
                for (int r = 0; r < (rows + 3) / 4 * 4; r++) {
                    sums[r] = r < rows ? softmax_row8(s + (int64_t)r * LK, causal ? past + i0 + r + 1 : L, upto) : 0.f;
                    if (r >= rows) memset(s + (int64_t)r * LK, 0, (size_t)upto * sizeof(float));
                    inv[r] = r < rows ? 1.f / sums[r] : 0.f;
                }
                for (int d = 0, nv; d < hd; d += nv * KB8) { /* a slab of values stays in L1/L2 for every row */
                    const int left = (hd - d) / KB8; /* 8-dim vectors left: 3 at a time, the last 4 as 2 + 2 */
                    nv = left == 4 ? 2 : left < KTILE ? left : KTILE;
                    for (int r = 0; r < rows; r += 4) {
                        const int n = causal ? past + i0 + (r + 4 < rows ? r + 4 : rows) : L; /* the tile's last row sees n */
                        float *o[4];
                        for (int i = 0; i < 4; i++)
                            o[i] = r + i < rows ? out + (int64_t)(i0 + r + i) * out_row + h * hd + d : NULL;
                        const float *pr = s + (int64_t)r * LK;
                        if (nv == 3) /* literals, so pv4 keeps its accumulators in registers */
                            pv4(pr, LK, n, vg + d, hd, 3, inv + r, o);
                        else
                            pv4(pr, LK, n, vg + d, hd, 2, inv + r, o);
                    }
                }
            }
        }
        free(s);
        free(kg);
        free(vg);
    }
    return rc;
}

#else
#define EI_PA_SIMD 0
int ei_prompt_attention(int T, int past, int heads, int kv_heads, int hd, const float *q, int64_t q_row,
                        int64_t q_head, const float *k, int64_t k_row, int64_t k_head, const float *v, int64_t v_row,
                        int64_t v_head, float *out, int64_t out_row, float scale, int causal, int threads) {
    (void)T, (void)past, (void)heads, (void)kv_heads, (void)hd, (void)q, (void)q_row, (void)q_head, (void)k;
    (void)k_row, (void)k_head, (void)v, (void)v_row, (void)v_head, (void)out, (void)out_row, (void)scale;
    (void)causal, (void)threads;
    return -2;
}
#endif

/* 2: bf16 dot products (AVX512-BF16); 1: fp32 (AVX2 + FMA); 0: the kernel declines every call. */
int ei_prompt_attention_simd(void) { return EI_PA_SIMD; }

int ei_prompt_attention_abi_version(void) { return 2; }
