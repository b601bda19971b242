"""`edgeinspect model make-tiny | info | export-vision`: checkpoints from the terminal."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from edgeinspect.cli.plan import Preset
from edgeinspect.models.onnx_export import DEFAULT_OPSET


class DiskDtype(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"


app = typer.Typer(no_args_is_help=True)


@app.command("make-tiny")
def make_tiny_command(
    out: Path = typer.Argument(..., help="folder to write the checkpoint into (created if missing)"),
    preset: Preset | None = typer.Option(
        None, help="write random weights at a real model's dimensions instead (~7.8 GB in fp32)"
    ),
    layers: int = typer.Option(5, help="language-model layers"),
    hidden: int = typer.Option(64, help="language-model width"),
    heads: int = typer.Option(4, help="attention heads"),
    kv_heads: int = typer.Option(2, help="key/value heads (< heads: grouped-query attention)"),
    image_size: int = typer.Option(64, help="input image side in pixels (visual tokens = (size/16)^2)"),
    seed: int = typer.Option(0, help="weight seed"),
    weights: DiskDtype = typer.Option(DiskDtype.fp32, help="preset only: dtype written to disk"),
) -> None:
    """Generate a DeepSeek-VL checkpoint with seeded random weights and a locally trained tokenizer.

    The result is an ordinary Hugging Face folder (config, safetensors, tokenizer, processor): every role loads it
    exactly as it loads deepseek-community/deepseek-vl-1.3b-chat.
    """
    import os

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from edgeinspect.models.checkpoint import open_checkpoint, torch_dtype
    from edgeinspect.models.tiny import PRESETS, TinySpec, make_random_preset, make_tiny

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    console = Console()
    if preset is not None:
        preset_name = preset.value
        if preset_name not in PRESETS:  # the enum and the table of dimensions drifted apart
            raise typer.BadParameter(f"unknown preset {preset_name!r}; choose one of {', '.join(PRESETS)}")
        dtype = torch_dtype(weights.value)
        gb = 7.8 if weights is DiskDtype.fp32 else 3.9
        console.print(f"Writing random weights at {preset_name} dimensions to {out}: about {gb} GB on disk.")
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("weights", total=None)
            make_random_preset(
                out, preset_name, dtype, progress=lambda done, total: bar.update(task, completed=done, total=total)
            )
    else:
        spec = TinySpec(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, image_size=image_size, seed=seed)
        make_tiny(out, spec)
    ckpt = open_checkpoint(out)
    console.print(f"[green]Checkpoint ready[/green] {ckpt.path}  fingerprint {ckpt.fingerprint}")


@app.command("info")
def info_command(checkpoint: Path = typer.Argument(..., help="checkpoint folder")) -> None:
    """Show a checkpoint's dimensions, fingerprints and weight sizes."""
    from rich.console import Console
    from rich.table import Table

    from edgeinspect.models.checkpoint import open_checkpoint

    ckpt = open_checkpoint(checkpoint)
    t, v = ckpt.text_config, ckpt.vision_config
    table = Table(title=str(ckpt.path), show_header=False)
    rows = [
        ("fingerprint", ckpt.fingerprint),
        ("tokenizer fingerprint", ckpt.tokenizer_fingerprint),
        (
            "language model",
            f"{t.num_hidden_layers} layers, width {t.hidden_size}, {t.num_attention_heads} heads "
            f"({t.num_key_value_heads} kv), vocab {t.vocab_size}",
        ),
        ("vision tower", f"{v.num_hidden_layers} layers, width {v.hidden_size}, {v.image_size} px / {v.patch_size}"),
        # transformers types both as int | list | tuple; a SigLIP vision config holds ints
        ("visual tokens", str((v.image_size // v.patch_size) ** 2)),  # pyright: ignore[reportOperatorIssue]
        ("weight files", ", ".join(p.name for p in ckpt.weight_files)),
    ]
    for k, val in rows:
        table.add_row(k, val)
    Console().print(table)


@app.command("export-vision")
def export_vision_command(
    checkpoint: Path = typer.Argument(..., help="DeepSeek-VL checkpoint folder (Hugging Face format)"),
    out: Path = typer.Argument(..., help="ONNX file to write (e.g. var/onnx/vision.onnx)"),
    opset: int = typer.Option(DEFAULT_OPSET, "--opset", help="ONNX opset version"),
    int8: bool = typer.Option(
        False,
        "--int8",
        help="dynamic int8 weights (onnxruntime.quantization), checked against fp32 on this CPU: 7-bit weights where "
        "8-bit ones saturate (AVX2 without VNNI), refused where neither keeps the visual tokens close",
    ),
) -> None:
    """Export the vision tower (pixels -> visual tokens, before the aligner) to ONNX for the onnxruntime backend."""
    import tempfile

    from rich.console import Console

    from edgeinspect.models.onnx_export import (
        META_FINGERPRINT,
        META_QUANT,
        META_WEIGHT_BITS,
        export_vision_onnx,
        onnx_metadata,
    )
    from edgeinspect.models.vision_int8 import META_CHECKED_COSINE, build_int8_copy, sample_frames

    if int8:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
            fp32 = export_vision_onnx(checkpoint, Path(tmp) / "vision.onnx", opset=opset)
            path = build_int8_copy(fp32, out, sample_frames(checkpoint, static=False), static=False)
    else:
        path = export_vision_onnx(checkpoint, out, opset=opset)
    meta = onnx_metadata(path)
    int8_note = ""
    if META_WEIGHT_BITS in meta:
        int8_note = f", {meta[META_WEIGHT_BITS]}-bit weights, worst token cosine {meta[META_CHECKED_COSINE]} here"
    Console().print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, checkpoint {meta[META_FINGERPRINT]}, "
        f"quantization {meta[META_QUANT]}{int8_note})"
    )
