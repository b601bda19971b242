"""Issue 58: the report store and its transactional outbox survive a power cut of the box without losing an
acknowledged result (tests/power_cut.py: what is simulated, why it is faithful, and what it does not model).

A real writer process stores reports through the gateway's ReportStore on an ext4 filesystem of its own; the test
cuts the power while it writes, boots the disk image (the journal replays), and checks every report the writer had
acknowledged: stored whole, its frame readable, its line result queued for every output. The control shows the rig
loses what was never fsynced, so the check can fail."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from power_cut import PowerCutBox, available, mounted

from edgeinspect.v1 import inspection_pb2

pytestmark = pytest.mark.skipif(bool(available()), reason=available() or "-")
WRITER = Path(__file__).with_name("power_cut_writer.py")


def write_then_cut(tmp_path: Path, mode: str, acknowledged: int) -> tuple[list[str], Path]:
    """Runs the writer until it has acknowledged `acknowledged` results, cuts the power mid-write; returns every id
    it acknowledged before the cut and the disk image the cut left."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with PowerCutBox(tmp_path) as box:
        proc = subprocess.Popen([sys.executable, str(WRITER), mode, str(box.root)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        acked: list[str] = []
        reader = threading.Thread(target=lambda: acked.extend(line.strip() for line in proc.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while len(acked) < acknowledged:
            assert proc.poll() is None, f"the writer died: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, f"only {len(acked)} results acknowledged in 120 s"
            time.sleep(0.01)
        image = box.cut(proc.pid)  # the writer is mid-way through its next result
        proc.wait(10)
        reader.join(10)  # ids it printed before it was frozen were acknowledged too
    return acked, image


def test_every_acknowledged_report_and_its_line_result_survive_a_power_cut(tmp_path):
    acked, image = write_then_cut(tmp_path, "store", acknowledged=60)
    from edgeinspect.services.gateway.reports.store import ReportStore
    from edgeinspect.services.gateway.settings import FrameSettings

    with mounted(image, tmp_path / "rebooted") as root:
        with sqlite3.connect(root / "reports.sqlite") as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            queued = {out: {r for (r,) in db.execute("SELECT report_id FROM outbox WHERE output = ?", (out,))}
                      for out in ("mqtt", "plant-webhook")}  # fmt: skip
        store = ReportStore(root / "reports.sqlite", frames=FrameSettings(dir=root / "frames"))
        try:
            for report_id in acked:
                report = store.get(report_id)
                assert report.verdict == inspection_pb2.VERDICT_OK and report.station == "st-1"
                frame = store.image(report_id)
                assert frame.state == inspection_pb2.IMAGE_STATE_STORED and frame.data.startswith(b"\x89PNG")
                for out, ids in queued.items():
                    assert report_id in ids, f"report {report_id} is stored but its result for {out} was lost"
        finally:
            store.close()
    assert len(acked) >= 60


def test_the_rig_loses_what_was_never_fsynced(tmp_path):
    """The control: WAL with synchronous=NORMAL (the old outboxes' setting) acknowledges before any fsync, and the
    cut takes those rows with it. Were the rig not cutting anything, this would fail. Up to five cuts: anything on
    the box that flushes every filesystem (a `sync` by another process) can save the rows of one."""
    losses = []
    for trial in range(5):
        acked, image = write_then_cut(tmp_path / f"cut{trial}", "unsynced", acknowledged=200)
        with mounted(image, tmp_path / f"rebooted{trial}") as root, sqlite3.connect(root / "unsynced.sqlite") as db:
            kept = {r for (r,) in db.execute("SELECT id FROM results")}
        losses.append(len([r for r in acked if r not in kept]))
        if losses[-1]:
            break
    assert losses[-1], f"every unsynced row survived {len(losses)} cuts: the rig did not cut the power"
