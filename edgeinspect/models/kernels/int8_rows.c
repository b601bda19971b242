/* The activation side of models/quant.py's fbgemm int8 linear, fused: one pass in, one pass out.
 *
 * fbgemm quantizes a linear's input per tensor. Int8Linear makes that per row (token) by scaling each row to absmax
 * 1 first, and for the linears it names runs a second, residual row per token (the first pass's rounding error,
 * scaled by `gain` so it stays inside the first rows' range). Written as torch ops that is about a dozen full passes
 * over [R, K] and [R, N] tensors; at a 974-token prompt they cost as much as the GEMM itself. Here:
 *
 *   ei_rows_prep:   x [R, K] -> out [R, K] = x / norm (rows), and with two_pass out [R..2R) = residual * gain;
 *                   returns the gain (0 where the range is one-sided: one pass, as in quant.py).
 *   ei_rows_finish: y [R or 2R, N] -> out [R, N] = (y[r] + y[R + r] / gain) * norm[r].
 *
 * The residual reproduces fbgemm's uint8 grid (ChooseQuantizationParams over [min(lo, 0), max(hi, 0)], 255 steps,
 * nearbyint(x / scale + zero)) as quant.py's torch version does, so it is what the first pass lost.
 * Built and loaded at run time by models/kernels/__init__.py (ctypes).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>

static const float ROUND = 12582912.f; /* 1.5 * 2^23 */

int ei_rows_abi_version(void) { return 1; }

/* norm: [R] out; rows == 1 keeps norm 1 (fbgemm's per-tensor grid is already per row). Returns the gain, or 0. */
double ei_rows_prep(int R, int K, const float *x, int64_t x_row, float *out, float *norm, int two_pass,
                    int threads) {
    float lo = 0.f, hi = 0.f;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(min : lo) reduction(max : hi)
    for (int r = 0; r < R; r++) {
        const float *src = x + r * x_row;
        float *dst = out + (int64_t)r * K;
        float m = 0.f;
        for (int i = 0; i < K; i++) {  /* ternaries, not fmaxf: they vectorize without -ffast-math */
            float a = fabsf(src[i]);
            m = a > m ? a : m;
        }
        float n = R == 1 ? 1.f : (m > 1e-30f ? m : 1e-30f);
        norm[r] = n;
        float rlo = 0.f, rhi = 0.f;
        for (int i = 0; i < K; i++) {
            float v = src[i] / n;
            dst[i] = v;
            rlo = v < rlo ? v : rlo;
            rhi = v > rhi ? v : rhi;
        }
        lo = fminf(lo, rlo);
        hi = fmaxf(hi, rhi);
    }
    if (!two_pass) return 0.0;
    double room = fmin(-(double)lo, (double)hi) * 0.99;
    float scale = (float)(((double)hi - (double)lo) / 255.0);
    if (room <= 0.0 || scale < 1e-30f) return 0.0;
    double z = nearbyint(-(double)lo / scale);
    float zero = (float)fmin(fmax(z, 0.0), 255.0);
    float inv = 1.f / scale;
    double gain = room / (scale / 2.0);
    float g = (float)gain;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int r = 0; r < R; r++) {
        const float *src = out + (int64_t)r * K;
        float *dst = out + (int64_t)(R + r) * K;
        for (int i = 0; i < K; i++) {
            float t = src[i] * inv + zero;
            t = t < 0.f ? 0.f : (t > 255.f ? 255.f : t);
            float q = (t + ROUND) - ROUND; /* round half to even for 0 <= t < 2^22, as nearbyint; vectorizes */
            dst[i] = (src[i] - (q - zero) * scale) * g;
        }
    }
    return gain;
}

/* y [R or 2R, N] (row stride y_row) -> out [R, N]; inv_gain 0 means one pass (rows [R, 2R) are not read). */
void ei_rows_finish(int R, int N, const float *y, int64_t y_row, float *out, const float *norm, float inv_gain,
                    int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int r = 0; r < R; r++) {
        const float *a = y + r * y_row;
        float *dst = out + (int64_t)r * N;
        float n = norm[r];
        if (inv_gain != 0.f) {
            const float *b = y + (int64_t)(R + r) * y_row;
            for (int i = 0; i < N; i++) dst[i] = (a[i] + b[i] * inv_gain) * n;
        } else {
            for (int i = 0; i < N; i++) dst[i] = a[i] * n;
        }
    }
}
