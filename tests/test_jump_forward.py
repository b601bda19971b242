"""Grammar jump-forward: tokens the report grammar forces are appended in one multi-token step, and greedy output
stays token for token what the step-by-step constrained run writes."""

from __future__ import annotations

import torch

from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.models.grammar import grammar_cache_for, single_allowed
from edgeinspect.models.stage import LayerRange, StageExecutor, StepInput, load_stage
from edgeinspect.services.gateway.reports.schema import build_report_grammar
from edgeinspect.testing import sample_spec_chunks

BUDGET = 120


def test_single_allowed_reads_one_bit_or_nothing():
    mask = torch.zeros(4, dtype=torch.int32)
    assert single_allowed(mask, 128) is None
    mask[2] = 1 << 5
    assert single_allowed(mask, 128) == 69
    mask[3] = torch.tensor(-(2**31), dtype=torch.int32)  # bit 31: a negative int32 word
    assert single_allowed(mask, 128) is None
    mask[2] = 0
    assert single_allowed(mask, 128) == 127
    assert single_allowed(mask, 100) is None  # beyond the model's vocab
    mask[3] = 0b11
    assert single_allowed(mask, 128) is None


def constrained_greedy(executor, cache, grammar_text: str, prompt: list[int], jump: bool) -> tuple[list[int], int]:
    """(generated tokens, decode steps after the prefill) of one greedy constrained report."""
    eos = cache.eos_id
    constraint = cache.constraint(grammar_text)
    out = executor.step([("s", StepInput(0, input_ids=torch.tensor(prompt)))])[0]
    tokens, steps, pos = [], 0, len(prompt)
    try:
        while len(tokens) < BUDGET:
            token = int(torch.argmax(constraint.mask(out.logits)))
            constraint.advance(token)
            new = [token, *(constraint.forced_tokens(64) if jump else [])]
            tokens += new
            if tokens[-1] == eos or len(tokens) >= BUDGET:
                break
            out = executor.step([("s", StepInput(pos, input_ids=torch.tensor(new)))])[0]
            pos += len(new)
            steps += 1
    finally:
        executor.release("s")
    return tokens, steps


def test_jump_forward_keeps_greedy_output_and_saves_steps(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    cache = grammar_cache_for(ckpt)
    executor = StageExecutor(load_stage(ckpt, LayerRange(0, ckpt.num_layers, ckpt.num_layers), "fp32"))
    grammar = build_report_grammar(sample_spec_chunks(), "CVR-310", BUDGET)
    prompt = cache_prompt(ckpt)
    plain, plain_steps = constrained_greedy(executor, cache, grammar.text, prompt, jump=False)
    jumped, jumped_steps = constrained_greedy(executor, cache, grammar.text, prompt, jump=True)
    assert jumped == plain
    assert plain[-1] == cache.eos_id  # a complete object, so every forced key and bracket was written
    saved = 1 - jumped_steps / plain_steps
    print(f"jump-forward: {plain_steps} -> {jumped_steps} decode steps ({saved:.0%} fewer), {len(plain)} tokens")
    assert saved >= 0.2


def cache_prompt(ckpt) -> list[int]:
    from edgeinspect.models.checkpoint import load_processor

    tok = load_processor(ckpt).tokenizer
    return tok("Inspect the cover. Answer with the JSON report.")["input_ids"]


async def _stage_report(port: int, prompt: list[int], grammar, jump: bool) -> tuple[list[int], int]:
    """One greedy constrained report through a real DecoderStage server's Forward stream: (tokens, decode steps)."""
    import asyncio

    import grpc

    from edgeinspect.v1 import stage_pb2, stage_pb2_grpc

    queue: asyncio.Queue = asyncio.Queue()

    async def requests():
        while (item := await queue.get()) is not None:
            yield item

    sampling = stage_pb2.SamplingParams(
        grammar_id=grammar.grammar_id, grammar_json=grammar.text, max_forced_tokens=64 if jump else 0
    )
    sid = f"jf-{jump}"
    tokens, steps, pos, feed = [], 0, 0, prompt
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = stage_pb2_grpc.DecoderStageStub(channel).Forward(requests())
        while True:
            step = stage_pb2.SessionStep(session_id=sid, position=pos, input_ids=feed, sampling=sampling)
            await queue.put(stage_pb2.StepRequest(steps=[step]))
            result = (await stream.read()).results[0]
            sampling = stage_pb2.SamplingParams(grammar_id=grammar.grammar_id, max_forced_tokens=64 if jump else 0)
            new = [result.token_id, *result.forced_token_ids]
            tokens += new
            pos, feed = result.cached_length, new
            if tokens[-1] == EOS_OF_TINY or len(tokens) >= BUDGET:
                break
            steps += 1
        await queue.put(None)
    return tokens, steps


EOS_OF_TINY = 1  # models/tiny.py's eos_token_id


def test_a_real_stage_returns_forced_tokens_and_the_report_is_unchanged(tiny_checkpoint):
    import asyncio

    from edgeinspect.services.stage.server import start
    from edgeinspect.services.stage.settings import StageSettings

    ckpt = open_checkpoint(tiny_checkpoint)
    assert ckpt.text_config.eos_token_id == EOS_OF_TINY
    grammar = build_report_grammar(sample_spec_chunks(), "PCB-410", BUDGET)
    prompt = cache_prompt(ckpt)

    async def main():
        settings = StageSettings(checkpoint=tiny_checkpoint, layer_start=0, layer_end=ckpt.num_layers)
        running, _ = await start(settings)
        try:
            plain = await _stage_report(running.port, prompt, grammar, jump=False)
            jumped = await _stage_report(running.port, prompt, grammar, jump=True)
        finally:
            await running.stop(0)
        return plain, jumped

    (plain, plain_steps), (jumped, jumped_steps) = asyncio.run(main())
    assert jumped == plain and plain[-1] == EOS_OF_TINY
    assert jumped_steps < plain_steps
