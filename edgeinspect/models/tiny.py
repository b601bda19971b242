"""Generated DeepSeek-VL checkpoints: a tiny one for tests and the embedded default, and random weights at the real
1.3B dimensions for benchmarks. Same classes and file layout as deepseek-community/deepseek-vl-1.3b-chat."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

BOS, EOS, PAD, IMAGE = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜pad｜>", "<image_placeholder>"
CORPUS = Path(__file__).with_name("tiny_corpus.txt")

# Same shape as DeepSeek-VL's chat format: optional system text, "User: ...", "Assistant:".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% else %}{{ 'User' if message['role'] == 'user' else 'Assistant' }}: "
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image_placeholder>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}\n\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Dimensions of a generated checkpoint (defaults: tiny, GQA, an odd layer count)."""

    layers: int = 5
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 176
    image_size: int = 64
    patch_size: int = 16
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 64
    vocab_size: int = 0  # 0: exactly the trained tokenizer's size
    tokenizer_vocab: int = 600
    seed: int = 0
    # Larger than transformers' 0.02 so that greedy output varies (an oracle test against one repeated token
    # proves nothing).
    initializer_range: float = 0.3
    max_position_embeddings: int = 4096

    @property
    def num_image_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2


# The real DeepSeek-VL 1.3B chat dimensions (SigLIP-L/16 at 384 px, a 24-layer LLaMA of width 2048).
PRESETS = {
    "deepseek-vl-1.3b": TinySpec(
        layers=24,
        hidden=2048,
        heads=16,
        kv_heads=16,
        intermediate=5632,
        image_size=384,
        patch_size=16,
        vision_hidden=1024,
        vision_layers=24,
        vision_heads=16,
        vision_intermediate=4096,
        vocab_size=102400,
        tokenizer_vocab=2000,
        initializer_range=0.02,
        max_position_embeddings=16384,
    ),
}


def train_tokenizer(vocab_size: int):
    """A byte-level BPE trained on the project's own text, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD, IMAGE],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.read_text().splitlines(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        extra_special_tokens={"image_token": IMAGE},
    )


def build_config(spec: TinySpec, tokenizer):
    from transformers import DeepseekVLConfig

    vocab = spec.vocab_size or len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size {vocab} is smaller than the tokenizer ({len(tokenizer)} tokens)")
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (("bos", BOS), ("eos", EOS), ("pad", PAD))}
    return DeepseekVLConfig(
        text_config=dict(
            model_type="llama",
            hidden_size=spec.hidden,
            intermediate_size=spec.intermediate,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            num_key_value_heads=spec.kv_heads,
            vocab_size=vocab,
            max_position_embeddings=spec.max_position_embeddings,
            rms_norm_eps=1e-6,
            initializer_range=spec.initializer_range,
            bos_token_id=ids["bos"],
            eos_token_id=ids["eos"],
            pad_token_id=ids["pad"],
            tie_word_embeddings=False,
        ),
        vision_config=dict(
            model_type="siglip_vision_model",
            hidden_size=spec.vision_hidden,
            intermediate_size=spec.vision_intermediate,
            num_hidden_layers=spec.vision_layers,
            num_attention_heads=spec.vision_heads,
            image_size=spec.image_size,
            patch_size=spec.patch_size,
            vision_use_head=False,
        ),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE),
        # DeepseekVLConfig defaults to tied embeddings; the real checkpoint is untied.
        tie_word_embeddings=False,
    )


def build_processor(spec: TinySpec, tokenizer):
    from transformers import DeepseekVLProcessor
    from transformers.models.deepseek_vl.image_processing_pil_deepseek_vl import DeepseekVLImageProcessorPil

    image_processor = DeepseekVLImageProcessorPil(size={"height": spec.image_size, "width": spec.image_size})
    return DeepseekVLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
        num_image_tokens=spec.num_image_tokens,
    )


def make_tiny(out: Path, spec: TinySpec = TinySpec()) -> Path:
    """Writes a seeded random-weight DeepSeek-VL checkpoint with save_pretrained; returns the folder."""
    from transformers import DeepseekVLForConditionalGeneration

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec.tokenizer_vocab)
    config = build_config(spec, tokenizer)
    torch.manual_seed(spec.seed)
    model = DeepseekVLForConditionalGeneration(config).eval()
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.save_pretrained(out)
    build_processor(spec, tokenizer).save_pretrained(out)
    log.info("wrote tiny checkpoint %s (%d params)", out, sum(p.numel() for p in model.parameters()))
    return out


def make_random_preset(
    out: Path,
    preset: str,
    dtype: torch.dtype = torch.float32,
    shard_bytes: int = 2 << 30,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Random weights at a real model's dimensions, streamed tensor by tensor into safetensors shards.

    The full model never sits in memory: it is built on the meta device for names and shapes only.
    `progress(done_bytes, total_bytes)` is called after each tensor.
    """
    from safetensors.torch import save_file
    from transformers import DeepseekVLForConditionalGeneration

    spec = PRESETS[preset]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec.tokenizer_vocab)
    config = build_config(spec, tokenizer)
    with torch.device("meta"):
        skeleton = DeepseekVLForConditionalGeneration(config)
    shapes = {name: tuple(t.shape) for name, t in skeleton.state_dict().items()}
    itemsize = torch.empty((), dtype=dtype).element_size()
    total = sum(_numel(s) for s in shapes.values()) * itemsize
    gen = torch.Generator().manual_seed(spec.seed)
    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_size, shard_no, done = 0, 0, 0

    def flush() -> None:
        nonlocal shard, shard_size, shard_no
        if shard:
            name = f"model-{shard_no + 1:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
            shard, shard_size, shard_no = {}, 0, shard_no + 1

    for name, shape in shapes.items():
        shard[name] = _random_tensor(name, shape, spec.initializer_range, gen).to(dtype)
        shard_size += _numel(shape) * itemsize
        done += _numel(shape) * itemsize
        if progress:
            progress(done, total)
        if shard_size >= shard_bytes:
            flush()
    flush()
    # Shards are named before their count is known; rename to the HF "-of-" convention.
    final_map: dict[str, str] = {}
    for i in range(shard_no):
        old = out / f"model-{i + 1:05d}.safetensors"
        new = f"model-{i + 1:05d}-of-{shard_no:05d}.safetensors"
        old.rename(out / new)
        final_map.update({k: new for k, v in weight_map.items() if v == old.name})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": final_map}, indent=2)
    )
    config.save_pretrained(out)
    build_processor(spec, tokenizer).save_pretrained(out)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _random_tensor(name: str, shape: tuple[int, ...], std: float, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("bias"):
        return torch.zeros(shape)
    if "norm" in name and name.endswith("weight"):
        return torch.ones(shape)
    return torch.randn(shape, generator=gen) * std
