/* int4 (and int6) weight x int8 activation matmul for decode rows: y[R, N] = x[R, K] @ W[N, K]^T.
 *
 * Built and loaded at run time by models/kernels/__init__.py (ctypes), like decode_attention.c.
 *
 * Weights (models/int4.py packs them): per row n, K / 64 chunks of 32 bytes, each the nibbles of one 64-byte vector
 * V: byte j holds V[j] in its low nibble and V[j + 32] in its high nibble, so one 32-byte load splits into the
 * vector's two halves with an AND and a shift. Each value q in [0, 15] stands for (q - 8) * d, with one fp16 scale d
 * per group of 32 (llama.cpp's q4_0 grid): 18 bytes per 32 weights. Which weights a vector holds: in each full
 * super-block of 512 weights (16 groups), vector v's 32-bit lane g holds elements 4v..4v+3 of group g, so one
 * vpdpbusd per vector adds four products to each of the 16 groups' own lanes, eight vectors complete every group's
 * sum, and one convert and one FMA apply the 16 groups' scales (per 512 weights, where a vector of two groups
 * needed them per 64). The last K % 512 weights are plain blocks: V holds 64 consecutive elements, two groups.
 *
 * Activations are quantized here per row and group of 32 to int8 with an fp32 scale (absmax / 127, like
 * llama.cpp's q8_0) and arranged as the weights are. A group's dot product is then sum(q * xq) - 8 * sum(xq), all
 * in int32: VNNI's vpdpbusd multiplies the unsigned nibbles by the signed activations, and the 8 * sum(xq) term is
 * folded in by starting the group's lanes at -8 * sum(xq) (a plain block: each of its 8 lanes at -sum(xq)). One
 * fp32 FMA per lane applies both scales. Rows of x are processed up to 4 at a time so each vector is unpacked once
 * per 4 rows.
 *
 * int6 (ei_int6_gemm, models/int4.py's q6 grid: q in [0, 63] for (q - 32) * d, one fp16 scale per 32): a chunk is
 * the int4 chunk's 32 bytes of low nibbles followed by 16 bytes of top bits, byte k holding bits 4-5 of V[k],
 * V[k + 16], V[k + 32] and V[k + 48] in its bit pairs 0-1, 2-3, 4-5 and 6-7, so one 16-byte load broadcast to four
 * lanes and shifted by 0, 2, 4 and 6 (with GFNI: one affine byte transform) puts every element's top bits at its
 * own byte: 26 bytes per 32 weights (0.81 of int8's bytes). Offset 32 instead of 8; both entry points share every
 * loop, the format a compile-time constant.
 * Returns 0, or -1 when the activation buffers cannot be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#define GROUP 32
#define BLOCK 64
#define SUPER 512 /* weights per super-block: 16 groups, 8 vectors */
#define SUPER_BLOCKS (SUPER / BLOCK)
/* Lane sets per activation row: one per super-block, then one per plain block (K % SUPER / BLOCK of them). */
#define UNITS(K) ((K) / SUPER + (K) % SUPER / BLOCK)
/* Bytes per 64-weight block: 32 of nibbles (+ 16 of top bit pairs for int6); the value offset (-8 / -32 * d). */
#define BLOCK_BYTES(bits) ((bits) == 6 ? 48 : 32)
#define OFFSET(bits) ((bits) == 6 ? 32 : 8)
#define ROWS 4
/* Bytes ahead of the weight stream that are prefetched into L2. One prefetch per 32-byte chunk (int6: 48), so two
 * per cache line: once per line measured slower on the Zen 4 (1.26-1.34x vs 1.23-1.24x). The AVX2 loop on a Zen 3
 * measured alike at 2, 4 and 8 KiB (1.15-1.18x a sum's time), 1 KiB 1.24x. The AVX-512 loop's distance depends on
 * the format and the loop (Zen 4 EPYC, 1.3B shapes x 24 + lm_head, 2 threads, each chain right after a sum of as
 * many bytes, 100-200 interleaved rounds, medians; bench/prefetch_sweep.py). With the super-blocks: int6 at 2 KiB
 * 0.99-1.01x the sum's time while memory read at 31-35 GB/s, 8 KiB 1.05-1.06x; at 53 GB/s 2 KiB 1.08-1.15x, 8 KiB
 * 1.13x, 3-4 KiB 1.27x (1 KiB as 2); int4 at 2 KiB 0.99x, 4 KiB 1.01x, 8 KiB 1.04x (31-35 GB/s). Before them the
 * loop was compute-bound at fast memory, and longer distances were the better there (int6 8 KiB 1.28x, 2 KiB
 * 1.65x). */
#define PREFETCH 8192
#ifndef PREFETCH_INT4 /* -D overrides both (bench/prefetch_sweep.py builds one library per distance) */
#define PREFETCH_INT4 2048
#endif
#ifndef PREFETCH_INT6
#define PREFETCH_INT6 2048
#endif
#define PREFETCH_512(bits) ((bits) == 4 ? PREFETCH_INT4 : PREFETCH_INT6)

