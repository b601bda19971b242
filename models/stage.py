"""A decoder stage: layers [start, end) of DeepSeek-VL's language model with a KV cache per session.

Stage 0 also embeds token ids and writes the aligned visual tokens over the image placeholders; the last stage also
applies the final norm and lm_head. The layers are transformers' own LlamaDecoderLayer objects with their original
layer indices, so a per-session DynamicCache is addressed exactly as in the full model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache
from transformers.masking_utils import create_causal_mask
from transformers.models.deepseek_vl.modeling_deepseek_vl import DeepseekVLAligner
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from edgeinspect.errors import InvalidInput, NotFound, PositionError
from edgeinspect.models.checkpoint import (
    ALIGNER_PREFIX,
    EMBED_KEY,
    NORM_KEY,
    Checkpoint,
    layer_prefix,
    torch_dtype,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LayerRange:
    """Layers [start, end) of a model with `total` layers."""

    start: int
    end: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end <= self.total:
            raise InvalidInput(f"layer range [{self.start}, {self.end}) is not inside [0, {self.total})")

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.total

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}) of {self.total}"


class StageModule(nn.Module):
    """The weights one stage holds; nothing outside its range is ever materialised."""

    def __init__(self, ckpt: Checkpoint, layers: LayerRange):
        super().__init__()
        cfg = ckpt.text_config
        cfg._attn_implementation = "sdpa"  # what from_pretrained picks on CPU: the oracle uses the same kernel
        self.config = cfg
        self.range = layers
        self.image_token_id = ckpt.config.image_token_id
        with torch.device("meta"):
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if layers.is_first else None
            self.aligner = DeepseekVLAligner(ckpt.config) if layers.is_first else None
            self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, i) for i in range(layers.start, layers.end))
            self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps) if layers.is_last else None
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if layers.is_last else None
        self.rotary_emb = LlamaRotaryEmbedding(config=cfg)  # buffers computed from config, not stored weights

    def checkpoint_keys(self, ckpt: Checkpoint) -> dict[str, str]:
        """Our parameter name -> checkpoint tensor name."""
        keys: dict[str, str] = {}
        for j, i in enumerate(range(self.range.start, self.range.end)):
            for key in ckpt.keys_with_prefix(layer_prefix(i)):
                keys[f"layers.{j}.{key.removeprefix(layer_prefix(i))}"] = key
        if self.range.is_first:
            keys["embed_tokens.weight"] = EMBED_KEY
            for key in ckpt.keys_with_prefix(ALIGNER_PREFIX):
                keys[f"aligner.{key.removeprefix(ALIGNER_PREFIX)}"] = key
        if self.range.is_last:
            keys["norm.weight"] = NORM_KEY
            keys["lm_head.weight"] = ckpt.lm_head_key
        return keys


def load_stage(ckpt: Checkpoint, layers: LayerRange, weights: str = "fp32") -> StageModule:
    """Builds the stage on the meta device and fills it with just its tensors from the safetensors files."""
    dtype = torch_dtype(weights)
    module = StageModule(ckpt, layers)
    keys = module.checkpoint_keys(ckpt)
    tensors = ckpt.read(keys.values(), dtype)
    state = {ours: tensors[theirs] for ours, theirs in keys.items()}
    module.load_state_dict(state, strict=False, assign=True)
    leftover = [n for n, p in module.named_parameters() if p.is_meta]
    if leftover:
        raise InvalidInput(f"checkpoint {ckpt.path} lacks weights for {', '.join(leftover[:5])}")
    module.rotary_emb.to(torch.float32)
    return module.eval()


@dataclass
class StepInput:
    """One session's inputs for one step. Stage 0 takes token ids (+ visual tokens at prefill); others hidden."""

    position: int
    input_ids: torch.Tensor | None = None  # [T] int64
    hidden: torch.Tensor | None = None  # [T, hidden]
    visual_tokens: torch.Tensor | None = None  # [N_img, vision_hidden], before the aligner


@dataclass
class StepOutput:
    hidden: torch.Tensor | None = None  # [T, hidden] (non-last stages)
    logits: torch.Tensor | None = None  # [vocab] at the last position (last stage), float32
    length: int = 0  # session length after the step


@dataclass
class Session:
    cache: DynamicCache
    length: int = 0
    last_used: float = 0.0
    nbytes: int = 0
    extra: dict = field(default_factory=dict)


