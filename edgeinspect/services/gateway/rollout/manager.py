"""Model versions on one gateway at run time: the candidate in shadow, canary stations, promote and rollback.

The servicer calls a VersionRouter, not an Inspector: it sends each request to the Inspector of the version
live for its station and, while a candidate shadows, queues the finished live report's request for the candidate.
The candidate runs it when it has capacity (bounded queue, bounded in flight; a full queue skips, counted) and
stores the report in its own database (shadow-reports.sqlite), flagged ModelInfo.shadow; the caller never sees it
and outputs never publish it. Each version is its own Inspector over its own vision/stage/retrieval processes, so
a promotion switches traffic, configuration (the record in rollout.json) and weights (the processes that hold
them) together, and the version it replaced stays connected for a rollback.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from edgeinspect.errors import FailedPrecondition, InvalidInput, NotFound
from edgeinspect.services.common.tasks import BackgroundTasks
from edgeinspect.services.gateway.inspection import Inspector, ReportWriter
from edgeinspect.services.gateway.prompt import check_prompt
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.gateway.rollout import versions as v
from edgeinspect.services.gateway.settings import FrameSettings, GatewaySettings
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.v1 import inspection_pb2, rollout_pb2

log = logging.getLogger(__name__)
SHADOW_DB = "shadow-reports.sqlite"
CONNECT_TIMEOUT_S = 120.0
DEFAULT_QUEUE = 64
DEFAULT_DISAGREEMENTS = 20


# server.connect: builds an Inspector for a version's settings, writing through the given store.
Connect = Callable[[GatewaySettings, ReportWriter], Awaitable[Inspector]]


class RoutingStore(ReportWriter):
    """The store a candidate's Inspector writes to: its shadow runs (idempotency key `shadow:<live id>`) go to the
    shadow database flagged ModelInfo.shadow, its live runs (canary stations, after promotion) to the live one."""

    def __init__(self, live: ReportStore, shadow: ReportStore):
        self.live, self.shadow = live, shadow
        self._shadow_ids: set[str] = set()

    def claim(self, key: str, request_id: str) -> tuple[str, inspection_pb2.DefectReport | None]:
        if not key.startswith(v.SHADOW_KEY):
            return self.live.claim(key, request_id)
        report_id, existing = self.shadow.claim(key, request_id)
        self._shadow_ids.add(report_id)
        return report_id, existing

    def complete(
        self,
        report: inspection_pb2.DefectReport,
        *,
        image: bytes | None = None,
        heatmap: bytes | None = None,
        to_line: bool = False,
    ) -> None:
        if not report.idempotency_key.startswith(v.SHADOW_KEY):
            return self.live.complete(report, image=image, heatmap=heatmap, to_line=to_line)
        self._shadow_ids.discard(report.report_id)
        report.model.shadow = True  # stored for comparison only: never queued for the line (is_shadow)
        return self.shadow.complete(report)  # the frame is the live report's, kept by the live store

    def fail(self, report_id: str, reason: str) -> None:
        store = self.shadow if report_id in self._shadow_ids else self.live
        self._shadow_ids.discard(report_id)
        return store.fail(report_id, reason)

    def explain(self, explained: inspection_pb2.DefectReport, to_line: bool = False) -> inspection_pb2.DefectReport:
        if explained.idempotency_key.startswith(v.SHADOW_KEY):
            explained.model.shadow = True
            return self.shadow.explain(explained)
        return self.live.explain(explained, to_line)

    def explanation_failed(
        self, report_id: str, reason: str, to_line: bool = False
    ) -> inspection_pb2.DefectReport | None:
        stored = self.live.explanation_failed(report_id, reason, to_line)
        return stored if stored is not None else self.shadow.explanation_failed(report_id, reason)


class RolloutManager:
    """Owns the versions' Inspectors, the rollout record and the shadow queue."""

    def __init__(self, cfg: GatewaySettings, live_store: ReportStore, connect: Connect):
        self.cfg = cfg
        self.live_store = live_store
        self.connect = connect
        self.path = v.state_path(cfg)
        self.shadow_store = ReportStore(Path(cfg.db_path).parent / SHADOW_DB, frames=FrameSettings(keep=False))
        self.routing_store = RoutingStore(live_store, self.shadow_store)
        record = v.load_record(self.path)
        here = v.version_of(cfg)
        if record is None:
            record = v.Record(v.IDLE, here)
        elif record.state != v.PROMOTED:
            record.live = replace(here, name=record.live.name, prompt=record.live.prompt)
        self.record = record
        self.inspectors: dict[str, Inspector] = {}  # by Version.name
        self.queue: asyncio.Queue | None = None
        self.workers: list[asyncio.Task] = []
        self.skipped = self.failed = 0
        self.primary: Inspector | None = None  # the one server.connect built at start (Readiness closes it)
        self._retiring = BackgroundTasks("rollout")  # versions closing once idle
        self._lock = asyncio.Lock()

    # -- wiring -------------------------------------------------------------------------------------------------

    async def attach(self, live_inspector: Inspector) -> VersionRouter:
        """Takes the Inspector server.connect built for the live version; resumes a shadow after a restart."""
        self.record.live = replace(self.record.live, fingerprint=live_inspector.ckpt.fingerprint)
        self.inspectors[self.record.live.name] = self.primary = live_inspector
        if self.record.state in (v.SHADOW, v.CANARY) and self.record.candidate is not None:
            try:
                await self._connect(self.record.candidate, wait_s=0)
                self._start_shadow(*self.record.shadow)
            except Exception as exc:  # a candidate that is gone must not keep the live version from serving
                log.error("rollout: candidate %s not resumed after restart: %s", self.record.candidate.name, exc)
        self._save()
        return VersionRouter(self)

    async def _connect(self, version: v.Version, wait_s: float = CONNECT_TIMEOUT_S) -> Inspector:
        """An Inspector for `version` writing through the routing store, its outputs the live version's."""
        quiet = v.settings_for(self.cfg, version, outputs=OutputsConfig())
        inspector = await self.connect(quiet, self.routing_store)
        inspector.outputs = self.live_inspector().outputs
        try:
            if wait_s:
                await inspector.router.wait_complete(wait_s)
                info = await inspector.vision.info()
                theirs, ours = info.identity.checkpoint_fingerprint, inspector.ckpt.fingerprint
                if theirs and theirs != ours:
                    raise FailedPrecondition(
                        f"candidate vision node {version.vision} runs checkpoint {theirs}, not {ours}"
                    )
        except BaseException:
            await _close(inspector)  # its health watchers would otherwise go on polling a version nobody uses
            raise
        self.inspectors[version.name] = inspector
        return inspector

    def live_inspector(self) -> Inspector:
        return self.inspectors[self.record.live.name]

    def route(self, station: str) -> tuple[Inspector, v.Version]:
        r = self.record
        if r.state == v.CANARY and station in r.canary and r.candidate is not None:
            return self.inspectors[r.candidate.name], r.candidate
        return self.live_inspector(), r.live

    def _save(self) -> None:
        v.save_record(self.path, self.record)

    # -- shadow ---------------------------------------------------------------------------------------------------

    def _start_shadow(self, in_flight: int, queue: int) -> None:
        self.queue = asyncio.Queue(maxsize=max(1, queue))
        # Workers start from an empty context: a shadow run must not inherit a live request's deadline or id.
        loop = asyncio.get_running_loop()
        self.workers = [
            loop.create_task(self._shadow_worker(self.queue), context=contextvars.Context())
            for _ in range(max(1, in_flight))
        ]

    async def stop_shadow(self) -> None:
        for task in self.workers:
            task.cancel()
        for task in self.workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.workers, self.queue = [], None

    def offer(self, req: inspection_pb2.InspectRequest, live: inspection_pb2.DefectReport) -> None:
        """A finished live report: queue its request for the candidate, or count it skipped when the queue is full."""
        # Only production frames: verification and evaluation requests would bias the agreement.
        if self.queue is None or req.verification or req.evaluation or self.record.candidate is None:
            return
        try:
            self.queue.put_nowait((req, live.report_id))
        except asyncio.QueueFull:
            self.skipped += 1

    async def _shadow_worker(self, queue: asyncio.Queue) -> None:
        while True:
            req, live_id = await queue.get()
            try:
                candidate = self.record.candidate
                if candidate is None:
                    continue
                shadow = inspection_pb2.InspectRequest()
                shadow.CopyFrom(req)
                shadow.idempotency_key = v.SHADOW_KEY + live_id
                shadow.prompt = req.prompt or candidate.prompt
                # Each run in a fresh context of its own (the Inspector sets its deadline in the context).
                run = asyncio.get_running_loop().create_task(
                    self._drain(self.inspectors[candidate.name], shadow), context=contextvars.Context()
                )
                await run
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failed += 1
                log.warning("shadow run of report %s failed: %s", live_id, exc)
            finally:
                queue.task_done()

    @staticmethod
    async def _drain(inspector: Inspector, req: inspection_pb2.InspectRequest) -> None:
        async for _ in inspector.run(req):
            pass

    # -- the RPCs -------------------------------------------------------------------------------------------------

    async def start(self, candidate: v.Version, in_flight: int, queue: int) -> rollout_pb2.RolloutStatus:
        async with self._lock:
            if self.record.state in (v.SHADOW, v.CANARY):
                raise FailedPrecondition(
                    f"a rollout of {self.record.candidate.name} is under way: promote or roll it back first"
                )
            if not candidate.checkpoint or not candidate.vision or not candidate.stages:
                raise InvalidInput("the candidate needs a checkpoint folder, a vision node and its decoder stages")
            if candidate.name == self.record.live.name:
                raise InvalidInput(f"the candidate's name {candidate.name!r} is the live version's: give it another")
            check_prompt(candidate.prompt)  # it replaces an empty request prompt, after the request's own check
            inspector = await self._connect(candidate)
            candidate = replace(candidate, fingerprint=inspector.ckpt.fingerprint)
            shadow = (in_flight or 1, queue or DEFAULT_QUEUE)
            self.record = v.Record(v.SHADOW, self.record.live, candidate, self.record.previous, [], v.now_iso(), shadow)
            self._save()
            self._start_shadow(*shadow)
            log.info("rollout: %s (%s) shadows %s", candidate.name, candidate.fingerprint, self.record.live.name)
        return await self.status(0)

    async def promote(self, stations: list[str]) -> rollout_pb2.RolloutStatus:
        async with self._lock:
            r = self.record
            if r.state not in (v.SHADOW, v.CANARY) or r.candidate is None:
                raise FailedPrecondition("no candidate to promote: start a rollout first")
            if stations:
                r.state, r.canary = v.CANARY, sorted(set(r.canary) | set(stations))
            else:
                await self.stop_shadow()
                self.record = v.Record(v.PROMOTED, r.candidate, None, r.live, [], r.started)
            self._save()
            log.info("rollout: %s live for %s", r.candidate.name, ", ".join(stations) or "every station")
        return await self.status(0)

    async def rollback(self) -> rollout_pb2.RolloutStatus:
        async with self._lock:
            r = self.record
            if r.state in (v.SHADOW, v.CANARY):
                await self.stop_shadow()
                self.record = v.Record(v.ROLLED_BACK, r.live, None, r.previous, [], r.started)
                self._retire(r.candidate.name)
            elif r.state == v.PROMOTED and r.previous is not None:
                if r.previous.name not in self.inspectors:  # promoted before a restart: connect it again
                    await self._connect(r.previous)
                self.record = v.Record(v.ROLLED_BACK, r.previous, None, None, [], r.started)
                self._retire(r.live.name)
            else:
                raise FailedPrecondition("nothing to roll back: no rollout is under way or promoted")
            self._save()
            log.info("rollout: rolled back; %s is live for every station", self.record.live.name)
        return await self.status(0)

    def _retire(self, name: str) -> None:
        """Disconnects a version nobody routes to any more once its in-flight inspections are done. Never the
        Inspector the gateway started with (Readiness closes that one at shutdown)."""
        inspector = self.inspectors.pop(name, None)
        if inspector is None or inspector is self.primary:
            return

        async def close_when_idle() -> None:
            deadline = asyncio.get_running_loop().time() + self.cfg.upstream_timeout_s
            while inspector.admission.inflight and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.5)
            await _close(inspector)

        self._retiring.spawn(close_when_idle(), name=f"retire {name}")

    async def status(self, max_disagreements: int) -> rollout_pb2.RolloutStatus:
        out = self.record.to_proto()
        pairs = await asyncio.to_thread(self._pairs)
        shadowed, agreed, listed = v.compare(pairs, max_disagreements or DEFAULT_DISAGREEMENTS)
        out.shadowed, out.agreed, out.agreement = shadowed, agreed, agreed / shadowed if shadowed else 0.0
        out.disagreements.extend(listed)
        out.skipped, out.shadow_failed = self.skipped, self.failed
        out.pending = self.queue.qsize() if self.queue is not None else 0
        return out

    def _pairs(self) -> list:
        """(live, shadow) report pairs of this rollout, newest first."""
        since = datetime.fromisoformat(self.record.started) if self.record.started else None
        pairs, token = [], ""
        while True:
            page, token = self.shadow_store.list(page_size=500, page_token=token, since=since)
            for shadow in page:
                try:
                    live = self.live_store.get(shadow.idempotency_key.removeprefix(v.SHADOW_KEY))
                except NotFound:
                    continue
                pairs.append((live, shadow))
            if not token:
                return pairs

    async def close(self) -> None:
        """At gateway stop: the shadow's runs end (failed in the shadow database), the versions other than the one
        the gateway started with are disconnected (Readiness closes that one), the shadow database closed."""
        await self.stop_shadow()
        await self._retiring.close()
        for inspector in self.inspectors.values():
            if inspector is not self.primary:
                await _close(inspector)
        await asyncio.to_thread(self.shadow_store.close)


async def _close(inspector: Inspector) -> None:
    """Stops what server.connect started for an Inspector (as Readiness.close does for the live one)."""
    await inspector.router.close()
    await inspector.vision.close()
    if inspector.retrieval is not None:
        await inspector.retrieval.close()


class VersionRouter:
    """What the servicer calls: `run` sends each request to the Inspector of the version live for its station;
    `live` is the live version's Inspector (cluster status)."""

    def __init__(self, manager: RolloutManager):
        self.manager = manager

    def live(self) -> Inspector:
        return self.manager.live_inspector()

    async def run(self, req: inspection_pb2.InspectRequest) -> AsyncGenerator[inspection_pb2.InspectEvent, None]:
        if req.idempotency_key.startswith(v.SHADOW_KEY):
            raise InvalidInput(f"idempotency keys starting with {v.SHADOW_KEY!r} are reserved for shadow runs")
        inspector, version = self.manager.route(req.station)
        if version.prompt and not req.prompt:
            req = inspection_pb2.InspectRequest.FromString(req.SerializeToString())
            req.prompt = version.prompt
        async for event in inspector.run(req):
            if event.HasField("report") and version == self.manager.record.live:
                self.manager.offer(req, event.report)
            yield event
