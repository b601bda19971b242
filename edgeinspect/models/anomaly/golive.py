"""The go-live gate of a staged bank version: its figures on labelled frames beside the current version's on the same
frames, recorded in the bank store, and the check that promotion runs.

    <root>/<part>/golive/v0005.json   {bank_id, baseline_bank_id, candidate, baseline, failures, passed, ...}

`record` scores the staged (candidate) and the current version on one labelled part folder (evaluate.py) and writes
the record atomically; `promote` makes the candidate current through BankStore.promote, refusing a version whose
record is missing, stale (another version became current since) or failed, unless forced. The rule is the one
`edgeinspect eval --baseline` applies to the gate (services/evaluation/gate.py): the candidate's escape and overkill
may not lie above the current version's 95% Wilson upper bound plus a tolerance. A part with no current version has
nothing to regress from: its first bank passes on its figures being recorded.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from edgeinspect.durable import fsync_dir, write_synced
from edgeinspect.errors import FailedPrecondition
from edgeinspect.models.anomaly.bank import Bank, BankStore
from edgeinspect.models.anomaly.evaluate import evaluate, wilson

log = logging.getLogger(__name__)

FOLDER = "golive"
# figure -> (count, denominator) in EvalResult.to_json(): what a candidate may not make worse.
GATED = {"escape": ("escaped", "n_defect"), "overkill": ("flagged_good", "n_good")}


def record_path(store: BankStore, part: str, version: int) -> Path:
    return store.root / part / FOLDER / f"v{version:04d}.json"


def regressions(candidate: dict, baseline: dict | None, tolerance: float = 0.0) -> list[str]:
    """The gated figures of `candidate` that lie above the baseline's 95% upper bound + tolerance, in words."""
    if baseline is None:
        return []
    out = []
    for name, (k_key, n_key) in GATED.items():
        k, n, base_k, base_n = candidate[k_key], candidate[n_key], baseline[k_key], baseline[n_key]
        if not n or not base_n:
            continue  # nothing measured on one side (a set without defects has no escape)
        limit = min(1.0, wilson(base_k, base_n).hi + tolerance)
        if k / n > limit + 1e-12:
            out.append(f"{name} {k}/{n} = {k / n:.1%} is above the current bank's {base_k}/{base_n} = "
                       f"{base_k / base_n:.1%} (limit {limit:.1%})")  # fmt: skip
    return out


def record(
    store: BankStore,
    part: str,
    version: int,
    part_dir: Path,
    open_scorer: Callable[[Bank], object],
    tolerance: float = 0.0,
) -> dict:
    """Scores version `version` and the current one on the labelled frames in `part_dir`, writes the record and
    returns it (open_scorer: a bank -> a scoring.Scorer with the extractor the bank names)."""
    candidate = store.load(part, version)
    current = store.current(part)
    figures = evaluate(part_dir, open_scorer(candidate)).to_json()
    baseline = (
        evaluate(part_dir, open_scorer(current)).to_json() if current and current.version != candidate.version else None
    )
    failures = regressions(figures, baseline, tolerance)
    doc = {
        "part": part,
        "version": candidate.version,
        "bank_id": candidate.bank_id,
        "baseline_bank_id": baseline["bank_id"] if baseline else None,
        "dataset": str(part_dir),
        "tolerance": tolerance,
        "candidate": figures,
        "baseline": baseline,
        "failures": failures,
        "passed": not failures,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    path = record_path(store, part, candidate.version)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    write_synced(tmp, (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return doc


def blockers(store: BankStore, candidate: Bank, current: Bank | None) -> list[str]:
    """Why `candidate` may not go live over `current` by its recorded figures (empty: it may)."""
    path = record_path(store, candidate.part, candidate.version)
    how = (f"record them with `edgeinspect anomaly eval ROOT --part {candidate.part} --version {candidate.version} "
           "--golive` on labelled frames")  # fmt: skip
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return [f"v{candidate.version} has no go-live figures: {how}"]
    except (OSError, ValueError) as exc:
        return [f"v{candidate.version}'s go-live record {path} is unreadable ({exc}): {how}"]
    if doc.get("bank_id") != candidate.bank_id:
        return [f"the go-live record of v{candidate.version} is of bank {doc.get('bank_id')}, not {candidate.bank_id}: "
                f"{how}"]  # fmt: skip
    now = current.bank_id if current is not None else None
    if doc.get("baseline_bank_id") != now:
        return [f"the go-live figures of v{candidate.version} were taken against {doc.get('baseline_bank_id')}, the "
                f"current bank is now {now}: {how}"]  # fmt: skip
    return list(doc.get("failures", []))


def promote(store: BankStore, part: str, version: int, force: bool = False) -> Bank:
    """Makes the staged `version` current when its go-live figures pass (force: whatever they say)."""

    def go_live(candidate: Bank, current: Bank | None) -> None:
        reasons = blockers(store, candidate, current)
        if reasons and not force:
            raise FailedPrecondition(
                f"part {part!r}: v{candidate.version} may not go live: {'; '.join(reasons)} (or promote with force)"
            )
        if reasons:
            log.warning("part %s: v%d promoted by force over its go-live figures: %s", part, version,
                        "; ".join(reasons))  # fmt: skip

    return store.promote(part, version, check=go_live)
