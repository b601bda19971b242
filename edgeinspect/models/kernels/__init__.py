"""Native CPU kernels for decode, compiled for this machine on first use and loaded with ctypes.

Decode attention reads one session's whole KV cache for a single query row. torch's SDPA runs that through a
blocked flash kernel built for many rows: at 1.3B dimensions it reads the cache at about half of memory speed,
and over a 16-bit cache it is slower still (no fast fp16 path on AVX2). decode_attention.c is one plain pass over
keys then values, fp16 rows converted in registers (F16C), so a 16-bit KV cache halves the bytes read instead of
costing more; one call per layer stores the new row of every session in the step and attends for all of them
(measured at 1.3B, 24 layers, one query: SDPA over fp32 18 ms, this kernel over fp16 7.5 ms at 600 positions).
Keys are scored four at a time, exp is vectorized and the weighted values stay in registers: at the report's 974
positions that took the 196 MB pass from 12.5 to 11.4 ms (~17 GB/s, this box's read speed; min of 20 interleaved
rounds against the previous build).
The same pass over int8 rows (models/kv.py: int8 values + a per-row fp32 scale, the default `kv_cache` of packed
stages) reads 0.52x the bytes; with AVX-512 loads and software prefetch it took the 974-position pass from ~15
to ~6.5-9.5 ms (fp16 rows then int8 rows, same process, min of 10; the spread is this box's memory speed).
With several concurrent sessions this attention is what bounds batching (bench/NOTES.md, perf_batching).

int4_gemm.c is the int4-weight (and int6-weight) x int8-activation matmul of models/int4.py (q4_0 and q6 grids,
VNNI dot products, or AVX2 ones with the same sums in the same order; a plain-C path where the CPU has neither,
correct but slow, which `weights: auto` then measures as such).

int8_rows.c is the activation side of the fbgemm int8 linear (models/quant.py) fused into one pass in and one
out: per-row scaling and the residual second pass, which as torch ops cost a prompt as much as the GEMM itself.

int8_vnni.c is the "vnni" int8 linear (models/quant.py): per-row int8 activations and our VNNI GEMV for decode
rows over row-major int8 weights (torch._int_mm runs prompts over the same weights). Where the CPU has AVX2 but no
VNNI it builds an AVX2 GEMV and its own exact int32 GEMM for prompts (ei_q8_mm: torch._int_mm there is oneDNN's
reference loop, ~170x slower than fbgemm). decode_attention.c also holds
the elementwise steps of a native decode layer (RMSNorm with its residual add, rotary embedding, silu * up), so a
decode step does not pay ~40 torch op dispatches per layer; on vnni int8 (and int4) stages int8_vnni.c's
ei_q8_decode_layer runs a whole layer in one call, and ei_q8_decode_layers every layer of the stage (DecodeLayers:
the same functions in the same order, so the same bits), taking the other libraries' functions as pointers (1.3B,
depth 974, a Zen 5 EPYC, interleaved: an int8 step 40.0 vs 43.1 ms with a Python call per step of the layer; int4
37.5 vs 43.1).

prompt_attention.c is the causal attention of prompt chunks in packed stages, with bf16 dot products (AVX512-BF16)
and an fp32 softmax: q, k, v and the probabilities rounded to bf16 are finer than the int8 KV rows decode attends
over later (974 positions x 16 heads x 128 on a Zen 5 EPYC: 8.9 ms a layer against SDPA fp32's 34-48 ms; a
974-token 1.3B prefill 3.43 -> 2.69 s; first-token logits cosine vs fp32 0.9946 with SDPA, 0.9943 with it). Where
the CPU has AVX2 and FMA but no AVX512-BF16 it runs in fp32, blocked for the caches (an AVX2 Zen 3 EPYC: 29.3 ms a
layer against SDPA's 38.7; a 974-token prefill's attention 0.98 -> 0.70 s); elsewhere it declines and SDPA runs.

The package is three modules: build.py compiles each source for this CPU into a cache keyed by the CPU and its
instruction set; bindings.py loads a build with ctypes, checks its ABI version and declares its signatures;
ops.py holds the torch-facing functions the stages, linears and vision tower call.
"""
