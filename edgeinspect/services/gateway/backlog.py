"""The line's backlog: when an output's queue for a station reaches max_queued (its peer is down or not keeping
up), new inspections for that station are refused (OutboxFull: RESOURCE_EXHAUSTED with retry pushback) instead of
dropping the oldest results the line has not seen. Other stations and reads go on; nothing is latched: every
admission counts again, so the station resumes by itself once the queue drains (outputs.on_full: refuse)."""

from __future__ import annotations

import asyncio
import logging

from edgeinspect.errors import OutboxFull
from edgeinspect.services.common import metrics
from edgeinspect.services.outputs.fanout import Outputs
from edgeinspect.services.outputs.outbox import Backlog

log = logging.getLogger(__name__)


def refusal(full: list[Backlog]) -> str:
    """What a refused caller reads (within the 300 characters a status carries): which output, how many results wait,
    that its peer is down (the peer's address goes to the log and the status)."""
    parts = [
        f"output {b.output!r} has {b.queued} results queued for station {b.station!r} (limit {b.limit})" for b in full
    ]
    return (
        "; ".join(parts) + ": its peer is down or not taking them, so this station's new inspections are refused "
        "until they are delivered"
    )


class BacklogGuard:
    """Admits a station's inspection only while each output's queue for it is below max_queued."""

    def __init__(self, outputs: Outputs) -> None:
        self.outputs = outputs
        # a refused caller comes back around the output's next delivery try
        self._pushback_ms = int(outputs.cfg.retry_max_s * 1000)
        self._refusing: dict[str, str] = {}  # station -> the last refusal's text

    async def admit(self, station: str) -> None:
        if not self.outputs.refuses:
            return
        full = await asyncio.to_thread(self.outputs.backlog, station)
        was = self._refusing.pop(station, "")
        if not full:
            if was:
                log.info("station %s: the line's outputs caught up; admitting its inspections again", station)
                for name in self.outputs.writer.outputs:
                    metrics.OUTBOX_FULL.labels(output=name, station=station).set(0)
            return
        text = refusal(full)
        if not was:
            peers = ", ".join(f"{b.output}={self.outputs.peers.get(b.output, '?')}" for b in full)
            log.warning("refusing inspections for station %s: %s [%s]", station, text, peers)
        self._refusing[station] = text
        for b in full:
            metrics.OUTBOX_FULL.labels(output=b.output, station=station).set(1)
            metrics.OUTBOX_REFUSED.labels(output=b.output).inc()
        raise OutboxFull(text, retry_after_ms=self._pushback_ms)

    def notes(self) -> list[str]:
        """For GetClusterStatus: every station refused now (counted afresh)."""
        if not self.outputs.refuses:
            return []
        return [
            f"inspections refused for station {b.station!r}: output {b.output!r} has {b.queued} results queued "
            f"(limit {b.limit}); {self.outputs.peers.get(b.output, 'its peer')} is down"
            for b in self.outputs.backlogs()
        ]
