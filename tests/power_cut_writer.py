"""The writer whose box loses power (tests/test_power_cut.py): stores reports until it is killed, printing each id
only once the store has acknowledged it. `store`: the gateway's real report store with a transactional outbox and
frames; `unsynced`: the control, a SQLite table in WAL mode with synchronous=NORMAL (no fsync per commit)."""

from __future__ import annotations

import sqlite3
import sys
import uuid
from pathlib import Path


def store(root: Path) -> None:
    import cv2
    import numpy as np

    from edgeinspect.services.gateway.reports.store import ReportStore
    from edgeinspect.services.gateway.settings import FrameSettings
    from edgeinspect.services.outputs.outbox import OutboxWriter
    from edgeinspect.v1 import inspection_pb2

    outbox = OutboxWriter(outputs=("mqtt", "plant-webhook"), max_queued=1_000_000, drop_oldest=False)
    reports = ReportStore(root / "reports.sqlite", frames=FrameSettings(dir=str(root / "frames")), outbox=outbox)
    for i in range(1_000_000):
        key = f"cam-1:{i}"
        report_id, _ = reports.claim(key, uuid.uuid4().hex)
        pixels = np.full((48, 64, 3), i % 251, np.uint8)
        pixels[0, :8, 0] = np.frombuffer(i.to_bytes(8, "little"), np.uint8)  # distinct bytes per frame: its own file
        image = cv2.imencode(".png", pixels)[1].tobytes()
        report = inspection_pb2.DefectReport(report_id=report_id, idempotency_key=key, station="st-1", part="p",
                                             verdict=inspection_pb2.VERDICT_OK)  # fmt: skip
        reports.complete(report, image=image, to_line=True)
        print(report_id, flush=True)  # acknowledged: the gateway would answer the caller now


def unsynced(root: Path) -> None:
    db = sqlite3.connect(root / "unsynced.sqlite", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS results (id TEXT PRIMARY KEY)")  # durable (FULL): only rows are at stake
    db.execute("PRAGMA synchronous=NORMAL")
    for _ in range(1_000_000):
        rid = uuid.uuid4().hex
        db.execute("INSERT INTO results (id) VALUES (?)", (rid,))
        print(rid, flush=True)


if __name__ == "__main__":
    {"store": store, "unsynced": unsynced}[sys.argv[1]](Path(sys.argv[2]))
