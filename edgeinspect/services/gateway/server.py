"""`edgeinspect serve gateway`: the public InspectionService; SERVING while a complete route over the stages exists."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path

from edgeinspect import codec
from edgeinspect.models.checkpoint import open_checkpoint
from edgeinspect.services.common.auth import public_auth
from edgeinspect.services.common.entry import run_role
from edgeinspect.services.common.server import RunningServer, serve_until_signal, start_server
from edgeinspect.services.gateway.api import rollout_servicer
from edgeinspect.services.gateway.api.servicer import InspectionServicer
from edgeinspect.services.gateway.backlog import BacklogGuard
from edgeinspect.services.gateway.decode.pipeline import WireOptions
from edgeinspect.services.gateway.decode.routing import StageRouter
from edgeinspect.services.gateway.decode.session import RecoveryPolicy
from edgeinspect.services.gateway.decode.stages import StageCluster
from edgeinspect.services.gateway.disk import gateway_guard
from edgeinspect.services.gateway.explain import RESTARTED
from edgeinspect.services.gateway.inspection import Inspector, ReportWriter
from edgeinspect.services.gateway.readiness import Readiness
from edgeinspect.services.gateway.replicas.clients import RetrievalClient, VisionClient
from edgeinspect.services.gateway.replicas.health import gateway_identity
from edgeinspect.services.gateway.reports.images import ReportImages
from edgeinspect.services.gateway.reports.store import ReportStore, open_gateway_store
from edgeinspect.services.gateway.rollout.manager import RolloutManager
from edgeinspect.services.gateway.rollout.versions import apply_record
from edgeinspect.services.gateway.settings import GatewaySettings
from edgeinspect.services.outputs.fanout import Outputs
from edgeinspect.services.store.banks import BankVersions
from edgeinspect.services.store.claims import HEARTBEAT_S, STOPPED
from edgeinspect.services.store.database import open_database
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = inspection_pb2.DESCRIPTOR.services_by_name["InspectionService"].full_name
# After the server's grace: how long cancelled inspections get to store their failure before the store closes.
SETTLE_S = 5.0


async def connect(cfg: GatewaySettings, store: ReportWriter, banks: BankVersions | None = None) -> Inspector:
    """Builds the Inspector over live views of the upstreams; nothing here waits for them to be up (readiness
    follows them: services/gateway/readiness.py). banks: the published anomaly banks its vision replicas are given."""
    ckpt = await asyncio.to_thread(open_checkpoint, cfg.checkpoint)
    mb = cfg.server.max_message_mb
    vision = VisionClient(cfg.vision, mb, cfg.client_tls, checkpoint_fingerprint=ckpt.fingerprint, banks=banks)
    retrieval = RetrievalClient(cfg.retrieval, mb, cfg.client_tls, cfg.retrieval_index) if cfg.retrieval else None
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
    wire = WireOptions(codec.Codec(cfg.codec.value), cfg.zstd)
    stages = StageCluster(router, wire, policy, cfg.micro_batches)
    inspector = Inspector(cfg, ckpt, store, vision, stages, retrieval)
    router.start()
    vision.start()
    if retrieval is not None:
        retrieval.start()
    return inspector


class Gateway:
    """The gateway process's runtime: `start` brings up what the role runs (report store, rollout manager, gRPC
    server and metrics, the outputs draining the store's outbox, the live Inspector's channels and readiness watcher),
    `close` ends all of it in reverse. A field stays None until its part started, so closing after a failed start
    closes what did start."""

    def __init__(self, cfg: GatewaySettings) -> None:
        self.cfg = apply_record(cfg)  # a promoted model version survives a restart (rollout/versions.py)
        self.store: ReportStore | None = None
        self.banks: BankVersions | None = None  # published anomaly banks, on a connection of their own
        self.outputs: Outputs | None = None
        self.rollout: RolloutManager | None = None
        self.running: RunningServer | None = None
        self.inspector: Inspector | None = None
        self.readiness: Readiness | None = None
        self._heartbeat: asyncio.Task | None = None

    async def start(self) -> RunningServer:
        cfg = self.cfg
        self.store = open_gateway_store(cfg)  # SQLite at db_path, or the PostgreSQL database a gateway pair shares
        self.store.recover_interrupted()  # rows a crash left pending: failed, "gateway restarted during inspection"
        self.store.fail_unexplained(RESTARTED)  # decisions whose explanation a crash cut short: the line is told
        self.store.heartbeat()  # one of a pair: alive before it admits a call (reports/store.py, OWNER_LEASE_S)
        self._heartbeat = asyncio.create_task(self._beat(self.store), name="store-heartbeat")
        # The same database, migrated by the store above; a connection of its own so that a bank's archive never
        # waits behind (or holds up) a report's commit.
        self.banks = BankVersions(open_database(cfg.store, cfg.db_path))
        self.outputs = Outputs.for_gateway(cfg)  # drains what earlier runs left queued at once
        # free-space floors; the line's outbox per station
        servicer = InspectionServicer(
            self.store,
            gateway_guard(cfg, self.store),
            BacklogGuard(self.outputs),
            ReportImages.for_gateway(self.store, cfg),
        )
        self.rollout = RolloutManager(cfg, self.store, functools.partial(connect, banks=self.banks))
        auth = [public_auth(cfg.api_tokens, cfg.token_rate_per_s, cfg.token_burst, cfg.allow_unauthenticated)]
        self.running = await start_server(
            [
                lambda s: inspection_pb2_grpc.add_InspectionServiceServicer_to_server(servicer, s),
                rollout_servicer.register(self.rollout),
            ],
            [SERVICE_NAME, rollout_servicer.SERVICE_NAME],
            cfg.server,
            role="gateway",
            interceptors=auth,
        )
        if self.store.owner:  # one of a pair: the other reads the frames this one holds at this address
            address = cfg.store.advertised(cfg.server.host, self.running.port)
            if not address:
                log.warning(
                    "server.host %s binds every interface and store.advertise is unset: the other gateway of the "
                    "pair cannot read the frames this one holds; set store.advertise to this box's host:port",
                    cfg.server.host,
                )
            await asyncio.to_thread(self.store.advertise, address)
        self.inspector = await connect(cfg, self.store, self.banks)
        self.inspector.outputs = self.outputs
        servicer.versions = await self.rollout.attach(self.inspector)  # per-station version routing and the shadow
        self.readiness = Readiness(self.inspector, self.running.health, live=self.rollout.live_inspector)
        self.readiness.start()
        log.info("gateway started: vision %s, stages %s, retrieval %s", cfg.vision, cfg.stages, cfg.retrieval)
        return self.running

    async def close(self) -> None:
        """Stops admitting (health NOT_SERVING, the server refuses new calls), gives in-flight inspections the
        server's grace, then waits for the cancelled ones to store their failure before it closes the rest."""
        if self.running is not None:
            await self.running.stop(self.cfg.server.grace_s)  # no-op when serve_until_signal stopped it
        if self.rollout is not None:
            await self.rollout.stop_shadow()  # shadow runs are no calls: the server's stop does not end them
            await self._settle(list(self.rollout.inspectors.values()))
            for inspector in self.rollout.inspectors.values():  # explanations get the grace too, then are failed
                await inspector.explanations.close(self.cfg.server.grace_s)
        if self.readiness is not None:
            await self.readiness.close()  # the watcher, re-planners and the live Inspector's channels
        if self.rollout is not None:
            await self.rollout.close()  # the shadow's runs, the candidate's channels, the shadow database
        if self.outputs is not None:
            await asyncio.to_thread(self.outputs.close)  # queued results stay in the outbox for the next start
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        if self.banks is not None:
            self.banks.close()  # after every VisionClient (readiness, rollout): none syncs any more
        if self.store is not None:
            # A call the grace cut short and that could not record its failure in SETTLE_S: failed here, by owner.
            await asyncio.to_thread(self.store.fail_pending, STOPPED)
            self.store.close()  # SQLite checkpoints its WAL into the file as the last connection closes
        log.info("gateway stopped")

    @staticmethod
    async def _beat(store: ReportStore) -> None:
        """The heartbeat that keeps this gateway's running keys its own; a failed beat is logged and retried (the
        database may be restarting: the lease outlasts several beats)."""
        if not store.owner:
            return
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await asyncio.to_thread(store.heartbeat)
            except Exception as exc:
                log.warning("report database heartbeat failed: %s", exc)

    @staticmethod
    async def _settle(inspectors: list[Inspector]) -> None:
        """Until no inspection holds an admission slot (a cancelled one leaves its slot after its row is failed);
        at most SETTLE_S."""
        deadline = time.monotonic() + SETTLE_S
        while any(i.admission.inflight or i.admission.queued for i in inspectors):
            if time.monotonic() >= deadline:
                log.warning("inspections still running %.0f s after the server stopped; failing their rows", SETTLE_S)
                return
            await asyncio.sleep(0.05)


async def serve(cfg: GatewaySettings) -> None:
    """Runs the gateway until SIGINT/SIGTERM, then closes everything it started."""
    gateway = Gateway(cfg)
    try:
        running = await gateway.start()
        await serve_until_signal(running, cfg.server.grace_s)
    finally:
        await gateway.close()


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve; exit 1 on a startup error."""
    run_role(GatewaySettings, serve, "gateway", config_path)
