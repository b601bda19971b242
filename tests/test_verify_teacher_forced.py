"""`edgeinspect verify` judges the cluster teacher-forced: a healthy cluster with the lossy fp16 wire passes over a
long generation (near ties that rounding flips are within the codec's bound), and a reference of another checkpoint
fails on its logits at the positions, not only on the fingerprint."""

from __future__ import annotations

import json

import pytest

from edgeinspect.assets import asset_path
from edgeinspect.stack.verify import (
    WIDE_BOUND,
    Decision,
    TeacherForced,
    check_positions,
    judge,
    margin_bound,
    verify,
)

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped

PROMPT = "Inspect the part in the image."
LONG = 600  # tokens: free-running fp16 and fp32 sequences part within a few hundred on these checkpoints


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory):
    """The tiny checkpoint's generator with another seed: the same tokenizer and shapes, other weights."""
    from edgeinspect.models.tiny import TinySpec, make_tiny

    return make_tiny(tmp_path_factory.mktemp("ckpt") / "tiny-seed7", TinySpec(seed=7))


def test_the_rounding_bound_follows_the_formats():
    assert margin_bound("fp32", "fp32") == 0.0  # lossless: exact, no near tie admitted
    fp16, int8 = margin_bound("fp16", "fp32"), margin_bound("int8", "fp32")
    assert 0.0 < fp16 < int8 < WIDE_BOUND + 0.5
    assert margin_bound("fp16", "int8") > margin_bound("fp16", "fp32")


def test_a_near_tie_within_the_bound_passes_and_a_margin_beyond_it_fails():
    assert judge(0.0, 0.0) is Decision.argmax
    assert judge(0.0, 0.3) is Decision.argmax
    assert judge(0.05, 0.3) is Decision.near_tie
    assert judge(0.3, 0.3) is Decision.near_tie
    assert judge(0.31, 0.3) is Decision.mismatch
    assert judge(1e-6, 0.0) is Decision.mismatch  # fp32: any non-argmax token is a mismatch
    # per position, the bound scales with that position's logit rms
    bound = margin_bound("fp16", "fp32")
    tf = TeacherForced(
        argmax=[5, 6, 7, 8], margin=[0.0, 0.5 * bound * 2.0, 1.5 * bound * 2.0, 0.5 * bound], rms=[2.0] * 3 + [1.0]
    )
    checks = check_positions([5, 1, 2, 3], tf, bound)
    assert [(c.position, c.cluster_token, c.reference_token, c.decision) for c in checks] == [
        (1, 1, 6, Decision.near_tie),
        (2, 2, 7, Decision.mismatch),
        (3, 3, 8, Decision.near_tie),
    ]
    # an explicit tolerance (logits) replaces the derived bound
    assert [c.decision for c in check_positions([5, 1, 2, 3], tf, bound, tolerance=10.0)] == [Decision.near_tie] * 3


def test_a_healthy_fp16_cluster_passes_over_a_long_generation(embedded_stack, tiny_checkpoint):
    image = asset_path("part_dent.jpg").read_bytes()
    result = verify(embedded_stack.gateway_address, embedded_stack.api_token, tiny_checkpoint, image, PROMPT, LONG)
    assert (result.wire, result.weights, result.stages) == ("fp16", "fp32", 2)
    assert result.compared == len(result.cluster_tokens) >= 100, "too short a generation to prove anything"
    assert result.agree, result.reasons
    assert result.mismatches == [] and result.fingerprint == result.cluster_fingerprint
    assert result.verdict in ("identical", f"within tolerance at {len(result.near_ties)} near-ties")
    for p in result.near_ties:  # each one a real near tie: far under a wrong checkpoint's margins (~3 rms)
        assert 0.0 < p.margin <= p.bound


def test_a_reference_of_another_checkpoint_fails_on_the_logits(embedded_stack, other_checkpoint):
    from typer.testing import CliRunner

    from edgeinspect.cli import app

    args = ["verify", "--checkpoint", str(other_checkpoint), "--gateway", embedded_stack.gateway_address,
            "--token", embedded_stack.api_token, "--image", str(asset_path("part_ok.jpg")), "--prompt", PROMPT,
            "--max-new-tokens", "48"]  # fmt: skip
    done = CliRunner().invoke(app, [*args, "--json"])
    assert done.exit_code == 1, done.output
    data = json.loads(done.stdout)
    assert data["agree"] is False and data["verdict"] == "mismatch"
    # the prompt is the same (same tokenizer), so the positions were judged: the failure is the logits'
    assert data["cluster_prompt_ids"] == data["prompt_token_ids"] and data["compared"] == len(data["cluster_tokens"])
    bad = [p for p in data["positions"] if p["decision"] == "mismatch"]
    assert len(bad) >= data["compared"] // 2, data["positions"]
    assert all(p["margin"] > p["bound"] and p["cluster_token"] != p["reference_token"] for p in bad)
    assert any("beyond the fp16/fp32 rounding bound" in r for r in data["reasons"])
    assert any("fingerprints differ" in r for r in data["reasons"])  # reported too, but not the only reason

    # the human output: a per-position table of the failing positions
    human = CliRunner().invoke(app, args)
    assert human.exit_code == 1, human.output
    assert "position" in human.stdout and "cluster token" in human.stdout and "reference argmax" in human.stdout
    assert "DISAGREE" in human.stdout and f"{bad[0]['margin']:.4g}" in human.stdout
