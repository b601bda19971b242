"""`edgeinspect serve stage`: load layers [a, b), pass a canary step, serve DecoderStage until signalled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from edgeinspect.services.common.entry import run_role
from edgeinspect.services.common.server import RunningServer, serve_until_signal, start_server
from edgeinspect.services.stage.backend import StageBackend
from edgeinspect.services.stage.servicer import DecoderStageServicer
from edgeinspect.services.stage.settings import StageSettings
from edgeinspect.v1 import stage_pb2, stage_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = stage_pb2.DESCRIPTOR.services_by_name["DecoderStage"].full_name
EVICTION_PERIOD_S = 1.0


async def start(cfg: StageSettings) -> tuple[RunningServer, StageBackend]:
    """Binds first (so health answers NOT_SERVING while loading), then loads, runs the canary, flips to SERVING."""
    servicer = DecoderStageServicer(None)
    running = await start_server(
        [lambda s: stage_pb2_grpc.add_DecoderStageServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        cfg.server,
        role="stage",
    )
    backend = await asyncio.to_thread(StageBackend, cfg)
    await asyncio.to_thread(backend.canary)
    servicer.attach(backend)
    await running.health.set_serving(True)
    log.info(
        "stage %s ready (checkpoint %s, weights %s)",
        backend.range,
        backend.identity.checkpoint_fingerprint,
        cfg.weights.value,
    )
    running.servicer = servicer
    return running, backend


async def _evict_forever(servicer: DecoderStageServicer) -> None:
    while True:
        await asyncio.sleep(EVICTION_PERIOD_S)
        await servicer.backend.evict()  # the servicer's backend: LoadLayers may have replaced it


async def serve(cfg: StageSettings) -> None:
    running, backend = await start(cfg)
    evictor = asyncio.create_task(_evict_forever(running.servicer))
    try:
        await serve_until_signal(running, cfg.server.grace_s)
    finally:
        evictor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await evictor


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve; exit 1 on a startup error."""
    run_role(StageSettings, serve, "stage", config_path)
