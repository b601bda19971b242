"""Prefix cache: frames of the same part reuse the stages' system prompt + spec context keys/values; tokens stay
generate()'s, and a stage that lacks the prefix makes the session start over rather than answer wrongly."""

from __future__ import annotations

import asyncio

import pytest
import torch

from edgeinspect import codec
from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.prefix_cache import PrefixCache
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.testing import local_stages

NEW_TOKENS = 8
CONTEXT = (
    "[HSG-210 / surface] Scratches up to 0.5 mm wide and 10 mm long pass. Dents deeper than 0.2 mm fail. "
    "Porosity on sealing faces is a major defect; a missing thread is critical."
)


@pytest.fixture(scope="module")
def frames(tiny_checkpoint, part_images):
    """Three frames of one part with the same spec context: (prompt ids, visual tokens, generate()'s tokens)."""
    ckpt = open_checkpoint(tiny_checkpoint)
    processor, model = load_processor(ckpt), load_reference_model(ckpt)
    tower, preprocess = load_vision_tower(ckpt), ImagePreprocessor(ckpt)
    text = prompt_text(processor, build_messages("Inspect the part.", context=CONTEXT))
    out = []
    for image in part_images[:3]:
        inputs = processor(text=text, images=image, return_tensors="pt")
        gen = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        with torch.inference_mode():
            visual = tower(preprocess(image))[0]
        out.append((prompt_ids(processor, text), visual, gen[0, inputs["input_ids"].shape[1] :].tolist()))
    assert len({tuple(t) for _, _, t in out}) > 1  # the frames' reports differ: the image really matters
    return out


async def _inspect_frames(path, frames, chunk: int, per_stage=None) -> tuple[list[list[int]], list, list[int]]:
    """Each frame as the gateway runs it: prefill with the prefix before the image, then greedy decode.
    Returns the tokens per frame, each stage's backend, and the positions each frame took from the cache."""
    image_id = open_checkpoint(path).config.image_token_id
    tokens, reused = [], []
    async with local_stages(path, 2, per_stage) as (pipeline, backends):
        for k, (ids, visual, _) in enumerate(frames):
            frame = codec.encode_frame(visual, codec.Codec.fp32)
            session = pipeline.session(f"frame{k}", ids, frame, prefix_length=ids.index(image_id), chunk_tokens=chunk)
            async with session:
                await session.prefill()
                while len(session.journal.generated) < NEW_TOKENS:
                    await session.decode()
            tokens.append(session.journal.generated)
            reused.append(session.prefix_reused)
    return tokens, backends, reused


@pytest.mark.parametrize("chunk", [0, 8])  # the prompt whole / pipelined in chunks
def test_later_frames_of_a_part_reuse_the_prefix_and_keep_generates_tokens(tiny_checkpoint, frames, chunk):
    tokens, backends, reused = asyncio.run(_inspect_frames(tiny_checkpoint, frames, chunk))
    assert tokens == [t for _, _, t in frames]
    prefix = frames[0][0].index(open_checkpoint(tiny_checkpoint).config.image_token_id)
    assert prefix > 20
    assert reused == [0, prefix, prefix]
    for b in backends:
        assert (b.prefixes.hits, b.prefixes.misses, len(b.prefixes)) == (2, 0, 1)


def test_a_stage_without_the_prefix_makes_the_session_start_over(tiny_checkpoint, frames):
    """Stage 1 keeps no prefixes: stage 0 hits, stage 1 misses, the session restarts whole and stays exact."""
    tokens, (first, second), reused = asyncio.run(
        _inspect_frames(tiny_checkpoint, frames[:2], 8, per_stage=[{}, {"prefix_cache_mb": 0}])
    )
    assert tokens == [t for _, _, t in frames[:2]]
    assert reused == [0, 0]
    assert first.prefixes.hits == 1 and second.prefixes.misses == 1


def test_prefix_cache_keeps_the_most_recent_within_its_budget():
    entry = torch.zeros(2, 2, 1, 4, 8)  # 512 bytes
    cache = PrefixCache(budget_bytes=1100)
    assert cache.put("a", entry) and cache.put("b", entry.clone())
    assert cache.get("a", 4) is not None  # refreshes a: b is now the oldest
    assert cache.put("c", entry.clone())
    assert "b" not in cache and "a" in cache and "c" in cache and cache.evicted == 1
    assert cache.get("a", 5) is None  # a length that differs is a miss, never a wrong prefix
    assert not PrefixCache(budget_bytes=100).put("a", entry)
