"""Fault points for crash tests: `EDGEINSPECT_FAULT=<point>` in a process's environment makes it SIGKILL itself when
it reaches that point (no cleanup, no flush: what an OOM kill or a power cut of the process leaves). Unset, a point
costs one dictionary lookup.

Points: `report_in_transaction` (ReportStore.complete, the report and its outbox rows written, not committed),
`report_committed` (committed, before any output was told), `output_sent` (an output's peer took the result, its
outbox row not yet deleted: the one window where a result is delivered twice, with the same report id), `explaining`
(a decision made at takt is stored and queued, its explanation generated but not stored: services/gateway/explain.py),
`explanation_in_transaction` (ReportStore.explain, the explanation written, not committed).
"""

from __future__ import annotations

import os
import signal

ENV = "EDGEINSPECT_FAULT"


def fault_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
