/* Decode attention over fp16 or int8 KV caches: each session of a step adds one key/value row and attends with one
 * query.
 *
 * Built and loaded at run time by models/kernels/__init__.py (ctypes; no Python API). OpenMP regions run on the
 * libgomp torch has already loaded (same soname), so they share torch's threads.
 *
 * One call per layer serves every session of the step:
 *   q [B, heads, head_dim], k/v [B, kv_heads, head_dim] fp32, rows q_row/k_row/v_row floats apart (the new rows,
 *   rotary already applied to q and k); cache[b] is session b's KVBuffer data [layers, 2, kv_heads, capacity[b],
 *   head_dim] fp16, holding past[b] valid positions; out [B, heads * head_dim] fp32.
 * First the new rows are stored at position past[b] (rounded to nearest even, as torch's .half() does), then each
 * (session, head) pair is softmax(q k^T * scale) v over past[b] + 1 positions: one pass over keys, one over values,
 * fp16 converted in registers, so the cost is reading the cache once at memory speed. Head h reads kv head
 * h / (heads / kv_heads) (grouped-query attention). Returns 0, or -1 when score buffers cannot be allocated.
 *
 * ei_decode_attention_q8 is the same over int8 rows (models/kv.py): head_dim int8 values then the row's fp32
 * scale, head_dim + 4 bytes a row. A new row is stored as quantize_rows() does it (s = absmax / 127, values
 * round-half-even(x / s)); a key's score is s * (q . values), a value row's weight is folded with its s.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include "simd8.h" /* hmax8 for quantize_row; exp8 and hsum8 for the decode loops below */
#endif

/* Rows from which the row-wise steps (norms, rope, silu * up) split over threads: prompt chunks, not decode steps. */
#define PARALLEL_ROWS 64

static inline float row_scale(const int8_t *row, int head_dim) {
    float s;
    memcpy(&s, row + head_dim, sizeof s);
    return s;
}

/* One row quantized as models/kv.py quantize_rows does (fp32 division, round half to even, |q| <= 127). */
static void quantize_row(int8_t *dst, const float *x, int head_dim) {
    /* The largest |x| in 8 lanes, then across them: a max is exact in any order. As one running max, written
     * plainly, it stayed scalar and took 3/4 of storing a 1.3B prompt's keys and values. */
    float amax = 0.f;
    int d = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 m = _mm256_setzero_ps();
    for (; d + 8 <= head_dim; d += 8)
        m = _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), _mm256_loadu_ps(x + d)), m);
    amax = hmax8(m);
#endif
    for (; d < head_dim; d++) amax = fabsf(x[d]) > amax ? fabsf(x[d]) : amax;
    float s = amax / 127.f, div = s > 0.f ? s : 1.f;
    for (d = 0; d < head_dim; d++) {
        float r = nearbyintf(x[d] / div);
        dst[d] = (int8_t)(r > 127.f ? 127.f : r < -127.f ? -127.f : r);
    }
    memcpy(dst + head_dim, &s, sizeof s);
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
static inline __m256 load8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline float to_float(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t to_half(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

static inline float dot(const float *q, const uint16_t *k, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= n; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(k + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load8(k + d + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; d < n; d++) s += q[d] * to_float(k[d]);
    return s;
}

static inline void axpy(float *o, float w, const uint16_t *v, int n) {
    __m256 wv = _mm256_set1_ps(w);
    int d = 0;
    for (; d + 8 <= n; d += 8) _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, load8(v + d), _mm256_loadu_ps(o + d)));
    for (; d < n; d++) o[d] += w * to_float(v[d]);
}


/* p[0..3] = (the sums of a0..a3) * row_scales * scale (row_scales 1 for fp16 rows: exact); returns their max. */
static inline float store_scores4(float *p, __m256 a0, __m256 a1, __m256 a2, __m256 a3, __m128 row_scales,
                                  float scale) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3)); /* [a0 a1 a2 a3] -> four sums */
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s4 = _mm_mul_ps(_mm_mul_ps(s4, row_scales), _mm_set1_ps(scale));
    _mm_storeu_ps(p, s4);
    __m128 mx = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_max_ss(mx, _mm_shuffle_ps(mx, mx, 1)));
}

/* p[t] = q . k[t] * scale for t < n, four keys at a time (their horizontal sums share one reduction); returns
 * the largest. */
static inline float scores(float *p, const float *q, const uint16_t *k, int n, int head_dim, float scale) {
    float m = -INFINITY;
    int t = 0;
    if (head_dim % 16 == 0) {
        for (; t + 4 <= n; t += 4) {
            const uint16_t *k0 = k + (int64_t)t * head_dim;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < head_dim; d += 8) {
                __m256 qv = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qv, load8(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qv, load8(k0 + head_dim + d), a1);
                a2 = _mm256_fmadd_ps(qv, load8(k0 + 2 * head_dim + d), a2);
                a3 = _mm256_fmadd_ps(qv, load8(k0 + 3 * head_dim + d), a3);
            }
            float m4 = store_scores4(p + t, a0, a1, a2, a3, _mm_set1_ps(1.f), scale);
            m = m4 > m ? m4 : m;
        }
    }
    for (; t < n; t++) {
        p[t] = dot(q, k + (int64_t)t * head_dim, head_dim) * scale;
        m = p[t] > m ? p[t] : m;
    }
    return m;
}

