"""Failover time per role (issue 58): kill -9 one process of a role while an inspection is in flight, and time
kill -> that inspection's report and kill -> the next fresh inspection's report (sent at the kill: the survivor's
first new work). An undisturbed inspection before every kill, in the same run, is the baseline.

One embedded stack with every role doubled: two gateways on one real PostgreSQL (pg_testing's throwaway server),
two vision nodes, 2 layer ranges x 2 replicas, two retrieval nodes over the sample KB. The client is the project's
InspectionClient holding both gateways. A round times one undisturbed inspection, starts a streamed one, waits until
its report row is pending in PostgreSQL (a stage round also waits until half the report has streamed: that much to
replay), picks the process that inspection uses (gateway: the row's owner; stage: a replica with an open session,
range alternating by round; vision / retrieval: the replica with a call in flight, else the one that answered last),
SIGKILLs it, sends the fresh inspection, waits for both reports, restarts the role and waits until every gateway sees
every replica healthy.

A gateway's in-flight inspection waits for the survivor to take its key over: a figure bounded below by the owner
lease (--owner-lease-s). A stage's records the report's own Failover (tokens replayed into the new route, failure
noticed -> failed step answered). A vision node is often done with the inspection by the time its row is pending (the
tiny checkpoint's vision is milliseconds): `victim_busy` records whether the killed replica still had its call.

    .venv/bin/python bench/role_failover.py                       # tiny checkpoint, every role, 3 rounds
    .venv/bin/python bench/role_failover.py --roles vision --rounds 1 --out /tmp/rf.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import grpc
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py when run as a script
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/pg_testing.py: a throwaway PostgreSQL
from common import load_average, machine_info, skip, write_json  # noqa: E402
from pg_testing import PostgresServer, unavailable_reason  # noqa: E402

from edgeinspect.assets import asset_path  # noqa: E402
from edgeinspect.services.client import InspectionClient  # noqa: E402
from edgeinspect.stack.launcher import LocalStack, StackOptions  # noqa: E402
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc  # noqa: E402

ROLES = ("gateway", "vision", "stage", "retrieval")
# Fixed-length reports (no grammar stopping early), one micro-batch: rounds compare like with like.
ENV = {"EDGEINSPECT_STRUCTURED_OUTPUT": "false", "EDGEINSPECT_MICRO_BATCHES": "1"}
IMAGE = "part_dent.jpg"


class Bench:
    """The stack, the client of the pair, a direct stub per gateway (to ask the inspection's owner what it uses)."""

    def __init__(self, stack: LocalStack, client: InspectionClient, dsn: str, tokens: int):
        self.stack, self.client, self.dsn, self.tokens = stack, client, dsn, tokens
        self.image = asset_path(IMAGE).read_bytes()
        self.md = [("authorization", f"Bearer {stack.api_token}")]
        self.channels = {r.name: grpc.insecure_channel(stack.address_of(r.name)) for r in self.of_role("gateway")}
        self.gateways = {n: inspection_pb2_grpc.InspectionServiceStub(c) for n, c in self.channels.items()}
        self.db = psycopg.connect(dsn, autocommit=True)  # polled every few ms while a round waits for its claim

    def close(self) -> None:
        self.db.close()
        for channel in self.channels.values():
            channel.close()

    def of_role(self, role: str) -> list:
        return [r for r in self.stack.roles if r.role == role]

    def inspect(self, on_delta=None) -> tuple[inspection_pb2.DefectReport, float]:
        """One inspection through the pair: (its report, the perf_counter when it returned)."""
        report = self.client.inspect(self.image, idempotency_key=uuid.uuid4().hex, max_new_tokens=self.tokens,
                                     on_delta=on_delta or (lambda _text: None))  # fmt: skip
        return report, time.perf_counter()

    def status(self, gateway: str) -> inspection_pb2.ClusterStatus:
        return self.gateways[gateway].GetClusterStatus(
            inspection_pb2.ClusterStatusRequest(), metadata=self.md, timeout=10
        )

    def pending_owner(self) -> str | None:
        row = self.db.execute("SELECT owner FROM reports WHERE status = 'pending' LIMIT 1").fetchone()
        return row[0] if row else None

    def wait_whole(self, timeout_s: float = 180) -> None:
        """Until every gateway serves and sees every stage, vision and retrieval replica healthy, nothing pending."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                views = [self.status(g) for g in self.gateways]
                whole = all(
                    st.serving
                    and all(s.state == "healthy" for s in st.stages)
                    and all(r.state == "healthy" for r in [*st.vision_replicas, *st.retrieval_replicas])
                    for st in views
                )
                if whole and self.pending_owner() is None:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"the stack did not come back whole within {timeout_s:.0f} s")

    def victim(self, role: str, owner: str, round_no: int) -> tuple[str, bool]:
        """The process of `role` the owner gateway's inspection uses: (its role name, busy with it at the kill)."""
        if role == "gateway":
            return owner, True
        names = {self.stack.address_of(r.name): r.name for r in self.of_role(role)}
        st = self.status(owner)
        if role == "stage":
            ranges = self.stack.layer_ranges
            busy = [s for s in st.stages if s.sessions > 0]
            want = [s for s in busy if (s.layer_start, s.layer_end) == ranges[round_no % len(ranges)]] or busy
            return (names[want[0].address], True) if want else (next(iter(names.values())), False)
        replicas = st.vision_replicas if role == "vision" else st.retrieval_replicas
        busy = [r for r in replicas if r.inflight > 0]
        pick = busy or [r for r in replicas if r.last] or list(replicas)
        return names[pick[0].address], bool(busy)

    def undisturbed_ms(self) -> float:
        t0 = time.perf_counter()
        return round((self.inspect()[1] - t0) * 1e3, 1)

    def kill_round(self, role: str, round_no: int) -> dict:
        """An undisturbed inspection (the baseline, interleaved: load drifts), then the kill (see the module)."""
        base = self.undisturbed_ms()
        halfway = threading.Event()  # a stage is killed with half the report generated: that much to replay
        deltas = []
        inflight: dict = {}

        def on_delta(_text: str) -> None:
            deltas.append(1)
            if len(deltas) >= self.tokens // 2:
                halfway.set()

        def run() -> None:
            t0 = time.perf_counter()
            try:
                inflight["report"], inflight["done"] = self.inspect(on_delta=on_delta)
            except Exception as exc:  # reported in the round's row: the bench goes on to restart the role
                inflight["error"] = repr(exc)
            inflight["t0"] = t0

        thread = threading.Thread(target=run, name=f"inflight-{role}")
        thread.start()
        deadline = time.monotonic() + 60
        while (owner := self.pending_owner()) is None:  # a gateway has claimed the key: the inspection is in flight
            if time.monotonic() > deadline or not thread.is_alive():
                raise SystemExit(f"{role} round {round_no}: no pending inspection seen")
            time.sleep(0.005)
        if role == "stage" and not halfway.wait(60):
            raise SystemExit(f"stage round {round_no}: the report did not get halfway")
        name, busy = self.victim(role, owner, round_no)
        self.stack.kill(name)
        killed = time.perf_counter()
        try:
            fresh, fresh_done = self.inspect()
        except grpc.RpcError as exc:
            fresh, fresh_error = None, f"{exc.code().name}: {exc.details()}"
        thread.join()
        row = {"role": role, "round": round_no, "killed": name, "victim_busy": busy, "owner": owner,
               "undisturbed_ms": base}  # fmt: skip
        if fresh is None:
            row["fresh_error"] = fresh_error
        else:
            row["fresh_ms"] = round((fresh_done - killed) * 1e3, 1)
            row["fresh_failovers"] = len(fresh.failovers)
        if "error" in inflight:
            row["inflight_error"] = inflight["error"]
        else:
            report = inflight["report"]
            row["inflight_ms"] = round((inflight["done"] - killed) * 1e3, 1)
            row["inflight_total_ms"] = round((inflight["done"] - inflight["t0"]) * 1e3, 1)
            row["degraded"] = list(report.degraded)
            row["failovers"] = [{"stage": f.stage, "reason": f.reason, "recovery_ms": round(f.recovery_ms, 1),
                                 "replayed_tokens": f.replayed_tokens} for f in report.failovers]  # fmt: skip
        print(row, flush=True)
        self.stack.restart(name)
        self.wait_whole()
        return row


def summary(rows: list[dict]) -> dict:
    def stats(key: str) -> dict:
        xs = [r[key] for r in rows if key in r]
        return {"median": round(statistics.median(xs), 1), "max": round(max(xs), 1)} if xs else {}

    out = {"rounds": len(rows), "undisturbed_ms": stats("undisturbed_ms"),
           "kill_to_inflight_report_ms": stats("inflight_ms"), "kill_to_fresh_report_ms": stats("fresh_ms"),
           "inflight_total_ms": stats("inflight_total_ms"),
           "errors": sum("inflight_error" in r or "fresh_error" in r for r in rows),
           "victim_busy": sum(r["victim_busy"] for r in rows)}  # fmt: skip
    failovers = [f for r in rows for f in r.get("failovers", [])]
    if failovers:
        out["replay"] = {
            "failovers": len(failovers),
            "replayed_tokens_median": statistics.median(f["replayed_tokens"] for f in failovers),
            "recovery_ms_median": round(statistics.median(f["recovery_ms"] for f in failovers), 1),
            "recovery_ms_max": round(max(f["recovery_ms"] for f in failovers), 1),
        }
    return out


def measure(args, workdir: Path, dsn: str) -> dict:
    from edgeinspect.models.tiny import make_tiny
    from edgeinspect.rag import sample_kb_dir
    from edgeinspect.rag.embed import Embedder
    from edgeinspect.rag.indexer import build_index

    checkpoint = args.checkpoint or make_tiny(workdir / "tiny")
    build_index(sample_kb_dir(), workdir / "kb", Embedder())
    opts = StackOptions(workdir=workdir / "stack", checkpoint=checkpoint, stages=2, replicas=2, vision_replicas=2,
                        kb_dir=workdir / "kb", retrieval_replicas=2, gateways=2, store_dsn=dsn,
                        owner_lease_s=args.owner_lease_s, weights=args.weights, extra_env=ENV,
                        start_timeout_s=args.start_timeout)  # fmt: skip
    with LocalStack(opts) as stack:
        client = InspectionClient(",".join(stack.gateway_addresses), stack.api_token, timeout_s=args.timeout)
        bench = Bench(stack, client, dsn, args.tokens)
        try:
            bench.wait_whole()
            for gateway in bench.gateways.values():  # warm-up: first-call costs on every hop, both gateways
                request = inspection_pb2.InspectRequest(image=bench.image, max_new_tokens=args.tokens)
                gateway.Inspect(request, metadata=bench.md, timeout=args.timeout)
            rows = [bench.kill_round(role, i) for role in args.roles for i in range(args.rounds)]
        finally:
            bench.close()
            client.__exit__()
    undisturbed = [r["undisturbed_ms"] for r in rows]
    return {
        "undisturbed_ms": {"median": round(statistics.median(undisturbed), 1), "max": max(undisturbed)},
        "roles": {role: summary([r for r in rows if r["role"] == role]) for role in args.roles},
        "rounds": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder (default: the tiny one)")
    ap.add_argument("--weights", default="fp32", help="stage weights")
    ap.add_argument("--roles", default=",".join(ROLES), help=f"roles to kill, comma-separated ({', '.join(ROLES)})")
    ap.add_argument("--rounds", type=int, default=3, help="kills per role")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per inspection")
    ap.add_argument("--owner-lease-s", type=float, default=10.0, help="the pair's owner lease (bounds a gateway's)")
    ap.add_argument("--timeout", type=float, default=120.0, help="the client's deadline per inspection, s")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default bench/results/role_failover.json)")
    args = ap.parse_args()
    args.roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    unknown = set(args.roles) - set(ROLES)
    if unknown or args.rounds < 1:
        ap.error(f"--roles takes {', '.join(ROLES)} (got {', '.join(sorted(unknown))}); --rounds >= 1")
    reason = unavailable_reason()
    if reason:
        skip(f"a gateway pair needs PostgreSQL: {reason}")
    payload = {"command": " ".join(["python", *sys.argv]), "date": datetime.now(UTC).isoformat(timespec="seconds"),
               "machine": machine_info(bandwidth=False), "checkpoint": str(args.checkpoint or "tiny (generated)"),
               "weights": args.weights, "tokens": args.tokens, "owner_lease_s": args.owner_lease_s,
               "layout": "2 gateways (PostgreSQL), 2 vision, 2 ranges x 2 stage replicas, 2 retrieval"}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="role-failover-") as tmp, PostgresServer() as pg:
        payload |= measure(args, Path(tmp), pg.fresh_schema_dsn())
    payload["machine"]["loadavg_end"] = load_average()
    for role, s in payload["roles"].items():
        print(role, s, flush=True)
    print(write_json("role_failover", payload, args.out))


if __name__ == "__main__":
    main()
