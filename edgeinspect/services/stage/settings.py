"""A decoder stage's settings: its layer range, weight and KV-cache formats, batching and memory budgets. Loaded
like every role's (edgeinspect/config.py RoleSettings: YAML, then EDGEINSPECT_* env)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from pydantic import Field

from edgeinspect.config import CHAINED_RETIRED, RoleSettings, WeightsDtype


class KVCacheFormat(StrEnum):
    int8 = "int8"  # int8 rows with a per-row fp32 scale: ~0.52x fp16's bytes, decode attention reads half
    fp16 = "fp16"


class StageSettings(RoleSettings):
    retired: ClassVar[dict[str, str | None]] = {
        "next_stage": CHAINED_RETIRED,
        "client_tls": None,  # a chained stage's certificate for the next one: older rendered configs carry it
    }

    checkpoint: Path = Field(..., description="DeepSeek-VL checkpoint folder (Hugging Face format)")
    layer_start: int = Field(..., description="first language-model layer this stage serves")
    layer_end: int = Field(..., description="one past the last layer this stage serves")
    weights: WeightsDtype = Field(default=WeightsDtype.fp32, description="weight dtype of the layers held here")
    kv_budget_mb: int = Field(
        default=2048,
        description="KV cache MB across sessions; a new session it cannot hold is refused (RESOURCE_EXHAUSTED)",
    )
    max_batch_sessions: int = Field(
        default=8, ge=1, description="sessions batched into one forward pass (continuous batching)"
    )
    max_step_tokens: int = Field(
        default=512, ge=1, description="rows per forward pass; longer prompts run in chunks so decode steps interleave"
    )
    batch_window_ms: float = Field(
        default=5.0,
        ge=0,
        description="after a batched pass, how long to wait for its sessions' next steps so they stay one batch",
    )
    prefix_cache_mb: int = Field(
        default=512, ge=0, description="keys/values of shared prompt prefixes (system prompt + spec context); 0: off"
    )
    session_ttl_s: float = Field(default=300.0, description="an idle session's cache is dropped after this")
    threads: int = Field(default=0, description="intra-op threads (0 = library default)")
    native_kernels: bool = Field(
        default=True,
        description="int8/int4/bf16-as-fp16 stages: compact KV cache + compiled decode attention (needs a C compiler)",
    )
    kv_cache: KVCacheFormat = Field(
        default=KVCacheFormat.int8,
        description="the compact KV cache of native_kernels stages: int8 rows (half of fp16's bytes) or fp16",
    )
    device: str = Field(
        default="cpu",
        pattern=r"^(cpu|auto|cuda(:\d+)?)$",
        description="cpu | cuda | cuda:N | auto (CUDA when torch sees one); the wire stays on the host either way",
    )
    kv_free_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="CUDA: the KV budget is at most this share of the device's free memory at load",
    )