/* p[t] = exp(p[t] - m); returns their sum. */
static inline float exp_sum(float *p, int n, float m) {
    __m256 mv = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), mv));
        _mm256_storeu_ps(p + t, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum8(acc);
    for (; t < n; t++) sum += (p[t] = expf(p[t] - m));
    return sum;
}

/* o[0, head_dim) = sum_t w[t] v[t]: 64 dims at a time in eight registers across all t (no store per row). */
static inline void weighted_values(float *o, const float *w, const uint16_t *v, int n, int head_dim) {
    int d0 = 0;
    for (; d0 + 64 <= head_dim; d0 += 64) {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            __m256 wv = _mm256_set1_ps(w[t]);
            const uint16_t *row = v + (int64_t)t * head_dim + d0;
            for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(wv, load8(row + 8 * i), a[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + d0 + 8 * i, a[i]);
    }
    if (d0 < head_dim) {
        for (int d = d0; d < head_dim; d++) o[d] = 0.f;
        for (int t = 0; t < n; t++) axpy(o + d0, w[t], v + (int64_t)t * head_dim + d0, head_dim - d0);
    }
}

static inline __m256 load8q(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline float dot_q8(const float *q, const int8_t *k, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= n; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8q(k + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load8q(k + d + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; d < n; d++) s += q[d] * (float)k[d];
    return s * row_scale(k, n);
}

#if defined(__AVX512F__)
/* Rows ahead to prefetch: the hardware prefetcher alone left a thread at ~6.5 GB/s here; 16 rows ahead, ~8.5. */
#define PREFETCH_ROWS 16
/* int8 rows with 16 lanes: one sign-extending load converts 16 values (the shuffle port is what bounds this). */
static inline __m512 load16q(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#endif

#if defined(__AVX512F__)
/* Two heads at once, for the int8 decode loops below: each thread then reads two key (or value) streams instead of
 * one, which kept more of the cache's reads in flight: a 1.3B step's attention at 974 positions took 6% less time
 * in the median of six runs with memory at 34-63 GB/s (-11% to +2%). Each head's arithmetic is the one-head loop's,
 * in the same order: same bits. */
static inline void scores_q8_pair(float *p0, float *p1, const float *q0, const float *q1, const int8_t *k0,
                                  const int8_t *k1, int n, int head_dim, float scale, float *m0, float *m1) {
    float ma = -INFINITY, mb = -INFINITY;
    int t = 0, row = head_dim + 4;
    for (; t + 4 <= n; t += 4) {
        const int8_t *a = k0 + (int64_t)t * row, *b = k1 + (int64_t)t * row;
        for (int c = 0; c < 4 * row; c += 64) {
            _mm_prefetch((const char *)a + PREFETCH_ROWS * row + c, _MM_HINT_T0);
            _mm_prefetch((const char *)b + PREFETCH_ROWS * row + c, _MM_HINT_T0);
        }
        __m512 x[4], y[4];
        for (int i = 0; i < 4; i++) x[i] = y[i] = _mm512_setzero_ps();
        for (int d = 0; d < head_dim; d += 16) {
            __m512 qa = _mm512_loadu_ps(q0 + d), qb = _mm512_loadu_ps(q1 + d);
            for (int i = 0; i < 4; i++) {
                x[i] = _mm512_fmadd_ps(qa, load16q(a + i * row + d), x[i]);
                y[i] = _mm512_fmadd_ps(qb, load16q(b + i * row + d), y[i]);
            }
        }
        for (int i = 0; i < 4; i++) {
            float u = _mm512_reduce_add_ps(x[i]) * row_scale(a + i * row, head_dim) * scale;
            float w = _mm512_reduce_add_ps(y[i]) * row_scale(b + i * row, head_dim) * scale;
            p0[t + i] = u;
            p1[t + i] = w;
            ma = u > ma ? u : ma;
            mb = w > mb ? w : mb;
        }
    }
    for (; t < n; t++) {
        p0[t] = dot_q8(q0, k0 + (int64_t)t * row, head_dim) * scale;
        p1[t] = dot_q8(q1, k1 + (int64_t)t * row, head_dim) * scale;
        ma = p0[t] > ma ? p0[t] : ma;
        mb = p1[t] > mb ? p1[t] : mb;
    }
    *m0 = ma;
    *m1 = mb;
}

/* weighted_values_q8() for two heads (head_dim a multiple of 128), 128 dims of each at a time. */
static inline void weighted_values_q8_pair(float *o0, float *o1, const float *w0, const float *w1, const int8_t *v0,
                                           const int8_t *v1, int n, int head_dim) {
    int row = head_dim + 4;
    for (int d0 = 0; d0 < head_dim; d0 += 128) {
        __m512 a[8], b[8];
        for (int i = 0; i < 8; i++) a[i] = b[i] = _mm512_setzero_ps();
        for (int t = 0; t < n; t++) {
            const int8_t *r = v0 + (int64_t)t * row, *s = v1 + (int64_t)t * row;
            for (int c = 0; c < row; c += 64) {
                _mm_prefetch((const char *)r + PREFETCH_ROWS * row + c, _MM_HINT_T0);
                _mm_prefetch((const char *)s + PREFETCH_ROWS * row + c, _MM_HINT_T0);
            }
            __m512 wa = _mm512_set1_ps(w0[t] * row_scale(r, head_dim));
            __m512 wb = _mm512_set1_ps(w1[t] * row_scale(s, head_dim));
            for (int i = 0; i < 8; i++) {
                a[i] = _mm512_fmadd_ps(wa, load16q(r + d0 + 16 * i), a[i]);
                b[i] = _mm512_fmadd_ps(wb, load16q(s + d0 + 16 * i), b[i]);
            }
        }
        for (int i = 0; i < 8; i++) {
            _mm512_storeu_ps(o0 + d0 + 16 * i, a[i]);
            _mm512_storeu_ps(o1 + d0 + 16 * i, b[i]);
        }
    }
}
#define Q8_PAIRS 1
#else
#define Q8_PAIRS 0
#endif

#if defined(EI_FIXED_ATTENTION) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* Built with -DEI_FIXED_ATTENTION (bench/perf_decode_attention.py; not the default), int8 heads of 128 or 256 dims
 * run in 16-bit fixed point. The float loops above take a sign-extend, a convert and an FMA per int8 value: a 1.3B
 * step's attention at 974 positions needs ~2.2 ms of that arithmetic with its rows in L3, more than its 98.7 MB take
 * at 57 GB/s (1.74 ms). Here q is rounded to int16 (its absmax to 32767), and a key row's score is one vpdpwssd per
 * 32 values into an exact int32 sum. The value side multiplies two rows at once by their weights rounded to int16
 * (per block of FIXED_BLOCK rows, the block's largest to 32767), sums them exactly in int32 and adds each block to
 * fp32: ~1.5 ms in L3. Yet whole 1.3B decode steps took the float build's time with memory slow and fast alike
 * (0.997x at 37 GB/s, 0.995x over 247 steps at 67 GB/s): the attention's wait on the cache's reads hides the
 * arithmetic, so it stays off. The rounding adds ~7e-5 relative error to a head's output, ~100x below what the int8
 * rows themselves carry. One head or two (`two`, a constant at each call) do the same arithmetic per head: the same
 * bits either way. */
#define Q8_FIXED 1
#define FIXED_MAX_DIM 256
#define FIXED_BLOCK 16
#define FIXED_PREFETCH_ROWS 24 /* value rows ahead: a block reads its rows' scales before their values */

/* dst = round(q / s) with s = absmax / 32767 (head_dim a multiple of 16); returns s. */
static inline float quantize_q16(int16_t *dst, const float *q, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int d = 0; d < n; d += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(q + d)));
    float amax = _mm512_reduce_max_ps(m);
    __m512 inv = _mm512_set1_ps(amax > 0.f ? 32767.f / amax : 1.f);
    for (int d = 0; d < n; d += 16) {
        __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(q + d), inv));
        _mm256_storeu_si256((__m256i *)(dst + d), _mm512_cvtsepi32_epi16(r));
    }
    return amax > 0.f ? amax / 32767.f : 1.f;
}

/* The 16 lanes of four int32 vectors summed: [sum a, sum b, sum c, sum d] (13 instructions for four rows, where a
 * reduction per row took ~8 each). */
static inline __m128i sum4_epi32(__m512i a, __m512i b, __m512i c, __m512i d) {
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i y = _mm256_add_epi32(_mm512_castsi512_si256(x), _mm512_extracti64x4_epi64(x, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
}

static inline __m512i widen32(const int8_t *p) { return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)); }

static inline __m128 scales4(const int8_t *r, int row, int head_dim) {
    return _mm_set_ps(row_scale(r + 3 * row, head_dim), row_scale(r + 2 * row, head_dim), row_scale(r + row, head_dim),
                      row_scale(r, head_dim));
}

/* Four key rows' scores for one head: q16 . k as exact int32 sums, times each row's scale and qs * scale. */
static inline __m128 scores4_fixed(const int16_t *q16, const int8_t *k, int row, int head_dim, float qs) {
    __m512i x[4];
    for (int i = 0; i < 4; i++) x[i] = _mm512_setzero_si512();
    for (int d = 0; d < head_dim; d += 32) {
        __m512i u = _mm512_loadu_si512(q16 + d);
        for (int i = 0; i < 4; i++) x[i] = _mm512_dpwssd_epi32(x[i], u, widen32(k + i * row + d));
    }
    __m128 s = _mm_cvtepi32_ps(sum4_epi32(x[0], x[1], x[2], x[3]));
    return _mm_mul_ps(_mm_mul_ps(s, scales4(k, row, head_dim)), _mm_set1_ps(qs));
}

/* One key row's score, the same int32 sum one product at a time (the last n % 4 rows). */
static inline float score1_fixed(const int16_t *q16, const int8_t *k, int head_dim, float qs) {
    int32_t sum = 0;
    for (int d = 0; d < head_dim; d++) sum += q16[d] * k[d];
    return (float)sum * row_scale(k, head_dim) * qs;
}

/* The maximum of 4 lanes (exact in any order). */
static inline float max4(__m128 m) {
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

/* scores_q8() for one head, or two at once (two != 0; see scores_q8_pair for why two): p0/p1 get the scores, m0/m1
 * their maxima. */
static inline void scores_fixed(int two, float *p0, float *p1, const float *q0, const float *q1, const int8_t *k0,
                                const int8_t *k1, int n, int head_dim, float scale, float *m0, float *m1) {
    int16_t qa[FIXED_MAX_DIM], qb[FIXED_MAX_DIM];
    float sa = quantize_q16(qa, q0, head_dim) * scale, sb = two ? quantize_q16(qb, q1, head_dim) * scale : 0.f;
    __m128 ma = _mm_set1_ps(-INFINITY), mb = ma;
    int t = 0, row = head_dim + 4;
    for (; t + 4 <= n; t += 4) {
        const int8_t *a = k0 + (int64_t)t * row, *b = k1 + (int64_t)t * row;
        for (int c = 0; c < 4 * row; c += 64) {
            _mm_prefetch((const char *)a + PREFETCH_ROWS * row + c, _MM_HINT_T0);
            if (two) _mm_prefetch((const char *)b + PREFETCH_ROWS * row + c, _MM_HINT_T0);
        }
        __m128 s = scores4_fixed(qa, a, row, head_dim, sa);
        _mm_storeu_ps(p0 + t, s);
        ma = _mm_max_ps(ma, s);
        if (two) {
            s = scores4_fixed(qb, b, row, head_dim, sb);
            _mm_storeu_ps(p1 + t, s);
            mb = _mm_max_ps(mb, s);
        }
    }
    float xa = max4(ma), xb = max4(mb);
    for (; t < n; t++) {
        p0[t] = score1_fixed(qa, k0 + (int64_t)t * row, head_dim, sa);
        xa = p0[t] > xa ? p0[t] : xa;
        if (two) {
            p1[t] = score1_fixed(qb, k1 + (int64_t)t * row, head_dim, sb);
            xb = p1[t] > xb ? p1[t] : xb;
        }
    }
    *m0 = xa;
    *m1 = xb;
}

/* A block's weights w * (row scale) rounded to int16, the largest to 32767: w16[0..16) (w16[nb..] = 0); returns
 * the block's step (what one int16 unit weighs). */
static inline float block_weights(int16_t *w16, const float *w, const int8_t *v, int nb, int row, int head_dim) {
    float c[FIXED_BLOCK];
    for (int i = 0; i < FIXED_BLOCK; i++) c[i] = i < nb ? w[i] * row_scale(v + (int64_t)i * row, head_dim) : 0.f;
    __m512 x = _mm512_loadu_ps(c);
    float big = _mm512_reduce_max_ps(_mm512_abs_ps(x));
    __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(x, _mm512_set1_ps(big > 0.f ? 32767.f / big : 1.f)));
    _mm256_storeu_si256((__m256i *)w16, _mm512_cvtsepi32_epi16(r));
    return big > 0.f ? big / 32767.f : 1.f;
}

/* acc += two rows (r, r1) of 128 int8 values times their int16 weights (w: the pair as one int32). The bytes of
 * the two rows are interleaved so that each int32 lane sums one dim of both: lanes 0-7 of acc[2c] are dims
 * 32c + 0..7, of acc[2c + 1] dims 32c + 8..15, and lanes 8-15 of each the same 16 dims later. */
static inline void values2_fixed(__m512i *acc, const int8_t *r, const int8_t *r1, int32_t w) {
    __m512i u = _mm512_set1_epi32(w);
    for (int c = 0; c < 4; c++) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(r + 32 * c));
        __m256i y = _mm256_loadu_si256((const __m256i *)(r1 + 32 * c));
        acc[2 * c] = _mm512_dpwssd_epi32(acc[2 * c], _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(x, y)), u);
        acc[2 * c + 1] = _mm512_dpwssd_epi32(acc[2 * c + 1], _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(x, y)), u);
    }
}

