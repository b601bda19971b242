"""What the line integration adds to an inspection: trigger -> ResultReady over OPC UA and trigger -> result
message over MQTT, against the gateway's own report time, per cycle, in one run.

The embedded stack (tiny checkpoint) with its gateway publishing to a local Mosquitto, a real `edgeinspect ingest`
process serving one OPC UA station (camera: an image folder at 20 fps), and an asyncua client as the PLC. Per
cycle, on one clock (one box):

    trigger ──(frame wait)── capture ──(gateway: inspect, store)── report stored ──(integration)── ResultReady / message

gateway_report_ms = report stored (the gateway's own log line) - capture: what `edgeinspect inspect` waits for too;
integration_opcua_ms = ResultReady seen by the PLC - report stored (gRPC answer, ingest, OPC UA writes, the PLC's
1 ms poll); integration_mqtt_ms = message received - report stored (outbox, broker, subscriber).
The frame wait is the camera's (half a frame period on average) and is reported on its own. Target: the median
integration adds <= 20 ms.

    .venv/bin/python bench/line_latency.py [--cycles 20] [--out bench/results/line_latency.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from common import load_average, machine_info, skip, target, write_json

from edgeinspect.assets import sample_image
from edgeinspect.services.client import InspectionClient
from edgeinspect.services.line.plcsim import PlcSim
from edgeinspect.services.line.testing import MosquittoBroker, free_port
from edgeinspect.services.outputs.config import mqtt_outputs_env
from edgeinspect.stack.launcher import LocalStack, StackOptions

TARGET_MS = 20.0


class Arrivals:
    """Wall time each result message arrived, by report id (paho-mqtt subscriber)."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt

        self.at: dict[str, float] = {}
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-line")
        self.client.on_connect = lambda c, *_: c.subscribe("edgeinspect/+/+/result", qos=1)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _c, _u, msg) -> None:
        now = time.time()
        report_id = json.loads(msg.payload)["report_id"]
        with self.lock:
            self.at.setdefault(report_id, now)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def stored_times(gateway_log: Path) -> dict[str, float]:
    """Wall time the gateway logged each report as stored ("report <id> stored: ..."), by report id."""
    from datetime import datetime

    out = {}
    for line in gateway_log.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        words = str(record.get("event", "")).split()
        if len(words) > 2 and words[0] == "report" and words[2].startswith("stored"):
            out[words[1]] = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()
    return out


def journal_written_at(path: Path, cycle_id: str) -> float:
    """Wall time the station wrote the cycle's result (trigger time + trigger -> write, from the journal)."""
    import sqlite3

    with sqlite3.connect(path) as db:
        triggered, written_ms = db.execute(
            "SELECT triggered_at, written_ms FROM cycles WHERE cycle_id = ?", (cycle_id,)
        ).fetchone()
    return triggered + written_ms / 1e3


def stats(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 2),
        "max": round(ordered[-1], 2),
        "min": round(ordered[0], 2),
    }