static inline float half_to_float(uint16_t h) {
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
}

/* x [R, K] -> xq [R, K] int8, xd [R, K / 32] scales, xs [R, K / 32] sums of each group's int8 values. The AVX-512
 * and AVX2 loops take the same steps per element as the scalar one (absmax, / 127, 1 / d, round to nearest even,
 * clamp), so all give the same bytes; the scalar loop (fmaxf a call) took ~6 us per decode row on the Zen 4, ~0.5 ms
 * of a 1.3B step. */
static void quantize_rows(int R, int K, const float *x, int64_t x_row, int8_t *xq, float *xd, int32_t *xs) {
    int groups = K / GROUP;
    for (int r = 0; r < R; r++)
        for (int g = 0; g < groups; g++) {
            const float *src = x + r * x_row + (int64_t)g * GROUP;
            int8_t *dst = xq + (int64_t)r * K + (int64_t)g * GROUP;
#if defined(__AVX512F__) && defined(__AVX512BW__)
            __m512 a = _mm512_loadu_ps(src), b = _mm512_loadu_ps(src + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
            const __m512 vinv = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.f), lo = _mm512_set1_ps(-127.f);
            const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            __m512i qa = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_roundscale_ps(_mm512_mul_ps(a, vinv), mode), hi), lo));
            __m512i qb = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(_mm512_roundscale_ps(_mm512_mul_ps(b, vinv), mode), hi), lo));
            _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(qa));
            _mm_storeu_si128((__m128i *)(dst + 16), _mm512_cvtepi32_epi8(qb));
            xd[(int64_t)r * groups + g] = d;
            xs[(int64_t)r * groups + g] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
#elif defined(__AVX2__)
            const __m256 sign = _mm256_set1_ps(-0.f);
            __m256 v[4], m = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i] = _mm256_loadu_ps(src + 8 * i)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
            const __m256 vinv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.f), lo = _mm256_set1_ps(-127.f);
            __m256i q[4], sum = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                __m256 t = _mm256_round_ps(_mm256_mul_ps(v[i], vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                q[i] = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(t, hi), lo));
                sum = _mm256_add_epi32(sum, q[i]);
            }
            /* the two packs interleave 4-value runs per 128-bit lane; one dword permute puts them back in order */
            __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)dst, bytes);
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            xd[(int64_t)r * groups + g] = d;
            xs[(int64_t)r * groups + g] = _mm_cvtsi128_si32(s4);
#elif defined(__aarch64__) && defined(__ARM_NEON)
            float32x4_t v[8], m = vdupq_n_f32(0.f);
            for (int i = 0; i < 8; i++) m = vmaxnmq_f32(m, vabsq_f32(v[i] = vld1q_f32(src + 4 * i))); /* as fmaxf */
            float amax = vmaxnmvq_f32(m);
            float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
            const float32x4_t vinv = vdupq_n_f32(inv), hi = vdupq_n_f32(127.f), lo = vdupq_n_f32(-127.f);
            int32x4_t q[8], sum = vdupq_n_s32(0);
            for (int i = 0; i < 8; i++) { /* vrndnq: to nearest even, as nearbyintf in the default rounding mode */
                q[i] = vcvtq_s32_f32(vmaxq_f32(vminq_f32(vrndnq_f32(vmulq_f32(v[i], vinv)), hi), lo));
                sum = vaddq_s32(sum, q[i]);
            }
            for (int h = 0; h < 2; h++) {
                int16x8_t a = vcombine_s16(vmovn_s32(q[4 * h]), vmovn_s32(q[4 * h + 1]));
                int16x8_t b = vcombine_s16(vmovn_s32(q[4 * h + 2]), vmovn_s32(q[4 * h + 3]));
                vst1q_s8(dst + 16 * h, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
            }
            xd[(int64_t)r * groups + g] = d;
            xs[(int64_t)r * groups + g] = vaddvq_s32(sum);
#else
            float amax = 0.f;
            for (int i = 0; i < GROUP; i++) amax = fmaxf(amax, fabsf(src[i]));
            float d = amax / 127.f, inv = d > 0.f ? 1.f / d : 0.f;
            int32_t sum = 0;
            for (int i = 0; i < GROUP; i++) {
                int v = (int)nearbyintf(src[i] * inv);
                dst[i] = (int8_t)(v > 127 ? 127 : (v < -127 ? -127 : v));
                sum += dst[i];
            }
            xd[(int64_t)r * groups + g] = d;
            xs[(int64_t)r * groups + g] = sum;
#endif
        }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define EI_INT4_SIMD 1
#define EI_INT4_LANE_SCALES 1 /* rows_simd takes the activation scales spread over lanes */