/* 128 dims of a head's output from values2_fixed's lane order. */
static inline void store128_fixed(float *o, const __m512 *f) {
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(o + 32 * c, _mm512_castps512_ps256(f[2 * c]));
        _mm256_storeu_ps(o + 32 * c + 8, _mm512_castps512_ps256(f[2 * c + 1]));
        _mm256_storeu_ps(o + 32 * c + 16, _mm512_extractf32x8_ps(f[2 * c], 1));
        _mm256_storeu_ps(o + 32 * c + 24, _mm512_extractf32x8_ps(f[2 * c + 1], 1));
    }
}

/* weighted_values_q8() for one head or two (two != 0). */
static inline void values_fixed(int two, float *o0, float *o1, const float *w0, const float *w1, const int8_t *v0,
                                const int8_t *v1, int n, int head_dim) {
    int row = head_dim + 4;
    for (int d0 = 0; d0 < head_dim; d0 += 128) {
        __m512 fa[8], fb[8];
        for (int i = 0; i < 8; i++) fa[i] = fb[i] = _mm512_setzero_ps();
        for (int t0 = 0; t0 < n; t0 += FIXED_BLOCK) {
            int nb = n - t0 < FIXED_BLOCK ? n - t0 : FIXED_BLOCK;
            const int8_t *ra = v0 + (int64_t)t0 * row, *rb = v1 + (int64_t)t0 * row;
            int16_t wa[FIXED_BLOCK], wb[FIXED_BLOCK];
            float sa = block_weights(wa, w0 + t0, ra, nb, row, head_dim);
            float sb = two ? block_weights(wb, w1 + t0, rb, nb, row, head_dim) : 0.f;
            __m512i a[8], b[8];
            for (int i = 0; i < 8; i++) a[i] = b[i] = _mm512_setzero_si512();
            for (int i = 0; i < nb; i += 2) {
                int step = i + 1 < nb ? row : 0; /* an odd block's last row pairs with itself, at weight 0 */
                const int8_t *r = ra + (int64_t)i * row, *s = rb + (int64_t)i * row;
                for (int c = 0; c < 2 * row; c += 64) {
                    _mm_prefetch((const char *)r + FIXED_PREFETCH_ROWS * row + c, _MM_HINT_T0);
                    if (two) _mm_prefetch((const char *)s + FIXED_PREFETCH_ROWS * row + c, _MM_HINT_T0);
                }
                int32_t pair;
                memcpy(&pair, wa + i, sizeof pair);
                values2_fixed(a, r + d0, r + step + d0, pair);
                if (two) {
                    memcpy(&pair, wb + i, sizeof pair);
                    values2_fixed(b, s + d0, s + step + d0, pair);
                }
            }
            for (int i = 0; i < 8; i++) {
                fa[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i]), _mm512_set1_ps(sa), fa[i]);
                if (two) fb[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(b[i]), _mm512_set1_ps(sb), fb[i]);
            }
        }
        store128_fixed(o0 + d0, fa);
        if (two) store128_fixed(o1 + d0, fb);
    }
}
#else
#define Q8_FIXED 0
#endif

