/* Decode attention: one new query row per head over a session's cached keys/values.
 *
 * Built and loaded at run time by models/kernels/__init__.py (ctypes; no Python API). OpenMP parallel regions
 * run on the libgomp torch has already loaded (same soname), so they share torch's threads and thread count.
 *
 * q [heads, head_dim] fp32; k, v [kv_heads, stride, head_dim] (positions [0, length) valid), fp32 or fp16;
 * out [heads, head_dim] fp32; threads: the OpenMP team size (torch's intra-op thread count). Head h reads kv head h / (heads / kv_heads) (grouped-query attention).
 * Keys are read once (scores), values once (weighted sum): the cost is one pass over the cache at memory speed,
 * where SDPA's blocked kernel, built for many query rows, runs one row at about half that.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
static inline __m256 load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

static inline float dot_f16(const float *q, const uint16_t *k, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int d = 0;
    for (; d + 16 <= n; d += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load_f16(k + d), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load_f16(k + d + 8), a1);
    }
    float s = hsum8(_mm256_add_ps(a0, a1));
    for (; d < n; d++) s += q[d] * half_to_float(k[d]);
    return s;
}

static inline void axpy_f16(float *o, float w, const uint16_t *v, int n) {
    __m256 wv = _mm256_set1_ps(w);
    int d = 0;
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(o + d, _mm256_fmadd_ps(wv, load_f16(v + d), _mm256_loadu_ps(o + d)));
    for (; d < n; d++) o[d] += w * half_to_float(v[d]);
}
#else
/* Portable path (ARM and CPUs without F16C): the compiler's own half type and auto-vectorisation. */
static inline float half_to_float(uint16_t h) {
    _Float16 f;
    __builtin_memcpy(&f, &h, 2);
    return (float)f;
}
static inline float dot_f16(const float *q, const uint16_t *k, int n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < n; d++) s += q[d] * half_to_float(k[d]);
    return s;
}
static inline void axpy_f16(float *o, float w, const uint16_t *v, int n) {
#pragma omp simd
    for (int d = 0; d < n; d++) o[d] += w * half_to_float(v[d]);
}
#endif

static inline float dot_f32(const float *q, const float *k, int n) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < n; d++) s += q[d] * k[d];
    return s;
}
static inline void axpy_f32(float *o, float w, const float *v, int n) {
#pragma omp simd
    for (int d = 0; d < n; d++) o[d] += w * v[d];
}

/* The body for one element type T (dot_T / axpy_T): softmax(q k^T * scale) v per head, heads in parallel. */
#define DECODE_ATTENTION(T, DOT, AXPY)                                                                  \
    int group = heads / kv_heads;                                                                       \
    int failed = 0;                                                                                     \
    _Pragma("omp parallel num_threads(threads)") {                                                                           \
        float *p = malloc(sizeof(float) * (size_t)length); /* this thread's scores */                  \
        if (!p) {                                                                                       \
            _Pragma("omp atomic write") failed = 1;                                                     \
        }                                                                                               \
        _Pragma("omp for schedule(static)") for (int h = 0; h < heads; h++) {                          \
            if (!p) continue;                                                                           \
            const float *qh = q + (int64_t)h * head_dim;                                                \
            const T *kh = k + (int64_t)(h / group) * stride * head_dim;                                 \
            const T *vh = v + (int64_t)(h / group) * stride * head_dim;                                 \
            float m = -INFINITY, sum = 0.f;                                                             \
            for (int t = 0; t < length; t++) {                                                          \
                p[t] = DOT(qh, kh + (int64_t)t * head_dim, head_dim) * scale;                           \
                m = p[t] > m ? p[t] : m;                                                                \
            }                                                                                           \
            for (int t = 0; t < length; t++) sum += (p[t] = expf(p[t] - m));                           \
            float *oh = out + (int64_t)h * head_dim, inv = 1.f / sum;                                   \
            for (int d = 0; d < head_dim; d++) oh[d] = 0.f;                                             \
            for (int t = 0; t < length; t++) AXPY(oh, p[t] * inv, vh + (int64_t)t * head_dim, head_dim); \
        }                                                                                               \
        free(p);                                                                                        \
    }                                                                                                   \
    return failed ? -1 : 0;

int ei_decode_attention_f32(const float *q, const float *k, const float *v, float *out, int heads, int kv_heads,
                            int length, int64_t stride, int head_dim, float scale, int threads) {
    DECODE_ATTENTION(float, dot_f32, axpy_f32)
}

int ei_decode_attention_f16(const float *q, const uint16_t *k, const uint16_t *v, float *out, int heads,
                            int kv_heads, int length, int64_t stride, int head_dim, float scale, int threads) {
    DECODE_ATTENTION(uint16_t, dot_f16, axpy_f16)
}

int ei_abi_version(void) { return 1; }
