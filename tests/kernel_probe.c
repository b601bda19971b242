/* Calls our kernels as an ARM box or an x86-64-v2 box runs them (plain C; NEON for the int4/int6 GEMM and the int8
 * linear on arm64) with fixed pseudo-random inputs and prints every output as C99 hex floats, one "name count" line
 * and then one value per line. tests/test_kernels_arm64.py builds it with the kernels for arm64 (run under qemu-user)
 * and for x86-64-v2 (run here), and compares the two printouts: what an ARM box (a Raspberry Pi vision node, a Jetson
 * stage) computes against the build the `generic` cpu_paths tests check against torch.
 * Usage: kernel_probe DECODE_ATTENTION_SO INT4_GEMM_SO INT8_ROWS_SO PROMPT_ATTENTION_SO INT8_VNNI_SO */
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t state = 0x9E3779B97F4A7C15ull;

static uint32_t next(void) { /* xorshift64*: the same integers on every architecture */
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return (uint32_t)((state * 0x2545F4914F6CDD1Dull) >> 32);
}

static float uniform(void) { return (float)(next() >> 8) / 8388608.f - 1.f; } /* [-1, 1), exact */

static float *floats(int64_t n) {
    float *x = malloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) x[i] = uniform();
    return x;
}

static uint16_t half(void) { /* a finite fp16 of either sign, 2^-5 .. 2^2 */
    uint32_t r = next();
    return (uint16_t)(((r & 1) << 15) | ((10 + (r >> 1) % 7) << 10) | ((r >> 8) & 0x3FF));
}

static void print(const char *name, const float *x, int64_t n) {
    printf("%s %lld\n", name, (long long)n);
    for (int64_t i = 0; i < n; i++) printf("%a\n", x[i]);
}

static void *sym(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (!f) fprintf(stderr, "missing %s\n", name), exit(2);
    return f;
}

static void *open_lib(const char *path) {
    void *lib = dlopen(path, RTLD_NOW);
    if (!lib) fprintf(stderr, "%s\n", dlerror()), exit(2);
    return lib;
}

typedef void (*rmsnorm_fn)(int, int, const float *, int64_t, const float *, int64_t, float *, const float *, float,
                           float *);
typedef void (*rope_fn)(int, int, int, int, float *, int64_t, float *, int64_t, const float *, const float *);
typedef void (*silu_fn)(int, int, const float *, int64_t, float *);
typedef void (*silu_q8_fn)(int, int, const int32_t *, const float *, const float *, float *);
typedef void (*store_fn)(int, int, int, const float *, int64_t, void *, int64_t, int, int, int, int);
typedef int (*attend_fn)(int, int, const float *, int64_t, const float *, int64_t, const float *, int64_t,
                         void *const *, const int64_t *, const int *, float *, int, int, int, float, int);
typedef int (*gemm_fn)(int, int, int, const float *, int64_t, const uint8_t *, const uint16_t *, float *, int64_t,
                       int);
typedef double (*rows_prep_fn)(int, int, const float *, int64_t, float *, float *, int, int);
typedef int (*q8_rows_fn)(int, int, int, int, int, const float *, int64_t, const int8_t *, const float *,
                          const int32_t *, float *, int);
typedef int (*q8_mm_fn)(int, int, int, const int8_t *, const int8_t *, int32_t *, int);
typedef void (*rows_finish_fn)(int, int, const float *, int64_t, float *, const float *, float, int);
typedef int (*prompt_fn)(int, int, int, int, int, const float *, int64_t, int64_t, const float *, int64_t, int64_t,
                         const float *, int64_t, int64_t, float *, int64_t, float, int, int);

static void elementwise(void *lib) {
    enum { R = 3, D = 200, H = 4, KV = 2, HD = 64, I = 300 };
    float *x = floats(R * D), *add = floats(R * D), *w = floats(D), sum[R * D], out[R * D];
    ((rmsnorm_fn)sym(lib, "ei_add_rmsnorm"))(R, D, x, D, add, D, sum, w, 1e-6f, out);
    print("add_rmsnorm.sum", sum, R * D);
    print("add_rmsnorm.out", out, R * D);

    float *q = floats(R * H * HD), *k = floats(R * KV * HD), *cos = floats(R * HD), *sin = floats(R * HD);
    ((rope_fn)sym(lib, "ei_rope"))(R, H, KV, HD, q, H * HD, k, KV * HD, cos, sin);
    print("rope.q", q, R * H * HD);
    print("rope.k", k, R * KV * HD);

    float *gu = floats(R * 2 * I), silu[R * I];
    for (int i = 0; i < R * 2 * I; i++) gu[i] *= 12.f; /* past the exp's clamp on both sides */
    ((silu_fn)sym(lib, "ei_silu_mul"))(R, I, gu, 2 * I, silu);
    print("silu_mul", silu, R * I);

    int32_t acc[R * 2 * I];
    float *xs = floats(R), *ws = floats(2 * I);
    for (int i = 0; i < R * 2 * I; i++) acc[i] = (int32_t)(next() % 20001) - 10000;
    for (int i = 0; i < 2 * I; i++) ws[i] *= 1e-3f;
    ((silu_q8_fn)sym(lib, "ei_silu_mul_q8"))(R, I, acc, xs, ws, silu);
    print("silu_mul_q8", silu, R * I);
}

