"""The cluster as the gateway sees it (GetClusterStatus, `edgeinspect status`)."""

from __future__ import annotations

import asyncio
import time

import grpc

from edgeinspect.services.gateway.inspection import Inspector
from edgeinspect.services.gateway.replicas.replica_set import Replica, ReplicaSet
from edgeinspect.v1 import inspection_pb2, stage_pb2

STATS_TIMEOUT_S = 1.0  # a stopped stage must not hold the status call


async def cluster_status(inspector: Inspector) -> inspection_pb2.ClusterStatus:
    router = inspector.router
    now = time.monotonic()

    async def one(ep) -> inspection_pb2.StageEndpointStatus:
        out = inspection_pb2.StageEndpointStatus(
            address=ep.address,
            layer_start=ep.layer_start,
            layer_end=ep.layer_end,
            home_start=ep.home[0] if ep.home else -1,
            home_end=ep.home[1] if ep.home else -1,
            state=ep.state(now),
            reason=ep.mismatch or ep.ban_reason,
            sessions=ep.sessions,
            last_step_ms=ep.last_step_ms,
            failures=ep.failures,
            weights=ep.weights,
            last=ep.last_at > 0 and ep.last_at == latest.get(ep.range),
        )
        if ep.serving:
            try:
                stats = await ep.stub.Stats(stage_pb2.StatsRequest(), timeout=STATS_TIMEOUT_S)
                out.kv_bytes, out.kv_budget_bytes, out.live_sessions = (
                    stats.kv_bytes,
                    stats.kv_budget_bytes,
                    stats.sessions,
                )
            except grpc.aio.AioRpcError as exc:
                out.reason = out.reason or f"Stats: {exc.code().name}"
        return out

    latest: dict[tuple[int, int], float] = {}  # layer range -> its latest good step on any replica
    for ep in router.endpoints:
        latest[ep.range] = max(latest.get(ep.range, 0.0), ep.last_at)
    stages = await asyncio.gather(*(one(ep) for ep in router.endpoints))
    vision_ok = inspector.vision.serving
    serving = router.complete() and vision_ok
    notes = router.degraded_notes()
    vision = inspector.vision.replicas
    up = len(vision.usable())
    if up < len(vision.replicas):
        notes.append(f"vision: {up} of {len(vision.replicas)} replicas usable")
    retrieval = inspector.retrieval.replicas.state if inspector.retrieval else ""
    if inspector.retrieval and retrieval != "SERVING":
        notes.append(f"retrieval {retrieval}: reports are made without spec context")
    if inspector.retrieval:
        reps = inspector.retrieval.replicas.replicas
        up, behind = len(inspector.retrieval.replicas.usable()), [r.address for r in reps if r.behind and r.serving]
        if up < len(reps):
            held = f" ({', '.join(behind)} not on index {inspector.retrieval.in_use})" if behind else ""
            notes.append(f"retrieval: {up} of {len(reps)} replicas usable{held}")
    return inspection_pb2.ClusterStatus(
        serving=serving,
        degraded=serving and bool(notes),
        plan=router.plan_text(),
        normal_plan=[f"[{a},{b})" for a, b in router.normal_plan()],
        stages=stages,
        vision=vision.state,
        retrieval=retrieval,
        inflight=inspector.admission.inflight,
        queued=inspector.admission.queued,
        max_inflight=inspector.admission.max_inflight,
        max_queued=inspector.admission.max_queued,
        failovers=router.events.failovers,
        notes=notes + router.events.notes[-10:],
        vision_replicas=[replica_status(vision, r, now, inspector.vision.newest) for r in vision.replicas],
        retrieval_replicas=[
            replica_status(inspector.retrieval.replicas, r, now) for r in inspector.retrieval.replicas.replicas
        ]
        if inspector.retrieval
        else [],
        retrieval_index=inspector.retrieval.in_use if inspector.retrieval else "",
        stations=station_gates(inspector.cfg.anomaly),
        explaining=len(inspector.explanations.running()),
        drift=[
            inspection_pb2.DriftStatus(
                station=d.station,
                part=d.part,
                bank_id=d.bank_id,
                frames=d.frames,
                p90_ratio=d.p90_ratio,
                drifting=d.drifting,
            )  # fmt: skip
            for d in inspector.drift.states()
        ],
    )


def station_gates(cfg) -> list[inspection_pb2.StationGateStatus]:
    """Each station's gate policy and what a flagged frame waits for there (GatewayAnomalySettings)."""

    def row(name: str, gate) -> inspection_pb2.StationGateStatus:
        flagged = ""
        if gate.policy.value == "gate":
            flagged = (
                "waits for the VLM (it may clear one)" if gate.vlm_may_clear else "decided at takt, explained after"
            )
        return inspection_pb2.StationGateStatus(station=name, policy=gate.policy.value, flagged=flagged)

    return [row("*", cfg.default), *(row(name, gate) for name, gate in sorted(cfg.stations.items()))]


def replica_status(
    replicas: ReplicaSet, rep: Replica, now: float, newest: dict[str, str] | None = None
) -> inspection_pb2.ReplicaStatus:
    """One vision or retrieval replica; for vision, its banks and the parts whose newest bank it lacks; for
    retrieval, its KB index."""
    return inspection_pb2.ReplicaStatus(
        address=rep.address,
        state=rep.state(now),
        reason=rep.why(now),
        inflight=rep.inflight,
        served=rep.served,
        failures=rep.failures,
        last=replicas.last is rep,
        last_ms=rep.last_ms,
        banks=rep.banks,
        behind=sorted(part for part, bank in (newest or {}).items() if rep.banks.get(part) != bank),
        index_version=rep.index.version if rep.index else "",
        index_fingerprint=rep.index.fingerprint if rep.index else "",
    )
