"""A last stage's last layer runs its attention output, o_proj and MLP only at the rows sampled from."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import cosine_similarity

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped


def rows_seen(module: torch.nn.Module, into: list[int]):
    return module.register_forward_hook(
        lambda _m, args, _out: into.append(int(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    )


@pytest.mark.parametrize("weights", ["int8", "fp32"])
def test_a_prompt_runs_the_last_layers_mlp_only_at_each_sampled_row(tiny_checkpoint, weights):
    ckpt = open_checkpoint(tiny_checkpoint)
    n = ckpt.num_layers
    g = torch.Generator().manual_seed(11)
    prompts = {"a": torch.randint(10, 500, (37,), generator=g), "b": torch.randint(10, 500, (20,), generator=g)}
    trimmed = StageExecutor(load_stage(ckpt, LayerRange(0, n, n), weights))
    whole = StageExecutor(load_stage(ckpt, LayerRange(0, n, n), weights), row_exact=True)  # never trims
    seen: dict[str, list[int]] = {"last": [], "first": []}
    hooks = [
        rows_seen(trimmed.module.layers[-1].mlp.down_proj, seen["last"]),
        rows_seen(trimmed.module.layers[0].mlp.down_proj, seen["first"]),
    ]
    batch = [(sid, StepInput(0, input_ids=ids)) for sid, ids in prompts.items()]
    batch.append(("c", StepInput(0, input_ids=prompts["a"][:9], logits=False)))  # a chunk with more to come
    got = trimmed.step(batch)
    for h in hooks:
        h.remove()
    want = whole.step(batch)
    every = [37 + 20 + 9] if weights == "int8" else [37, 20, 9]  # fp32 runs each session's rows on their own
    assert seen["first"] == every
    # packed stages: the two sampled rows; fp32 keeps every row (its GEMM row counts are generate()'s bits)
    assert seen["last"] == ([2] if weights == "int8" else every)
    assert got[2].logits is None and want[2].logits is None
    if weights == "fp32":
        assert all(torch.equal(out.logits, ref.logits) for out, ref in zip(got[:2], want[:2], strict=True))
    for out, ref in zip(got[:2], want[:2], strict=True):
        # the kept rows take the GEMV path (the down projection's two passes) where the whole prompt took one
        assert cosine_similarity(out.logits, ref.logits, dim=0) > 0.999
        assert int(out.logits.argmax()) == int(ref.logits.argmax())
    for sid in prompts:  # every row's keys and values are stored as before
        assert torch.equal(trimmed.snapshot(sid, 20), whole.snapshot(sid, 20))
    # and decoding goes on from there
    step = trimmed.step([("a", StepInput(37, input_ids=torch.tensor([5])))])[0]
    assert step.length == 38 and torch.isfinite(step.logits).all()
