"""The stage executor: steps for many sessions over one StageModule (stage/load.py), each session with its own
preallocated KV buffer (models/kv.py). transformers' LlamaDecoderLayer objects hold the weights; the executor
calls their norms, projections and MLP itself, through the layer path chosen at load (stage/layers.py), and SDPA
exactly as transformers calls it, so fp32 results match generate() while skipping DynamicCache concatenation
and per-step mask building.
"""

from __future__ import annotations

import ctypes
import functools

import torch
from torch import nn

from edgeinspect.errors import InvalidInput, NotFound, PositionError
from edgeinspect.models.device import HostCopy, to_device
from edgeinspect.models.kernels import bindings, ops
from edgeinspect.models.kv import SCALE_BYTES, KVBuffer, encode_rows, row_width
from edgeinspect.models.stage.layers import LAYER_PATHS, LayerPath, choose_layer_path, offsets
from edgeinspect.models.stage.load import StageModule
from edgeinspect.models.stage.steps import Session, StepInput, StepOutput

# The compact KV caches of native (packed-weight) stages, by their `kv_cache` name.
KV_CACHE_FORMATS = {"int8": torch.int8, "fp16": torch.float16}

# Rows per block when a packed stage runs a long prompt's linears and MLP (row-wise work; attention is not
# blocked). A whole 4,000-token prompt would make [4000, 11264] fp32 intermediates (180 MB) at 1.3B: fresh mmaps
# that page-fault in, streamed from memory by the elementwise ops around the GEMMs. Blocks of 512 rows stay in the
# heap (see keep_freed_memory). A prompt of up to 1,024 rows runs whole even so (its gate_up output, 44 MB at 974
# rows, leaves the heap): fbgemm is as fast at 256 rows as at 974 (bench/NOTES.md, "Prefill"), while oneDNN's int8
# GEMM (the vnni kernel's prompts) gains from more rows: a 974-token 1.3B prefill took 2.75 s in 256-row blocks,
# 2.60 in 336, 2.58 whole (Zen 5 EPYC, median of 3; after q8_linear's int32 row blocks: 2.40 in 2 x 487, 2.33 whole).
# fp32 stages never block: their GEMM's row count is part of matching generate() bit for bit.
PROMPT_BLOCK = 512
# One-row steps' rotary table (StageExecutor._rotary): blocks of positions, 256 KB each at head_dim 128.
ROPE_BLOCK = 256
ROPE_BLOCKS_KEPT = 64


