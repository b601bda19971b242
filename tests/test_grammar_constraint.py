"""The per-session grammar constraint: masks, EOS at the end state, padding ids, the grammar cache, release."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from edgeinspect.errors import FailedPrecondition, InvalidInput
from edgeinspect.models.checkpoint import load_processor, open_checkpoint
from edgeinspect.models.grammar import GrammarCache, SessionConstraints, grammar_cache_for, schema_id
from edgeinspect.services.gateway.reports.schema import build_report_grammar


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint):
    return open_checkpoint(tiny_checkpoint)


@pytest.fixture(scope="module")
def tokenizer(ckpt):
    return load_processor(ckpt).tokenizer


@pytest.fixture(scope="module")
def grammar():
    return build_report_grammar([], "", 160)


def _random_walk(constraint, vocab: int, eos: int, seed: int, limit: int = 600) -> tuple[list[int], bool]:
    """Greedy over random logits under the constraint: the worst case for a grammar (no model preference)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = []
    for _ in range(limit):
        logits = torch.randn(vocab, generator=gen) * 4  # [vocab]
        token = int(torch.argmax(constraint.mask(logits)))
        constraint.advance(token)
        if token == eos:
            return tokens, True
        tokens.append(token)
    return tokens, False


def test_random_logits_under_the_constraint_always_give_a_valid_report_then_eos(ckpt, tokenizer, grammar):
    cache = grammar_cache_for(ckpt)
    eos = ckpt.text_config.eos_token_id
    for seed in range(10):
        constraint = cache.constraint(grammar.text)
        tokens, ended = _random_walk(constraint, ckpt.text_config.vocab_size, eos, seed)
        assert ended and constraint.finished
        assert len(tokens) + 1 <= grammar.max_tokens  # the schema's token bound holds
        jsonschema.validate(json.loads(tokenizer.decode(tokens)), grammar.schema)


def test_after_the_closing_brace_eos_is_the_only_token_allowed(ckpt, tokenizer, grammar):
    cache = grammar_cache_for(ckpt)
    constraint = cache.constraint(grammar.text)
    text = json.dumps({"verdict": "OK", "defects": [], "description": "fine"}, separators=(",", ":"))
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        constraint.mask(torch.zeros(ckpt.text_config.vocab_size))
        constraint.advance(token)
    masked = constraint.mask(torch.zeros(ckpt.text_config.vocab_size))
    allowed = torch.isfinite(masked).nonzero().flatten().tolist()
    assert allowed == [ckpt.text_config.eos_token_id]
    constraint.advance(ckpt.text_config.eos_token_id)
    assert constraint.finished


def test_padding_ids_past_the_tokenizer_and_special_tokens_are_never_allowed(tokenizer, grammar):
    vocab = len(tokenizer) + 50  # a model whose embedding rows outnumber the tokenizer
    cache = GrammarCache(tokenizer, vocab, tokenizer.eos_token_id, "fp-test")
    constraint = cache.constraint(grammar.text)
    logits = torch.zeros(vocab)
    logits[len(tokenizer) :] = 100.0  # the padding ids would win without the mask
    masked = constraint.mask(logits)
    assert torch.isinf(masked[len(tokenizer) :]).all()
    specials = [tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<image_placeholder>")]
    assert torch.isinf(masked[specials]).all()
    assert torch.isfinite(masked[: len(tokenizer)]).any()


def test_a_refused_token_is_an_error_not_skipped(ckpt, grammar):
    constraint = grammar_cache_for(ckpt).constraint(grammar.text)
    masked = constraint.mask(torch.zeros(ckpt.text_config.vocab_size))
    refused = int(torch.isinf(masked).nonzero()[0])
    with pytest.raises(FailedPrecondition):
        constraint.advance(refused)


def test_grammars_are_cached_per_schema_and_tokenizer(tokenizer, grammar):
    cache = GrammarCache(tokenizer, len(tokenizer), tokenizer.eos_token_id, "fp-a", max_entries=2)
    first = cache.compile(grammar.schema)
    assert cache.compile(grammar.text) is first  # dict or text, same canonical schema
    assert first.grammar_id == grammar.grammar_id == schema_id(grammar.schema)
    other = GrammarCache(tokenizer, len(tokenizer), tokenizer.eos_token_id, "fp-b")
    assert other.lookup(grammar.grammar_id) is None  # another tokenizer fingerprint never shares entries
    cache.compile(build_report_grammar([], "", 200).schema)
    cache.compile(build_report_grammar([], "", 300).schema)
    assert cache.lookup(grammar.grammar_id) is None  # least recently used, dropped beyond max_entries


def test_session_constraints_register_by_id_keep_state_per_session_and_drop_it_on_release(ckpt, grammar):
    sessions = SessionConstraints(lambda: grammar_cache_for(ckpt))
    with pytest.raises(FailedPrecondition, match="send grammar_json"):
        sessions.for_step("a", grammar.grammar_id)
    with pytest.raises(InvalidInput, match="does not hash"):
        sessions.for_step("a", "0" * 24, grammar.text)
    a = sessions.for_step("a", grammar.grammar_id, grammar.text)
    b = sessions.for_step("b", grammar.grammar_id)  # cached by id: later sessions send the id only
    assert a is not b and sessions.for_step("a", grammar.grammar_id) is a
    assert sessions.for_step("a", "") is a  # later steps may omit the id
    assert sessions.for_step("c", "") is None  # unconstrained sessions stay unconstrained
    sessions.release("a")
    assert len(sessions) == 1
    fresh = sessions.for_step("a", grammar.grammar_id)
    assert fresh is not a


def test_a_schema_that_does_not_compile_is_invalid_input(tokenizer):
    cache = GrammarCache(tokenizer, len(tokenizer), tokenizer.eos_token_id, "fp")
    with pytest.raises(InvalidInput):
        cache.compile({"type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}})
