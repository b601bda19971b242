"""The OPC UA server the PLC connects to: one object per station, its nodes driven by the Handshake machine.

Node ids are strings a PLC engineer can type: ns=<urn:edgeinspect:line>;s=<station>.<Node>, e.g.
`ns=2;s=station-3.Trigger`. Inputs are sampled every poll_ms (a local read, no network); outputs are written in
the handshake's write order, so ResultReady never rises before the results it announces.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from asyncua import Server, ua  # pyright: ignore[reportPrivateImportUsage]  # asyncua re-exports it without __all__

from edgeinspect.services.ingest.delivery import idempotency_key
from edgeinspect.services.line.config import OpcUaConfig, Security, StationLineConfig
from edgeinspect.services.line.handshake import (
    Handshake,
    Late,
    Outcome,
    Signals,
    Start,
    Written,
    write_order,
)
from edgeinspect.services.line.journal import CycleJournal

logger = logging.getLogger(__name__)

V = ua.VariantType
INPUTS = {  # written by the PLC
    "Trigger": (V.Boolean, False),
    "ResultAck": (V.Boolean, False),
    "Recipe": (V.String, ""),  # part number to inspect for (empty: the camera's configured part)
    "LotId": (V.String, ""),  # recorded with the cycle
}
OUTPUTS = {  # Signals field -> (node, type)
    "trigger_ready": ("TriggerReady", V.Boolean),
    "busy": ("Busy", V.Boolean),
    "result_ready": ("ResultReady", V.Boolean),
    "result_ok": ("ResultOK", V.Boolean),
    "result_ng": ("ResultNG", V.Boolean),
    "result_recheck": ("ResultRecheck", V.Boolean),
    "defect_class": ("DefectClass", V.String),
    "report_id": ("ReportId", V.String),
    "cycle_id": ("CycleId", V.String),
    "error": ("Error", V.Int32),
    "anomaly_score": ("AnomalyScore", V.Double),
    "anomaly_threshold": ("AnomalyThreshold", V.Double),
    "decided_by": ("DecidedBy", V.String),
    "region_count": ("RegionCount", V.Int32),
    "regions": ("Regions", V.Double),  # an array: x, y, w, h per region
}
HEARTBEAT = ("Heartbeat", V.UInt32)


@dataclass(frozen=True)
class LineStation:
    name: str
    camera_id: str
    cfg: StationLineConfig


# (station, the cycle to run, recipe, lot id) -> Outcome; must not raise (failures are outcomes with an error)
CycleRunner = Callable[[LineStation, Start, str, str], Awaitable[Outcome]]


def variant(value, vtype: ua.VariantType) -> ua.Variant:
    """A node value; tuples become OPC UA arrays (Regions), typed even when empty."""
    if isinstance(value, tuple):
        return ua.Variant(list(value), vtype, is_array=True)
    return ua.Variant(value, vtype)


def line_word(signals: Signals) -> str:
    return "OK" if signals.result_ok else "RECHECK" if signals.result_recheck else "NG"


class StationDriver:
    """Feeds one station's inputs and clock to its Handshake and writes what changed."""

    def __init__(
        self,
        server: Server,
        station: LineStation,
        nodes: dict[str, ua.NodeId],
        run_cycle: CycleRunner,
        journal: CycleJournal,
    ) -> None:
        self.server = server
        self.station = station
        self.nodes = nodes
        self.hs = Handshake(station.name, station.cfg)
        self._run_cycle = run_cycle
        self._journal = journal
        self._shown = Signals()  # what the nodes hold now
        self._lock = asyncio.Lock()
        self._cycles: set[asyncio.Task] = set()

    def _read(self, name: str):
        return self.server.read_attribute_value(self.nodes[name]).Value.Value

    async def step(self) -> None:
        trigger, ack = bool(self._read("Trigger")), bool(self._read("ResultAck"))
        # The cycle id doubles as the inspection's idempotency key: the gateway's report carries it.
        cycle_id = idempotency_key(self.station.camera_id, time.time()) if trigger else ""
        async with self._lock:
            for start in self.hs.inputs(trigger, ack, time.monotonic(), cycle_id):
                recipe, lot = str(self._read("Recipe") or ""), str(self._read("LotId") or "")
                self._journal.started(start.cycle_id, self.station.name, start.cycle, recipe, lot)
                task = asyncio.create_task(self._cycle(start, recipe, lot))
                self._cycles.add(task)
                task.add_done_callback(self._cycles.discard)
            timed_out = self.hs.tick(time.monotonic())
            await self._sync()
        for written in timed_out:  # journaled once the line has it: the PLC never waits on the disk
            self._record(written)

    async def _cycle(self, start: Start, recipe: str, lot: str) -> None:
        outcome = await self._run_cycle(self.station, start, recipe, lot)
        async with self._lock:
            actions = self.hs.outcome(outcome, time.monotonic())
            await self._sync()
        for action in actions:
            if isinstance(action, Written):
                self._record(action)
            elif isinstance(action, Late):
                logger.warning(
                    "station %s: cycle %s: report %s arrived after the deadline (the line got NG/timeout)",
                    self.station.name,
                    start.cycle_id,
                    outcome.report_id,
                )
                self._journal.resolved(start.cycle_id, outcome.report_id, outcome.verdict, late=True)

    def _record(self, written: Written) -> None:
        cycle_id = written.signals.cycle_id
        self._journal.written(cycle_id, line_word(written.signals), written.signals.error, written.elapsed_s * 1e3)
        if written.outcome.report_id:
            self._journal.resolved(cycle_id, written.outcome.report_id, written.outcome.verdict, late=False)
        logger.info(
            "station %s: cycle %d %s in %.0f ms (report %s, error %d)",
            self.station.name,
            written.cycle,
            line_word(written.signals),
            written.elapsed_s * 1e3,
            written.outcome.report_id or "-",
            written.signals.error,
        )

    async def _sync(self) -> None:
        new = self.hs.signals
        for field_name, value in write_order(self._shown, new):
            node, vtype = OUTPUTS[field_name]
            await self.server.write_attribute_value(self.nodes[node], ua.DataValue(variant(value, vtype)))
        self._shown = new

    async def close(self) -> None:
        for task in list(self._cycles):
            task.cancel()
        await asyncio.gather(*self._cycles, return_exceptions=True)