/* One decode step of two sessions at different depths over a two-layer cache (layer 1), as the native stage takes
 * it: the int8 cache filled by ei_store_rows_q8 (its rows carry their scales), the fp16 one with finite halves. */
static void attention(void *lib) {
    enum { B = 2, LAYERS = 2, H = 4, KV = 2, HD = 64, CAP = 40 };
    const int past[B] = {17, 33};
    const int64_t capacity[B] = {CAP, CAP};
    float *q = floats(B * H * HD), *k = floats(B * KV * HD), *v = floats(B * KV * HD), out[B * H * HD];
    attend_fn q8 = (attend_fn)sym(lib, "ei_decode_attention_q8"), f16 = (attend_fn)sym(lib, "ei_decode_attention_f16");

    void *cache[B];
    int64_t q8_bytes = (int64_t)LAYERS * 2 * KV * CAP * (HD + 4);
    for (int b = 0; b < B; b++) {
        cache[b] = calloc(q8_bytes, 1);
        for (int which = 0; which < 2; which++) {
            float *rows = floats(past[b] * KV * HD);
            ((store_fn)sym(lib, "ei_store_rows_q8"))(past[b], 1, which, rows, KV * HD, cache[b], CAP, 0, KV, HD, 2);
            free(rows);
        }
    }
    if (q8(B, 1, q, H * HD, k, KV * HD, v, KV * HD, cache, capacity, past, out, H, KV, HD, 0.125f, 2))
        fprintf(stderr, "ei_decode_attention_q8 failed\n"), exit(3);
    print("decode_attention_q8", out, B * H * HD);
    for (int b = 0; b < B; b++) { /* the step's own key and value, stored at position past[b] */
        float row[HD];
        for (int which = 0; which < 2; which++)
            for (int g = 0; g < KV; g++) {
                int64_t at = ((((int64_t)1 * 2 + which) * KV + g) * CAP + past[b]) * (HD + 4); /* row_index */
                const int8_t *r = (const int8_t *)cache[b] + at;
                float scale;
                __builtin_memcpy(&scale, r + HD, 4);
                for (int d = 0; d < HD; d++) row[d] = r[d] * scale;
                print(which ? "q8_cache.v" : "q8_cache.k", row, HD);
            }
        free(cache[b]);
    }

    int64_t halves = (int64_t)LAYERS * 2 * KV * CAP * HD;
    for (int b = 0; b < B; b++) {
        uint16_t *c = malloc(halves * 2);
        for (int64_t i = 0; i < halves; i++) c[i] = half() & 0xBFFF; /* |x| < 2: softmax inputs stay moderate */
        cache[b] = c;
    }
    if (f16(B, 1, q, H * HD, k, KV * HD, v, KV * HD, cache, capacity, past, out, H, KV, HD, 0.125f, 2))
        fprintf(stderr, "ei_decode_attention_f16 failed\n"), exit(3);
    print("decode_attention_f16", out, B * H * HD);
    for (int b = 0; b < B; b++) free(cache[b]);
}

/* int4 and int6 weights of random bytes (any byte is a valid code) with finite fp16 scales; K covers a full
 * super-block of 512 and plain 64-blocks after it; 5 rows, one past a group of 4. */
static void gemm(void *lib) {
    enum { R = 5, N = 24, K = 512 + 3 * 64 };
    float *x = floats(R * K), y[R * N];
    uint16_t wd[N * K / 32];
    for (int i = 0; i < N * K / 32; i++) wd[i] = half() & 0x7FFF;
    for (int bits = 4; bits <= 6; bits += 2) {
        int64_t bytes = (int64_t)N * K / 64 * (bits == 6 ? 48 : 32);
        uint8_t *qw = malloc(bytes);
        for (int64_t i = 0; i < bytes; i++) qw[i] = (uint8_t)next();
        gemm_fn f = (gemm_fn)sym(lib, bits == 4 ? "ei_int4_gemm" : "ei_int6_gemm");
        if (f(R, N, K, x, K, qw, wd, y, N, 2)) fprintf(stderr, "int%d gemm failed\n", bits), exit(3);
        print(bits == 4 ? "int4_gemm" : "int6_gemm", y, R * N);
        free(qw);
    }
    float simd = (float)((int (*)(void))sym(lib, "ei_int4_simd"))(); /* which loop computed the sums above */
    print("int4_simd", &simd, 1);
}

