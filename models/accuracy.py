"""The accuracy cost of a weight format: logits cosine against fp32 and greedy-token agreement, on one prompt."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.models.pipeline import LocalPipeline, Request
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage


@dataclass(frozen=True)
class FormatAccuracy:
    weights: str
    min_cosine: float  # worst per-step logits cosine vs fp32, teacher-forced on fp32's tokens
    mean_cosine: float
    token_agreement: float  # free-running greedy tokens equal to fp32's, position by position
    first_divergence: int  # index of the first differing token (= tokens when none differs)


def whole_model(ckpt: Checkpoint, weights: str) -> StageExecutor:
    return StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), weights))


@torch.inference_mode()
def teacher_forced_logits(ex: StageExecutor, ids: list[int], visual, tokens: list[int]) -> list[torch.Tensor]:
    """Logits [vocab] for each step when the given `tokens` are fed back (prefill, then len(tokens) - 1 steps)."""
    out = [ex.step([("acc", StepInput(0, input_ids=torch.tensor(ids), visual_tokens=visual))])[0].logits]
    pos = len(ids)
    try:
        for tok in tokens[:-1]:
            out.append(ex.step([("acc", StepInput(pos, input_ids=torch.tensor([tok])))])[0].logits)
            pos += 1
    finally:
        ex.release("acc")
    return out


def compare(ckpt: Checkpoint, ids: list[int], visual, weights: str, tokens: int, eos_id: int | None = None):
    """FormatAccuracy of `weights` against fp32 on this prompt (each model loaded once, fp32 first)."""
    ref = whole_model(ckpt, "fp32")
    ref_tokens = LocalPipeline([ref]).generate({"r": Request(ids, visual, max_new_tokens=tokens)})["r"].tokens
    ref_logits = teacher_forced_logits(ref, ids, visual, ref_tokens)
    del ref
    ex = whole_model(ckpt, weights)
    got_logits = teacher_forced_logits(ex, ids, visual, ref_tokens)
    free = LocalPipeline([ex]).generate({"r": Request(ids, visual, max_new_tokens=tokens)})["r"].tokens
    cos = [
        float(torch.nn.functional.cosine_similarity(a, b, dim=0)) for a, b in zip(ref_logits, got_logits, strict=True)
    ]
    same = [a == b for a, b in zip(free, ref_tokens, strict=False)]
    first = same.index(False) if False in same else len(ref_tokens)
    return FormatAccuracy(weights, min(cos), sum(cos) / len(cos), sum(same) / len(ref_tokens), first)
