"""Building the model prompt: system text, spec context, the image, the instruction, via the chat template."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_SYSTEM = (
    "You are an industrial visual inspection assistant. You inspect one part per image against the plant's "
    "defect specifications and write a defect report."
)
DEFAULT_INSTRUCTION = (
    "Inspect the part in the image. Give the verdict (OK, DEFECT or UNCERTAIN), then each defect with class, "
    "severity, location and evidence, then a short description."
)


def build_messages(
    instruction: str = DEFAULT_INSTRUCTION,
    context: str = "",
    system: str = DEFAULT_SYSTEM,
    captions: Sequence[str] = (),
) -> list:
    """Chat messages with one image; spec context goes into the system turn, before the image. With captions: one
    image per caption, each followed by its caption (the words that tell the model which image is which), so that
    everything before the first image stays the one-image prompt's (the stages' cached prefix)."""
    system_text = f"{system}\n\nDefect specifications:\n{context}" if context else system
    shown: list[dict] = [{"type": "image"}]
    if captions:
        shown = [item for caption in captions for item in ({"type": "image"}, {"type": "text", "text": f"{caption}\n"})]
    return [
        {"role": "system", "content": system_text},
        {"role": "user", "content": [*shown, {"type": "text", "text": instruction}]},
    ]


def prompt_text(processor, messages: list) -> str:
    return processor.apply_chat_template(messages, add_generation_prompt=True)


def prompt_ids(processor, text: str) -> list[int]:
    """Token ids with each image placeholder expanded to num_image_tokens copies, as DeepseekVLProcessor does."""
    expanded = text.replace(processor.image_token, processor.image_token * processor.num_image_tokens)
    return list(processor.tokenizer(expanded)["input_ids"])