/* int6: a block's top bit pairs (its bytes 32-47) at each element's own byte, as values 0-3: the 16 bytes in all
 * four 128-bit lanes, lane L shifted right by 2L (16-bit shifts: a byte's pair never crosses into its neighbour once
 * masked). */
static inline __m512i q6_top_bits(const uint8_t *blk) {
    const __m512i shift = _mm512_set_epi64(0x0006000600060006, 0x0006000600060006, 0x0004000400040004,
                                           0x0004000400040004, 0x0002000200020002, 0x0002000200020002, 0, 0);
    __m512i four = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + 32)));
    return _mm512_and_si512(_mm512_srlv_epi16(four, shift), _mm512_set1_epi8(0x03));
}

/* One chunk's 64-byte vector V (see the top), each value at its own byte. */
static inline __attribute__((always_inline)) __m512i unpack_vector(const uint8_t *blk, const int bits) {
#ifdef __GFNI__
    /* vgf2p8affineqb moves bits within each byte by an 8 x 8 bit matrix per qword (result bit i = parity of matrix
     * byte 7 - i AND the source byte), so one instruction masks and shifts lanes differently: the chunk's 32 bytes in
     * both halves, the low half keeping bits 0-3, the high half moving bits 4-7 to 0-3; for int6 the 16 bytes of top
     * bits in all four lanes, lane L moving bits 2L, 2L + 1 to 4, 5. On the Zen 4 the int6 loop took 2.2 ns per
     * block and core from L2 against 2.6-2.9 with the shifts, masks and lane insert below (one thread, 1.3B
     * shapes). */
    const long long low_nibble = 0x0102040800000000ll, high_nibble = 0x1020408000000000ll;
    const __m512i nibbles = _mm512_set_epi64(high_nibble, high_nibble, high_nibble, high_nibble, low_nibble,
                                             low_nibble, low_nibble, low_nibble);
    const __m512i top_pairs = _mm512_set_epi64(0x40800000ll, 0x40800000ll, 0x10200000ll, 0x10200000ll, 0x04080000ll,
                                               0x04080000ll, 0x01020000ll, 0x01020000ll);
    __m512i w = _mm512_gf2p8affine_epi64_epi8(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)blk)),
                                              nibbles, 0);
    if (bits == 6)
        w = _mm512_or_si512(w, _mm512_gf2p8affine_epi64_epi8(
                                   _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(blk + 32))), top_pairs, 0));
    return w;
#else
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i packed = _mm256_loadu_si256((const __m256i *)blk);
    __m256i lo = _mm256_and_si256(packed, low4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    if (bits == 6) w = _mm512_or_si512(w, _mm512_slli_epi16(q6_top_bits(blk), 4));
    return w;
#endif
}

/* Output rows [n0, n1) for x rows [r0, r0 + nr), nr <= ROWS: each weight row read to its end before the next, one
 * sequential stream per thread, prefetched into L2 PREFETCH_512 bytes ahead. A decode row (nr 1) used to read four
 * weight rows side by side, sharing the activation loads: the faster on an AVX512 Xeon, but on a Zen 5 EPYC (1.3B
 * layer shapes x 24, 0.54 GB, 2 threads, against a plain sum of the same bytes) 0.69x of the sum's speed where this
 * loop read at 0.79-0.84x (without software prefetch). On a Zen 4 EPYC (512-bit ops on 256-bit units; memory at
 * 25-28 GB/s) the loop took 1.40-1.77x the sum's time without software prefetch, 1.17-1.38x prefetching into L1
 * 2 KiB ahead and 1.16x into L2 8 KiB ahead (medians of 21-31 interleaved rounds; at 37 GB/s it is compute-bound:
 * 1.51x). Tried there and slower: one 64-byte load per two blocks with the activations pre-arranged to match, a
 * second accumulator. xs and xd are per row and unit (a super-block, then each plain block) 16 lanes: the unit's
 * start values and activation scales. nr is a constant where rows_vnni is inlined. */
