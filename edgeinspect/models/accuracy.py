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


def whole_model(ckpt: Checkpoint, weights: str, int8_kernel: str | None = None) -> StageExecutor:
    return StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), weights, int8_kernel))


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


def reference(ckpt: Checkpoint, ids: list[int], visual, tokens: int) -> tuple[list[int], list[torch.Tensor]]:
    """fp32's greedy tokens on this prompt and its teacher-forced logits [vocab] per step."""
    ref = whole_model(ckpt, "fp32")
    ref_tokens = LocalPipeline([ref]).generate({"r": Request(ids, visual, max_new_tokens=tokens)})["r"].tokens
    return ref_tokens, teacher_forced_logits(ref, ids, visual, ref_tokens)


def compare(
    ckpt: Checkpoint,
    ids: list[int],
    visual,
    weights: str,
    tokens: int,
    int8_kernel: str | None = None,
    ref: tuple[list[int], list[torch.Tensor]] | None = None,
) -> FormatAccuracy:
    """FormatAccuracy of `weights` against fp32 on this prompt (`ref` from reference(), computed when absent)."""
    ref = ref or reference(ckpt, ids, visual, tokens)
    return accuracy_of(whole_model(ckpt, weights, int8_kernel), ids, visual, ref, weights)


def accuracy_of(
    ex: StageExecutor, ids: list[int], visual, ref: tuple[list[int], list[torch.Tensor]], weights: str
) -> FormatAccuracy:
    """FormatAccuracy of the whole model `ex` as it stands (named `weights`) against fp32's `ref`."""
    ref_tokens, ref_logits = ref
    got_logits = teacher_forced_logits(ex, ids, visual, ref_tokens)
    free = LocalPipeline([ex]).generate({"r": Request(ids, visual, max_new_tokens=len(ref_tokens))})["r"].tokens
    cos = [
        float(torch.nn.functional.cosine_similarity(a, b, dim=0)) for a, b in zip(ref_logits, got_logits, strict=True)
    ]
    same = [a == b for a, b in zip(free, ref_tokens, strict=False)]
    first = same.index(False) if False in same else len(ref_tokens)
    return FormatAccuracy(weights, min(cos), sum(cos) / len(cos), sum(same) / len(ref_tokens), first)
