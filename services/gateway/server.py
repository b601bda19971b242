"""`edgeinspect serve gateway`: the public InspectionService, ready once every upstream role is."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from edgeinspect import codec
from edgeinspect.config import GatewaySettings
from edgeinspect.errors import PeerMismatch
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.services.common.auth import public_auth
from edgeinspect.services.common.channel import wait_for_serving
from edgeinspect.services.common.entry import run_role
from edgeinspect.services.common.server import RunningServer, serve_until_signal, start_server
from edgeinspect.services.gateway.inspection import Inspector
from edgeinspect.services.gateway.servicer import InspectionServicer
from edgeinspect.services.gateway.store import ReportStore
from edgeinspect.services.gateway.upstream import RetrievalClient, StagePipeline, VisionClient, gateway_identity
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = inspection_pb2.DESCRIPTOR.services_by_name["InspectionService"].full_name


async def connect(cfg: GatewaySettings, store: ReportStore) -> Inspector:
    """Waits for every upstream to be SERVING, checks they run our checkpoint, and builds the Inspector."""
    ckpt = await asyncio.to_thread(open_checkpoint, cfg.checkpoint)
    upstreams = [cfg.vision, *cfg.stages] + ([cfg.retrieval] if cfg.retrieval else [])
    for address in upstreams:
        await wait_for_serving(address, cfg.upstream_timeout_s)
    mb = cfg.server.max_message_mb
    vision = VisionClient(cfg.vision, mb)
    info = await vision.info()
    if info.identity.checkpoint_fingerprint and info.identity.checkpoint_fingerprint != ckpt.fingerprint:
        raise PeerMismatch(
            f"vision node {cfg.vision} runs checkpoint {info.identity.checkpoint_fingerprint}, "
            f"this gateway {ckpt.fingerprint}"
        )
    stages = StagePipeline(cfg.stages, codec.Codec(cfg.codec.value), cfg.zstd, cfg.chained, mb, cfg.micro_batches)
    await stages.handshake(gateway_identity(ckpt.fingerprint, ckpt.tokenizer_fingerprint), ckpt.num_layers)
    retrieval = RetrievalClient(cfg.retrieval, mb) if cfg.retrieval else None
    return Inspector(cfg, ckpt, store, vision, stages, retrieval)


async def start(cfg: GatewaySettings) -> RunningServer:
    store = ReportStore(cfg.db_path, frames=cfg.frames)
    store.recover_interrupted()  # rows a crash left pending: failed, "gateway restarted during inspection"
    servicer = InspectionServicer(store)
    auth = [public_auth(cfg.api_tokens, cfg.token_rate_per_s, cfg.token_burst, cfg.allow_unauthenticated)]
    running = await start_server(
        [lambda s: inspection_pb2_grpc.add_InspectionServiceServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        cfg.server,
        role="gateway",
        interceptors=auth,
    )
    servicer.inspector = await connect(cfg, store)
    await running.health.set_serving(True)
    log.info("gateway ready: vision %s, stages %s, retrieval %s", cfg.vision, cfg.stages, cfg.retrieval)
    return running


async def serve(cfg: GatewaySettings) -> None:
    running = await start(cfg)
    await serve_until_signal(running, cfg.server.grace_s)


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve; exit 1 on a startup error."""
    run_role(GatewaySettings, serve, "gateway", config_path)
