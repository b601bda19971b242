"""The gateway's readiness: SERVING exactly while a complete route over the decoder stages exists and a vision
replica (handshaken on our checkpoint: services/gateway/replicas/clients.py) is usable. Re-planning is started from here
when a layer range is left without a stage.
It follows the live model version: after a rollout promotes or rolls back in process, the new live version's
route, vision node and re-planner are what health reports on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from edgeinspect.services.common import metrics
from edgeinspect.services.common.server import HealthState
from edgeinspect.services.gateway.decode.replan import Replanner
from edgeinspect.services.gateway.inspection import Inspector

log = logging.getLogger(__name__)
PERIOD_S = 0.25  # also woken at once by any change the router sees


class Readiness:
    def __init__(self, inspector: Inspector, health: HealthState, live: Callable[[], Inspector] | None = None):
        self.primary = inspector  # the one server.connect built; closed here
        self.live = live or (lambda: inspector)  # the rollout's live version, which may change while serving
        self.inspector = inspector
        self.health = health
        self.replanners: dict[int, Replanner] = {}  # id(Inspector) -> its re-planner, one per version followed
        self._retrieval_seen = False
        self._started = time.monotonic()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for replanner in self.replanners.values():
            await replanner.close()
        for insp in {id(i): i for i in (self.primary, self.inspector)}.values():
            await insp.router.close()
            await insp.vision.close()
            if insp.retrieval is not None:
                await insp.retrieval.close()

    @property
    def replanner(self) -> Replanner:
        insp = self.inspector
        if id(insp) not in self.replanners:
            self.replanners[id(insp)] = Replanner(insp.router, insp.ckpt, insp.cfg)
        return self.replanners[id(insp)]

    def _follow_live(self) -> bool:
        """Switches to the live version's Inspector when a rollout changed it; True when it did."""
        live = self.live()
        if live is self.inspector:
            return False
        log.info(
            "readiness now follows checkpoint %s (was %s): rollout changed the live version",
            live.ckpt.fingerprint,
            self.inspector.ckpt.fingerprint,
        )
        self.inspector = live
        return True

    def serving(self) -> bool:
        insp = self.inspector
        return insp.router.complete() and insp.vision.serving and not self._awaiting_retrieval()

    def _awaiting_retrieval(self) -> bool:
        """At start-up a configured retrieval node gets upstream_timeout_s to come up before the gateway serves
        without it: the first reports of a shift should not lack spec context only because the gateway started
        first. Once seen, a lost retrieval node only degrades reports."""
        retrieval = self.inspector.retrieval
        if retrieval is None or self._retrieval_seen:
            return False
        if retrieval.serving:
            self._retrieval_seen = True
            return False
        return time.monotonic() - self._started < self.inspector.cfg.upstream_timeout_s

    async def _follow(self) -> None:
        while True:
            switched = self._follow_live()
            router = self.inspector.router
            if not router.complete():
                await self.replanner.cover_gaps()
            else:
                await self.replanner.restore_when_settled()
            serving = self.serving()
            metrics.ROUTE_COMPLETE.set(1 if router.complete() else 0)
            metrics.ADMISSION.labels(state="running").set(self.inspector.admission.inflight)
            metrics.ADMISSION.labels(state="queued").set(self.inspector.admission.queued)
            if serving != self.health.serving or (switched and serving):
                if serving:
                    self._size_admission()
                    self.inspector.stages.regroup()
                    log.info("gateway ready: plan %s", router.plan_text())
                else:
                    log.warning("gateway not ready: %s", self.why_not())
                await self.health.set_serving(serving)
            await router.wait_changed(PERIOD_S)

    def why_not(self) -> str:
        insp = self.inspector
        if not insp.vision.serving:
            return insp.vision.replicas.why_not()
        if self._awaiting_retrieval():
            return "waiting for the retrieval node to come up"
        return insp.router.missing_message()

    def _size_admission(self) -> None:
        per_range: dict[tuple[int, int], int] = {}
        for ep in self.inspector.router.usable():
            per_range[ep.range] = per_range.get(ep.range, 0) + ep.max_batch
        self.inspector.size_admission(list(per_range.values()))