/* scores() over int8 rows (head_dim + 4 bytes apart), each key's dot product times its row scale. */
static inline float scores_q8(float *p, const float *q, const int8_t *k, int n, int head_dim, float scale) {
    float m = -INFINITY;
    int t = 0, row = head_dim + 4;
#if defined(__AVX512F__)
    if (head_dim % 16 == 0) {
        for (; t + 4 <= n; t += 4) {
            const int8_t *k0 = k + (int64_t)t * row;
            for (int c = 0; c < 4 * row; c += 64) _mm_prefetch((const char *)k0 + PREFETCH_ROWS * row + c, _MM_HINT_T0);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < head_dim; d += 16) {
                __m512 qv = _mm512_loadu_ps(q + d);
                a0 = _mm512_fmadd_ps(qv, load16q(k0 + d), a0);
                a1 = _mm512_fmadd_ps(qv, load16q(k0 + row + d), a1);
                a2 = _mm512_fmadd_ps(qv, load16q(k0 + 2 * row + d), a2);
                a3 = _mm512_fmadd_ps(qv, load16q(k0 + 3 * row + d), a3);
            }
            for (int i = 0; i < 4; i++) {
                __m512 a = i == 0 ? a0 : i == 1 ? a1 : i == 2 ? a2 : a3;
                float x = _mm512_reduce_add_ps(a) * row_scale(k0 + i * row, head_dim) * scale;
                p[t + i] = x;
                m = x > m ? x : m;
            }
        }
    }
