"""The fan-out: each output drains its own rows of the outbox table (outbox.py), oldest first, one in flight, at its
own pace, in a thread of its own, so a dead broker or a slow webhook never delays an inspection or the other
outputs. On the gateway the rows are written by the report's own transaction (ReportStore.complete) and `notify()`
wakes the drainers; the ingest role queues with `publish_result`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter, Gauge

from edgeinspect.faults import fault_point
from edgeinspect.services.common.retry import backoff_delays
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.services.outputs.outbox import DROPPED, Backlog, Outbox, OutboxWriter, open_local
from edgeinspect.services.outputs.result import DriftAlert, LineResult
from edgeinspect.services.outputs.webhook import Rejected, WebhookOutput
from edgeinspect.services.store.database import Database

logger = logging.getLogger(__name__)

DELIVERED = Counter("edgeinspect_output_delivered", "results an output's peer accepted", ["output"])
FAILURES = Counter("edgeinspect_output_failures", "failed delivery tries (retried)", ["output"])
QUEUED = Gauge("edgeinspect_output_queued", "results waiting in an output's outbox", ["output"])


class Sender(Protocol):
    name: str
    peer: str  # what a refusal names: the broker's host:port, the webhook's scheme://host:port

    async def send(self, key: str, payload: bytes) -> None:
        """Delivers one result; raises to have it retried (webhook.Rejected: dropped instead)."""

    async def close(self) -> None: ...


def retry_delays(base_s: float, max_s: float) -> Iterator[float]:
    """Doubling, jittered, capped, endless: a peer that is down for an hour still gets its results."""
    return itertools.chain(backoff_delays(base_s, 2.0, max_s, 8, jitter=0.2), itertools.repeat(max_s))


class OutputWorker:
    """One output: the loop that drains its rows, oldest first, one result in flight."""

    def __init__(self, sender: Sender, outbox: Outbox, cfg: OutputsConfig) -> None:
        self.sender = sender
        self.outbox = outbox
        self.cfg = cfg
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def _idle(self) -> None:
        """Until woken, or poll_s (rows another gateway queued, a lease that ran out)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.cfg.poll_s)
        self._wake.clear()

    async def run(self) -> None:
        name = self.sender.name
        delays = retry_delays(self.cfg.retry_base_s, self.cfg.retry_max_s)
        while True:
            try:
                entry = await asyncio.to_thread(self.outbox.claim, name)
                QUEUED.labels(output=name).set(await asyncio.to_thread(self.outbox.queued, name))
            except Exception as exc:  # the database is unreachable (PostgreSQL restarting): try again later
                logger.warning("output %s: cannot read the outbox (%s); retrying", name, exc)
                await asyncio.sleep(next(delays))
                continue
            if entry is None:
                await self._idle()
                continue
            try:
                await self.sender.send(entry.report_id, entry.payload)
            except asyncio.CancelledError:
                await asyncio.to_thread(self.outbox.release, entry)  # the next start (or gateway) sends it at once
                raise
            except Rejected as exc:
                logger.error("output %s: result %s rejected, dropped: %s", name, entry.report_id, exc)
                DROPPED.labels(output=name, reason="rejected").inc()
            except Exception as exc:  # the peer is down or broke: keep the row (and its lease), back off, try again
                FAILURES.labels(output=name).inc()
                delay = next(delays)
                logger.warning(
                    "output %s: delivery of %s failed (%s); retrying in %.2fs", name, entry.report_id, exc, delay
                )
                await asyncio.sleep(delay)
                continue
            else:
                DELIVERED.labels(output=name).inc()
                fault_point("output_sent")  # sent, not yet acknowledged in the outbox: the redelivery window
            delays = retry_delays(self.cfg.retry_base_s, self.cfg.retry_max_s)
            await asyncio.to_thread(self.outbox.ack, entry)


def make_senders(cfg: OutputsConfig) -> list[Sender]:
    senders: list[Sender] = []
    names = cfg.names()
    if cfg.mqtt is not None:
        from edgeinspect.services.outputs.mqtt import MqttOutput

        senders.append(MqttOutput(cfg.mqtt, names[0]))
    for hook, name in zip(cfg.webhooks, names[len(senders) :], strict=True):
        senders.append(WebhookOutput(hook, name))
    return senders


