"""The fan-out: `publish(report)` returns at once; each output delivers from its own durable outbox, in order,
on its own pace, in a thread of its own, so a dead broker or a slow webhook never delays an inspection or the
other outputs."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter, Gauge

from edgeinspect.services.common.retry import backoff_delays
from edgeinspect.services.outputs.config import OutputsConfig
from edgeinspect.services.outputs.outbox import Outbox
from edgeinspect.services.outputs.result import LineResult, from_report, is_shadow
from edgeinspect.services.outputs.webhook import Rejected, WebhookOutput

logger = logging.getLogger(__name__)

DELIVERED = Counter("edgeinspect_output_delivered", "results an output's peer accepted", ["output"])
FAILURES = Counter("edgeinspect_output_failures", "failed delivery tries (retried)", ["output"])
DROPPED = Counter("edgeinspect_output_dropped", "results an output gave up on", ["output", "reason"])
QUEUED = Gauge("edgeinspect_output_queued", "results waiting in an output's outbox", ["output"])


class Sender(Protocol):
    name: str

    async def send(self, key: str, payload: bytes) -> None:
        """Delivers one result; raises to have it retried (webhook.Rejected: dropped instead)."""

    async def close(self) -> None: ...


def retry_delays(base_s: float, max_s: float) -> Iterator[float]:
    """Doubling, jittered, capped, endless: a peer that is down for an hour still gets its results."""
    return itertools.chain(backoff_delays(base_s, 2.0, max_s, 8, jitter=0.2), itertools.repeat(max_s))


class OutputWorker:
    """One output: its outbox and the loop that drains it, oldest first, one result in flight."""

    def __init__(self, sender: Sender, outbox: Outbox, cfg: OutputsConfig) -> None:
        self.sender = sender
        self.outbox = outbox
        self.cfg = cfg
        self._wake = asyncio.Event()
        self.idle = asyncio.Event()

    def offer(self, key: str, payload: bytes) -> None:
        dropped = self.outbox.put(key, payload)
        if dropped:
            DROPPED.labels(output=self.sender.name, reason="outbox_full").inc(dropped)
            logger.warning(
                "output %s: outbox full (%d results), dropped the %d oldest",
                self.sender.name,
                self.outbox.max_items,
                dropped,
            )
        QUEUED.labels(output=self.sender.name).set(len(self.outbox))
        self.idle.clear()
        self._wake.set()

    async def run(self) -> None:
        name = self.sender.name
        delays = retry_delays(self.cfg.retry_base_s, self.cfg.retry_max_s)
        while True:
            item = self.outbox.head()
            if item is None:
                self.idle.set()
                await self._wake.wait()
                self._wake.clear()
                continue
            seq, key, payload = item
            try:
                await self.sender.send(key, payload)
            except asyncio.CancelledError:
                raise
            except Rejected as exc:
                logger.error("output %s: result %s rejected, dropped: %s", name, key, exc)
                DROPPED.labels(output=name, reason="rejected").inc()
            except Exception as exc:  # the peer is down or broke: keep the result, back off, try again
                FAILURES.labels(output=name).inc()
                delay = next(delays)
                logger.warning("output %s: delivery of %s failed (%s); retrying in %.2fs", name, key, exc, delay)
                await asyncio.sleep(delay)
                continue
            else:
                DELIVERED.labels(output=name).inc()
            delays = retry_delays(self.cfg.retry_base_s, self.cfg.retry_max_s)
            self.outbox.ack(seq)
            QUEUED.labels(output=name).set(len(self.outbox))


def make_senders(cfg: OutputsConfig) -> list[Sender]:
    senders: list[Sender] = []
    if cfg.mqtt is not None:
        from edgeinspect.services.outputs.mqtt import MqttOutput

        senders.append(MqttOutput(cfg.mqtt))
    if cfg.webhooks:
        for i, hook in enumerate(cfg.webhooks):
            senders.append(WebhookOutput(hook, hook.name or f"webhook{i}"))
    return senders


class Outputs:
    """Every configured output; a no-op when none is. Thread-safe `publish`."""

    def __init__(self, cfg: OutputsConfig, outbox_dir: Path, senders: list[Sender] | None = None) -> None:
        self.cfg = cfg
        senders = make_senders(cfg) if senders is None else senders
        names = [s.name for s in senders]
        if len(set(names)) != len(names):
            raise ValueError(f"output names must be unique, got {names}")
        self.workers: list[OutputWorker] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if not senders:
            return
        outbox_dir = Path(cfg.outbox_dir or outbox_dir)
        self._loop = asyncio.new_event_loop()
        self._tasks: list[asyncio.Task] = []
        for sender in senders:
            outbox = Outbox(outbox_dir / f"{sender.name}.sqlite", cfg.max_queued)
            self.workers.append(OutputWorker(sender, outbox, cfg))
        self._thread = threading.Thread(target=self._run, name="outputs", daemon=True)
        self._thread.start()

    @classmethod
    def for_gateway(cls, settings) -> Outputs:
        """From GatewaySettings.outputs; outboxes beside the report database unless configured."""
        return cls(settings.outputs, Path(settings.db_path).parent / "outbox")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        # Workers are made outside the loop (their Events bind to it on first use), tasks inside it.
        self._tasks = [self._loop.create_task(w.run()) for w in self.workers]
        self._loop.run_forever()

    def publish(self, report) -> None:
        """A stored DefectReport; shadow reports never leave the box."""
        if self._loop is None or is_shadow(report):
            return
        self.publish_result(from_report(report))

    def publish_result(self, result: LineResult) -> None:
        if self._loop is None:
            return
        payload = result.to_json()
        for worker in self.workers:
            self._loop.call_soon_threadsafe(worker.offer, result.report_id, payload)

    def wait_idle(self, timeout_s: float) -> bool:
        """Blocks until every outbox is empty (tests, clean shutdown)."""
        if self._loop is None:
            return True

        async def idle() -> None:
            await asyncio.sleep(0)  # offers scheduled before this call run first
            await asyncio.gather(*(w.idle.wait() for w in self.workers))

        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(idle(), timeout_s), self._loop)
        try:
            future.result(timeout_s + 1)
            return True
        except TimeoutError:
            return False

    def close(self, drain_s: float = 2.0) -> None:
        """Gives queued results `drain_s` to go out (the rest stay in the outboxes for the next start)."""
        if self._loop is None or self._thread is None:
            return
        self.wait_idle(drain_s)

        async def stop() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for worker in self.workers:
                await worker.sender.close()
                worker.outbox.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop = None