/* The int8 linear's activation rows: scaled per row, the two-pass residual rows after them, and back. */
static void rows(void *lib) {
    enum { R = 3, K = 200, N = 50 };
    float *x = floats(R * K), *y = floats(2 * R * N), out[2 * R * K], norm[R], back[R * N];
    /* row 0 mostly positive: an asymmetric range, the residual grid's zero point off the middle */
    for (int i = 0; i < K; i++) x[i] = 0.5f * x[i] + 0.4f;
    float gain = (float)((rows_prep_fn)sym(lib, "ei_rows_prep"))(R, K, x, K, out, norm, 1, 2);
    print("rows_prep.out", out, 2 * R * K);
    print("rows_prep.norm", norm, R);
    print("rows_prep.gain", &gain, 1);
    ((rows_finish_fn)sym(lib, "ei_rows_finish"))(R, N, y, N, back, norm, gain > 0.f ? 1.f / gain : 0.f, 2);
    print("rows_finish", back, R * N);
}

/* The int8 linear: decode rows in one pass (K with a tail past the 16-byte steps) and in two rotated passes, and the
 * prompt GEMM's int32 sums (a partial tile of rows, a partial block of outputs), which are exact on every path. */
static void int8_linear(void *lib) {
    enum { R = 3, N = 50, PR = 7 };
    int8_t *w = malloc(N * 208), *xq = malloc(PR * 200);
    float *ws = floats(N), *x = floats(R * 208), y[R * N], acc_f[PR * N];
    int32_t wsum[N], acc[PR * N];
    for (int i = 0; i < N * 208; i++) w[i] = (int8_t)((int)(next() % 255) - 127); /* +-127, as quant.py stores */
    for (int i = 0; i < PR * 200; i++) xq[i] = (int8_t)((int)(next() % 255) - 127);
    for (int n = 0; n < N; n++) ws[n] = fabsf(ws[n]) * 0.01f + 1e-3f;
    const int widths[2] = {200, 208}, two_pass[2] = {0, 1}, rotate[2] = {0, 16};
    for (int c = 0; c < 2; c++) {
        const int K = widths[c];
        for (int n = 0; n < N; n++) {
            wsum[n] = 0;
            for (int k = 0; k < K; k++) wsum[n] += w[n * K + k];
        }
        if (((q8_rows_fn)sym(lib, "ei_q8_gemv_rows"))(R, N, K, two_pass[c], rotate[c], x, K, w, ws, wsum, y, 2))
            fprintf(stderr, "ei_q8_gemv_rows failed\n"), exit(3);
        print(c ? "q8_gemv_two_pass" : "q8_gemv", y, R * N);
    }
    if (((q8_mm_fn)sym(lib, "ei_q8_mm"))(PR, N, 200, xq, w, acc, 2)) fprintf(stderr, "ei_q8_mm failed\n"), exit(3);
    for (int i = 0; i < PR * N; i++) acc_f[i] = (float)acc[i]; /* |sum| < 127 * 127 * 200 < 2^24: exact */
    print("q8_mm", acc_f, PR * N);
    float simd = (float)((int (*)(void))sym(lib, "ei_q8_simd"))(); /* which loops computed the sums above */
    print("q8_simd", &simd, 1);
    free(w), free(xq), free(ws), free(x);
}

int main(int argc, char **argv) {
    if (argc != 6)
        return fprintf(stderr, "usage: %s DECODE INT4 ROWS PROMPT INT8 (the kernels' .so)\n", argv[0]), 2;
    void *decode = open_lib(argv[1]), *int4 = open_lib(argv[2]), *prompt = open_lib(argv[4]);
    elementwise(decode);
    attention(decode);
    gemm(int4);
    rows(open_lib(argv[3]));
    int8_linear(open_lib(argv[5]));
    /* Without SIMD the prompt kernel declines every call (-2) and stages run SDPA; the simd level says which. */
    int (*simd)(void) = (int (*)(void))sym(prompt, "ei_prompt_attention_simd");
    float *qkv = floats(3 * 64), o[64];
    int rc = ((prompt_fn)sym(prompt, "ei_prompt_attention"))(1, 0, 1, 1, 64, qkv, 64, 64, qkv + 64, 64, 64, qkv + 128,
                                                            64, 64, o, 64, 0.125f, 1, 1);
    float declined[2] = {(float)simd(), (float)rc};
    print("prompt_attention", declined, 2);
    return 0;
}
