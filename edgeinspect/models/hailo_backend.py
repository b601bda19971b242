"""The vision tower on a Hailo accelerator through HailoRT's Python API (`hailo_platform`).

Which part: Hailo-8 and Hailo-8L (the Pi 5 AI Kit / AI HAT) run vision CNNs only; the real checkpoint's SigLIP-L
tower is a ViT-L-sized encoder and, like the gen-AI models, needs a Hailo-10H. On a Hailo-8/8L this backend can
serve only a tower that the DFC compiles for it (a CNN-sized encoder); otherwise choose torch or onnxruntime.

Written against HailoRT's InferModel API (`VDevice.create_infer_model(hef)` -> `configure()` -> bindings ->
`run_async`), which HailoRT's tutorials recommend over the older InferVStreams pipeline. Never run here (no Hailo
device or HailoRT wheel on the build machine): treat it as untested until it has run on the hardware.

The HEF is compiled offline with Hailo's Dataflow Compiler (DFC, x86 Linux) from our ONNX export; HEFs need a
static batch, and the DFC quantises with a calibration set of preprocessed frames ([n, S, S, 3] float32 .npy,
channels last, made with our ImagePreprocessor from real station images):

    edgeinspect model export-vision CKPT vision.onnx
    hailo parser onnx vision.onnx --hw-arch hailo8l --net-name siglip_vision
    hailo optimize siglip_vision.har --hw-arch hailo8l --calib-set-path calib.npy
    hailo compiler siglip_vision_optimized.har --hw-arch hailo8l   # -> siglip_vision.hef

A HEF carries no metadata of ours, so the checkpoint cannot be verified from it: the node checks the input and
output shapes against the checkpoint and logs the HEF it serves; name HEF files after the checkpoint fingerprint.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from edgeinspect.errors import CheckpointError, InvalidInput

log = logging.getLogger(__name__)

NOT_INSTALLED = (
    "HailoRT Python package hailo_platform is not installed: install the wheel that ships with HailoRT "
    "(hailort-<version>-cp311-cp311-linux_aarch64.whl from Hailo's Developer Zone, same version as the HailoRT "
    "driver) into this environment, or choose backend torch or onnxruntime"
)


def import_hailo() -> ModuleType:
    """hailo_platform, or CheckpointError (FAILED_PRECONDITION) saying how to install it."""
    try:
        import hailo_platform  # pyright: ignore[reportMissingImports] (HailoRT's wheel: not on PyPI, not here)
    except ImportError as exc:
        raise CheckpointError(NOT_INSTALLED) from exc
    return hailo_platform


# How long one batch may wait for the device (ms): a frame takes tens of ms on a Hailo-8L, a stuck device forever.
RUN_TIMEOUT_MS = 10_000


class HailoVisionBackend:
    """pixel_values [B, 3, S, S] -> visual tokens [B, N, D] on the Hailo device (float32 in and out).

    One VDevice and one configured InferModel for the life of the node (configuring costs milliseconds); each call
    binds one input/output buffer pair per frame and runs them as one async job."""

    name = "hailo"

    def __init__(self, hef_path: Path, image_size: int, num_tokens: int, hidden: int, max_batch: int = 1) -> None:
        hp = import_hailo()
        if not Path(hef_path).is_file():
            raise CheckpointError(f"HEF file {hef_path} does not exist (compile it from the ONNX export)")
        self._stack = contextlib.ExitStack()
        try:
            params = hp.VDevice.create_params()
            # The scheduler lets another model (a second HEF on the same device) share it without manual switching.
            params.scheduling_algorithm = hp.HailoSchedulingAlgorithm.ROUND_ROBIN
            self._vdevice = self._stack.enter_context(hp.VDevice(params))
            model = self._vdevice.create_infer_model(str(hef_path))
            if len(model.input_names) != 1 or len(model.output_names) != 1:
                raise CheckpointError(
                    f"{hef_path}: expected one input and one output, found {len(model.input_names)} and "
                    f"{len(model.output_names)}"
                )
            model.set_batch_size(max_batch)
            model.input().set_format_type(hp.FormatType.FLOAT32)
            model.output().set_format_type(hp.FormatType.FLOAT32)
            # Hailo streams are channels-last per frame: (H, W, C).
            self._in_shape = tuple(int(d) for d in model.input().shape)
            self._out_shape = tuple(int(d) for d in model.output().shape)
            if self._in_shape != (image_size, image_size, 3):
                raise CheckpointError(
                    f"{hef_path} takes frames of shape {self._in_shape}, the checkpoint's vision tower "
                    f"{(image_size, image_size, 3)}: compiled from another model?"
                )
            if math.prod(self._out_shape) != num_tokens * hidden:
                raise CheckpointError(
                    f"{hef_path} outputs {self._out_shape} per frame, expected {num_tokens}x{hidden} values"
                )
            self._configured = self._stack.enter_context(model.configure())
        except BaseException:
            self._stack.close()
            raise
        self._num_tokens, self._hidden = num_tokens, hidden
        log.info("hailo backend: %s, input %s, output %s", hef_path, self._in_shape, self._out_shape)

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch = pixel_values.shape[0]
        frames = pixel_values.permute(0, 2, 3, 1).contiguous().numpy().astype(np.float32)  # [B, S, S, 3]
        if tuple(frames.shape[1:]) != self._in_shape:
            raise InvalidInput(f"pixel frames {tuple(frames.shape[1:])} do not match the HEF's {self._in_shape}")
        outputs = np.empty((batch, *self._out_shape), dtype=np.float32)  # the device writes into these
        bindings = []
        for k in range(batch):
            b = self._configured.create_bindings()
            b.input().set_buffer(np.ascontiguousarray(frames[k]))
            b.output().set_buffer(outputs[k])
            bindings.append(b)
        self._configured.wait_for_async_ready(timeout_ms=RUN_TIMEOUT_MS, frames_count=batch)
        job = self._configured.run_async(bindings)
        job.wait(RUN_TIMEOUT_MS)
        return torch.from_numpy(outputs.reshape(batch, self._num_tokens, self._hidden))  # [B, N, D]

    def close(self) -> None:
        self._stack.close()
