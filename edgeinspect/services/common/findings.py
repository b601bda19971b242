"""What every reader of a report's AnomalyFinding (console, client, line outputs, evaluation) shows beside a score."""

from __future__ import annotations


def ok_cut(finding) -> float:
    """The OK cut of an AnomalyFinding: below it the gate called the part OK. Reports stored before the cut was
    recorded carry 0 there; their threshold, the number they showed, stands in."""
    return finding.ok_cut or finding.threshold