static inline __attribute__((always_inline)) void rows_vnni(int n0, int n1, int r0, const int nr, int K,
                                                            const int bits, const uint8_t *qw, const uint16_t *wd,
                                                            const int8_t *xq, const float *xd, const int32_t *xs,
                                                            float *y, int64_t y_row) {
    const int blocks = K / BLOCK, groups = K / GROUP, bb = BLOCK_BYTES(bits);
    const int supers = K / SUPER, units = UNITS(K);
    const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int n = n0; n < n1; n++) {
        const uint8_t *wrow = qw + (int64_t)n * blocks * bb;
        const uint16_t *drow = wd + (int64_t)n * groups;
        __m512 acc[ROWS];
        for (int r = 0; r < nr; r++) acc[r] = _mm512_setzero_ps();
        for (int s = 0; s < supers; s++) {
            __m512i dot[ROWS];
            for (int r = 0; r < nr; r++)
                dot[r] = _mm512_loadu_si512((const void *)(xs + ((int64_t)(r0 + r) * units + s) * 16));
            for (int v = 0; v < SUPER_BLOCKS; v++) {
                const uint8_t *blk = wrow + (int64_t)(s * SUPER_BLOCKS + v) * bb;
                _mm_prefetch((const char *)(blk + PREFETCH_512(bits)), _MM_HINT_T1);
                __m512i w = unpack_vector(blk, bits);
                for (int r = 0; r < nr; r++)
                    dot[r] = _mm512_dpbusd_epi32(
                        dot[r], w,
                        _mm512_loadu_si512((const void *)(xq + (int64_t)(r0 + r) * K + (int64_t)s * SUPER + v * 64)));
            }
            __m512 wscale = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(drow + 16 * s)));
            for (int r = 0; r < nr; r++) {
                __m512 xscale = _mm512_loadu_ps(xd + ((int64_t)(r0 + r) * units + s) * 16);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(wscale, xscale), acc[r]);
            }
        }
        for (int b = supers * SUPER_BLOCKS; b < blocks; b++) { /* plain blocks: groups 2b | 2b + 1 */
            const uint8_t *blk = wrow + (int64_t)b * bb;
            _mm_prefetch((const char *)(blk + PREFETCH_512(bits)), _MM_HINT_T1);
            __m512i w = unpack_vector(blk, bits);
            uint32_t two;
            memcpy(&two, drow + 2 * b, 4);
            __m512 wscale = _mm512_permutexvar_ps(pick, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(two))));
            const int64_t u = supers + b - supers * SUPER_BLOCKS;
            for (int r = 0; r < nr; r++) {
                int64_t lanes = ((int64_t)(r0 + r) * units + u) * 16;
                __m512i xv = _mm512_loadu_si512((const void *)(xq + (int64_t)(r0 + r) * K + (int64_t)b * BLOCK));
                __m512i dot = _mm512_dpbusd_epi32(_mm512_loadu_si512((const void *)(xs + lanes)), w, xv);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(wscale, _mm512_loadu_ps(xd + lanes)),
                                         acc[r]);
            }
        }
        for (int r = 0; r < nr; r++) y[(int64_t)(r0 + r) * y_row + n] = _mm512_reduce_add_ps(acc[r]);
    }
}

#define ROWS_LOOP rows_vnni

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define EI_INT4_SIMD 1
#define EI_INT4_LANE_SCALES 0

/* _mm512_reduce_add_ps's order (GCC: 256-bit halves, 128-bit halves, then pairs) over the 16 lanes lo | hi, so this
 * path's sums are the VNNI path's to the bit. */
static inline float reduce16(__m256 lo, __m256 hi) {
    __m256 t = _mm256_add_ps(hi, lo);
    __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    u = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0x4E));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps(u, u, 0x55)));
}

/* One chunk's vector V (see the top) as its halves V[0..31] and V[32..63], each value at its own byte. */
static inline __attribute__((always_inline)) void unpack_halves(const uint8_t *blk, const int bits, __m256i *lo,
                                                                __m256i *hi) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03);
    /* int6 top bit pairs: V[0..31] sit in pairs 0-1 (k) and 2-3 (k + 16), V[32..63] in 4-5 and 6-7 */
    const __m256i shift_lo = _mm256_set_epi32(2, 2, 2, 2, 0, 0, 0, 0), shift_hi = _mm256_set_epi32(6, 6, 6, 6, 4, 4, 4, 4);
    __m256i packed = _mm256_loadu_si256((const __m256i *)blk);
    *lo = _mm256_and_si256(packed, low4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    if (bits == 6) { /* values <= 63: vpmaddubsw's pairs stay below 2 * 63 * 127 < 32768 */
        __m256i two = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 32)));
        *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi32(two, shift_lo), low2), 4));
        *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srlv_epi32(two, shift_hi), low2), 4));
    }
}

/* The VNNI loop above on AVX2: nibbles (unsigned, <= 15) times int8 activations by vpmaddubsw cannot saturate
 * (2 * 15 * 127 < 32768), vpmaddwd by ones adds the pairs into the same four-product int32 lanes vpdpbusd makes;
 * a vector's halves (lo, hi) keep 8 lanes each as the 512-bit accumulator's two halves do (a super-block's groups
 * 0-7 and 8-15, a plain block's two groups). AVX2 runs this loop short of memory speed (an AVX2 Zen 3 at 8.4 cycles
 * per block from cache), so the scale products every lane needs (weight scale x activation scale, the same fp32
 * product per group) are formed once per weight row, eight groups per multiply, and a super-block loads its 16, a
 * plain block broadcasts its two (a load, no shuffle or multiply): fewer operations per block, the same products,
 * the same bits. nr is a constant where rows_avx2 is inlined. */