class Outputs:
    """Every configured output draining the outbox table of `db`; a no-op when none is configured."""

    def __init__(
        self,
        cfg: OutputsConfig,
        db_opener: Callable[[], Database] | None = None,
        *,
        holder: str = "",
        senders: list[Sender] | None = None,
        legacy_dir: Path | None = None,
    ) -> None:
        """db_opener: opens this drainer's own connection to the database holding the outbox table (called only
        when an output is configured); holder: this drainer's name among those sharing the database."""
        self.cfg = cfg
        senders = make_senders(cfg) if senders is None else senders
        names = [s.name for s in senders]
        if len(set(names)) != len(names):
            raise ValueError(f"output names must be unique, got {names}")
        self.writer = OutboxWriter.of(cfg, names)
        self.peers = {s.name: s.peer for s in senders}
        self.workers: list[OutputWorker] = []
        self.outbox: Outbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if not senders:
            return
        if db_opener is None:
            raise ValueError("outputs are configured but no database to queue their results in was given")
        self.outbox = Outbox(db_opener(), holder, cfg.lease_s)
        if legacy_dir is not None:
            self.outbox.import_legacy(legacy_dir, names)
        self._loop = asyncio.new_event_loop()
        self._tasks: list[asyncio.Task] = []
        self.workers = [OutputWorker(sender, self.outbox, cfg) for sender in senders]
        self._thread = threading.Thread(target=self._run, args=(self._loop,), name="outputs", daemon=True)
        self._thread.start()

    @classmethod
    def none(cls) -> Outputs:
        return cls(OutputsConfig(), senders=[])

    @classmethod
    def for_gateway(cls, settings) -> Outputs:
        """From GatewaySettings: the outbox table of the report database (its own connection), outboxes older
        releases left beside the database imported once."""
        from edgeinspect.services.store.database import open_database

        legacy = settings.outputs.outbox_dir or Path(settings.db_path).parent / "outbox"
        return cls(
            settings.outputs,
            lambda: open_database(settings.store, settings.db_path),
            holder=settings.store.owner(),
            legacy_dir=legacy,
        )

    @classmethod
    def local(cls, cfg: OutputsConfig, folder: Path) -> Outputs:
        """The ingest role's outputs: an outbox database of their own in `folder` (cfg.outbox_dir wins)."""
        folder = Path(cfg.outbox_dir or folder)
        return cls(cfg, lambda: open_local(folder), legacy_dir=folder)

    @property
    def enabled(self) -> bool:
        return self._loop is not None

    @property
    def refuses(self) -> bool:
        """A full queue refuses that station's inspections (instead of dropping its oldest results)."""
        return self.enabled and not self.writer.drop_oldest

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        # Workers are made outside the loop (their Events bind to it on first use), tasks inside it.
        self._tasks = [loop.create_task(w.run()) for w in self.workers]
        loop.run_forever()

    def notify(self) -> None:
        """Rows were committed: the drainers look now instead of at their next poll. Thread-safe."""
        if self._loop is not None:
            for worker in self.workers:
                self._loop.call_soon_threadsafe(worker.wake)

    def publish_result(self, result: LineResult) -> None:
        """Queues one result in a transaction of its own (the ingest role, which has no report store); durable
        when this returns. Over max_queued: refuse mode keeps it (only the gateway can refuse inspections)."""
        if self.outbox is None:
            return
        self.outbox.put(self.writer, result)
        self.notify()

    def publish_drift(self, alert: DriftAlert) -> None:
        """Queues a drift alert for the MQTT output alone (webhooks take results only), in a transaction of its
        own; durable when this returns. A no-op without an MQTT output or with its drift_topic empty."""
        mqtt = self.cfg.mqtt
        if self.outbox is None or mqtt is None or not mqtt.drift_topic:
            return
        mqtt_only = dataclasses.replace(self.writer, outputs=self.writer.outputs[:1])  # make_senders: MQTT first
        self.outbox.put(mqtt_only, alert)
        self.notify()

    def backlog(self, station: str) -> list[Backlog]:
        """The outputs whose queue for `station` has reached max_queued."""
        if self.outbox is None:
            return []
        queued = self.outbox.queued_for(station)
        limit = self.cfg.max_queued
        return [Backlog(name, station, n, limit) for name, n in sorted(queued.items()) if n >= limit]

    def backlogs(self) -> list[Backlog]:
        """Every (output, station) queue at max_queued."""
        return [] if self.outbox is None else self.outbox.backlogs(self.cfg.max_queued)

    def wait_idle(self, timeout_s: float) -> bool:
        """Blocks until every output's rows are delivered (tests, clean shutdown); False at the timeout."""
        if self.outbox is None:
            return True
        deadline = time.monotonic() + timeout_s
        while any(self.outbox.queued(w.sender.name) for w in self.workers):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def close(self, drain_s: float = 2.0) -> None:
        """Gives queued results `drain_s` to go out (the rest stay in the outbox for the next start)."""
        if self._loop is None or self._thread is None:
            return
        self.wait_idle(drain_s)

        async def stop() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for worker in self.workers:
                await worker.sender.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop = None
        if self.outbox is not None:
            self.outbox.close()
