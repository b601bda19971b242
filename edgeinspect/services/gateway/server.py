"""`edgeinspect serve gateway`: the public InspectionService; SERVING while a complete route over the stages exists."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from edgeinspect import codec
from edgeinspect.config import GatewaySettings
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.services.common.auth import public_auth
from edgeinspect.services.common.entry import run_role
from edgeinspect.services.common.server import RunningServer, serve_until_signal, start_server
from edgeinspect.services.gateway.api import rollout_servicer
from edgeinspect.services.gateway.api.servicer import InspectionServicer
from edgeinspect.services.gateway.clients import RetrievalClient, VisionClient, gateway_identity
from edgeinspect.services.gateway.decode.pipeline import WireOptions
from edgeinspect.services.gateway.decode.routing import StageRouter
from edgeinspect.services.gateway.decode.session import RecoveryPolicy
from edgeinspect.services.gateway.decode.stages import StageCluster
from edgeinspect.services.gateway.inspection import Inspector, ReportWriter
from edgeinspect.services.gateway.readiness import Readiness
from edgeinspect.services.gateway.reports.store import open_gateway_store
from edgeinspect.services.gateway.rollout.manager import RolloutManager
from edgeinspect.services.gateway.rollout.versions import apply_record
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = inspection_pb2.DESCRIPTOR.services_by_name["InspectionService"].full_name


async def connect(cfg: GatewaySettings, store: ReportWriter) -> Inspector:
    """Builds the Inspector over live views of the upstreams; nothing here waits for them to be up (readiness
    follows them: services/gateway/readiness.py)."""
    ckpt = await asyncio.to_thread(open_checkpoint, cfg.checkpoint)
    mb = cfg.server.max_message_mb
    vision = VisionClient(cfg.vision, mb, cfg.client_tls)
    retrieval = RetrievalClient(cfg.retrieval, mb, cfg.client_tls) if cfg.retrieval else None
    router = StageRouter(
        cfg.stages,
        gateway_identity(ckpt.fingerprint, ckpt.tokenizer_fingerprint),
        ckpt.num_layers,
        codec.Codec(cfg.codec.value),
        mb,
        tls=cfg.client_tls,
    )
    policy = RecoveryPolicy(
        max_failovers=cfg.max_failovers,
        stall_min_s=cfg.stall_min_s,
        stall_factor=cfg.stall_factor,
        prefill_stall_s=cfg.prefill_stall_s,
        chunk_tokens=cfg.prefill_chunk_tokens,
        image_token_id=ckpt.config.image_token_id,
        route_wait_s=min(30.0, cfg.upstream_timeout_s) if cfg.replan else 0.0,
    )
    wire = WireOptions(codec.Codec(cfg.codec.value), cfg.zstd, cfg.chained)
    stages = StageCluster(router, wire, policy, cfg.micro_batches)
    inspector = Inspector(cfg, ckpt, store, vision, stages, retrieval)
    router.start()
    vision.health.start()
    if retrieval is not None:
        retrieval.health.start()
    return inspector


async def start(cfg: GatewaySettings) -> tuple[RunningServer, Readiness]:
    cfg = apply_record(cfg)  # a promoted model version survives a restart (services/gateway/rollout/versions.py)
    store = open_gateway_store(cfg)  # SQLite at db_path, or the PostgreSQL database a gateway pair shares
    store.recover_interrupted()  # rows a crash left pending: failed, "gateway restarted during inspection"
    servicer = InspectionServicer(store)
    rollout = RolloutManager(cfg, store, connect)
    auth = [public_auth(cfg.api_tokens, cfg.token_rate_per_s, cfg.token_burst, cfg.allow_unauthenticated)]
    running = await start_server(
        [
            lambda s: inspection_pb2_grpc.add_InspectionServiceServicer_to_server(servicer, s),
            rollout_servicer.register(rollout),
        ],
        [SERVICE_NAME, rollout_servicer.SERVICE_NAME],
        cfg.server,
        role="gateway",
        interceptors=auth,
    )
    inspector = await connect(cfg, store)
    servicer.versions = await rollout.attach(inspector)  # per-station version routing and the shadow
    readiness = Readiness(inspector, running.health, live=rollout.live_inspector)  # follows promotions
    readiness.start()
    log.info("gateway started: vision %s, stages %s, retrieval %s", cfg.vision, cfg.stages, cfg.retrieval)
    return running, readiness


async def serve(cfg: GatewaySettings) -> None:
    running, readiness = await start(cfg)
    try:
        await serve_until_signal(running, cfg.server.grace_s)
    finally:
        await readiness.close()


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve; exit 1 on a startup error."""
    run_role(GatewaySettings, serve, "gateway", config_path)
