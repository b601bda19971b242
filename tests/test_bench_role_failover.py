"""bench/role_failover.py end to end on the tiny checkpoint: the doubled stack on a real PostgreSQL, one vision kill."""

from __future__ import annotations

import pytest
from bench_scripts import run_bench
from pg_testing import unavailable_reason

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,  # ~11 processes: 60 s on a quiet box, over 2 minutes under load
    pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
]


def test_role_failover_records_both_times_per_role_against_the_undisturbed_inspection(tmp_path):
    data = run_bench(
        "role_failover",
        "--roles",
        "vision",
        "--rounds",
        "1",
        "--tokens",
        "8",
        "--owner-lease-s",
        "3",
        out=tmp_path / "role_failover.json",
        timeout=240,
    )
    assert data["command"] and data["date"] and "cpu_flags" in data["machine"] and data["owner_lease_s"] == 3.0
    assert set(data["roles"]) == {"vision"} and data["undisturbed_ms"]["median"] > 0
    vision = data["roles"]["vision"]
    assert vision["rounds"] == 1 and vision["errors"] == 0
    for figure in ("undisturbed_ms", "kill_to_inflight_report_ms", "kill_to_fresh_report_ms"):
        assert 0 < vision[figure]["median"] <= vision[figure]["max"]
    (row,) = data["rounds"]
    assert row["role"] == "vision" and row["killed"] in ("vision", "vision1")
    assert row["inflight_ms"] > 0 and row["fresh_ms"] > 0
