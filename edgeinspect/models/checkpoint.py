"""DeepSeek-VL checkpoint folders in Hugging Face format: open, fingerprint, and read only the tensors a role needs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import cast

import torch
from safetensors import safe_open
from transformers import DeepseekVLConfig, LlamaConfig, SiglipVisionConfig

from edgeinspect.errors import CheckpointError

log = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "processor_config.json",
    "preprocessor_config.json",
)
FINGERPRINT_CACHE = ".edgeinspect-fingerprint.json"

# Where each part lives in the checkpoint's state dict (as written by save_pretrained).
VISION_PREFIX = "model.vision_model."
ALIGNER_PREFIX = "model.aligner."
EMBED_KEY = "model.language_model.embed_tokens.weight"
NORM_KEY = "model.language_model.norm.weight"
LM_HEAD_KEY = "lm_head.weight"


def layer_prefix(i: int) -> str:
    return f"model.language_model.layers.{i}."


# Formats that are not a torch dtype on disk: read as this dtype, then converted by the stage (models/quant.py).
QUANTIZED = {"int8": torch.float32, "int4": torch.float32, "int6": torch.float32}


def load_dtype(name: str) -> torch.dtype:
    """The dtype to read checkpoint tensors in for weight format `name` (int8 is quantized after reading)."""
    return QUANTIZED[name] if name in QUANTIZED else torch_dtype(name)


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise CheckpointError(f"unknown weight dtype {name!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass
class Checkpoint:
    """An opened checkpoint folder: config, the tensor -> file index, fingerprints."""

    path: Path
    config: DeepseekVLConfig
    tensor_files: dict[str, Path] = field(repr=False)

    @property
    def text_config(self) -> LlamaConfig:
        """The language model's config (DeepseekVLConfig types it loosely: a dict or None before it is built)."""
        return cast(LlamaConfig, self.config.text_config)

    @property
    def vision_config(self) -> SiglipVisionConfig:
        """The SigLIP tower's config, typed as it is once the checkpoint is open."""
        return cast(SiglipVisionConfig, self.config.vision_config)

    @property
    def num_layers(self) -> int:
        return self.text_config.num_hidden_layers

    @property
    def lm_head_key(self) -> str:
        # A tied checkpoint (the generated default config) stores no lm_head: it reuses the embeddings.
        return LM_HEAD_KEY if LM_HEAD_KEY in self.tensor_files else EMBED_KEY

    def keys_with_prefix(self, prefix: str) -> list[str]:
        return sorted(k for k in self.tensor_files if k.startswith(prefix))

    def read(self, keys: Iterable[str], dtype: torch.dtype, strip: str = "") -> dict[str, torch.Tensor]:
        """Reads just these tensors (memory-mapped by safetensors), cast to dtype, with `strip` removed from names."""
        by_file: dict[Path, list[str]] = {}
        for key in keys:
            if key not in self.tensor_files:
                raise CheckpointError(f"{self.path}: tensor {key!r} is missing from the safetensors files")
            by_file.setdefault(self.tensor_files[key], []).append(key)
        out: dict[str, torch.Tensor] = {}
        for file, file_keys in by_file.items():
            with safe_open(file, framework="pt") as f:
                for key in file_keys:
                    out[key.removeprefix(strip)] = f.get_tensor(key).to(dtype)
        return out

    @cached_property
    def tokenizer_fingerprint(self) -> str:
        """sha256 over the tokenizer and processor files: peers must tokenize identically."""
        h = hashlib.sha256()
        for name in TOKENIZER_FILES:
            file = self.path / name
            if file.is_file():
                h.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
        return h.hexdigest()[:16]

    @cached_property
    def fingerprint(self) -> str:
        """sha256 over the canonical config, the tokenizer and every weight file's bytes; cached by size+mtime."""
        stamp = {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in self.weight_files}
        cache = self.path / FINGERPRINT_CACHE
        try:
            cached = json.loads(cache.read_text())
            if cached.get("stamp") == stamp:
                return cached["fingerprint"]
        except (OSError, ValueError, KeyError):
            pass
        h = hashlib.sha256()
        h.update(json.dumps(_canonical_config(self.path), sort_keys=True).encode())
        h.update(self.tokenizer_fingerprint.encode())
        for file in self.weight_files:
            with file.open("rb") as f:
                h.update(hashlib.file_digest(f, "sha256").digest())
        fingerprint = h.hexdigest()[:16]
        try:  # a read-only checkpoint volume is fine: we just hash again next time
            tmp = cache.with_suffix(".tmp")
            tmp.write_text(json.dumps({"stamp": stamp, "fingerprint": fingerprint}))
            os.replace(tmp, cache)
        except OSError:
            log.debug("checkpoint folder %s is read-only; fingerprint not cached", self.path)
        return fingerprint

    @property
    def weight_files(self) -> list[Path]:
        return sorted(set(self.tensor_files.values()))

    def weight_bytes(self, keys: Iterable[str], dtype: torch.dtype) -> int:
        """Bytes these tensors take once loaded in dtype (from headers only)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        total = 0
        for file, file_keys in _group(keys, self.tensor_files).items():
            with safe_open(file, framework="pt") as f:
                for key in file_keys:
                    numel = 1
                    for d in f.get_slice(key).get_shape():
                        numel *= d
                    total += numel * itemsize
        return total


def _group(keys: Iterable[str], index: dict[str, Path]) -> dict[Path, list[str]]:
    out: dict[Path, list[str]] = {}
    for key in keys:
        out.setdefault(index[key], []).append(key)
    return out


def _canonical_config(path: Path) -> dict:
    """The config without fields that differ between machines or library versions but not the model."""
    data = json.loads((path / "config.json").read_text())
    for volatile in ("transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype"):
        data.pop(volatile, None)
    return data


def open_checkpoint(path: Path | str) -> Checkpoint:
    """Opens a Hugging Face DeepSeek-VL folder, checking that config, weights and tokenizer are all there."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise CheckpointError(f"checkpoint folder {path} does not exist (make one with `edgeinspect model make-tiny`)")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} has no config.json: not a Hugging Face checkpoint folder")
    config = DeepseekVLConfig.from_pretrained(path)
    if config.model_type != "deepseek_vl":
        raise CheckpointError(f"{path} holds a {config.model_type!r} model, not deepseek_vl")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise CheckpointError(f"{path} has no tokenizer files (tokenizer.json)")
    return Checkpoint(path=path, config=config, tensor_files=_index_tensors(path))


def _index_tensors(path: Path) -> dict[str, Path]:
    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():
        weight_map = json.loads(index_file.read_text())["weight_map"]
        files = {name: path / file for name, file in weight_map.items()}
        missing = sorted({str(f.name) for f in files.values() if not f.is_file()})
        if missing:
            raise CheckpointError(f"{path}: shards listed in the index are missing: {', '.join(missing)}")
        return files
    single = path / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{path} has no model.safetensors or model.safetensors.index.json")
    with safe_open(single, framework="pt") as f:
        return {key: single for key in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)


def load_processor(ckpt: Checkpoint):
    """The checkpoint's DeepseekVLProcessor (tokenizer + image processor + chat template), offline."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(ckpt.path, local_files_only=True)


def load_reference_model(ckpt: Checkpoint, weights: str = "fp32"):
    """The whole model through transformers' own from_pretrained: the single-process oracle."""
    from transformers import DeepseekVLForConditionalGeneration

    model = DeepseekVLForConditionalGeneration.from_pretrained(
        ckpt.path, dtype=torch_dtype(weights), local_files_only=True, attn_implementation="sdpa"
    )
    return model.eval()
