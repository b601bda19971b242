"""Failover cost: recovery time (kill -> next token) and replay cost by the position at failure; a re-planned
(degraded) plan's throughput against the normal plan's, in the same run.

Real processes through the embedded launcher: vision, 2 layer ranges x 2 replicas, gateway (fp32 on the wire, so
every disturbed report is checked against its undisturbed tokens). For each position P an inspection streams; at
its P-th token the replica of range 1 serving it is SIGKILLed; recovery = kill -> the next token delta, and the
report's own Failover record gives the gateway's view (failure noticed -> failed step answered on the new route).
Then 3 stages without replicas: sequential inspections on the normal plan, one stage killed (its layers merged
into a survivor), the same inspections on the degraded plan.

    .venv/bin/python bench/failover.py                                  # tiny checkpoint (generated), positions 8..96
    .venv/bin/python bench/failover.py --checkpoint /work/ckpt-1.3b --weights int8 --positions 16,64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, write_json  # noqa: E402

from edgeinspect.assets import asset_path  # noqa: E402
from edgeinspect.stack.launcher import LocalStack, StackOptions  # noqa: E402
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc  # noqa: E402

ENV = {"EDGEINSPECT_STRUCTURED_OUTPUT": "false", "EDGEINSPECT_MICRO_BATCHES": "1"}
IMAGE = "part_dent.jpg"


class Client:
    def __init__(self, stack: LocalStack):
        self.channel = grpc.insecure_channel(stack.gateway_address)
        self.stub = inspection_pb2_grpc.InspectionServiceStub(self.channel)
        self.md = [("authorization", f"Bearer {stack.api_token}")]

    def request(self, tokens: int) -> inspection_pb2.InspectRequest:
        return inspection_pb2.InspectRequest(
            image=asset_path(IMAGE).read_bytes(), max_new_tokens=tokens, idempotency_key=uuid.uuid4().hex
        )

    def wait_healthy(self, n: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.stub.GetClusterStatus(inspection_pb2.ClusterStatusRequest(), metadata=self.md, timeout=10)
            if sum(s.state == "healthy" for s in st.stages) == n and st.serving:
                return
            time.sleep(0.2)
        raise SystemExit("the stages did not all come back")


def kill_at(stack: LocalStack, client: Client, position: int, reference: list[int]) -> dict:
    """One inspection; at its `position`-th token the range-1 replica it uses is SIGKILLed."""
    request = client.request(position + 16)
    killed_at, report, arrivals = None, None, []  # arrivals: (time, tokens received so far)
    seen = 0
    for event in client.stub.InspectStream(request, metadata=client.md, timeout=600):
        if event.HasField("report"):
            report = event.report
            break
        seen += len(event.delta.token_ids)
        arrivals.append((time.perf_counter(), seen))
        if killed_at is None and seen >= position:
            # the route's range-1 endpoint: ask the gateway which one this session is on
            st = client.stub.GetClusterStatus(inspection_pb2.ClusterStatusRequest(), metadata=client.md)
            busy = [s.address for s in st.stages if s.layer_start > 0 and s.sessions > 0]
            victim = next(r.name for r in stack.roles if r.role == "stage" and stack.address_of(r.name) in busy)
            stack.kill(victim)
            killed_at = time.perf_counter()
    f = report.failovers[0] if report.failovers else None
    # The first token sampled after the failed step (its index from the failover's session position) reached the
    # caller at the first delta that carried it.
    next_token_at = None
    if f is not None:
        wanted = f.position - report.prompt_tokens + 2  # tokens the caller holds once the failed step's one arrived
        next_token_at = next((t for t, n in arrivals if n >= wanted and t > killed_at), None)
    stack.restart(victim)
    client.wait_healthy(4)
    return {
        "position": position,
        "kill_to_next_token_ms": round((next_token_at - killed_at) * 1e3, 1) if next_token_at else None,
        "gateway_recovery_ms": round(f.recovery_ms, 1) if f else None,
        "replayed_tokens": f.replayed_tokens if f else 0,
        "tokens_equal_undisturbed": list(report.generated_token_ids) == reference[: len(report.generated_token_ids)],
    }


def recovery_by_position(args, workdir: Path) -> list[dict]:
    opts = StackOptions(
        workdir=workdir / "replicas",
        checkpoint=args.checkpoint,
        stages=2,
        replicas=2,
        codec="fp32",
        weights=args.weights,
        extra_env=ENV | {"EDGEINSPECT_REPLAN": "false"},
        start_timeout_s=args.start_timeout,
    )
    rows = []
    with LocalStack(opts) as stack:
        client = Client(stack)
        client.wait_healthy(4)
        longest = max(args.positions) + 16
        reference = list(client.stub.Inspect(client.request(longest), metadata=client.md).generated_token_ids)
        for position in args.positions:
            rows.append(kill_at(stack, client, position, reference))
            print(rows[-1], flush=True)
    return rows


def degraded_throughput(args, workdir: Path) -> dict:
    opts = StackOptions(
        workdir=workdir / "replan",
        checkpoint=args.checkpoint,
        stages=3,
        codec="fp32",
        weights=args.weights,
        extra_env=ENV | {"EDGEINSPECT_REPLAN_SETTLE_S": "3600"},
        start_timeout_s=args.start_timeout,
    )

    def tokens_per_s(client: Client) -> float:
        t0, tokens = time.perf_counter(), 0
        for _ in range(args.repeats):
            report = client.stub.Inspect(client.request(args.tokens), metadata=client.md, timeout=600)
            tokens += len(report.generated_token_ids)
        return tokens / (time.perf_counter() - t0)

    with LocalStack(opts) as stack:
        client = Client(stack)
        client.wait_healthy(3)
        tokens_per_s(client)  # warm-up
        normal = tokens_per_s(client)
        stack.kill("stage1")
        deadline = time.monotonic() + 300
        while True:
            st = client.stub.GetClusterStatus(inspection_pb2.ClusterStatusRequest(), metadata=client.md)
            if st.serving and st.plan.startswith("degraded"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"no re-plan: {st}")
            time.sleep(0.2)
        degraded = tokens_per_s(client)
        return {
            "normal_plan_tokens_per_s": round(normal, 2),
            "degraded_plan": st.plan,
            "degraded_plan_tokens_per_s": round(degraded, 2),
            "degraded_vs_normal": round(degraded / normal, 3),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=None, help="checkpoint folder (default: the tiny one)")
    ap.add_argument("--weights", default="fp32", help="stage weights (fp32 keeps replay bit-exact)")
    ap.add_argument("--positions", default="8,32,64,96", help="token positions at which a stage is killed")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per inspection in the throughput runs")
    ap.add_argument("--repeats", type=int, default=4, help="inspections per throughput measurement")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--out", type=Path, default=None, help="JSON to write (default bench/results/failover.json)")
    args = ap.parse_args()
    args.positions = [int(p) for p in args.positions.split(",")]
    with tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        rows = recovery_by_position(args, Path(tmp))
        throughput = degraded_throughput(args, Path(tmp))
    recovered = [r["kill_to_next_token_ms"] for r in rows if r["kill_to_next_token_ms"]]
    payload = {
        "machine": machine_info(bandwidth=False),
        "checkpoint": str(args.checkpoint or "tiny (generated)"),
        "weights": args.weights,
        "recovery_by_position": rows,
        "median_kill_to_next_token_ms": round(statistics.median(recovered), 1) if recovered else None,
        "all_tokens_equal_undisturbed": all(r["tokens_equal_undisturbed"] for r in rows),
        "throughput": throughput,
    }
    print(write_json("failover", payload, args.out))


if __name__ == "__main__":
    main()