#else
    if (head_dim % 16 == 0) {
        for (; t + 4 <= n; t += 4) {
            const int8_t *k0 = k + (int64_t)t * row;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int d = 0; d < head_dim; d += 8) {
                __m256 qv = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(qv, load8q(k0 + d), a0);
                a1 = _mm256_fmadd_ps(qv, load8q(k0 + row + d), a1);
                a2 = _mm256_fmadd_ps(qv, load8q(k0 + 2 * row + d), a2);
                a3 = _mm256_fmadd_ps(qv, load8q(k0 + 3 * row + d), a3);
            }
            __m128 rs = _mm_set_ps(row_scale(k0 + 3 * row, head_dim), row_scale(k0 + 2 * row, head_dim),
                                   row_scale(k0 + row, head_dim), row_scale(k0, head_dim));
            float m4 = store_scores4(p + t, a0, a1, a2, a3, rs, scale);
            m = m4 > m ? m4 : m;
        }
    }
#endif
    for (; t < n; t++) {
        p[t] = dot_q8(q, k + (int64_t)t * row, head_dim) * scale;
        m = p[t] > m ? p[t] : m;
    }
    return m;
}

/* weighted_values() over int8 rows: each row's weight times its scale. */
static inline void weighted_values_q8(float *o, const float *w, const int8_t *v, int n, int head_dim) {
    int d0 = 0, row = head_dim + 4;
#if defined(__AVX512F__)
    for (; d0 + 128 <= head_dim; d0 += 128) {
        __m512 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm512_setzero_ps();
        for (int t = 0; t < n; t++) {
            const int8_t *r = v + (int64_t)t * row;
            for (int c = 0; c < row; c += 64) _mm_prefetch((const char *)r + PREFETCH_ROWS * row + c, _MM_HINT_T0);
            __m512 wv = _mm512_set1_ps(w[t] * row_scale(r, head_dim));
            for (int i = 0; i < 8; i++) a[i] = _mm512_fmadd_ps(wv, load16q(r + d0 + 16 * i), a[i]);
        }
        for (int i = 0; i < 8; i++) _mm512_storeu_ps(o + d0 + 16 * i, a[i]);
    }
#endif
    for (; d0 + 64 <= head_dim; d0 += 64) {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const int8_t *r = v + (int64_t)t * row;
            __m256 wv = _mm256_set1_ps(w[t] * row_scale(r, head_dim));
            for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(wv, load8q(r + d0 + 8 * i), a[i]);
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(o + d0 + 8 * i, a[i]);
    }
    for (int d = d0; d < head_dim; d++) o[d] = 0.f;
    if (d0 < head_dim)
        for (int t = 0; t < n; t++) {
            const int8_t *r = v + (int64_t)t * row;
            float wt = w[t] * row_scale(r, head_dim);
            for (int d = d0; d < head_dim; d++) o[d] += wt * (float)r[d];
        }
}
#else
/* Portable path (Arm, CPUs without F16C): the compiler's half type and its auto-vectorisation. */
static inline float to_float(uint16_t h) {
    _Float16 f;
    __builtin_memcpy(&f, &h, 2);
    return (float)f;
}
static inline uint16_t to_half(float f) {
    _Float16 h = (_Float16)f;
    uint16_t u;
    __builtin_memcpy(&u, &h, 2);
    return u;
}
static inline float dot(const float *q, const uint16_t *k, int n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < n; d++) s += q[d] * to_float(k[d]);
    return s;
}
static inline void axpy(float *o, float w, const uint16_t *v, int n) {
#pragma omp simd
    for (int d = 0; d < n; d++) o[d] += w * to_float(v[d]);
}
static inline float scores(float *p, const float *q, const uint16_t *k, int n, int head_dim, float scale) {
    float m = -INFINITY;
    for (int t = 0; t < n; t++) {
        p[t] = dot(q, k + (int64_t)t * head_dim, head_dim) * scale;
        m = p[t] > m ? p[t] : m;
    }
    return m;
}
static inline float exp_sum(float *p, int n, float m) {
    float sum = 0.f;
    for (int t = 0; t < n; t++) sum += (p[t] = expf(p[t] - m));
    return sum;
}
static inline void weighted_values(float *o, const float *w, const uint16_t *v, int n, int head_dim) {
    for (int d = 0; d < head_dim; d++) o[d] = 0.f;
    for (int t = 0; t < n; t++) axpy(o, w[t], v + (int64_t)t * head_dim, head_dim);
}
static inline float scores_q8(float *p, const float *q, const int8_t *k, int n, int head_dim, float scale) {
    float m = -INFINITY;
    for (int t = 0; t < n; t++) {
        const int8_t *r = k + (int64_t)t * (head_dim + 4);
        float s = 0.f;
#pragma omp simd reduction(+ : s)
        for (int d = 0; d < head_dim; d++) s += q[d] * (float)r[d];
        p[t] = s * row_scale(r, head_dim) * scale;
        m = p[t] > m ? p[t] : m;
    }
    return m;
}
static inline void weighted_values_q8(float *o, const float *w, const int8_t *v, int n, int head_dim) {
    for (int d = 0; d < head_dim; d++) o[d] = 0.f;
    for (int t = 0; t < n; t++) {
        const int8_t *r = v + (int64_t)t * (head_dim + 4);
        float wt = w[t] * row_scale(r, head_dim);
#pragma omp simd
        for (int d = 0; d < head_dim; d++) o[d] += wt * (float)r[d];
    }
}
#endif