static inline __attribute__((always_inline)) void rows_avx2(int n0, int n1, int r0, const int nr, int K,
                                                            const int bits, const uint8_t *qw, const uint16_t *wd,
                                                            const int8_t *xq, const float *xd, const int32_t *xs,
                                                            float *y, int64_t y_row) {
    const int blocks = K / BLOCK, groups = K / GROUP, bb = BLOCK_BYTES(bits);
    const int supers = K / SUPER, units = UNITS(K);
    const __m256i ones = _mm256_set1_epi16(1);
    float prod[nr * groups];
    for (int n = n0; n < n1; n++) {
        const uint8_t *wrow = qw + (int64_t)n * blocks * bb;
        const uint16_t *drow = wd + (int64_t)n * groups;
        for (int r = 0; r < nr; r++) {
            const float *xr = xd + (int64_t)(r0 + r) * groups;
            float *pr = prod + r * groups;
            int g = 0;
            for (; g + 8 <= groups; g += 8) {
                __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(drow + g)));
                _mm256_storeu_ps(pr + g, _mm256_mul_ps(dw, _mm256_loadu_ps(xr + g)));
            }
            for (; g < groups; g++) pr[g] = half_to_float(drow[g]) * xr[g];
        }
        __m256 lo_acc[ROWS], hi_acc[ROWS];
        for (int r = 0; r < nr; r++) lo_acc[r] = hi_acc[r] = _mm256_setzero_ps();
        for (int s = 0; s < supers; s++) { /* lo: groups 16s..16s+7, hi: 16s+8..16s+15, as the VNNI loop's lanes */
            __m256i lo_dot[ROWS], hi_dot[ROWS];
            for (int r = 0; r < nr; r++) {
                const int32_t *start = xs + ((int64_t)(r0 + r) * units + s) * 16;
                lo_dot[r] = _mm256_loadu_si256((const __m256i *)start);
                hi_dot[r] = _mm256_loadu_si256((const __m256i *)(start + 8));
            }
            for (int v = 0; v < SUPER_BLOCKS; v++) {
                const uint8_t *blk = wrow + (int64_t)(s * SUPER_BLOCKS + v) * bb;
                _mm_prefetch((const char *)(blk + PREFETCH), _MM_HINT_T1);
                __m256i lo, hi;
                unpack_halves(blk, bits, &lo, &hi);
                for (int r = 0; r < nr; r++) {
                    const int8_t *xb = xq + (int64_t)(r0 + r) * K + (int64_t)s * SUPER + v * 64;
                    lo_dot[r] = _mm256_add_epi32(lo_dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xb)), ones));
                    hi_dot[r] = _mm256_add_epi32(hi_dot[r], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xb + 32))), ones));
                }
            }
            for (int r = 0; r < nr; r++) {
                const float *pb = prod + r * groups + 16 * s;
                lo_acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo_dot[r]), _mm256_loadu_ps(pb), lo_acc[r]);
                hi_acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi_dot[r]), _mm256_loadu_ps(pb + 8), hi_acc[r]);
            }
        }
        for (int b = supers * SUPER_BLOCKS; b < blocks; b++) { /* plain blocks: groups 2b | 2b + 1 */
            const uint8_t *blk = wrow + (int64_t)b * bb;
            _mm_prefetch((const char *)(blk + PREFETCH), _MM_HINT_T1);
            __m256i lo, hi;
            unpack_halves(blk, bits, &lo, &hi);
            const int64_t u = supers + b - supers * SUPER_BLOCKS;
            for (int r = 0; r < nr; r++) {
                const int32_t *start = xs + ((int64_t)(r0 + r) * units + u) * 16;
                const int8_t *xb = xq + (int64_t)(r0 + r) * K + (int64_t)b * BLOCK;
                __m256i lo_dot = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xb)), ones);
                __m256i hi_dot = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xb + 32))), ones);
                lo_dot = _mm256_add_epi32(lo_dot, _mm256_loadu_si256((const __m256i *)start));
                hi_dot = _mm256_add_epi32(hi_dot, _mm256_loadu_si256((const __m256i *)(start + 8)));
                const float *pb = prod + r * groups + 2 * b;
                lo_acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo_dot), _mm256_broadcast_ss(pb), lo_acc[r]);
                hi_acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi_dot), _mm256_broadcast_ss(pb + 1), hi_acc[r]);
            }
        }
        for (int r = 0; r < nr; r++) y[(int64_t)(r0 + r) * y_row + n] = reduce16(lo_acc[r], hi_acc[r]);
    }
}

#define ROWS_LOOP rows_avx2

#elif defined(__aarch64__) && defined(__ARM_NEON)
#define EI_INT4_SIMD 1
#define EI_INT4_LANE_SCALES 0

/* Four int8 products summed into each int32 lane, as vpdpbusd does: sdot where the CPU has dot products (ARMv8.2
 * dotprod: a Jetson Orin, a Pi 5), else two widening multiplies and two pairwise adds (a Pi 4). Weights are <= 63
 * and activations within +-127, so a pair of products stays below 2 * 63 * 127 < 32768 in int16: the same sums. */
static inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t x) {
#ifdef __ARM_FEATURE_DOTPROD
    return vdotq_s32(acc, w, x);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(x)), hi = vmull_high_s8(w, x);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
#endif
}

/* One chunk's vector V (see the top) as four 16-byte quarters, each value at its own byte: V[0..15] and V[16..31]
 * are the low nibbles of bytes 0-15 and 16-31, V[32..47] and V[48..63] their high nibbles; int6 adds the top bit
 * pairs 0-1, 2-3, 4-5 and 6-7 of bytes 32-47, moved to bits 4-5. Quarter i holds the accumulator's lanes 4i..4i+3. */
static inline __attribute__((always_inline)) void unpack_quarters(const uint8_t *blk, const int bits, int8x16_t *q) {
    const uint8x16_t low4 = vdupq_n_u8(0x0F), top = vdupq_n_u8(0x30);
    uint8x16_t p0 = vld1q_u8(blk), p1 = vld1q_u8(blk + 16);
    uint8x16_t v[4] = {vandq_u8(p0, low4), vandq_u8(p1, low4), vshrq_n_u8(p0, 4), vshrq_n_u8(p1, 4)};
    if (bits == 6) {
        uint8x16_t t = vld1q_u8(blk + 32);
        v[0] = vorrq_u8(v[0], vandq_u8(vshlq_n_u8(t, 4), top));
        v[1] = vorrq_u8(v[1], vandq_u8(vshlq_n_u8(t, 2), top));
        v[2] = vorrq_u8(v[2], vandq_u8(t, top));
        v[3] = vorrq_u8(v[3], vandq_u8(vshrq_n_u8(t, 2), top));
    }
    for (int i = 0; i < 4; i++) q[i] = vreinterpretq_s8_u8(v[i]); /* values <= 63: the same bytes signed */
}

/* The AVX2 loop on NEON (128-bit registers: a vector is four quarters, a super-block's 16 group lanes four int32x4
 * accumulators), with its per-row products of weight and activation scales. No software prefetch: each thread reads
 * one sequential stream, which the cores' own prefetchers follow, and no ARM box here to tune a distance on. nr is a
 * constant where rows_neon is inlined. */
static inline __attribute__((always_inline)) void rows_neon(int n0, int n1, int r0, const int nr, int K,
                                                            const int bits, const uint8_t *qw, const uint16_t *wd,
                                                            const int8_t *xq, const float *xd, const int32_t *xs,
                                                            float *y, int64_t y_row) {
    const int blocks = K / BLOCK, groups = K / GROUP, bb = BLOCK_BYTES(bits);
    const int supers = K / SUPER, units = UNITS(K);
    float prod[nr * groups];
    for (int n = n0; n < n1; n++) {
        const uint8_t *wrow = qw + (int64_t)n * blocks * bb;
        const uint16_t *drow = wd + (int64_t)n * groups;
        for (int r = 0; r < nr; r++)
            for (int g = 0; g < groups; g++)
                prod[r * groups + g] = half_to_float(drow[g]) * xd[(int64_t)(r0 + r) * groups + g];
        float32x4_t acc[ROWS][4];
        for (int r = 0; r < nr; r++)
            for (int i = 0; i < 4; i++) acc[r][i] = vdupq_n_f32(0.f);
        for (int s = 0; s < supers; s++) {
            int32x4_t dot[ROWS][4];
            for (int r = 0; r < nr; r++)
                for (int i = 0; i < 4; i++) dot[r][i] = vld1q_s32(xs + ((int64_t)(r0 + r) * units + s) * 16 + 4 * i);
            for (int v = 0; v < SUPER_BLOCKS; v++) {
                int8x16_t w[4];
                unpack_quarters(wrow + (int64_t)(s * SUPER_BLOCKS + v) * bb, bits, w);
                for (int r = 0; r < nr; r++) {
                    const int8_t *xb = xq + (int64_t)(r0 + r) * K + (int64_t)s * SUPER + v * 64;
                    for (int i = 0; i < 4; i++) dot[r][i] = dot4(dot[r][i], w[i], vld1q_s8(xb + 16 * i));
                }
            }
            for (int r = 0; r < nr; r++)
                for (int i = 0; i < 4; i++)
                    acc[r][i] = vfmaq_f32(acc[r][i], vcvtq_f32_s32(dot[r][i]),
                                          vld1q_f32(prod + r * groups + 16 * s + 4 * i));
        }
        for (int b = supers * SUPER_BLOCKS; b < blocks; b++) { /* plain blocks: quarters 0-1 group 2b, 2-3 2b + 1 */
            int8x16_t w[4];
            unpack_quarters(wrow + (int64_t)b * bb, bits, w);
            const int64_t u = supers + b - supers * SUPER_BLOCKS;
            for (int r = 0; r < nr; r++) {
                const int32_t *start = xs + ((int64_t)(r0 + r) * units + u) * 16;
                const int8_t *xb = xq + (int64_t)(r0 + r) * K + (int64_t)b * BLOCK;
                const float *pb = prod + r * groups + 2 * b;
                for (int i = 0; i < 4; i++) {
                    int32x4_t dot = dot4(vld1q_s32(start + 4 * i), w[i], vld1q_s8(xb + 16 * i));
                    acc[r][i] = vfmaq_f32(acc[r][i], vcvtq_f32_s32(dot), vdupq_n_f32(pb[i / 2]));
                }
            }
        }
        for (int r = 0; r < nr; r++) {
            float32x4_t sum = vaddq_f32(vaddq_f32(acc[r][0], acc[r][1]), vaddq_f32(acc[r][2], acc[r][3]));
            y[(int64_t)(r0 + r) * y_row + n] = vaddvq_f32(sum);
        }
    }
}

