"""The cluster status for people: one row per replica of every role and one per gateway a client holds. The CLI's
`edgeinspect status` and the console's stations page both show these rows, so they say the same thing."""

from __future__ import annotations

from dataclasses import dataclass

from edgeinspect.v1 import inspection_pb2


@dataclass(frozen=True)
class ReplicaRow:
    role: str  # vision | stage | retrieval
    address: str
    state: str  # healthy | connecting | down | banned | behind | mismatch
    last: bool  # it answered its role's latest call (a stage: its layer range's latest step)
    load: str  # in flight and served, or a stage's sessions and KV
    version: str  # what it serves: anomaly banks, KB index, a stage's layers and weights
    why: str  # what keeps it out of use, or what it lacks


@dataclass(frozen=True)
class GatewayRow:
    address: str
    state: str  # serving | not serving | unreachable (its health check)
    current: bool  # the one this client sends its calls to


def replica_rows(status: inspection_pb2.ClusterStatus) -> list[ReplicaRow]:
    """Every vision, stage and retrieval replica in the gateway's status, in that order."""
    rows = [_vision(r) for r in status.vision_replicas]
    rows += [_stage(s) for s in status.stages]
    rows += [_retrieval(r) for r in status.retrieval_replicas]
    return rows


def _vision(r: inspection_pb2.ReplicaStatus) -> ReplicaRow:
    # A replica lacking a part's newest bank still encodes; only that part's Score skips it.
    behind = r.state == "healthy" and bool(r.behind)
    why = f"lacks the newest anomaly bank of {', '.join(r.behind)} (no Score of them goes to it)" if behind else ""
    return ReplicaRow(
        "vision", r.address, "behind" if behind else r.state, r.last, f"{r.inflight} in flight, {r.served} served",
        " ".join(sorted(r.banks.values())), r.reason or why,
    )  # fmt: skip


def _stage(s: inspection_pb2.StageEndpointStatus) -> ReplicaRow:
    layers = f"layers [{s.layer_start},{s.layer_end})" if s.layer_end > 0 else "layers ?"
    kv = f", KV {s.kv_bytes / 2**20:.0f}/{s.kv_budget_bytes / 2**20:.0f} MiB" if s.kv_budget_bytes else ""
    return ReplicaRow(
        "stage", s.address, s.state, s.last, f"{s.sessions} sessions ({s.live_sessions} live){kv}",
        " ".join(p for p in (layers, s.weights) if p), s.reason,
    )  # fmt: skip


def _retrieval(r: inspection_pb2.ReplicaStatus) -> ReplicaRow:
    index = f"index {r.index_version} ({r.index_fingerprint})" if r.index_version else ""
    return ReplicaRow(
        "retrieval", r.address, r.state, r.last, f"{r.inflight} in flight, {r.served} served", index, r.reason
    )