/* Row t of kv head g (which = 0: keys, 1: values) of one layer in a session's cache, `row` elements a row. */
static inline int64_t row_index(int layer, int which, int g, int t, int kv_heads, int64_t cap, int row) {
    return ((((int64_t)layer * 2 + which) * kv_heads + g) * cap + t) * row;
}

/* The body of both entry points; `q8` is a constant in each, so each gets its own specialised copy. */
static inline int attend(int q8, int batch, int layer, const float *q, int64_t q_row, const float *k, int64_t k_row,
                         const float *v, int64_t v_row, void *const *cache, const int64_t *capacity, const int *past,
                         float *out, int heads, int kv_heads, int head_dim, float scale, int threads) {
    int group = heads / kv_heads, longest = 0, failed = 0, row = q8 ? head_dim + 4 : head_dim;
    for (int b = 0; b < batch; b++) longest = past[b] + 1 > longest ? past[b] + 1 : longest;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < batch; b++)
            for (int g = 0; g < kv_heads; g++) {
                int64_t ki = row_index(layer, 0, g, past[b], kv_heads, capacity[b], row);
                int64_t vi = row_index(layer, 1, g, past[b], kv_heads, capacity[b], row);
                const float *ks = k + b * k_row + (int64_t)g * head_dim, *vs = v + b * v_row + (int64_t)g * head_dim;
                if (q8) {
                    quantize_row((int8_t *)cache[b] + ki, ks, head_dim);
                    quantize_row((int8_t *)cache[b] + vi, vs, head_dim);
                } else {
                    uint16_t *kd = (uint16_t *)cache[b] + ki, *vd = (uint16_t *)cache[b] + vi;
                    for (int d = 0; d < head_dim; d++) {
                        kd[d] = to_half(ks[d]);
                        vd[d] = to_half(vs[d]);
                    }
                }
            }
        /* the implicit barrier above: every new row is stored before any head reads it */
        float *p = malloc(sizeof(float) * (size_t)longest); /* this thread's scores */
        if (!p) {
#pragma omp atomic write
            failed = 1;
        }
#if Q8_FIXED
        const int fixed = q8 && head_dim % 128 == 0 && head_dim <= FIXED_MAX_DIM;
#else
        const int fixed = 0;
#endif
#if Q8_PAIRS
        /* int8 heads two at a time where their rows allow it (see scores_q8_pair) */
        const int paired = q8 && head_dim % 128 == 0 && heads % 2 == 0;
#else
        const int paired = 0;
