"""Pipelined prefill over real gRPC stages: chunks overlap across stages and the tokens stay generate()'s."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from edgeinspect import codec
from edgeinspect.errors import InvalidInput
from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.gateway.decode.pipeline import prompt_chunks
from edgeinspect.testing import local_stages

NEW_TOKENS = 10
CONTEXT = "Scratches up to 0.5 mm wide pass. Dents deeper than 0.2 mm fail. Missing holes are critical."


@pytest.fixture(scope="module")
def case(tiny_checkpoint, part_images):
    """(prompt ids, visual tokens [N, vision_hidden], generate()'s greedy tokens) for one image prompt."""
    ckpt = open_checkpoint(tiny_checkpoint)
    processor, model = load_processor(ckpt), load_reference_model(ckpt)
    text = prompt_text(processor, build_messages("Inspect the part.", context=CONTEXT))
    inputs = processor(text=text, images=part_images[1], return_tensors="pt")
    gen = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    with torch.inference_mode():
        visual = load_vision_tower(ckpt)(ImagePreprocessor(ckpt)(part_images[1]))[0]
    return prompt_ids(processor, text), visual, gen[0, inputs["input_ids"].shape[1] :].tolist()


async def _run(path, case, n_stages: int, chunk: int) -> tuple[list[int], list[list[tuple[float, float]]]]:
    """Prefill (pipelined in `chunk`-token chunks) + greedy decode through `n_stages` real stage servers; returns
    the tokens and, per stage, the (start, end) time of every step it ran."""
    ids, visual, _ = case
    image_id = open_checkpoint(path).config.image_token_id
    async with local_stages(path, n_stages) as (cluster, backends):
        spans = [_record_steps(b) for b in backends]
        frame = codec.encode_frame(visual, codec.Codec.fp32)
        async with cluster.session("s1", ids, frame, chunk_tokens=chunk) as session:
            await session.prefill()
            while len(session.journal.generated) < NEW_TOKENS:
                await session.decode()
    assert image_id in ids
    return session.journal.generated, spans


def _record_steps(backend) -> list[tuple[float, float]]:
    """Wraps the backend's submit (what the servicer calls after admission) so each step's start and end time is
    kept (the real submit still does the work)."""
    spans: list[tuple[float, float]] = []
    run = backend.submit

    async def timed(work):
        t0 = time.perf_counter()
        out = await run(work)
        spans.append((t0, time.perf_counter()))
        return out

    backend.submit = timed
    return spans


@pytest.mark.parametrize("n_stages,chunk", [(2, 8), (3, 16)])
def test_pipelined_prefill_reproduces_generate(tiny_checkpoint, case, n_stages, chunk):
    tokens, spans = asyncio.run(_run(tiny_checkpoint, case, n_stages, chunk))
    assert tokens == case[2]
    n_chunks = -(-len(case[0]) // chunk)
    assert n_chunks >= 4
    assert all(len(s) == n_chunks + NEW_TOKENS - 1 for s in spans)  # every chunk, then one step per token


def test_chunks_overlap_across_stages(tiny_checkpoint, case):
    """Stage 0 starts chunk 2 before stage 1 has finished chunk 1: the stages work at the same time."""
    _, (first, second) = asyncio.run(_run(tiny_checkpoint, case, 2, 8))
    assert first[1][0] < second[0][1]
    # Lock step would start every stage-0 chunk only after stage 1 finished the previous one.
    overlapped = sum(1 for c in range(1, 6) if first[c][0] < second[c - 1][1])
    assert overlapped >= 3


def test_prompt_chunks_give_each_chunk_its_own_visual_rows(tiny_checkpoint, case):
    ids, visual, _ = case
    image_id = open_checkpoint(tiny_checkpoint).config.image_token_id
    frame = codec.encode_frame(visual, codec.Codec.fp32)
    chunks = prompt_chunks(ids, frame, 5, image_id)
    assert [i for part, _ in chunks for i in part] == ids
    rows = [codec.decode_frame(f) for _, f in chunks if f is not None]
    assert torch.equal(torch.cat(rows), visual)
    assert all((f is None) == (image_id not in part) for part, f in chunks)
    with pytest.raises(InvalidInput, match="image placeholders"):
        prompt_chunks(ids, codec.encode_frame(visual[1:], codec.Codec.fp32), 5, image_id)