class StageExecutor:
    """Runs steps for many sessions over one StageModule. Not thread-safe: one step at a time."""

    def __init__(self, module: StageModule):
        self.module = module
        self.range = module.range
        self.dtype = next(module.layers.parameters()).dtype
        self.sessions: dict[str, Session] = {}

    def open(self, session_id: str, now: float = 0.0) -> Session:
        sess = self.sessions.get(session_id)
        if sess is None:
            sess = self.sessions[session_id] = Session(cache=DynamicCache(config=self.module.config), last_used=now)
        return sess

    def release(self, session_id: str) -> bool:
        return self.sessions.pop(session_id, None) is not None

    def kv_bytes(self) -> int:
        return sum(s.nbytes for s in self.sessions.values())

    @torch.inference_mode()
    def step(self, batch: list[tuple[str, StepInput]], now: float = 0.0) -> list[StepOutput]:
        """One step for several sessions (each continues its own cache); outputs in input order."""
        return [self._step_one(sid, inp, now) for sid, inp in batch]

    def _step_one(self, session_id: str, inp: StepInput, now: float) -> StepOutput:
        m = self.module
        x = self._inputs_to_hidden(inp)  # [1, T, D]
        sess = self.sessions.get(session_id)
        if sess is None:
            if inp.position != 0:
                raise NotFound(f"session {session_id!r} is unknown here (expired or released); restart it at 0")
            sess = self.open(session_id, now)
        if inp.position != sess.length:
            raise PositionError(
                f"session {session_id!r}: step at position {inp.position}, but this stage holds {sess.length} "
                f"cached positions; steps must continue the cache"
            )
        # Layer `start` is this stage's first cache layer: earlier layers of the cache are always empty here.
        past = sess.cache.get_seq_length(self.range.start)
        positions = torch.arange(past, past + x.shape[1]).unsqueeze(0)  # [1, T]
        mask = create_causal_mask(
            config=m.config,
            inputs_embeds=x,
            attention_mask=None,
            cache=sess.cache,
            position_ids=positions,
            layer_idx=self.range.start,
        )
        rope = m.rotary_emb(x, position_ids=positions)
        for layer in m.layers:
            x = layer(
                x,
                attention_mask=mask,
                position_ids=positions,
                cache=sess.cache,
                use_cache=True,
                position_embeddings=rope,
            )
        sess.length = past + x.shape[1]
        sess.last_used = now
        sess.nbytes = _cache_bytes(sess.cache, self.range)
        if not self.range.is_last:
            return StepOutput(hidden=x[0], length=sess.length)
        last = m.norm(x[:, -1:])
        return StepOutput(logits=m.lm_head(last)[0, -1].float(), length=sess.length)

    def _inputs_to_hidden(self, inp: StepInput) -> torch.Tensor:
        m = self.module
        if not self.range.is_first:
            if inp.hidden is None or inp.hidden.dim() != 2 or inp.hidden.shape[1] != m.config.hidden_size:
                raise InvalidInput(f"stage {self.range} needs hidden states of shape [T, {m.config.hidden_size}]")
            return inp.hidden.to(self.dtype).unsqueeze(0)
        ids = inp.input_ids
        if ids is None or ids.dim() != 1 or ids.numel() == 0:
            raise InvalidInput("the first stage needs a non-empty 1-D list of token ids")
        if int(ids.min()) < 0 or int(ids.max()) >= m.config.vocab_size:
            raise InvalidInput(f"token ids must lie in [0, {m.config.vocab_size})")
        x = m.embed_tokens(ids).unsqueeze(0)  # [1, T, D]
        slots = ids == m.image_token_id  # [T]
        n_slots = int(slots.sum())
        if inp.visual_tokens is None:
            # A generated token may be the placeholder id: like generate(), embed it plainly after the prompt.
            if n_slots and inp.position == 0:
                raise InvalidInput(f"the prompt has {n_slots} image placeholders but no visual tokens were sent")
            return x
        vis = inp.visual_tokens
        expected_dim = m.aligner.linear1.in_features
        if vis.dim() != 2 or vis.shape[1] != expected_dim or vis.shape[0] != n_slots:
            raise InvalidInput(
                f"visual tokens {list(vis.shape)} do not fit: the prompt has {n_slots} image placeholders and the "
                f"aligner takes width {expected_dim}"
            )
        aligned = m.aligner(vis.to(self.dtype))  # [N, D]
        return x.masked_scatter(slots.view(1, -1, 1), aligned.unsqueeze(0))


def _cache_bytes(cache: DynamicCache, layers: LayerRange) -> int:
    total = 0
    for i in range(layers.start, layers.end):
        layer = cache.layers[i]
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def ids_tensor(values) -> torch.Tensor:
    """Token ids from the wire as the 1-D int64 tensor a first stage takes."""
    return torch.tensor(list(values), dtype=torch.long)
