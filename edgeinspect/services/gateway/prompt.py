"""The prompt, from the request's text to the token ids a session decodes: the request's limit (checked once at the
edge, and on a model version's own prompt), the ids the Inspector sends (system prompt, spec context, image
placeholders, instruction, the report schema when output is structured), the shared prefix the stages may cache,
and the digest a report records of what it was asked.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from edgeinspect.errors import InvalidInput
from edgeinspect.models.checkpoint import Checkpoint
from edgeinspect.models.prompt import DEFAULT_INSTRUCTION, build_messages, prompt_ids, prompt_text
from edgeinspect.services.gateway.reports.schema import ReportGrammar, build_report_grammar, schema_instruction
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.v1 import inspection_pb2, retrieval_pb2

MAX_PROMPT_CHARS = 2000
MIN_PREFIX_TOKENS = 16  # shorter shared prefixes cost more in bookkeeping than they save


def check_prompt(prompt: str) -> None:
    """A request's prompt, or a model version's (it replaces an empty request prompt)."""
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidInput(f"prompt is {len(prompt)} characters; at most {MAX_PROMPT_CHARS}")


def prompt_digest(ids: list[int], grammar_id: str) -> str:
    """ModelInfo.prompt_sha256: the prompt's token ids and the report schema's id, hashed together. Two reports
    with the same digest were asked the same thing under the same constraint (what a model version's prompt and
    KB change, and what an evaluation records)."""
    h = hashlib.sha256(array("q", ids).tobytes())
    h.update(grammar_id.encode())
    return h.hexdigest()


@dataclass
class Prompt:
    ids: list[int]
    chunks: list[retrieval_pb2.SpecChunk]
    grammar: ReportGrammar | None
    budget: int
    degraded: list[str] = field(default_factory=list)


class PromptBuilder:
    """The prompts of one model version: its checkpoint's processor and context, the gateway's prompt settings."""

    def __init__(self, cfg: GatewaySettings, ckpt: Checkpoint, processor) -> None:
        self.cfg = cfg
        self.processor = processor
        self.context_limit = ckpt.text_config.max_position_embeddings
        self.image_token_id = ckpt.config.image_token_id

    def prompt(
        self,
        req: inspection_pb2.InspectRequest,
        chunks: list[retrieval_pb2.SpecChunk],
        extra: str = "",
        captions: Sequence[str] = (),
    ) -> Prompt:
        """The prompt ids (system + spec context + image placeholders + instruction). It must fit the model's
        context with the budget of new tokens: spec chunks are dropped from the end until it does (said in the
        report), and a prompt that cannot fit even without them is refused naming both numbers. captions: one image
        per caption (the evidence of a flagged part, evidence.py); none: the frame alone."""
        budget = req.max_new_tokens or self.cfg.max_new_tokens
        degraded: list[str] = []
        total = len(chunks)
        while True:
            prompt = self._build(req, chunks, budget, extra, captions)
            need = len(prompt.ids) + budget
            if need <= self.context_limit:
                break
            if not chunks:
                raise InvalidInput(
                    f"the prompt is {len(prompt.ids)} tokens and the budget {budget} new tokens: {need} positions, "
                    f"but the model's context holds {self.context_limit}; shorten the prompt or lower max_new_tokens"
                )
            chunks = chunks[:-1]
        if len(chunks) < total:
            degraded.append(
                f"spec context trimmed to fit the model context: {total - len(chunks)} of {total} chunks dropped"
            )
        prompt.degraded = degraded
        return prompt

    def _build(self, req, chunks, budget: int, extra: str, captions: Sequence[str]) -> Prompt:
        context = "\n".join(f"[{c.doc_id} / {c.section}] {c.text}" for c in chunks)
        # extra: where the anomaly gate flagged the frame; after the image, so the cached prefix stays shared.
        instruction = "\n".join(x for x in (req.prompt or DEFAULT_INSTRUCTION, extra) if x)
        # Verification compares with unconstrained generate(), so it is never constrained.
        grammar = None
        if self.cfg.structured_output and not req.verification:
            grammar = build_report_grammar(chunks, req.part, budget)
            instruction = f"{instruction}\n{schema_instruction(grammar.vocabulary)}"
        messages = build_messages(instruction, context, captions=captions)
        ids = prompt_ids(self.processor, prompt_text(self.processor, messages))
        return Prompt(ids, list(chunks), grammar, budget)

    def prefix_length(self, ids: list[int]) -> int:
        """The shared prompt prefix (system prompt + spec context): everything before the image, which is the same
        for every frame of a part; 0 when prefix caching is off or the prefix is too short to be worth it."""
        image_id = self.image_token_id
        if not self.cfg.prefix_cache or image_id not in ids:
            return 0
        n = ids.index(image_id)
        return n if n >= MIN_PREFIX_TOKENS else 0
