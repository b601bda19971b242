"""Constrained decoding: a JSON Schema compiled for a checkpoint's tokenizer, one matcher per session.

xgrammar does the work (chosen by measurement against llguidance, see bench/grammar_bench.py): it compiles a schema
into a token-level automaton in tens of milliseconds and fills a next-token bitmask per step. Ids the tokenizer does
not have (vocab_size in the config may exceed the tokenizer) and special tokens are always masked; the stop token is
allowed exactly when the object is complete, and then it is the only token allowed, so the sampler emits EOS.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from edgeinspect.errors import FailedPrecondition, InvalidInput

log = logging.getLogger(__name__)

# Compact separators: no whitespace tokens to pay for, and the token bound of a schema is the bytes of its largest
# object.
SEPARATORS = (",", ":")
MAX_SCHEMA_CHARS = 64_000
DEFAULT_CACHE_ENTRIES = 32


def canonical_schema(schema: dict | str) -> str:
    """The schema as compact JSON text, so equal schemas hash alike. Key order is kept: the grammar writes
    properties in the order the schema lists them (the verdict first)."""
    obj = json.loads(schema) if isinstance(schema, str) else schema
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def schema_id(schema: dict | str) -> str:
    """A short content hash of the canonical schema; the gateway and the last stage compute it alike."""
    return hashlib.sha256(canonical_schema(schema).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class CompiledSchema:
    grammar_id: str
    compiled: object  # xgrammar.CompiledGrammar
    compile_ms: float


class GrammarCache:
    """Compiled grammars for one tokenizer, keyed by (schema hash, tokenizer fingerprint); least recently used
    entries are dropped beyond `max_entries`."""

    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_id: int,
        tokenizer_fingerprint: str,
        max_entries: int = DEFAULT_CACHE_ENTRIES,
    ):
        import xgrammar as xgr

        if vocab_size < len(tokenizer):
            raise InvalidInput(f"model vocab {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens")
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.tokenizer_fingerprint = tokenizer_fingerprint
        self.max_entries = max_entries
        # vocab_size = the model's: ids past the tokenizer are padding, which xgrammar never allows.
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=[eos_id])
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._entries: OrderedDict[tuple[str, str], CompiledSchema] = OrderedDict()

    def compile(self, schema: dict | str) -> CompiledSchema:
        """The compiled grammar for a schema, from the cache when it is there."""
        text = canonical_schema(schema)
        if len(text) > MAX_SCHEMA_CHARS:
            raise InvalidInput(f"schema is {len(text)} characters; at most {MAX_SCHEMA_CHARS}")
        gid = schema_id(text)
        key = (gid, self.tokenizer_fingerprint)
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit
        t0 = time.perf_counter()
        try:
            compiled = self._compiler.compile_json_schema(
                text, any_whitespace=False, separators=SEPARATORS, strict_mode=True
            )
        except (RuntimeError, ValueError) as exc:
            raise InvalidInput(f"the schema does not compile to a grammar: {exc}") from exc
        entry = CompiledSchema(gid, compiled, (time.perf_counter() - t0) * 1e3)
        self._entries[key] = entry
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        log.info("compiled grammar %s in %.1f ms", gid, entry.compile_ms)
        return entry

    def lookup(self, grammar_id: str) -> CompiledSchema | None:
        entry = self._entries.get((grammar_id, self.tokenizer_fingerprint))
        if entry is not None:
            self._entries.move_to_end((grammar_id, self.tokenizer_fingerprint))
        return entry

    def constraint(self, schema: dict | str) -> LogitsConstraint:
        return LogitsConstraint(self.compile(schema), self.vocab_size, self.eos_id)


class LogitsConstraint:
    """One session's grammar state: `mask(logits)` before sampling, `advance(token)` after it."""

    def __init__(self, schema: CompiledSchema, vocab_size: int, eos_id: int):
        import xgrammar as xgr

        self.grammar_id = schema.grammar_id
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self._matcher = xgr.GrammarMatcher(schema.compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # [1, ceil(vocab / 32)] int32
        self.dead_end = False

    @property
    def finished(self) -> bool:
        """The object is complete and the stop token was accepted."""
        return self._matcher.is_terminated()

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: [vocab] float32, masked in place (disallowed ids -> -inf) and returned."""
        import xgrammar as xgr

        if logits.shape != (self.vocab_size,):
            raise InvalidInput(f"logits {list(logits.shape)} do not match the grammar's vocab {self.vocab_size}")
        if self.finished or self.dead_end:
            return _only(logits, self.eos_id)
        self._matcher.fill_next_token_bitmask(self._bitmask)
        if not bool(self._bitmask.any()):
            # No token of this tokenizer continues the object (a character it cannot spell): end the session
            # rather than sample garbage; the parser turns the cut-off text into UNCERTAIN.
            log.warning("grammar %s: no token can continue the object; forcing EOS", self.grammar_id)
            self.dead_end = True
            return _only(logits, self.eos_id)
        xgr.apply_token_bitmask_inplace(logits.view(1, -1), self._bitmask, vocab_size=self.vocab_size)
        return logits

    def forced_tokens(self, limit: int) -> list[int]:
        """Jump-forward: the tokens the grammar forces from here (exactly one token allowed at each), accepted.

        Where the bitmask admits a single token, greedy sampling over the masked logits can only pick that token,
        whatever the model says, so appending it without a decode step leaves the output token for token what the
        step-by-step run writes (a forced-string jump would not: the same text can be spelt by other tokens). The
        stop token counts: a complete object is followed by EOS alone. At most `limit` tokens.
        """
        out: list[int] = []
        while len(out) < limit and not self.finished and not self.dead_end:
            self._matcher.fill_next_token_bitmask(self._bitmask)
            token = single_allowed(self._bitmask[0], self.vocab_size)
            if token is None:
                break
            self.advance(token)
            out.append(token)
        return out

    def advance(self, token: int) -> None:
        """Moves the matcher past the sampled token; a token the grammar refused is an error, never ignored."""
        if self.dead_end and token == self.eos_id:
            return
        if self.finished:
            raise FailedPrecondition(f"grammar {self.grammar_id}: the object is complete; no token may follow EOS")
        if not self._matcher.accept_token(int(token)):
            raise FailedPrecondition(f"grammar {self.grammar_id}: token {token} does not continue the object")


def single_allowed(bitmask: torch.Tensor, vocab_size: int) -> int | None:
    """The one token id a [ceil(vocab / 32)] int32 bitmask allows, or None when it allows none or several."""
    words = torch.nonzero(bitmask).flatten()
    if words.numel() != 1:
        return None
    w = int(words[0])
    bits = int(bitmask[w]) & 0xFFFFFFFF  # int32 words: bit 31 reads negative
    if bits & (bits - 1):
        return None
    token = w * 32 + bits.bit_length() - 1
    return token if token < vocab_size else None


def _only(logits: torch.Tensor, token: int) -> torch.Tensor:
    keep = logits[token].clone()
    logits.fill_(float("-inf"))
    logits[token] = keep
    return logits


class SessionConstraints:
    """The sampling stage's per-session constraints. Grammars arrive once per session as JSON keyed by their id
    (the schema hash) and stay cached; each session gets its own matcher, dropped on release."""

    def __init__(self, make_cache):
        self._make_cache = make_cache  # () -> GrammarCache; the tokenizer is loaded on first use only
        self._cache: GrammarCache | None = None
        self._sessions: dict[str, LogitsConstraint] = {}

    @property
    def cache(self) -> GrammarCache:
        if self._cache is None:
            self._cache = self._make_cache()
        return self._cache

    def for_step(self, session_id: str, grammar_id: str, grammar_json: str = "") -> LogitsConstraint | None:
        """The session's constraint (made on its first constrained step), or None when the step is unconstrained."""
        if not grammar_id:
            return self._sessions.get(session_id)
        current = self._sessions.get(session_id)
        if current is not None:
            if current.grammar_id != grammar_id:
                raise InvalidInput(f"session {session_id!r} is constrained by grammar {current.grammar_id}")
            return current
        if grammar_json:
            if schema_id(grammar_json) != grammar_id:
                raise InvalidInput(f"grammar_json does not hash to grammar_id {grammar_id}")
            compiled = self.cache.compile(grammar_json)
        else:
            compiled = self.cache.lookup(grammar_id)
            if compiled is None:
                raise FailedPrecondition(
                    f"grammar {grammar_id} is not cached at this stage; send grammar_json with the session's first step"
                )
        constraint = LogitsConstraint(compiled, self.cache.vocab_size, self.cache.eos_id)
        self._sessions[session_id] = constraint
        return constraint

    def release(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._sessions)


def grammar_cache_for(ckpt, max_entries: int = DEFAULT_CACHE_ENTRIES) -> GrammarCache:
    """A GrammarCache for a checkpoint's own tokenizer and model vocab."""
    from edgeinspect.models.checkpoint import load_processor

    tokenizer = load_processor(ckpt).tokenizer
    cfg = ckpt.text_config
    return GrammarCache(tokenizer, cfg.vocab_size, cfg.eos_token_id, ckpt.tokenizer_fingerprint, max_entries)


def logits_processor(constraint: LogitsConstraint, prompt_length: int):
    """The same constraint as a transformers LogitsProcessor (batch of one), for generate() as the oracle."""
    from transformers import LogitsProcessor

    class _Processor(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            # input_ids: [1, prompt + generated]; the newest generated token has not been fed to the matcher yet.
            if input_ids.shape[1] > prompt_length:
                constraint.advance(int(input_ids[0, -1]))
            row = scores[0].float().clone()  # [vocab]
            return constraint.mask(row).to(scores.dtype).unsqueeze(0)

    return _Processor()
