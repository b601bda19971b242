"""Decide at takt, explain after: the VLM's explanations of reports whose verdict already went to the line.

At a gated station whose VLM may not clear a flagged frame, the VLM cannot change what the line does with the part,
so the gateway stores and sends the gate's decision at once (inspection.py) and hands the VLM's run to this module.
Each explanation is a task of its own, not tied to the caller's RPC: a unary Inspect answered with the decision, or a
stream whose caller went away, leaves it running. Callers still listening follow its events (token deltas, then the
explained report). The job stores the explanation into the same report (ReportStore.explain: the verdict stays as
sent) and queues its `explained` result for the outputs; a job that fails, or is cut short by shutdown, marks the
explanation failed instead. A gateway killed mid-explanation marks it failed at its next start (fail_unexplained).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from prometheus_client import Counter, Gauge

from edgeinspect.faults import fault_point
from edgeinspect.v1 import inspection_pb2

log = logging.getLogger(__name__)

EXPLANATIONS = Counter(
    "edgeinspect_explanations", "explanations after a decision, by result (done | failed)", ["result"]
)
EXPLAINING = Gauge("edgeinspect_explaining", "explanations running after their decision went to the line")
RESTARTED = "the gateway restarted while the VLM explained this report; the decision stands"
STOPPED = "the gateway stopped before the VLM finished explaining this report; the decision stands"


class ExplanationJob:
    """One running explanation: its events so far, replayed to every follower."""

    def __init__(self, report_id: str) -> None:
        self.report_id = report_id
        self._events: list[inspection_pb2.InspectEvent] = []
        self._changed = asyncio.Condition()
        self.finished = False

    async def publish(self, event: inspection_pb2.InspectEvent | None) -> None:
        """Adds an event for the followers; None: the job is over."""
        async with self._changed:
            if event is None:
                self.finished = True
            else:
                self._events.append(event)
            self._changed.notify_all()

    async def follow(self) -> AsyncIterator[inspection_pb2.InspectEvent]:
        """Every event from the first, then each new one, until the stored report."""
        sent = 0
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda n=sent: n < len(self._events) or self.finished)
                fresh = self._events[sent:]
            for event in fresh:
                yield event
            sent += len(fresh)
            if not fresh and self.finished:
                return


# What a job runs: the VLM's events (token deltas), ending with the explained report, not yet stored.
Explain = Callable[[], AsyncIterator[inspection_pb2.InspectEvent]]


class Explanations:
    """The gateway's running explanations (one task each); `close` lets them finish within a grace, then marks the
    rest failed."""

    def __init__(self, store, notify: Callable[[], None]) -> None:
        """store: the ReportStore; notify: wakes the outputs once an explanation's rows are committed."""
        self.store = store
        self.notify = notify
        self._jobs: dict[str, tuple[ExplanationJob, asyncio.Task]] = {}

    def start(self, report_id: str, explain: Explain, to_line: bool) -> ExplanationJob:
        job = ExplanationJob(report_id)
        task = asyncio.create_task(self._run(job, explain, to_line), name=f"explain-{report_id}")
        self._jobs[report_id] = (job, task)
        EXPLAINING.set(len(self._jobs))
        return job

    def running(self) -> list[str]:
        return list(self._jobs)

    async def _run(self, job: ExplanationJob, explain: Explain, to_line: bool) -> None:
        report = None
        try:
            async for event in explain():
                if event.HasField("report"):
                    report = event.report
                else:
                    await job.publish(event)
            if report is None:
                raise RuntimeError("the VLM's run ended without a report")
            fault_point("explaining")  # the decision on the line, the explanation made but not stored
            stored = await asyncio.to_thread(self.store.explain, report, to_line)
            EXPLANATIONS.labels(result="done").inc()
            log.info("report %s explained", job.report_id, extra={"report_id": job.report_id})
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            reason = STOPPED if cancelled else f"the VLM's explanation failed: {_why(exc)}; the decision stands"
            log.warning("report %s: %s", job.report_id, reason, extra={"report_id": job.report_id})
            failing = asyncio.to_thread(self.store.explanation_failed, job.report_id, reason, to_line)
            stored = await asyncio.shield(failing)
            EXPLANATIONS.labels(result="failed").inc()
            if not cancelled and not isinstance(exc, Exception):
                raise
        finally:
            self.notify()
            self._jobs.pop(job.report_id, None)
            EXPLAINING.set(len(self._jobs))
        if stored is not None:
            await job.publish(inspection_pb2.InspectEvent(report=stored))
        await job.publish(None)

    async def close(self, grace_s: float) -> None:
        """Waits up to grace_s for the running explanations, then cancels the rest (each marks itself failed)."""
        tasks = [task for _, task in self._jobs.values()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=10.0)


def _why(exc: BaseException) -> str:
    """A failure as one line for the report (a gRPC status and its details, or our own error's text)."""
    code = getattr(exc, "code", None)
    if callable(code):
        return f"{code().name}: {exc.details()}"  # type: ignore[attr-defined]
    return str(exc) or type(exc).__name__
