"""The vision tower as ONNX (pixel_values -> visual tokens before the aligner), stamped with its checkpoint.

`edgeinspect model export-vision CKPT OUT [--opset N] [--int8]`. The file carries the checkpoint fingerprint in
its metadata_props; loading it against another checkpoint is refused, because a vision node serving tokens from a
different SigLIP than the decoder expects produces fluent garbage.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import typer

from edgeinspect.errors import CheckpointError

log = logging.getLogger(__name__)

INPUT_NAME = "pixel_values"
OUTPUT_NAME = "visual_tokens"
META_FINGERPRINT = "edgeinspect.checkpoint_fingerprint"
META_QUANT = "edgeinspect.quantization"
META_IMAGE_SIZE = "edgeinspect.image_size"
DEFAULT_OPSET = 18


def export_vision_onnx(ckpt_path: Path, out: Path, opset: int = DEFAULT_OPSET, int8: bool = False) -> Path:
    """Exports the checkpoint's vision tower (fp32; dynamic batch axis) to `out`; int8: dynamic quantisation."""
    import torch

    from edgeinspect.models.checkpoint import open_checkpoint
    from edgeinspect.models.vision import load_vision_tower

    ckpt = open_checkpoint(ckpt_path)
    tower = load_vision_tower(ckpt, "fp32")
    size = ckpt.vision_config.image_size
    example = torch.zeros(2, 3, size, size)  # [B, 3, S, S]; batch 2 so the exporter cannot specialise on 1
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
        fp32_path = Path(tmp) / "vision.onnx"
        with torch.no_grad():
            torch.onnx.export(
                tower,
                (example,),
                str(fp32_path),
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                opset_version=opset,
                dynamo=True,
                dynamic_shapes={INPUT_NAME: {0: torch.export.Dim("batch")}},
                external_data=False,
                verbose=False,
            )
        source = fp32_path
        if int8:
            source = _quantize(fp32_path, Path(tmp) / "vision-int8.onnx")
        _write_stamped(source, out, ckpt.fingerprint, size, "int8-dynamic" if int8 else "none")
    log.info("exported vision tower of %s (%s) to %s%s", ckpt.path, ckpt.fingerprint, out, " (int8)" if int8 else "")
    return out


def quantize_vision_onnx(src: Path, out: Path) -> Path:
    """Dynamic int8 copy of an fp32 export, keeping its checkpoint stamp."""
    meta = onnx_metadata(src)
    if META_FINGERPRINT not in meta:
        raise CheckpointError(f"{src} carries no {META_FINGERPRINT} metadata: not one of our exports")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".quantize-") as tmp:
        quantized = _quantize(Path(src), Path(tmp) / "vision-int8.onnx")
        _write_stamped(quantized, out, meta[META_FINGERPRINT], int(meta[META_IMAGE_SIZE]), "int8-dynamic")
    return out


def _quantize(src: Path, dst: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Weights of MatMul/Gemm to int8, activations quantised per call: no calibration set needed.
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    return dst


def _write_stamped(src: Path, out: Path, fingerprint: str, image_size: int, quantization: str) -> None:
    """Copies the model to `out` (atomically) with our metadata_props set."""
    import onnx

    model = onnx.load(str(src))
    stamp = {META_FINGERPRINT: fingerprint, META_QUANT: quantization, META_IMAGE_SIZE: str(image_size)}
    kept = [p for p in model.metadata_props if p.key not in stamp]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in stamp.items():
        model.metadata_props.add(key=key, value=value)
    partial = out.with_name(f".{out.name}.partial")
    onnx.save(model, str(partial))
    os.replace(partial, out)


def onnx_metadata(path: Path) -> dict[str, str]:
    """The custom metadata of an ONNX file (read through onnxruntime: no second copy of the weights)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return dict(session.get_modelmeta().custom_metadata_map)


def check_onnx_matches(metadata: dict[str, str], path: Path, fingerprint: str) -> None:
    """Refuses an ONNX export whose stamped checkpoint fingerprint is not `fingerprint`."""
    stamped = metadata.get(META_FINGERPRINT)
    if stamped is None:
        raise CheckpointError(
            f"{path} carries no {META_FINGERPRINT} metadata: export it with `edgeinspect model export-vision`"
        )
    if stamped != fingerprint:
        raise CheckpointError(
            f"{path} was exported from checkpoint {stamped}, but this node serves checkpoint {fingerprint}: "
            "re-export it with `edgeinspect model export-vision`"
        )


def export_vision_command(
    checkpoint: Path = typer.Argument(..., help="DeepSeek-VL checkpoint folder (Hugging Face format)"),
    out: Path = typer.Argument(..., help="ONNX file to write (e.g. var/onnx/vision.onnx)"),
    opset: int = typer.Option(DEFAULT_OPSET, "--opset", help="ONNX opset version"),
    int8: bool = typer.Option(
        False, "--int8", help="dynamic int8 quantisation of the weights (onnxruntime.quantization)"
    ),
) -> None:
    """Export the vision tower (pixels -> visual tokens, before the aligner) to ONNX for the onnxruntime backend."""
    from rich.console import Console

    path = export_vision_onnx(checkpoint, out, opset=opset, int8=int8)
    meta = onnx_metadata(path)
    Console().print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, checkpoint {meta[META_FINGERPRINT]}, "
        f"quantization {meta[META_QUANT]})"
    )
