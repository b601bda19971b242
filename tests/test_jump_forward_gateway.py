"""Grammar jump-forward through the real gateway: a structured greedy report asks the last stage for the tokens the
schema forces and feeds them in one step with the sampled one, and the report is token for token the one written
step by step, the one transformers' generate() writes with the same constraint, and the one a failover in the
middle of it writes.

Real processes on loopback (vision, 2 layer ranges x 2 replicas, gateway; no retrieval node, so the schema is the
one for no specs), fp32 on the wire and in the stages. The stack starts with jump-forward off (step by step), then
the gateway is restarted with its default (on). The fault is real: the replica serving the session is SIGKILLed
while the report is being written.
"""

from __future__ import annotations

import io
import os
import signal
import urllib.request
import uuid

import grpc
import pytest
from PIL import Image
from transformers import LogitsProcessorList

from edgeinspect.assets import asset_path
from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.grammar import grammar_cache_for, logits_processor
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_text
from edgeinspect.services.gateway.decode.pipeline import StepResult
from edgeinspect.services.gateway.decode.session import Journal
from edgeinspect.services.gateway.reports.schema import build_report_grammar, schema_instruction
from edgeinspect.stack.launcher import LocalStack, StackOptions, stage_name
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc, stage_pb2

IMAGE, PART, BUDGET, SHORT = "part_scratch.jpg", "CVR-310", 160, 12
ENV = {
    # The replicas of range 1 are frozen for the ~1 s the status call takes while the test picks the victim: no
    # stall may end the step before the kill does.
    "EDGEINSPECT_STALL_MIN_S": "20.0",
    "EDGEINSPECT_MICRO_BATCHES": "1",
    "EDGEINSPECT_REPLAN": "false",
}
JUMP_OFF = "EDGEINSPECT_JUMP_FORWARD_TOKENS"


@pytest.fixture(scope="module")
def stack(tiny_checkpoint, tmp_path_factory):
    opts = StackOptions(
        workdir=tmp_path_factory.mktemp("jump-forward"),
        checkpoint=tiny_checkpoint,
        stages=2,
        replicas=2,
        codec="fp32",
        extra_env=ENV | {JUMP_OFF: "0"},
    )
    with LocalStack(opts) as s:
        yield s


class Gateway:
    def __init__(self, stack: LocalStack):
        self.channel = grpc.insecure_channel(stack.gateway_address)
        self.stub = inspection_pb2_grpc.InspectionServiceStub(self.channel)
        self.md = [("authorization", f"Bearer {stack.api_token}")]

    def request(self, budget: int) -> inspection_pb2.InspectRequest:
        image = asset_path(IMAGE).read_bytes()
        return inspection_pb2.InspectRequest(
            image=image, station="s1", part=PART, max_new_tokens=budget, idempotency_key=uuid.uuid4().hex
        )

    def inspect(self, budget: int) -> inspection_pb2.DefectReport:
        return self.stub.Inspect(self.request(budget), metadata=self.md, timeout=120)

    def stream(self, budget: int) -> tuple[list[inspection_pb2.TokenDelta], inspection_pb2.DefectReport]:
        events = list(self.stub.InspectStream(self.request(budget), metadata=self.md, timeout=120))
        return [e.delta for e in events[:-1]], events[-1].report

    def status(self) -> inspection_pb2.ClusterStatus:
        return self.stub.GetClusterStatus(inspection_pb2.ClusterStatusRequest(), metadata=self.md, timeout=10)

    def close(self) -> None:
        self.channel.close()


def jump_forward_metric(stack: LocalStack) -> float:
    text = urllib.request.urlopen(stack.metrics_url("gateway"), timeout=10).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("edgeinspect_jump_forward_"))


@pytest.fixture(scope="module")
def runs_off(stack):
    """The reports written step by step: the stack starts with jump_forward_tokens 0."""
    gateway = Gateway(stack)
    try:
        return {"off": gateway.stream(BUDGET), "off_short": gateway.stream(SHORT)}
    finally:
        gateway.close()


@pytest.fixture(scope="module")
def runs(stack, runs_off):
    """The step-by-step reports, the same requests with jump-forward on (the gateway restarted with its default),
    and the gateway's jump-forward counter after them."""
    del stack.opts.extra_env[JUMP_OFF]  # read at each start: the restarted gateway has the default
    stack.restart("gateway")
    gateway = Gateway(stack)
    try:
        on = {"on": gateway.stream(BUDGET), "on_short": gateway.stream(SHORT)}
        return runs_off | on | {"metric": jump_forward_metric(stack)}
    finally:
        gateway.close()


def generate_oracle(checkpoint) -> tuple[list[int], int]:
    """transformers' generate() on the gateway's prompt (no specs) with the report grammar as a logits processor."""
    grammar = build_report_grammar([], PART, BUDGET)
    ckpt = open_checkpoint(checkpoint)
    processor = load_processor(ckpt)
    instruction = f"{DEFAULT_INSTRUCTION}\n{schema_instruction(grammar.vocabulary)}"
    text = prompt_text(processor, build_messages(instruction, ""))
    image = Image.open(io.BytesIO(asset_path(IMAGE).read_bytes())).convert("RGB")
    inputs = processor(text=text, images=image, return_tensors="pt")
    prompt_len = inputs["input_ids"].shape[1]
    constraint = grammar_cache_for(ckpt).constraint(grammar.text)
    out = load_reference_model(ckpt).generate(
        **inputs,
        max_new_tokens=BUDGET,
        do_sample=False,
        logits_processor=LogitsProcessorList([logits_processor(constraint, prompt_len)]),
    )
    return out[0, prompt_len:].tolist(), prompt_len