class LineServer:
    def __init__(
        self, cfg: OpcUaConfig, stations: list[LineStation], run_cycle: CycleRunner, journal: CycleJournal
    ) -> None:
        self.cfg = cfg
        self.stations = stations
        self._run_cycle = run_cycle
        self.journal = journal
        self.server = Server()
        self.drivers: dict[str, StationDriver] = {}
        self._tasks: list[asyncio.Task] = []
        self.namespace_index = 0

    @property
    def endpoint(self) -> str:
        return f"opc.tcp://{self.cfg.host}:{self.cfg.port}/edgeinspect/"

    async def start(self) -> LineServer:
        if self.cfg.port == 0:  # the endpoint URL names the port, so pick it before binding
            with socket.socket() as probe:
                probe.bind((self.cfg.host, 0))
                self.cfg = self.cfg.model_copy(update={"port": probe.getsockname()[1]})
        server, cfg = self.server, self.cfg
        await server.init()
        server.set_endpoint(self.endpoint)
        server.set_server_name("edgeinspect line")
        await self._security()
        ns = self.namespace_index = await server.register_namespace(cfg.namespace)
        for station in self.stations:
            obj = await server.nodes.objects.add_object(ua.NodeId(station.name, ns), ua.QualifiedName(station.name, ns))
            nodes: dict[str, ua.NodeId] = {}
            specs = [(n, t, d, True) for n, (t, d) in INPUTS.items()]
            defaults = Signals()
            specs += [(n, t, getattr(defaults, f), False) for f, (n, t) in OUTPUTS.items()]
            specs.append((HEARTBEAT[0], HEARTBEAT[1], 0, False))
            for name, vtype, default, writable in specs:
                node = await obj.add_variable(
                    ua.NodeId(f"{station.name}.{name}", ns), ua.QualifiedName(name, ns), variant(default, vtype)
                )
                if writable:
                    await node.set_writable()
                nodes[name] = node.nodeid
            self.drivers[station.name] = StationDriver(server, station, nodes, self._run_cycle, self.journal)
        await server.start()
        self._tasks = [asyncio.create_task(self._poll(d)) for d in self.drivers.values()]
        self._tasks.append(asyncio.create_task(self._heartbeat()))
        logger.info("OPC UA line server on %s: stations %s", self.endpoint, ", ".join(self.drivers))
        return self

    async def _security(self) -> None:
        cfg = self.cfg
        if cfg.security is Security.none:
            self.server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
            return
        self.server.set_security_policy([ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt])
        await self.server.load_certificate(str(cfg.certificate))
        await self.server.load_private_key(str(cfg.private_key))
        if cfg.trusted_clients is not None:
            from asyncua.crypto.truststore import TrustStore
            from asyncua.crypto.validator import CertificateValidator, CertificateValidatorOptions

            store = TrustStore([cfg.trusted_clients], [])
            await store.load()
            options = CertificateValidatorOptions.TIME_RANGE | CertificateValidatorOptions.TRUSTED
            self.server.set_certificate_validator(CertificateValidator(options, store))

    async def _poll(self, driver: StationDriver) -> None:
        period = self.cfg.poll_ms / 1000.0
        while True:
            try:
                await driver.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one step must not freeze the station: log it, keep sampling
                logger.exception("station %s: handshake step failed", driver.station.name)
            await asyncio.sleep(period)

    async def _heartbeat(self) -> None:
        beat = 0
        while True:
            beat = (beat + 1) % 2**32
            for driver in self.drivers.values():
                node = driver.nodes[HEARTBEAT[0]]
                await self.server.write_attribute_value(node, ua.DataValue(ua.Variant(beat, HEARTBEAT[1])))
            await asyncio.sleep(self.cfg.heartbeat_s)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for driver in self.drivers.values():
            await driver.close()
        with contextlib.suppress(Exception):
            await self.server.stop()
