"""The vision tower on a Hailo-8 / Hailo-8L through HailoRT's Python API (`hailo_platform`).

Written against HailoRT's documented Python API; never run here (no Hailo device or HailoRT wheel on the build
machine), so treat it as untested until it has run on a Pi 5 with the AI Kit.

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
        import hailo_platform
    except ImportError as exc:
        raise CheckpointError(NOT_INSTALLED) from exc
    return hailo_platform


class HailoVisionBackend:
    """pixel_values [B, 3, S, S] -> visual tokens [B, N, D] on the Hailo device (float32 in and out)."""

    name = "hailo"

    def __init__(self, hef_path: Path, image_size: int, num_tokens: int, hidden: int) -> None:
        hp = import_hailo()
        if not Path(hef_path).is_file():
            raise CheckpointError(f"HEF file {hef_path} does not exist (compile it from the ONNX export)")
        self._hp = hp
        self._hef = hp.HEF(str(hef_path))
        inputs, outputs = self._hef.get_input_vstream_infos(), self._hef.get_output_vstream_infos()
        if len(inputs) != 1 or len(outputs) != 1:
            raise CheckpointError(
                f"{hef_path}: expected one input and one output vstream, found {len(inputs)} and {len(outputs)}"
            )
        self._in_name, self._out_name = inputs[0].name, outputs[0].name
        # Hailo vstreams are channels-last per frame: (H, W, C).
        self._in_shape = tuple(int(d) for d in inputs[0].shape)
        if self._in_shape != (image_size, image_size, 3):
            raise CheckpointError(
                f"{hef_path} takes frames of shape {self._in_shape}, the checkpoint's vision tower "
                f"{(image_size, image_size, 3)}: compiled from another model?"
            )
        out_numel = math.prod(int(d) for d in outputs[0].shape)
        if out_numel != num_tokens * hidden:
            raise CheckpointError(
                f"{hef_path} outputs {tuple(outputs[0].shape)} per frame, expected {num_tokens}x{hidden} values"
            )
        self._num_tokens, self._hidden = num_tokens, hidden

        self._stack = contextlib.ExitStack()
        try:
            self._vdevice = self._stack.enter_context(hp.VDevice(hp.VDevice.create_params()))
            configure = hp.ConfigureParams.create_from_hef(hef=self._hef, interface=hp.HailoStreamInterface.PCIe)
            self._group = self._vdevice.configure(self._hef, configure)[0]
            in_params = hp.InputVStreamParams.make(self._group, format_type=hp.FormatType.FLOAT32)
            out_params = hp.OutputVStreamParams.make(self._group, format_type=hp.FormatType.FLOAT32)
            # One pipeline for the life of the node: activating a network group per call costs milliseconds.
            self._pipeline = self._stack.enter_context(hp.InferVStreams(self._group, in_params, out_params))
            self._stack.enter_context(self._group.activate(self._group.create_params()))
        except BaseException:
            self._stack.close()
            raise
        log.info("hailo backend: %s, input %s, output %s", hef_path, self._in_shape, tuple(outputs[0].shape))

    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch = pixel_values.shape[0]
        frames = pixel_values.permute(0, 2, 3, 1).contiguous().numpy().astype(np.float32)  # [B, S, S, 3]
        if tuple(frames.shape[1:]) != self._in_shape:
            raise InvalidInput(f"pixel frames {tuple(frames.shape[1:])} do not match the HEF's {self._in_shape}")
        out = self._pipeline.infer({self._in_name: frames})[self._out_name]
        out = np.ascontiguousarray(out, dtype=np.float32).reshape(batch, self._num_tokens, self._hidden)
        return torch.from_numpy(out)  # [B, N, D]

    def close(self) -> None:
        self._stack.close()