def test_the_journal_feeds_each_steps_tokens_at_once_and_ends_at_the_end_of_sequence():
    j = Journal([1, 2, 3], None, stage_pb2.SamplingParams(max_forced_tokens=32))
    j.add(StepResult(5, forced_token_ids=[6, 7]))
    assert j.unfed() == [5, 6, 7] and j.forced == 2  # the next step's input: sampled + forced
    j.add(StepResult(8))
    assert j.unfed() == [8] and not j.stop_at(99)
    j.add(StepResult(9, forced_token_ids=[99, 10]))  # nothing after an end of sequence counts
    assert j.stop_at(99)
    assert j.generated == [5, 6, 7, 8, 9, 99] and j.steps == [3, 1, 2] and j.forced == 3


def test_a_jump_forward_report_equals_the_step_by_step_one_and_generate_in_fewer_steps(runs, tiny_checkpoint):
    (_, on), (_, off) = runs["on"], runs["off"]
    expected, prompt_len = generate_oracle(tiny_checkpoint)
    assert on.prompt_tokens == prompt_len
    assert list(on.generated_token_ids) == list(off.generated_token_ids) == expected
    assert expected[-1] == open_checkpoint(tiny_checkpoint).text_config.eos_token_id  # a complete object
    assert on.raw_text == off.raw_text and on.verdict == off.verdict
    # Every token after the first is a decode step's sample or a forced one.
    assert off.jump_forward_tokens == 0 and off.decode_steps == len(expected) - 1
    assert on.jump_forward_tokens > 0 and on.decode_steps + on.jump_forward_tokens == len(expected) - 1
    saved = 1 - on.decode_steps / off.decode_steps
    print(f"\njump-forward via the gateway: {off.decode_steps} -> {on.decode_steps} decode steps ({saved:.0%} fewer)")
    assert saved >= 0.2
    assert runs["metric"] >= on.jump_forward_tokens  # edgeinspect_jump_forward_tokens_total


def test_the_budget_holds_exactly_with_forced_tokens(runs):
    (_, on), (_, off) = runs["on_short"], runs["off_short"]
    assert len(on.generated_token_ids) == SHORT  # no forced token past max_new_tokens
    assert list(on.generated_token_ids) == list(off.generated_token_ids)
    assert on.jump_forward_tokens > 0 and on.decode_steps + on.jump_forward_tokens == SHORT - 1
    assert on.verdict == inspection_pb2.VERDICT_UNCERTAIN  # the object did not fit: truncated, as without


def test_forced_tokens_are_streamed_like_sampled_ones(runs, tiny_checkpoint):
    eos = open_checkpoint(tiny_checkpoint).text_config.eos_token_id
    for key in ("on", "off", "on_short"):
        deltas, report = runs[key]
        ids, text = [i for d in deltas for i in d.token_ids], "".join(d.text for d in deltas)
        generated = list(report.generated_token_ids)
        # Every token reaches the caller once and in order (held-back ones ride with a later delta) ...
        assert ids == generated[: len(ids)] and report.raw_text.startswith(text)
        if generated[-1] == eos:  # ... and a complete report's all but the end of sequence, forced or not
            assert ids == generated[:-1] and text == report.raw_text


def test_a_replica_killed_mid_report_gives_the_same_tokens(stack, runs):
    """Runs last: the victim stays down."""
    expected = list(runs["on"][1].generated_token_ids)
    gateway = Gateway(stack)
    replicas = [stack.role(stage_name(1, r)) for r in range(2)]
    out: dict = {}
    try:
        seen = 0
        for event in gateway.stub.InspectStream(gateway.request(BUDGET), metadata=gateway.md, timeout=120):
            if event.HasField("report"):
                out["report"] = event.report
                break
            seen += len(event.delta.token_ids)
            if "victim" not in out and seen >= 8:
                # Freeze range 1 (the grammar's stage) so the report cannot finish while the victim is chosen.
                for r in replicas:
                    os.kill(r.pid, signal.SIGSTOP)
                try:
                    busy = {s.address for s in gateway.status().stages if s.layer_start > 0 and s.sessions > 0}
                    out["victim"] = next(r.name for r in replicas if stack.address_of(r.name) in busy)
                    out["killed_after"] = seen
                    stack.kill(out["victim"])
                finally:
                    for r in replicas:
                        if r.name != out.get("victim"):
                            os.kill(r.pid, signal.SIGCONT)
        report = out["report"]
        assert list(report.generated_token_ids) == expected
        assert report.jump_forward_tokens == runs["on"][1].jump_forward_tokens
        assert len(report.failovers) == 1, report.failovers
        failover = report.failovers[0]
        assert failover.stage == "[3,5)" and failover.recovery_ms > 0 and "diverged" not in failover.reason
        assert failover.position > report.prompt_tokens and failover.replayed_tokens > 0  # mid-generation
        assert all(failover.endpoint not in r for r in failover.route)
    finally:
        gateway.close()