#endif
        float *p1 = paired && p ? malloc(sizeof(float) * (size_t)longest) : NULL;
        if (paired && p && !p1) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < batch; b++)
            for (int h = 0; h < heads; h++) {
                if (!p || (paired && (h % 2 || !p1))) continue; /* a pair's second head is done with its first */
#if Q8_FIXED
                if (fixed) {
                    int n = past[b] + 1, two = paired;
                    const float *q0 = q + b * q_row + (int64_t)h * head_dim;
                    const int8_t *c = (const int8_t *)cache[b];
                    int g0 = h / group, g1 = two ? (h + 1) / group : g0;
                    const int8_t *k0 = c + row_index(layer, 0, g0, 0, kv_heads, capacity[b], row);
                    const int8_t *v0 = c + row_index(layer, 1, g0, 0, kv_heads, capacity[b], row);
                    const int8_t *k1 = c + row_index(layer, 0, g1, 0, kv_heads, capacity[b], row);
                    const int8_t *v1 = c + row_index(layer, 1, g1, 0, kv_heads, capacity[b], row);
                    float m0, m1, *o0 = out + ((int64_t)b * heads + h) * head_dim;
                    if (two) {
                        scores_fixed(1, p, p1, q0, q0 + head_dim, k0, k1, n, head_dim, scale, &m0, &m1);
                    } else {
                        scores_fixed(0, p, p, q0, q0, k0, k0, n, head_dim, scale, &m0, &m1);
                    }
                    float inv0 = 1.f / exp_sum(p, n, m0), inv1 = two ? 1.f / exp_sum(p1, n, m1) : 0.f;
                    for (int t = 0; t < n; t++) p[t] *= inv0;
                    for (int t = 0; two && t < n; t++) p1[t] *= inv1;
                    if (two)
                        values_fixed(1, o0, o0 + head_dim, p, p1, v0, v1, n, head_dim);
                    else
                        values_fixed(0, o0, o0, p, p, v0, v0, n, head_dim);
                    continue;
                }
#endif
#if Q8_PAIRS
                if (paired) {
                    int n = past[b] + 1;
                    const float *q0 = q + b * q_row + (int64_t)h * head_dim;
                    const int8_t *c = (const int8_t *)cache[b];
                    const int8_t *k0 = c + row_index(layer, 0, h / group, 0, kv_heads, capacity[b], row);
                    const int8_t *k1 = c + row_index(layer, 0, (h + 1) / group, 0, kv_heads, capacity[b], row);
                    const int8_t *v0 = c + row_index(layer, 1, h / group, 0, kv_heads, capacity[b], row);
                    const int8_t *v1 = c + row_index(layer, 1, (h + 1) / group, 0, kv_heads, capacity[b], row);
                    float m0, m1;
                    scores_q8_pair(p, p1, q0, q0 + head_dim, k0, k1, n, head_dim, scale, &m0, &m1);
                    float inv0 = 1.f / exp_sum(p, n, m0), inv1 = 1.f / exp_sum(p1, n, m1);
                    for (int t = 0; t < n; t++) {
                        p[t] *= inv0;
                        p1[t] *= inv1;
                    }
                    float *o0 = out + ((int64_t)b * heads + h) * head_dim;
                    weighted_values_q8_pair(o0, o0 + head_dim, p, p1, v0, v1, n, head_dim);
                    continue;
                }
#endif
                int n = past[b] + 1, g = h / group;
                const float *qh = q + b * q_row + (int64_t)h * head_dim;
                int64_t ki = row_index(layer, 0, g, 0, kv_heads, capacity[b], row);
                int64_t vi = row_index(layer, 1, g, 0, kv_heads, capacity[b], row);
                float m = q8 ? scores_q8(p, qh, (const int8_t *)cache[b] + ki, n, head_dim, scale)
                             : scores(p, qh, (const uint16_t *)cache[b] + ki, n, head_dim, scale);
                float sum = exp_sum(p, n, m);
                float *oh = out + ((int64_t)b * heads + h) * head_dim, inv = 1.f / sum;
                for (int t = 0; t < n; t++) p[t] *= inv;
                if (q8)
                    weighted_values_q8(oh, p, (const int8_t *)cache[b] + vi, n, head_dim);
                else
                    weighted_values(oh, p, (const uint16_t *)cache[b] + vi, n, head_dim);
            }
        free(p);
        free(p1);
    }
    return failed ? -1 : 0;
}

int ei_decode_attention_f16(int batch, int layer, const float *q, int64_t q_row, const float *k, int64_t k_row,
                            const float *v, int64_t v_row, void *const *cache, const int64_t *capacity,
                            const int *past, float *out, int heads, int kv_heads, int head_dim, float scale,
                            int threads) {
    return attend(0, batch, layer, q, q_row, k, k_row, v, v_row, cache, capacity, past, out, heads, kv_heads,
                  head_dim, scale, threads);
}

int ei_decode_attention_q8(int batch, int layer, const float *q, int64_t q_row, const float *k, int64_t k_row,
                           const float *v, int64_t v_row, void *const *cache, const int64_t *capacity,
                           const int *past, float *out, int heads, int kv_heads, int head_dim, float scale,
                           int threads) {
    return attend(1, batch, layer, q, q_row, k, k_row, v, v_row, cache, capacity, past, out, heads, kv_heads,
                  head_dim, scale, threads);
}

/* A prompt chunk's keys or values (which 0 / 1) into a session's int8 cache: src [T, kv_heads, head_dim] fp32, rows
 * src_row floats apart (heads contiguous), stored at positions [at, at + T) of `layer` as quantize_rows() stores them
 * (KVBuffer.write's bytes, without its six full-size torch passes); T x kv_heads rows over the threads. */