@functools.cache
def keep_freed_memory() -> None:
    """Lets glibc's malloc reuse freed blocks up to 32 MiB (its largest mmap threshold) and keep up to 256 MiB of
    freed heap instead of unmapping it: a prompt's activations are allocated and freed layer after layer, and with
    the defaults each large one comes back as fresh pages to fault in. 256 MiB holds a 1,024-row prompt block's
    working set at 1.3B and bounds what an idle stage keeps; buffers over 32 MiB (most KV caches) stay mmapped.
    Process-wide; no-op off glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 256 << 20)
    except (OSError, AttributeError):
        pass


class StageExecutor:
    """Runs steps for many sessions over one StageModule. Not thread-safe: one step at a time.

    A step of several sessions is one forward pass: their new rows are concatenated ([sum T_i, D]) for every
    projection, norm and MLP (each weight is read once per step, not once per session); only attention runs per
    session, against that session's own KV buffer. No padding, no KV copies, no mask unless a prompt is continued
    in chunks.

    `row_exact` (default: on for fp32 weights) runs each linear per session instead: a GEMM's summation order
    depends on its row count, so only then does a batched fp32 step reproduce generate() to the last bits. On this
    CPU fp32 GEMM gains nothing from more rows anyway (bf16 and int8 do).

    `native` (default on) lets packed-weight stages (int8, int6, int4, and bf16 run as fp16 on CPUs without bf16) keep a
    compact KV cache and run decode attention in the compiled kernel (models/kernels), read at memory speed:
    `kv_cache` "int8" (default: rows of int8 with a per-row scale, models/kv.py, ~0.52x fp16's bytes) or "fp16".
    Prompt chunks attend over their own keys/values as computed and an fp32 copy of the stored past, with bf16 dot
    products and an fp32 softmax (ops.prompt_attention) where the CPU has AVX512-BF16, in that kernel's fp32
    form where it has AVX2 + FMA, else with SDPA. Pure decode steps also run each layer's norms, rotary and silu *
    up natively; on vnni int8 and int4 stages each whole layer is one native call (ops.DecodeLayers, the same steps
    bit for bit). Which of those layer paths a stage runs is chosen once at load (stage/layers.py, LAYER_PATHS).
    fp32 stages never use any of it: SDPA's summation order and torch's ops are what generate() does.

    `device`: where the module's weights are (stage/device.py moves them there) and every tensor of a step lives;
    inputs come from the host and outputs go back to it (pinned, non-blocking), so callers never see the device.
    `static_kv` (default on off the CPU): a session opened with a known capacity (its admitted max_positions) gets
    a cache allocated once, zeroed, never regrown, which the "device" path's decode step and its CUDA graphs need.
    """

    def __init__(
        self,
        module: StageModule,
        row_exact: bool | None = None,
        native: bool = True,
        kv_cache: str = "int8",
        device: torch.device | None = None,
        static_kv: bool | None = None,
        cuda_graphs: bool = True,
    ):
        if kv_cache not in KV_CACHE_FORMATS:
            raise InvalidInput(f"kv_cache must be one of {', '.join(KV_CACHE_FORMATS)}, not {kv_cache!r}")
        self.module = module
        self.range = module.range
        self.device = device or torch.device("cpu")
        on_cpu = self.device.type == "cpu"
        self.static_kv = (not on_cpu) if static_kv is None else static_kv
        self.cuda_graphs = cuda_graphs
        self.host = HostCopy(self.device)
        self.dtype = next(module.layers.parameters()).dtype  # norms keep the compute dtype even in int8 stages
        exact_default = module.weights == "fp32" and self.dtype == torch.float32
        self.row_exact = exact_default if row_exact is None else row_exact
        packed = module.weights != "fp32" and self.dtype == torch.float32
        self.native = native and packed and on_cpu and bindings.available()
        self.prompt_block = PROMPT_BLOCK if module.weights != "fp32" else 0
        if packed:
            keep_freed_memory()
        cfg = module.config
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if kv_cache == "int8" and self.head_dim % SCALE_BYTES:  # the row's scale must stay 4-byte aligned
            kv_cache = "fp16"
        self.kv_dtype = KV_CACHE_FORMATS[kv_cache] if self.native else self.dtype
        # prompt chunks of native stages attend with bf16 dot products where the CPU has them (~5x SDPA fp32 here)
        self.prompt_kernel = self.native and bindings.prompt_attention_fast()
        # LlamaConfig fills an unset num_key_value_heads with the head count itself; it is typed Optional only
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads or cfg.num_attention_heads
        # The layer path, chosen here once from LAYER_PATHS (stage/layers.py); no step re-decides it.
        path = choose_layer_path(self.native, getattr(cfg, "hidden_act", ""), module.weights, module.layers, device)
        self.path: LayerPath = LAYER_PATHS[path].build(self)
        self.sessions: dict[str, Session] = {}
        self._rope_table: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}  # see _rotary

    def use_path(self, name: str) -> None:
        """Runs the layers through LAYER_PATHS[name] from now on (load picks one; tests and benchmarks compare)."""
        self.path = LAYER_PATHS[name].build(self)

    @property
    def decode_layers(self) -> ops.DecodeLayers | None:
        """The whole-stage native decode call of the "native-stage" path (None on the others)."""
        return self.path.decode_layers

    def open(self, session_id: str, now: float = 0.0, capacity: int = 0) -> Session:
        sess = self.sessions.get(session_id)
        if sess is None:
            static = self.static_kv and capacity > 0  # an unknown budget keeps a growing cache (and the eager step)
            n_layers = len(self.module.layers)
            kv = KVBuffer(n_layers, self.kv_heads, self.head_dim, self.kv_dtype, capacity, self.device, static)
            sess = self.sessions[session_id] = Session(kv=kv, last_used=now)
        return sess

    def release(self, session_id: str) -> bool:
        return self.sessions.pop(session_id, None) is not None

    def kv_bytes(self) -> int:
        # list() copies under the GIL: gauges read this from the event loop while a step may open a session
        return sum(s.nbytes for s in list(self.sessions.values()))

    def kv_bytes_per_position(self) -> int:
        row_bytes = row_width(self.head_dim, self.kv_dtype) * self.kv_dtype.itemsize
        return 2 * len(self.module.layers) * self.kv_heads * row_bytes

    def kv_rows(self, kv: torch.Tensor) -> torch.Tensor:
        """Float keys/values [L, 2, H_kv, length, hd] as this stage's cache stores them (for open_from)."""
        return encode_rows(kv, self.kv_dtype)

    def install(self, session_id: str, kv: list[tuple[torch.Tensor, torch.Tensor]], spare: int = 0) -> Session:
        """A session holding given keys/values (benchmarks): kv per model layer, each [1, H_kv, length, hd]."""
        length = kv[0][0].shape[2]
        sess = self.open(session_id, capacity=length + spare)
        for j, i in enumerate(range(self.range.start, self.range.end)):
            sess.kv.write(j, kv[i][0][0], kv[i][1][0], 0)  # stored in the cache's own format
        sess.kv.length = length
        return sess

    def snapshot(self, session_id: str, length: int) -> torch.Tensor:
        """A copy of positions [0, length) of a session's stored keys/values: [L, 2, H_kv, length, row]."""
        return self.sessions[session_id].kv.data[:, :, :, :length].clone()

    def open_from(self, session_id: str, kv: torch.Tensor, now: float = 0.0, spare: int = 0) -> Session:
        """A new session holding the given prefix keys/values (stored rows as snapshot() returns, copied)."""
        length = kv.shape[3]
        sess = self.open(session_id, now, capacity=length + spare)
        sess.kv.data[:, :, :, :length] = kv
        sess.kv.length = length
        return sess

    def check(self, session_id: str, inp: StepInput) -> None:
        """Raises what step() would for this input, without touching any state (lets a caller drop one bad item)."""
        sess = self.sessions.get(session_id)
        if sess is None and inp.position != 0:
            raise NotFound(f"session {session_id!r} is unknown here (expired or released); restart it at 0")
        held = 0 if sess is None else sess.length
        if inp.position != held:
            raise PositionError(
                f"session {session_id!r}: step at position {inp.position}, but this stage holds {held} "
                f"cached positions; steps must continue the cache"
            )
        self._check_inputs(inp)

    @torch.inference_mode()
    def step(self, batch: list[tuple[str, StepInput]], now: float = 0.0) -> list[StepOutput]:
        """One step for several sessions (each continues its own cache) in one forward pass; outputs in order."""
        if len({sid for sid, _ in batch}) != len(batch):
            raise InvalidInput("a step may hold each session at most once")
        for sid, inp in batch:
            self.check(sid, inp)
        xs = [self._inputs_to_hidden(inp) for _, inp in batch]  # each [T_i, D]
        sessions = [self.open(sid, now) for sid, _ in batch]
        spans = [(s.length, x.shape[0]) for s, x in zip(sessions, xs, strict=True)]  # (past, new) per session
        for s, (past, t) in zip(sessions, spans, strict=True):
            s.kv.reserve(past + t)
        x = torch.cat(xs) if len(xs) > 1 else xs[0]  # [R, D], R = sum T_i
        rope = self._rotary(x, spans)  # cos, sin: [R, head_dim]
        # Sessions adding one row (decode): one native call per layer stores and attends for all of them.
        one_row = [i for i, (_, t) in enumerate(spans) if t == 1] if self.native else []
        decode = None
        if one_row:
            decode = ops.DecodeAttention([sessions[i].kv for i in one_row], [spans[i][0] for i in one_row])
        wanted = [i for i, (_, inp) in enumerate(batch) if inp.logits]  # prompt chunks with more to come: none
        starts = offsets(spans)
        ends = None  # rows logits are taken from (a last stage's only)
        if self.range.is_last:
            ends = torch.tensor([starts[i] + spans[i][1] - 1 for i in wanted], dtype=torch.long, device=x.device)
        # The last layer of a last stage needs its attention output, o_proj and MLP only at the rows sampled from
        # (its keys and values are stored for every row before): a prompt's last layer then costs ~1/4 (packed
        # stages; fp32 and row-exact stages keep their GEMMs' row counts, which generate()'s bits depend on).
        trim = self.range.is_last and not self.row_exact and self.module.weights != "fp32"
        trim = trim and any(t > 1 for _, t in spans)
        x = self.path.run(x, rope, sessions, spans, (decode, one_row), ends if trim else None)
        outs = []
        for s, (past, t) in zip(sessions, spans, strict=True):
            s.kv.length = past + t
            s.last_used = now
        if not self.range.is_last:
            hidden = self.host([x[o : o + t] for o, (_, t) in zip(starts, spans, strict=True)])
            return [StepOutput(hidden=h, length=p + t) for h, (p, t) in zip(hidden, spans, strict=True)]
        logits = None
        if wanted:
            last = x if trim else x[ends]  # [B, D]: one lm_head read for every session
            norm = self.module.norm
            # packed stages' layers already norm natively (~0.3 ms of torch ops less per step at 1.3B)
            last = self.path.norm(norm, last)
            logits = self.rows(self.module.lm_head, last, [(0, 1)] * len(wanted)).float()  # [B, vocab]
            logits = self.host([logits])[0]
        row = {i: k for k, i in enumerate(wanted)}
        for i, (p, t) in enumerate(spans):
            outs.append(StepOutput(logits=logits[row[i]] if i in row else None, length=p + t))
        return outs

    def _rotary(self, x: torch.Tensor, spans) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos/sin of the step's rows [R, head_dim]. A one-row step's come from a table filled
        ROPE_BLOCK positions per call: its half-dozen torch ops cost ~0.13 ms of a ~28 ms 1.3B decode step.
        The default rotary is elementwise in the position, so a table row has the one-position call's bits
        (tests/test_stage_split.py checks); other rope types (dynamic scaling looks at the longest position) call it."""
        rotary = self.module.rotary_emb
        if x.shape[0] != 1 or getattr(rotary, "rope_type", None) != "default":
            positions = torch.cat([torch.arange(p, p + t, device=x.device) for p, t in spans])  # [R]
            return rotary(x, position_ids=positions)
        block, row = divmod(spans[0][0], ROPE_BLOCK)
        table = self._rope_table.get((block, x.dtype))
        if table is None:
            if len(self._rope_table) >= ROPE_BLOCKS_KEPT:
                self._rope_table.clear()
            positions = torch.arange(block * ROPE_BLOCK, (block + 1) * ROPE_BLOCK, device=x.device)
            table = self._rope_table[(block, x.dtype)] = rotary(x, position_ids=positions)
        return table[0][row : row + 1], table[1][row : row + 1]

    def attention(self, j: int, attn, q, k, v, sessions: list[Session], spans, decode) -> torch.Tensor:
        """q [R, H, hd], k/v [R, H_kv, hd] -> [R, H*hd]: the one-row sessions in `decode` (a DecodeAttention and
        their indices) in one native call, the others (prompt chunks, fp32 stages) session by session with SDPA."""
        native, one_row = decode
        if native is not None and len(one_row) == len(spans):  # a pure decode step: its rows are the batch's rows
            return native(j, q, k, v, attn.scaling)
        starts = offsets(spans)
        outs: list[torch.Tensor | None] = [None] * len(spans)
        if native is not None:
            rows = [starts[i] for i in one_row]
            for n, row in zip(one_row, native(j, q[rows], k[rows], v[rows], attn.scaling).split(1), strict=True):
                outs[n] = row
        for i, (s, o, (past, t)) in enumerate(zip(sessions, starts, spans, strict=True)):
            if outs[i] is not None:
                continue
            new_k, new_v = k[o : o + t].transpose(0, 1), v[o : o + t].transpose(0, 1)  # [H_kv, t, hd]
            if self.native and s.kv.quantized and k.dtype == torch.float32:  # the same bytes, in one native pass
                ops.store_rows_q8(s.kv, j, k[o : o + t], v[o : o + t], past)
            else:
                s.kv.write(j, new_k, new_v, past)
            if s.kv.dtype == self.dtype:
                keys, values = s.kv.view(j, past + t)  # [H_kv, past + t, hd]
            else:  # a compact cache: the chunk attends over its own rows as computed, the past as stored
                keys, values = s.kv.view(j, past)
                keys = torch.cat([keys.to(self.dtype), new_k], dim=1) if past else new_k
                values = torch.cat([values.to(self.dtype), new_v], dim=1) if past else new_v
            outs[i] = self._attend(attn, q[o : o + t].transpose(0, 1), keys, values, past)  # [t, H*hd]
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def rows(self, fn, h: torch.Tensor, spans) -> torch.Tensor:
        """fn over all rows at once, or per session's rows when row-exact; packed stages take long prompts in
        blocks of PROMPT_BLOCK rows (see there)."""
        if self.row_exact and len(spans) > 1:
            return torch.cat([fn(h[o : o + t]) for o, (_, t) in zip(offsets(spans), spans, strict=True)])
        block = self.prompt_block
        if self.row_exact or not block or h.shape[0] <= 2 * block:
            return fn(h)
        return torch.cat([fn(h[i : i + block]) for i in range(0, h.shape[0], block)])

    def _attend(self, attn, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int) -> torch.Tensor:
        """q [H, t, hd] over keys/values [H_kv, past + t, hd] -> [t, H*hd]; SDPA exactly as transformers calls it."""
        t = q.shape[1]
        if keys.dtype != self.dtype:  # a 16-bit cache: SDPA has no fast fp16 path here, so prompts attend in fp32
            keys, values = keys.to(self.dtype), values.to(self.dtype)
        if self.prompt_kernel and t > 1:
            out = ops.prompt_attention(q, keys, values, past, attn.scaling)
            if out is not None:
                return out
        mask, causal = None, False
        if t > 1 and past == 0:
            causal = True  # a prompt from position 0: transformers also passes is_causal with no mask
        elif t > 1:  # a prompt continued in chunks: query i sees keys [0, past + i]
            mask = torch.ones(t, past + t, dtype=torch.bool, device=q.device).tril(diagonal=past)  # [t, past + t]
        out = nn.functional.scaled_dot_product_attention(
            q.unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            is_causal=causal,
            scale=attn.scaling,
            enable_gqa=self.heads != self.kv_heads,
        )  # [1, H, t, hd]
        return out[0].transpose(0, 1).reshape(t, self.heads * self.head_dim)

    def _check_inputs(self, inp: StepInput) -> None:
        m = self.module
        if not self.range.is_first:
            if inp.hidden is None or inp.hidden.dim() != 2 or inp.hidden.shape[1] != m.config.hidden_size:
                raise InvalidInput(f"stage {self.range} needs hidden states of shape [T, {m.config.hidden_size}]")
            if inp.hidden.shape[0] == 0:
                raise InvalidInput("a step needs at least one position")
            return
        ids = inp.input_ids
        if ids is None or ids.dim() != 1 or ids.numel() == 0:
            raise InvalidInput("the first stage needs a non-empty 1-D list of token ids")
        if ids.numel() <= 64:  # a decode step's few ids: Python over a list beats three torch reductions
            values = ids.tolist()
            low, high, n_slots = min(values), max(values), values.count(m.image_token_id)
        else:
            low, high, n_slots = int(ids.min()), int(ids.max()), int((ids == m.image_token_id).sum())
        if low < 0 or high >= m.config.vocab_size:
            raise InvalidInput(f"token ids must lie in [0, {m.config.vocab_size})")
        if inp.visual_tokens is None:
            # A generated token may be the placeholder id: like generate(), embed it plainly after the prompt.
            if n_slots and inp.position == 0:
                raise InvalidInput(f"the prompt has {n_slots} image placeholders but no visual tokens were sent")
            return
        vis = inp.visual_tokens
        expected_dim = m.aligner.linear1.in_features
        if vis.dim() != 2 or vis.shape[1] != expected_dim or vis.shape[0] != n_slots:
            raise InvalidInput(
                f"visual tokens {list(vis.shape)} do not fit: the prompt has {n_slots} image placeholders and the "
                f"aligner takes width {expected_dim}"
            )

    def _inputs_to_hidden(self, inp: StepInput) -> torch.Tensor:
        """[T, D] in the stage's compute dtype (inputs already checked)."""
        m = self.module
        if not self.range.is_first:
            return to_device(inp.hidden, self.device).to(self.dtype)
        ids = to_device(inp.input_ids, self.device)
        x = m.embed_tokens(ids).to(self.dtype)  # [T, D]
        if inp.visual_tokens is None:
            return x
        slots = ids == m.image_token_id  # [T]
        aligned = m.aligner(to_device(inp.visual_tokens, self.device).to(self.dtype))  # [N, D]
        return x.masked_scatter(slots.view(-1, 1), aligned)
