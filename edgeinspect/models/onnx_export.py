"""The vision tower as ONNX (pixel_values -> visual tokens before the aligner), stamped with its checkpoint.

`edgeinspect model export-vision CKPT OUT [--opset N] [--int8]`. The file carries the checkpoint fingerprint in
its metadata_props; loading it against another checkpoint is refused, because a vision node serving tokens from a
different SigLIP than the decoder expects produces fluent garbage.

Two int8 copies: dynamic (weights int8, activations quantised per call; the CPU's) and static QDQ
(QuantizeLinear/DequantizeLinear pairs with scales calibrated on sample frames), the one int8 a GPU runs: the CUDA
provider sends dynamic quantisation's nodes back to the host and TensorRT cannot parse them (DESIGN §9).
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from edgeinspect.errors import CheckpointError

log = logging.getLogger(__name__)

INPUT_NAME = "pixel_values"
OUTPUT_NAME = "visual_tokens"
META_FINGERPRINT = "edgeinspect.checkpoint_fingerprint"
META_QUANT = "edgeinspect.quantization"
META_IMAGE_SIZE = "edgeinspect.image_size"
META_WEIGHT_BITS = "edgeinspect.int8_weight_bits"  # 8, or 7 (reduce_range) where 8-bit saturates: models/vision_int8
DEFAULT_OPSET = 18
QUANT_QDQ = "int8-qdq"  # META_QUANT of the static copy ("int8-dynamic": the dynamic one, "none": fp32)
# The linears carry SigLIP's weight bytes and FLOPs; attention's score MatMuls are MatMul too. Norms, GELU and
# softmax stay fp32 between DequantizeLinear and QuantizeLinear.
QDQ_OPS = ["MatMul", "Gemm", "Conv"]
CALIBRATION_PER_PART = 4  # good + defective frames of each of the sample set's 4 parts: 32 frames


def export_vision_onnx(ckpt_path: Path, out: Path, opset: int = DEFAULT_OPSET) -> Path:
    """Exports the checkpoint's vision tower (fp32; dynamic batch axis) to `out` (int8 copies: models/vision_int8)."""
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
        _write_stamped(fp32_path, out, ckpt.fingerprint, size, "none")
    log.info("exported vision tower of %s (%s) to %s", ckpt.path, ckpt.fingerprint, out)
    return out


def quantize_vision_onnx(src: Path, out: Path, weight_bits: int = 8) -> Path:
    """Dynamic int8 copy of an fp32 export, keeping its checkpoint stamp; weight_bits 7: reduce_range."""
    meta = onnx_metadata(src)
    if META_FINGERPRINT not in meta:
        raise CheckpointError(f"{src} carries no {META_FINGERPRINT} metadata: not one of our exports")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".quantize-") as tmp:
        quantized = _quantize(Path(src), Path(tmp) / "vision-int8.onnx", reduce_range=_reduce_range(weight_bits))
        _write_stamped(
            quantized,
            out,
            meta[META_FINGERPRINT],
            int(meta[META_IMAGE_SIZE]),
            "int8-dynamic",
            {META_WEIGHT_BITS: str(weight_bits)},
        )
    return out


def quantize_vision_qdq(src: Path, out: Path, calibration: Iterable[np.ndarray], weight_bits: int = 8) -> Path:
    """Static QDQ int8 copy of an fp32 export, keeping its checkpoint stamp. `calibration`: pixel_values batches
    ([B, 3, S, S] float32, the checkpoint's preprocessing) whose activation ranges set the scales; weight_bits 7:
    reduce_range."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    meta = onnx_metadata(src)
    if META_FINGERPRINT not in meta:
        raise CheckpointError(f"{src} carries no {META_FINGERPRINT} metadata: not one of our exports")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".quantize-") as tmp:
        prepared = Path(tmp) / "vision-prep.onnx"
        quant_pre_process(str(src), str(prepared), skip_symbolic_shape=True)
        quantized = Path(tmp) / "vision-qdq.onnx"
        quantize_static(
            str(prepared),
            str(quantized),
            _Frames(calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=QDQ_OPS,
            per_channel=True,  # one scale per output channel of a weight: SigLIP's rows differ widely in range
            activation_type=QuantType.QInt8,  # symmetric int8 activations: what TensorRT's int8 kernels take
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            reduce_range=_reduce_range(weight_bits),
            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
        )
        _write_stamped(
            quantized,
            out,
            meta[META_FINGERPRINT],
            int(meta[META_IMAGE_SIZE]),
            QUANT_QDQ,
            {META_WEIGHT_BITS: str(weight_bits)},
        )
    return out


def sample_calibration(ckpt_path: Path, per_part: int = CALIBRATION_PER_PART, seed: int = 0) -> list[np.ndarray]:
    """Calibration batches: good and defective frames of every part of the drawn sample set
    (models/anomaly/sample.py), through the checkpoint's own preprocessing; one [1, 3, S, S] batch each."""
    from PIL import Image

    from edgeinspect.models.anomaly.sample import PARTS, defect_frame, good_frame
    from edgeinspect.models.checkpoint import open_checkpoint
    from edgeinspect.models.vision import ImagePreprocessor

    pre = ImagePreprocessor(open_checkpoint(ckpt_path))
    rng = np.random.default_rng(seed)
    frames = []
    for part, (_, kinds) in PARTS.items():
        for k in range(per_part):
            frames.append(good_frame(part, rng))
            kind = list(kinds)[k % len(kinds)]
            frames.append(defect_frame(part, kind, 1 + k % 3, rng)[0])
    return [pre(Image.fromarray(f)).numpy() for f in frames]


class _Frames:
    """onnxruntime's CalibrationDataReader over pixel_values batches."""

    def __init__(self, batches: Iterable[np.ndarray]) -> None:
        self._it = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._it, None)
        return None if batch is None else {INPUT_NAME: np.ascontiguousarray(batch, dtype=np.float32)}


def _reduce_range(weight_bits: int) -> bool:
    if weight_bits not in (7, 8):
        raise ValueError(f"int8 weights are 8 or 7 bits wide (reduce_range), not {weight_bits}")
    return weight_bits == 7


def _quantize(src: Path, dst: Path, reduce_range: bool = False) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Weights of MatMul/Gemm to int8, activations quantised per call: no calibration set needed.
    quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=reduce_range)
    return dst


def restamp(src: Path, out: Path, props: dict[str, str]) -> None:
    """Copies an export to `out` (atomically; `out` may be `src`) with `props` set in its metadata_props."""
    import onnx

    model = onnx.load(str(src))
    _set_props(model, props)
    _save_atomic(model, out)


def _write_stamped(
    src: Path, out: Path, fingerprint: str, image_size: int, quantization: str, extra: dict[str, str] | None = None
) -> None:
    """Copies the model to `out` (atomically) with our metadata_props set."""
    import onnx

    model = onnx.load(str(src))
    stamp = {META_FINGERPRINT: fingerprint, META_QUANT: quantization, META_IMAGE_SIZE: str(image_size)}
    _set_props(model, stamp | (extra or {}))
    _save_atomic(model, out)


def _set_props(model, props: dict[str, str]) -> None:
    kept = [p for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)


def _save_atomic(model, out: Path) -> None:
    import onnx

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
