/* 8-lane fp32 helpers shared by the kernels (each .c is built into its own library and includes this;
 * models/kernels/__init__.py keys every build by the headers too): exp8, hsum8 and hmax8. Include under AVX2 + FMA. */
#ifndef EI_SIMD8_H
#define EI_SIMD8_H
#include <immintrin.h>

/* The sum of 8 lanes: (lo + hi) halves, then pairs; one order for every kernel that reduces with it. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* The largest of 8 lanes (a max is exact in any order). */
static inline float hmax8(__m256 v) {
    __m128 u = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    u = _mm_max_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_max_ss(u, _mm_movehdup_ps(u)));
}

/* exp(x) for x <= 0, 8 lanes: 2^(x log2 e) as 2^n * 2^f, f in [-0.5, 0.5], degree-6 polynomial (relative error
 * ~2e-7, like expf's); below -87 it is 0. The scalar libm expf was a quarter of the decode attention's time. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
    __m256 t = _mm256_mul_ps(x, _mm256_set1_ps(1.44269504f));
    __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_mul_ps(_mm256_sub_ps(t, n), _mm256_set1_ps(0.693147181f)); /* ln 2 * frac, |f| <= 0.35 */
    __m256 r = _mm256_set1_ps(1.f / 720.f);
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(1.f / 120.f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(1.f / 24.f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(1.f / 6.f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(0.5f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(1.f));
    r = _mm256_fmadd_ps(r, f, _mm256_set1_ps(1.f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(r, _mm256_castsi256_ps(e));
}

#endif