#define ROWS_LOOP rows_neon

#else
#define EI_INT4_SIMD 0
#define EI_INT4_LANE_SCALES 0
#endif

#if EI_INT4_SIMD
/* The loop with the row count and format as constants. xd: the VNNI loop takes the activation scales on lanes, per
 * row and unit; the AVX2 and NEON loops per group [R, K / 32]. */
static void rows_simd(int n0, int n1, int r0, int nr, int K, int bits, const uint8_t *qw, const uint16_t *wd,
                      const int8_t *xq, const float *xd, const int32_t *xs, float *y, int64_t y_row) {
#define EI_ROWS(b)                                                                                                     \
    switch (nr) {                                                                                                      \
    case 1: ROWS_LOOP(n0, n1, r0, 1, K, b, qw, wd, xq, xd, xs, y, y_row); break;                                       \
    case 2: ROWS_LOOP(n0, n1, r0, 2, K, b, qw, wd, xq, xd, xs, y, y_row); break;                                       \
    case 3: ROWS_LOOP(n0, n1, r0, 3, K, b, qw, wd, xq, xd, xs, y, y_row); break;                                       \
    default: ROWS_LOOP(n0, n1, r0, 4, K, b, qw, wd, xq, xd, xs, y, y_row); break;                                      \
    }
    if (bits == 6) {
        EI_ROWS(6)
    } else {
        EI_ROWS(4)
    }
#undef EI_ROWS
}
#endif

/* Portable path: the same arithmetic in plain C (no VNNI here: slower, but exact to the same int32 sums). */
static inline int32_t weight_q(const uint8_t *wrow, int K, int e, int bits) {
    if (e < K / SUPER * SUPER) { /* natural element e of a super-block: group g's element j is in vector j / 4 */
        int s = e / SUPER, g = e % SUPER / GROUP, j = e % GROUP;
        e = s * SUPER + j / 4 * 64 + 4 * g + j % 4;
    }
    const uint8_t *blk = wrow + (int64_t)(e / BLOCK) * BLOCK_BYTES(bits);
    int i = e % BLOCK;
    int32_t q = i < 32 ? blk[i] & 0x0F : blk[i - 32] >> 4;
    return bits == 6 ? q | ((blk[32 + i % 16] >> (2 * (i / 16)) & 0x03) << 4) : q;
}

static void rows_plain(int n0, int n1, int r0, int nr, int K, int bits, const uint8_t *qw, const uint16_t *wd,
                       const int8_t *xq, const float *xd, const int32_t *xs, float *y, int64_t y_row) {
    const int blocks = K / BLOCK, groups = K / GROUP, bb = BLOCK_BYTES(bits), offset = OFFSET(bits);
    for (int n = n0; n < n1; n++) {
        const uint8_t *wrow = qw + (int64_t)n * blocks * bb;
        for (int r = r0; r < r0 + nr; r++) {
            const int8_t *xrow = xq + (int64_t)r * K;
            float acc = 0.f;
            for (int b = 0; b < blocks; b++) {
                int32_t s0 = 0, s1 = 0;
                for (int j = 0; j < 32; j++) {
                    s0 += weight_q(wrow, K, b * BLOCK + j, bits) * xrow[b * BLOCK + j];
                    s1 += weight_q(wrow, K, b * BLOCK + j + 32, bits) * xrow[b * BLOCK + j + 32];
                }
                int64_t g = (int64_t)r * groups + 2 * b;
                s0 -= offset * xs[g];
                s1 -= offset * xs[g + 1];
                acc += (float)s0 * half_to_float(wd[(int64_t)n * groups + 2 * b]) * xd[g];
                acc += (float)s1 * half_to_float(wd[(int64_t)n * groups + 2 * b + 1]) * xd[g + 1];
            }
            y[(int64_t)r * y_row + n] = acc;
        }
    }
}

