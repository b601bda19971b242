"""Constrained reports in process: 50 different images on the tiny random-weight checkpoint, each report valid
against its part's schema and naming only that part's defect classes; a budget too small gives UNCERTAIN."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch
from PIL import Image

from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.grammar import grammar_cache_for
from edgeinspect.models.pipeline import LocalPipeline, Request, even_split, load_local_stages
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_ids, prompt_text
from edgeinspect.models.vision import ImagePreprocessor, load_vision_tower
from edgeinspect.services.gateway.reports.report_text import REASON_TRUNCATED
from edgeinspect.services.gateway.reports.schema import build_report_grammar, parse_structured, schema_instruction
from edgeinspect.testing import sample_spec_chunks
from edgeinspect.v1 import inspection_pb2

PARTS = ["CVR-310", "PCB-410", "HSG-210", "WLD-710", "SHF-510", "XYZ-999"]  # the last: general specs only
BUDGET = 200


def varied_image(seed: int) -> Image.Image:
    """Sizes, colours, noise and a bright blob that all vary with the seed."""
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(24, 160)), int(rng.integers(24, 160))
    base = rng.uniform(0, 255, 3) * np.ones((h, w, 3))
    base += rng.normal(0, rng.uniform(0, 80), (h, w, 3))
    y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
    base[max(0, y - 5) : y + 5, max(0, x - 5) : x + 5] = rng.uniform(0, 255, 3)
    return Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    # One thread: the tiny model's ops are too small to split, and on a shared box two threads contend badly.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ckpt = open_checkpoint(tiny_checkpoint)
    stages = load_local_stages(ckpt, even_split(ckpt.num_layers, 2))
    yield {
        "ckpt": ckpt,
        "processor": load_processor(ckpt),
        "pipeline": LocalPipeline(stages, eos_id=ckpt.text_config.eos_token_id),
        "tower": load_vision_tower(ckpt),
        "pre": ImagePreprocessor(ckpt),
        "grammars": grammar_cache_for(ckpt),
    }
    torch.set_num_threads(threads)


def run(model, image: Image.Image, grammar, budget: int):
    processor = model["processor"]
    text = prompt_text(processor, build_messages(f"{DEFAULT_INSTRUCTION}\n{schema_instruction(grammar.vocabulary)}"))
    with torch.inference_mode():
        visual = model["tower"](model["pre"](image))[0]  # [N, vision_hidden]
    constraint = model["grammars"].constraint(grammar.text)
    request = Request(prompt_ids(processor, text), visual, max_new_tokens=budget, constraint=constraint)
    gen = model["pipeline"].generate({"s": request})["s"]
    return gen, processor.tokenizer.decode(gen.tokens, skip_special_tokens=True)


def test_fifty_images_give_reports_valid_against_their_parts_schema(model):
    chunks = sample_spec_chunks()
    verdicts, named = set(), 0
    for i in range(50):
        part = PARTS[i % len(PARTS)]
        grammar = build_report_grammar(chunks, part, BUDGET)
        gen, raw = run(model, varied_image(i), grammar, BUDGET)
        assert gen.finished_by_eos, f"image {i}: the object did not finish within {BUDGET} tokens: {raw!r}"
        obj = json.loads(raw)
        jsonschema.validate(obj, grammar.schema)
        # The part's own specs and the general ones (product: all), read here independently of the schema code.
        allowed = {x for c in chunks if {part, "all"} & set(c.product.split(", ")) for x in c.defect_classes}
        allowed.add("other")
        assert {d["class"] for d in obj["defects"]} <= allowed
        assert set(grammar.vocabulary.classes) <= allowed
        parsed = parse_structured(raw, truncated=False)
        assert parsed.verdict != inspection_pb2.VERDICT_UNSPECIFIED
        assert {d["defect_class"] for d in parsed.defects} <= allowed
        verdicts.add(obj["verdict"])
        named += len(obj["defects"])
    assert len(verdicts) >= 2, "every image gave the same verdict: the test would not notice a stuck constraint"
    assert named > 0, "no report named a defect: the class check above proved nothing"


def test_a_budget_too_small_for_the_object_gives_uncertain_with_the_reason(model):
    grammar = build_report_grammar(sample_spec_chunks(), "CVR-310", 24)
    assert grammar.max_tokens > 24
    gen, raw = run(model, varied_image(7), grammar, 24)
    assert len(gen.tokens) == 24 and not gen.finished_by_eos
    parsed = parse_structured(raw, truncated=True)
    assert parsed.verdict == inspection_pb2.VERDICT_UNCERTAIN
    assert parsed.verdict_reason == REASON_TRUNCATED
    assert parsed.defects == []


def test_sessions_decoded_together_keep_their_own_grammar_state(model):
    """Several sessions in one generate() (one step for all per token) each end exactly as when run alone."""
    chunks = sample_spec_chunks()
    processor = model["processor"]
    cases = [(part, varied_image(100 + k)) for k, part in enumerate(["CVR-310", "PCB-410", "XYZ-999"])]
    alone, requests = {}, {}
    for k, (part, image) in enumerate(cases):
        grammar = build_report_grammar(chunks, part, BUDGET)
        gen, _ = run(model, image, grammar, BUDGET)
        alone[f"s{k}"] = gen.tokens
        instruction = f"{DEFAULT_INSTRUCTION}\n{schema_instruction(grammar.vocabulary)}"
        text = prompt_text(processor, build_messages(instruction))
        with torch.inference_mode():
            visual = model["tower"](model["pre"](image))[0]  # [N, vision_hidden]
        constraint = model["grammars"].constraint(grammar.text)
        requests[f"s{k}"] = Request(prompt_ids(processor, text), visual, max_new_tokens=BUDGET, constraint=constraint)
    together = model["pipeline"].generate(requests)
    assert {sid: g.tokens for sid, g in together.items()} == alone
    assert len({tuple(t) for t in alone.values()}) == len(cases)
