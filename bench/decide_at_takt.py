"""Decide at takt, explain after (issue 65): a flagged part's time to the line, before and after, same stack, same
run. Two gated stations on one embedded stack, the drawn sample part `board` taught with efficientnet-lite0:

- `waits`: the station lets the VLM clear a flagged frame (vlm_may_clear), so its answer waits for the whole VLM
  report: the path every flagged part took before this change;
- `takt`: the VLM may not clear a flagged frame, so the gate's decision is the answer at once and the VLM's
  explanation completes the report after (services/gateway/explain.py); its completion time is reported beside it.

The time to the line is Inspect's answer time, what `edgeinspect ingest` writes to the PLC's OPC UA nodes on receipt
(that write adds about a millisecond on loopback: bench/line_latency.py). Frames are drawn defects of severity 2-3,
alternating between the stations; each `takt` explanation is awaited before the next frame, so both paths see the
same idle stack.

    .venv/bin/python bench/decide_at_takt.py [--rounds 4] [--workdir var/bench-takt] [--out PATH]
        [--checkpoint var/checkpoints/deepseek-vl-1.3b --weights int8 --vision-backend torch --max-new-tokens 80]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import grpc
from anomaly_service import PART, teach
from common import load_average, machine_info, write_json

from edgeinspect.models.anomaly.sample import write_sample_set
from edgeinspect.services.gateway.settings import AnomalyPolicy, GatewaySettings, StationGate
from edgeinspect.stack.launcher import LocalStack, StackOptions
from edgeinspect.stack.roles import write_private_yaml
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

TAKT, WAITS = "takt", "waits"
GOAL = 0.1  # a flagged part's time to the line, after / before


def inspect(stub, token: str, image: bytes, station: str, budget: int) -> tuple[float, inspection_pb2.DefectReport]:
    request = inspection_pb2.InspectRequest(image=image, station=station, part=PART, max_new_tokens=budget)
    start = time.perf_counter()
    report = stub.Inspect(request, metadata=[("authorization", f"Bearer {token}")], timeout=900)
    return time.perf_counter() - start, report


def explained_after(stub, token: str, report_id: str) -> tuple[float, int]:
    """Seconds from the decision until its explanation was stored, and its state."""
    while True:
        report = stub.GetReport(inspection_pb2.GetReportRequest(report_id=report_id),
                                metadata=[("authorization", f"Bearer {token}")], timeout=30)  # fmt: skip
        if report.explanation != inspection_pb2.EXPLANATION_PENDING:
            done = report.explained_time.ToNanoseconds() / 1e9 - report.created_time.ToNanoseconds() / 1e9
            return done, report.explanation
        time.sleep(0.1)


def measure(workdir: Path, rounds: int, checkpoint: Path | None, weights: str, vision_backend: str,
            budget: int) -> dict:  # fmt: skip
    sample_root = workdir / "sample"
    if not (sample_root / PART / "defects.json").is_file():
        write_sample_set(sample_root, parts=[PART])
    sample = sample_root / PART
    labels = json.loads((sample / "defects.json").read_text())
    defects = [(sample / n).read_bytes() for n, label in sorted(labels.items()) if label["severity"] >= 2]
    opts = StackOptions(workdir=workdir, stages=2, anomaly="vlm", gate_stations=(TAKT,), checkpoint=checkpoint,
                        weights=weights, vision_backend=vision_backend)  # fmt: skip
    with LocalStack(opts) as stack:
        # The `waits` station as a plant would configure it: gate, and the VLM may clear a flagged frame.
        gateway = stack.role("gateway")
        cfg = GatewaySettings.load(gateway.config_path)
        cfg.anomaly.stations[WAITS] = StationGate(policy=AnomalyPolicy.gate, vlm_may_clear=True)
        write_private_yaml(cfg, gateway.config_path)
        stack.restart("gateway")
        bank = teach(stack, sample)
        channel = grpc.insecure_channel(stack.gateway_address)
        stub = inspection_pb2_grpc.InspectionServiceStub(channel)
        token = stack.api_token
        inspect(stub, token, defects[0], WAITS, budget)  # warm both paths
        _, warm = inspect(stub, token, defects[0], TAKT, budget)
        explained_after(stub, token, warm.report_id)
        before, after, explained, states = [], [], [], []
        for i in range(rounds):
            image = defects[(i + 1) % len(defects)]
            seconds, report = inspect(stub, token, image, WAITS, budget)
            assert report.verdict != inspection_pb2.VERDICT_UNSPECIFIED and report.generated_token_ids
            before.append(seconds)
            seconds, report = inspect(stub, token, image, TAKT, budget)
            assert report.explanation == inspection_pb2.EXPLANATION_PENDING, report.explanation
            after.append(seconds)
            done, state = explained_after(stub, token, report.report_id)
            explained.append(done)
            states.append(inspection_pb2.Explanation.Name(state))
        channel.close()
    b, a, e = statistics.median(before), statistics.median(after), statistics.median(explained)
    return {
        "checkpoint": str(checkpoint) if checkpoint else "tiny (2-layer random test checkpoint): VLM times are not "
        "1.3B's",
        "weights": weights, "vision_backend": vision_backend, "max_new_tokens": budget or "gateway default",
        "bank": bank,
        "flagged_part_to_the_line": {
            "before_waits_for_vlm_s": [round(x, 3) for x in before],
            "after_decided_at_takt_s": [round(x, 3) for x in after],
            "before_median_s": round(b, 3), "after_median_s": round(a, 3), "ratio": round(a / b, 4),
            "goal": f"<= {GOAL}x", "met": a / b <= GOAL,
        },
        "explanation_stored_after_the_decision_s": {"each": [round(x, 3) for x in explained], "median": round(e, 3),
                                         "states": states},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="flagged frames timed on each station")
    ap.add_argument("--workdir", type=Path, default=Path("var/bench-takt"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--checkpoint", type=Path, default=None, help="default: the tiny test checkpoint")
    ap.add_argument("--weights", default="fp32", help="decoder stages' weights (int8 at 1.3B: the product's choice)")
    ap.add_argument("--vision-backend", default="torch")
    ap.add_argument("--max-new-tokens", type=int, default=0, help="report budget (0: the gateway's default)")
    args = ap.parse_args()
    payload = {"command": " ".join(["python", *sys.argv]), "machine": machine_info(bandwidth=False)}
    payload["takt"] = measure(args.workdir.resolve(), args.rounds, args.checkpoint, args.weights,
                              args.vision_backend, args.max_new_tokens)  # fmt: skip
    payload["machine"]["loadavg_end"] = load_average()
    line = payload["takt"]["flagged_part_to_the_line"]
    done = payload["takt"]["explanation_stored_after_the_decision_s"]["median"]
    path = write_json("decide_at_takt" + ("_1.3b" if args.checkpoint else ""), payload, args.out)
    print(
        f"flagged part to the line: {line['after_median_s']:.3f} s decided at takt vs {line['before_median_s']:.3f} s "
        f"waiting for the VLM = {line['ratio']:.3f}x; explanation stored {done:.2f} s after the decision\n{path}"
    )


if __name__ == "__main__":
    main()
