"""Runs the vision node: bind, load the backend off the event loop, canary, then SERVING."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from edgeinspect.services.common.entry import run_role
from edgeinspect.services.common.server import RunningServer, serve_until_signal, start_server
from edgeinspect.services.vision.anomaly import AnomalyGate
from edgeinspect.services.vision.banks import BankKeeper
from edgeinspect.services.vision.encoder import VisionEncoder
from edgeinspect.services.vision.servicer import ROLE, VisionServicer
from edgeinspect.services.vision.settings import VisionSettings
from edgeinspect.v1 import vision_pb2, vision_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = vision_pb2.DESCRIPTOR.services_by_name["VisionService"].full_name


def _load_and_check(cfg: VisionSettings) -> VisionEncoder:
    encoder = VisionEncoder.load(cfg)
    try:
        encoder.canary()
    except BaseException:
        encoder.close()
        raise
    return encoder


async def start_vision(cfg: VisionSettings) -> tuple[RunningServer, VisionServicer]:
    """Binds the port (health NOT_SERVING), loads the model in a thread, then flips health to SERVING."""
    servicer = VisionServicer(anomaly_enabled=cfg.anomaly.enabled)
    running = await start_server(
        [lambda s: vision_pb2_grpc.add_VisionServiceServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        cfg.server,
        role=ROLE,
    )
    try:
        # In a thread: health checks and reflection keep answering during a load that takes seconds.
        servicer.encoder = await asyncio.to_thread(_load_and_check, cfg)
        if cfg.anomaly.enabled:
            encoder = servicer.encoder
            keeper = await asyncio.to_thread(BankKeeper.open, cfg, encoder.ckpt.path, encoder.backend)
            servicer.keeper, servicer.gate = keeper, AnomalyGate(cfg, keeper)
    except BaseException:
        await running.stop(0)
        if servicer.encoder is not None:
            servicer.encoder.close()
        raise
    await running.health.set_serving(True)
    return running, servicer


async def serve(cfg: VisionSettings) -> None:
    """Serves VisionService until SIGINT/SIGTERM."""
    running, servicer = await start_vision(cfg)
    try:
        await serve_until_signal(running, cfg.server.grace_s)
    finally:
        if servicer.keeper is not None:
            servicer.keeper.close()
        if servicer.encoder is not None:
            servicer.encoder.close()


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve; exit 1 on a startup error."""
    run_role(VisionSettings, serve, ROLE, config_path)