/* xq [R, K] in natural order -> xa [R, K] as the weights are laid out (see the top): in each super-block, vector v's
 * lane g takes elements 4v..4v+3 of group g, a 16 x 8 transpose of 4-byte pieces; plain blocks stay as they are. */
static void arrange_rows(int R, int K, const int8_t *xq, int8_t *xa) {
    const int supers = K / SUPER;
    for (int r = 0; r < R; r++) {
        const int8_t *src = xq + (int64_t)r * K;
        int8_t *dst = xa + (int64_t)r * K;
        for (int s = 0; s < supers; s++)
            for (int v = 0; v < SUPER_BLOCKS; v++)
                for (int g = 0; g < 16; g++)
                    memcpy(dst + s * SUPER + v * 64 + 4 * g, src + s * SUPER + g * GROUP + 4 * v, 4);
        memcpy(dst + supers * SUPER, src + supers * SUPER, K - supers * SUPER);
    }
}

static int gemm(int bits, int R, int N, int K, const float *x, int64_t x_row, const uint8_t *qw, const uint16_t *wd,
                float *y, int64_t y_row, int threads) {
    if (K % BLOCK) return -2;
    const int groups = K / GROUP, supers = K / SUPER, units = UNITS(K);
    int8_t *xq = malloc((size_t)R * K), *xa = EI_INT4_SIMD ? malloc((size_t)R * K) : NULL; /* the plain loop reads xq */
    float *xd = malloc(sizeof(float) * (size_t)R * groups);
    int32_t *xs = malloc(sizeof(int32_t) * (size_t)R * groups);
    /* SIMD paths: per row and unit (a super-block, then each plain block) 16 lanes of accumulator starts (-offset
     * times a group's activation sum: a super-block lane per group, a plain block's 8 lanes per group a share each);
     * the VNNI loop takes the activation scales on the same lanes */
    float *xdl = EI_INT4_LANE_SCALES ? malloc(sizeof(float) * (size_t)R * units * 16) : NULL; /* VNNI loop only */
    int32_t *xsl = malloc(sizeof(int32_t) * (size_t)R * units * 16);
    int rc = 0;
    if (!xq || (EI_INT4_SIMD && !xa) || !xd || !xs || (EI_INT4_LANE_SCALES && !xdl) || !xsl) {
        rc = -1;
        goto done;
    }
    quantize_rows(R, K, x, x_row, xq, xd, xs);
    if (EI_INT4_SIMD) arrange_rows(R, K, xq, xa);
    for (int64_t r = 0; r < R; r++)
        for (int u = 0; u < units; u++)
            for (int l = 0; l < 16; l++) {
                /* a super-block's lane l is group 16u + l; plain block b's lanes 0-7 group 2b, 8-15 group 2b + 1 */
                int super = u < supers;
                int64_t g = r * groups + (super ? 16 * u + l : 2 * (supers * SUPER_BLOCKS + u - supers) + l / 8);
                if (EI_INT4_LANE_SCALES) xdl[(r * units + u) * 16 + l] = xd[g];
                xsl[(r * units + u) * 16 + l] = -OFFSET(bits) * xs[g] / (super ? 1 : 8);
            }
    const int chunk = 16; /* output rows per task: 16 rows of a 2048-wide weight are 16 KiB */
    int tasks = (N + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < tasks; t++) {
        int n0 = t * chunk, n1 = n0 + chunk < N ? n0 + chunk : N;
        for (int r0 = 0; r0 < R; r0 += ROWS) {
            int nr = R - r0 < ROWS ? R - r0 : ROWS;
#if EI_INT4_SIMD
            rows_simd(n0, n1, r0, nr, K, bits, qw, wd, xa, EI_INT4_LANE_SCALES ? xdl : xd, xsl, y, y_row);
#else
            rows_plain(n0, n1, r0, nr, K, bits, qw, wd, xq, xd, xs, y, y_row);
#endif
        }
    }
done:
    free(xq);
    free(xa);
    free(xd);
    free(xs);
    free(xdl);
    free(xsl);
    return rc;
}

/* Both take the same arguments, so the native decode layer (int8_vnni.c) calls either through one pointer. */
int ei_int4_gemm(int R, int N, int K, const float *x, int64_t x_row, const uint8_t *qw, const uint16_t *wd, float *y,
                 int64_t y_row, int threads) {
    return gemm(4, R, N, K, x, x_row, qw, wd, y, y_row, threads);
}

int ei_int6_gemm(int R, int N, int K, const float *x, int64_t x_row, const uint8_t *qw, const uint16_t *wd, float *y,
                 int64_t y_row, int threads) {
    return gemm(6, R, N, K, x, x_row, qw, wd, y, y_row, threads);
}

/* 1 where the VNNI, AVX2 or NEON path was compiled in (the plain path is a correctness fallback, not fast). */
int ei_int4_simd(void) { return EI_INT4_SIMD; }

int ei_int4_abi_version(void) { return 3; }