async def run_cycles(endpoint: str, n: int, warmup: int) -> list:
    deadline = time.monotonic() + 120
    while True:
        try:
            plc = await PlcSim(endpoint, "bench-station").__aenter__()
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    try:
        for _ in range(warmup):
            await plc.cycle(result_timeout_s=60)
        return [await plc.cycle(result_timeout_s=60) for _ in range(n)]
    finally:
        await plc.__aexit__()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if shutil.which("mosquitto") is None:
        skip("needs Debian's mosquitto")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    info = machine_info(bandwidth=False)
    work = Path(tempfile.mkdtemp(prefix="bench-line-"))
    broker = MosquittoBroker(work / "broker").start()
    ingest = None
    try:
        opts = StackOptions(workdir=work / "stack", stages=2, extra_env=mqtt_outputs_env(broker.url, "bench"))
        with LocalStack(opts) as stack:
            (work / "cam").mkdir()
            shutil.copy(sample_image(), work / "cam" / "part.jpg")
            port = free_port()
            cameras = {
                "cameras": [
                    {
                        "id": "bench-cam",
                        "station": "bench-station",
                        "part": "HSG-210",
                        "source": str(work / "cam"),
                        "loop": True,
                        "folder_fps": 20,
                        "sampling": {"trigger_only": True},
                        "max_new_tokens": 12,
                        "line": {"result_deadline_ms": 60_000},
                    }
                ],
                "gateway": stack.gateway_address,
                "api_token": stack.api_token,
                "frames_dir": str(work / "frames"),
                "opcua": {"port": port, "journal": str(work / "line.sqlite")},
                "log_json": False,
            }
            (work / "cameras.yaml").write_text(yaml.safe_dump(cameras))
            log = (work / "ingest.log").open("wb")
            ingest = subprocess.Popen(
                [sys.executable, "-m", "edgeinspect.cli", "ingest", "--config", str(work / "cameras.yaml")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            arrivals = Arrivals(broker.port)
            cycles = asyncio.run(run_cycles(f"opc.tcp://127.0.0.1:{port}/edgeinspect/", args.cycles, args.warmup))
            time.sleep(1.0)  # the last messages
            arrivals.close()
            rows = []
            stored_at = stored_times(work / "stack" / "logs" / "gateway.log")
            with InspectionClient(stack.gateway_address, stack.api_token) as client:
                for c in cycles:
                    report = client.get(c.report_id)
                    created = report.created_time.ToNanoseconds() / 1e9
                    capture = report.capture_time.ToNanoseconds() / 1e9
                    triggered = c.result_seen_at - c.trigger_to_result_ms / 1e3
                    message = arrivals.at.get(c.report_id)
                    stored = stored_at[c.report_id]
                    wrote = journal_written_at(work / "line.sqlite", c.cycle_id)
                    rows.append(
                        {
                            "report_id": c.report_id,
                            "trigger_to_result_ready_ms": round(c.trigger_to_result_ms, 2),
                            "trigger_to_message_ms": None if message is None else round((message - triggered) * 1e3, 2),
                            "frame_wait_ms": round((capture - triggered) * 1e3, 2),
                            "gateway_report_ms": round((stored - capture) * 1e3, 2),
                            "gateway_store_ms": round((stored - created) * 1e3, 2),
                            "integration_opcua_ms": round((c.result_seen_at - stored) * 1e3, 2),
                            "integration_mqtt_ms": None if message is None else round((message - stored) * 1e3, 2),
                            # the OPC UA integration split: stored -> ingest wrote the result nodes -> PLC saw them
                            "stored_to_written_ms": round((wrote - stored) * 1e3, 2),
                            "written_to_plc_ms": round((c.result_seen_at - wrote) * 1e3, 2),
                        }
                    )
    finally:
        if ingest is not None:
            ingest.terminate()
            ingest.wait(20)
        broker.stop()
    missing = [r["report_id"] for r in rows if r["integration_mqtt_ms"] is None]
    col = {k: [r[k] for r in rows if r[k] is not None] for k in rows[0] if k != "report_id"}
    summary = {k: stats(v) for k, v in col.items()}
    payload = {
        "bench": "line_latency",
        "what": "per cycle: trigger -> ResultReady (OPC UA) and trigger -> result message (MQTT) vs the gateway's "
        "report time (capture -> report created), one run, one clock",
        "machine": {**info, "loadavg_end": load_average()},
        "cycles": len(rows),
        "mqtt_messages_missing": missing,
        "summary_ms": summary,
        "targets": {
            "integration_opcua_median_ms": target(summary["integration_opcua_ms"]["median"], TARGET_MS, False),
            "integration_mqtt_median_ms": target(summary["integration_mqtt_ms"]["median"], TARGET_MS, False),
            # our side of the OPC UA figure alone (the rest is the PLC client's poll)
            "station_write_median_ms": target(summary["stored_to_written_ms"]["median"], TARGET_MS, False),
        },
        "rows": rows,
    }
    path = write_json("line_latency", payload, args.out)
    for key, s in summary.items():
        print(f"{key:30s} median {s['median']:9.2f}  p95 {s['p95']:9.2f}  max {s['max']:9.2f} ms")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
