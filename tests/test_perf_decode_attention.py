"""The single-row decode attention of packed-format stages equals SDPA's (the fp32 oracle path) to rounding."""

from __future__ import annotations

import pytest
import torch

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage


@pytest.mark.parametrize("fixture", ["tiny_checkpoint", "tiny_mha_checkpoint"])  # grouped and plain heads
def test_single_row_attention_matches_sdpa(fixture, request):
    path = request.getfixturevalue(fixture)
    ckpt = open_checkpoint(path)
    module = load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers))
    sdpa, bmm = StageExecutor(module, row_exact=True), StageExecutor(module, row_exact=False)
    ids = torch.full((9,), ckpt.text_config.eos_token_id)
    for ex in (sdpa, bmm):
        ex.step([("s", StepInput(0, input_ids=ids))])
    assert (sdpa.heads == sdpa.kv_heads) == (fixture == "tiny_mha_checkpoint")
    for pos, token in enumerate([5, 17, 3, 42], start=9):
        a = sdpa.step([("s", StepInput(pos, input_ids=torch.tensor([token])))])[0].logits
        b = bmm.step([("s", StepInput(pos, input_ids=torch.tensor([token])))])[0].logits
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
