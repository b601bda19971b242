"""Continuous batching across concurrent inspections: same tokens as generate(), fewer forward passes."""

from __future__ import annotations

import asyncio

import pytest
import torch

from edgeinspect.models.checkpoint import load_processor, load_reference_model, open_checkpoint
from edgeinspect.models.prompt import build_messages, prompt_ids, prompt_text
from edgeinspect.models.stage import StepInput
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.stage.backend import SessionWork, StageBackend
from edgeinspect.services.stage.settings import StageSettings

pytestmark = pytest.mark.cpu_paths  # tools/test.sh runs these again with the ISA capped

NEW_TOKENS = 12
CASES = [  # (image index, instruction, spec context): prompts of different lengths
    (0, "Inspect the part.", ""),
    (1, "Is the scratch longer than the 5 mm acceptance limit? Answer with the verdict first.", "Scratches pass."),
    (2, "Describe every dent with its location and depth, then give the verdict.", "Dents deeper than 0.2 mm fail."),
    (
        3,
        "Check the holes.",
        "All four holes must be present and round; a missing hole is a critical defect. Burrs fail.",
    ),
]


@pytest.fixture(scope="module")
def references(tiny_checkpoint, part_images):
    """(prompt ids, visual tokens, generate()'s greedy tokens) per case."""
    ckpt = open_checkpoint(tiny_checkpoint)
    processor, model = load_processor(ckpt), load_reference_model(ckpt)
    tower, preprocess = load_vision_tower(ckpt), ImagePreprocessor(ckpt)
    out = []
    for image_idx, instruction, context in CASES:
        text = prompt_text(processor, build_messages(instruction, context=context))
        inputs = processor(text=text, images=part_images[image_idx], return_tensors="pt")
        gen = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        with torch.inference_mode():
            visual = tower(preprocess(part_images[image_idx]))[0]
        n = inputs["input_ids"].shape[1]
        out.append((prompt_ids(processor, text), visual, gen[0, n:].tolist()))
    assert len({len(ids) for ids, _, _ in out}) == len(CASES)
    return out


def _backends(path, max_step_tokens: int, weights: str = "fp32") -> list[StageBackend]:
    ckpt = open_checkpoint(path)
    bounds = [(0, 2), (2, ckpt.num_layers)]
    return [
        StageBackend(
            StageSettings.load(
                None, checkpoint=path, layer_start=a, layer_end=b, weights=weights, max_step_tokens=max_step_tokens
            ),
            ckpt,
        )
        for a, b in bounds
    ]


async def _inspect(backends, sid: str, ids: list[int], visual, n_tokens: int, delay: float) -> list[int]:
    """One inspection driven like the gateway drives a 2-stage pipeline: every step through both stages."""
    await asyncio.sleep(delay)
    first, last = backends
    step = StepInput(0, input_ids=torch.tensor(ids), visual_tokens=visual)
    tokens: list[int] = []
    pos = 0
    while len(tokens) < n_tokens:
        (h,) = await first.run([SessionWork(sid, step)])
        (out,) = await last.run([SessionWork(sid, StepInput(pos, hidden=h.hidden))])
        tokens.append(out.token_id)
        pos = out.length
        step = StepInput(pos, input_ids=torch.tensor([out.token_id]))
    return tokens


@pytest.mark.parametrize("max_step_tokens", [4096, 40])  # whole prompts / prompts in chunks beside decodes
def test_concurrent_inspections_reproduce_generate_and_share_passes(tiny_checkpoint, references, max_step_tokens):
    backends = _backends(tiny_checkpoint, max_step_tokens)

    async def main():
        runs = [
            _inspect(backends, f"s{i}", ids, vis, NEW_TOKENS, delay=0.01 * i)  # arrivals staggered: join mid-flight
            for i, (ids, vis, _) in enumerate(references)
        ]
        return await asyncio.gather(*runs)

    got = asyncio.run(main())
    for (_, _, ref), tokens in zip(references, got, strict=True):
        assert tokens == ref
    for b in backends:
        # Fewer forward passes than session-steps: sessions of different streams shared passes.
        assert b.sessions_stepped > b.steps_run
        assert b.sessions_stepped / b.steps_run > 1.5, (b.sessions_stepped, b.steps_run)


def test_a_refused_step_fails_only_its_own_caller(tiny_checkpoint, references):
    first, _ = _backends(tiny_checkpoint, 4096)
    ids, vis, _ = references[0]

    async def main():
        good = first.run([SessionWork("good", StepInput(0, input_ids=torch.tensor(ids), visual_tokens=vis))])
        bad = first.run([SessionWork("bad", StepInput(5, input_ids=torch.tensor([7])))])  # unknown session at 5
        return await asyncio.gather(good, bad, return_exceptions=True)

    good, bad = asyncio.run(main())
    assert good[0].length == len(ids)
    assert type(bad).__name__ == "NotFound"
