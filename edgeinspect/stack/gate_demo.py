"""The demo's anomaly-gate act: draw the sample part, teach its bank, inspect a good and a defective frame.

Runs the same commands a user would (`edgeinspect anomaly sample`, `edgeinspect anomaly teach --banks`), then waits
for the vision node to load the new bank and inspects through the gateway like any client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import grpc
from rich.console import Console

from edgeinspect.services.client import InspectionClient
from edgeinspect.services.common.findings import ok_cut
from edgeinspect.services.gateway.gate import where_in_words
from edgeinspect.v1 import inspection_pb2, vision_pb2, vision_pb2_grpc

PART = "board"  # the drawn circuit board: pads whose absence only a taught gate sees
STATION = "gate-demo"
BANK_WAIT_S = 60.0  # the vision node looks for new bank versions every few seconds


def teach_sample_part(console: Console, workdir: Path, banks: Path) -> Path:
    """Draws the sample part (once) and teaches its bank into `banks`; returns the part's sample folder."""
    sample = workdir / "anomaly-sample"
    if not (sample / PART / "defects.json").is_file():
        _run(console, ["anomaly", "sample", str(sample), "--part", PART])
    _run(console, ["anomaly", "teach", "--part", PART, "--from", str(sample / PART / "train" / "good"),
                   "--banks", str(banks)])  # fmt: skip
    return sample / PART


def wait_for_bank(vision_address: str, part: str, timeout_s: float = BANK_WAIT_S) -> str:
    """The bank id the vision node serves for `part` once it has loaded one."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(vision_address) as channel:
        stub = vision_pb2_grpc.VisionServiceStub(channel)
        while True:
            try:
                banks = {b.part: b.bank_id for b in stub.Info(vision_pb2.InfoRequest(), timeout=5).banks}
                if part in banks:
                    return banks[part]
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the vision node did not load a bank for part {part} within {timeout_s:.0f} s")
            time.sleep(0.5)


def show_gate(console: Console, stack, workdir: Path) -> None:
    """Teach, then a good and a defective frame through a gated station, one line each."""
    console.print(f"[green]Anomaly gate[/green]: teaching part {PART} from the drawn sample set ...")
    folder = teach_sample_part(console, workdir, stack.banks_dir)
    console.print(f"vision node serves {wait_for_bank(stack.address_of('vision'), PART)}")  # the demo runs plaintext
    labels = json.loads((folder / "defects.json").read_text())
    defect = next(name for name, label in labels.items() if label["severity"] == 3)
    frames = [("good", folder / "test" / "good" / "000.png", None), ("defective", folder / defect, labels[defect])]
    with InspectionClient(stack.gateway_address, stack.api_token, ca=stack.client_ca) as client:
        for what, path, label in frames:
            started = time.perf_counter()
            report = client.inspect(path.read_bytes(), station=STATION, part=PART)
            seconds = time.perf_counter() - started
            console.print(_line(what, report, seconds))
            if label is not None:
                x0, y0, x1, y1 = label["box"]
                drawn = f"drawn {label['kind']} at x {x0:.0%}-{x1:.0%}, y {y0:.0%}-{y1:.0%}"
                console.print(f"   {drawn}; heatmap: GetReportImage(report_id={report.report_id}, heatmap=true)")


def _line(what: str, report: inspection_pb2.DefectReport, seconds: float) -> str:
    a = report.anomaly
    verdict = inspection_pb2.Verdict.Name(report.verdict).removeprefix("VERDICT_")
    decided = {"GATE": "the gate", "GATE_AND_VLM": "the gate and the VLM", "VLM": "the VLM"}.get(
        inspection_pb2.DecidedBy.Name(a.decided_by).removeprefix("DECIDED_BY_"), "-"
    )
    peak = "no region above the OK cut"
    if a.regions:
        peak = "heatmap peaks " + where_in_words(a.regions[0])
    return (f"{what} frame: [bold]{verdict}[/bold] in {seconds:.2f} s, decided by {decided}; score {a.score:.3g} "
            f"(OK below {ok_cut(a):.3g}, bank {a.bank_id}); {peak}")  # fmt: skip


def _run(console: Console, args: list[str]) -> None:
    console.print(f"$ edgeinspect {' '.join(args)}", markup=False, highlight=False)
    subprocess.run([sys.executable, "-m", "edgeinspect.cli", *args], check=True)
