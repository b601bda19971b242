"""The prefix-cache miss travels as a typed detail (trailing metadata `edgeinspect-error-code`), not as message text:
the gateway restarts the session whole whatever the stage's message says, and never on the text alone."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import torch

from edgeinspect import codec
from edgeinspect.errors import FailedPrecondition, PrefixCacheMiss
from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.stage import backend as stage_backend
from edgeinspect.testing import local_stages

NEW_TOKENS = 6
CONTEXT = "[HSG-210 / surface] Scratches up to 0.5 mm wide pass. Dents deeper than 0.2 mm fail."


class RewordedMiss(PrefixCacheMiss):
    """The same typed miss with a message that shares no word with today's."""

    def __init__(self, _message: str) -> None:
        super().__init__("kv snapshot unavailable here; resend from position zero")


class UntypedLookalike(FailedPrecondition):
    """Today's miss text without the code: a peer matching text would take it for a miss."""

    def __init__(self, _message: str) -> None:
        super().__init__("prefix cache miss: prefix is not cached on this stage; send the whole prompt")


@pytest.fixture(scope="module")
def frame_case(tiny_checkpoint, part_images):
    """(prompt ids, fp32 visual-token frame, prefix length: the positions before the image)."""
    ckpt = open_checkpoint(tiny_checkpoint)
    text = prompt_text(load_processor(ckpt), build_messages("Inspect the part.", context=CONTEXT))
    ids = prompt_ids(load_processor(ckpt), text)
    with torch.inference_mode():
        visual = load_vision_tower(ckpt)(ImagePreprocessor(ckpt)(part_images[0]))[0]
    return ids, codec.encode_frame(visual, codec.Codec.fp32), ids.index(ckpt.config.image_token_id)


async def _same_frame_twice(path, case) -> tuple[list[list[int]], list[int], list]:
    """The frame inspected twice with its prefix; stage 1 keeps no prefixes, so the second one misses there."""
    ids, frame, prefix = case
    tokens, reused = [], []
    async with local_stages(path, 2, [{}, {"prefix_cache_mb": 0}]) as (cluster, backends):
        for k in range(2):
            async with cluster.session(f"frame{k}", ids, frame, prefix_length=prefix, chunk_tokens=8) as session:
                await session.prefill()
                while len(session.journal.generated) < NEW_TOKENS:
                    await session.decode()
            tokens.append(list(session.journal.generated))
            reused.append(session.prefix_reused)
    return tokens, reused, backends


def test_a_reworded_miss_still_makes_the_session_start_over(tiny_checkpoint, frame_case, monkeypatch):
    monkeypatch.setattr(stage_backend, "PrefixCacheMiss", RewordedMiss)  # the real stage raises it, reworded
    tokens, reused, (first, second) = asyncio.run(_same_frame_twice(tiny_checkpoint, frame_case))
    assert tokens[1] == tokens[0]  # restarted whole, and exact
    assert reused == [0, 0]
    assert first.prefixes.hits == 1 and second.prefixes.misses == 1


def test_the_miss_text_without_the_code_is_not_taken_for_a_miss(tiny_checkpoint, frame_case, monkeypatch):
    monkeypatch.setattr(stage_backend, "PrefixCacheMiss", UntypedLookalike)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        asyncio.run(_same_frame_twice(tiny_checkpoint, frame_case))
    assert failed.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "prefix cache miss" in failed.value.details()