void ei_store_rows_q8(int T, int layer, int which, const float *src, int64_t src_row, void *cache, int64_t capacity,
                      int at, int kv_heads, int head_dim, int threads) {
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static)
    for (int g = 0; g < kv_heads; g++)
        for (int t = 0; t < T; t++)
            quantize_row((int8_t *)cache + row_index(layer, which, g, at + t, kv_heads, capacity, head_dim + 4),
                         src + t * src_row + (int64_t)g * head_dim, head_dim);
}

/* The elementwise work between a decode layer's matmuls, one call each instead of a dozen torch ops (each op's
 * dispatch costs about what its arithmetic on one 2048-wide row does). Rows are R short rows; plain loops the
 * compiler vectorizes. */

/* out[r] = w * x[r] / sqrt(mean(x[r]^2) + eps), as LlamaRMSNorm in fp32; with add != NULL, x[r] + add[r] is
 * written to sum[r] first and normalized. */
void ei_add_rmsnorm(int R, int D, const float *x, int64_t x_row, const float *add, int64_t add_row, float *sum,
                    const float *w, float eps, float *out) {
    /* prompt rows over torch's threads (libgomp is shared); decode's few rows stay on the caller's */
#pragma omp parallel for schedule(static) if (R >= PARALLEL_ROWS)
    for (int r = 0; r < R; r++) {
        const float *src = x + r * x_row;
        if (add) {
            const float *ar = add + r * add_row;
            float *dst = sum + (int64_t)r * D;
            for (int d = 0; d < D; d++) dst[d] = src[d] + ar[d];
            src = dst;
        }
        float part[16] = {0.f}, ss = 0.f; /* 16 running sums, then added in order: one took 60% of this call */
        int d = 0;
        for (; d + 16 <= D; d += 16)
            for (int i = 0; i < 16; i++) part[i] += src[d + i] * src[d + i];
        for (; d < D; d++) ss += src[d] * src[d];
        for (int i = 0; i < 16; i++) ss += part[i];
        float inv = 1.f / sqrtf(ss / (float)D + eps);
        float *o = out + (int64_t)r * D;
        for (d = 0; d < D; d++) o[d] = w[d] * (src[d] * inv);
    }
}

/* Rotary embedding in place on q [R, heads, hd] and k [R, kv_heads, hd] (rows q_row / k_row floats apart, heads
 * contiguous), as transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, cos/sin [R, hd]. */
void ei_rope(int R, int heads, int kv_heads, int hd, float *q, int64_t q_row, float *k, int64_t k_row,
             const float *cos, const float *sin) {
    int half = hd / 2;
#pragma omp parallel for schedule(static) if (R >= PARALLEL_ROWS)
    for (int r = 0; r < R; r++) {
        const float *c = cos + (int64_t)r * hd, *s = sin + (int64_t)r * hd;
        for (int which = 0; which < 2; which++) {
            int n = which ? kv_heads : heads;
            float *base = which ? k + r * k_row : q + r * q_row;
            for (int h = 0; h < n; h++) {
                float *x = base + (int64_t)h * hd;
                for (int d = 0; d < half; d++) {
                    float a = x[d], b = x[d + half];
                    x[d] = a * c[d] - b * s[d];
                    x[d + half] = b * c[d + half] + a * s[d + half];
                }
            }
        }
    }
}

/* o[i] = silu(g[i]) * u[i] for i < n: exp8 in blocks of 8, the tail with libm (every caller's row alike). */
static inline void silu_mul_span(int n, const float *g, const float *u, float *o) {
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    for (; i + 8 <= n; i += 8) { /* exp8 of -g clamped to 87: e^87 still fits a float, g / (1 + it) -> 0 */
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), gv), _mm256_set1_ps(87.f)));
        __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) o[i] = g[i] / (1.f + expf(-g[i])) * u[i];
}

/* out[r, i] = silu(gu[r, i]) * gu[r, I + i]: the fused gate/up projection's two halves. */
void ei_silu_mul(int R, int I, const float *gu, int64_t gu_row, float *out) {
#pragma omp parallel for schedule(static) if (R >= PARALLEL_ROWS)
    for (int r = 0; r < R; r++) silu_mul_span(I, gu + r * gu_row, gu + r * gu_row + I, out + (int64_t)r * I);
}

/* ei_silu_mul straight from the fused gate/up projection's int32 output (torch._int_mm over int8_vnni.c's one-pass
 * prompt rows): each value scaled as ei_q8_finish scales it (ws[n] * s * acc), 256 at a time, then the same span,
 * so the bits are finish + ei_silu_mul's and the [R, 2I] fp32 output is never written. Pieces start at multiples
 * of 8: the vector blocks and the scalar tail cover the elements a whole row would. */
void ei_silu_mul_q8(int R, int I, const int32_t *acc, const float *xs, const float *ws, float *out) {
#pragma omp parallel for schedule(static) if (R >= PARALLEL_ROWS)
    for (int r = 0; r < R; r++) {
        const int32_t *a = acc + (int64_t)r * 2 * I;
        float s = xs[r], g[256], u[256];
        for (int c = 0; c < I; c += 256) {
            int n = I - c < 256 ? I - c : 256;
            for (int i = 0; i < n; i++) {
                g[i] = ws[c + i] * s * (float)a[c + i];
                u[i] = ws[I + c + i] * s * (float)a[I + c + i];
            }
            silu_mul_span(n, g, u, out + (int64_t)r * I + c);
        }
    }
}

int ei_abi_version(void) { return 6; }
