"""The PLC side of the handshake, as a controls engineer runs it before wiring the real PLC (`edgeinspect line
plc-sim`), and as the tests and the latency bench drive the station."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from asyncua import Client, ua  # pyright: ignore[reportPrivateImportUsage]  # asyncua re-exports it without __all__

from edgeinspect.errors import Unavailable
from edgeinspect.services.line.handshake import ErrorCode

RESULT_NODES = ("ResultOK", "ResultNG", "ResultRecheck", "DefectClass", "ReportId", "CycleId", "Error", "Busy")
ANOMALY_NODES = ("AnomalyScore", "AnomalyThreshold", "DecidedBy", "Regions")


@dataclass(frozen=True)
class PlcCycle:
    cycle: int
    ok: bool
    ng: bool
    recheck: bool
    defect_class: str
    report_id: str
    cycle_id: str
    error: int
    busy_at_result: bool
    trigger_to_result_ms: float  # Trigger written -> ResultReady seen
    ack_to_ready_ms: float | None  # ResultAck written -> TriggerReady seen (None: not acked)
    result_seen_at: float  # unix seconds ResultReady was seen (benches compare it with the report's time)
    anomaly: dict = field(default_factory=dict)  # the gate's nodes ({} on a server without them)

    @property
    def error_name(self) -> str:
        try:
            return ErrorCode(self.error).name
        except ValueError:
            return str(self.error)

    @property
    def line(self) -> str:
        return "OK" if self.ok else "RECHECK" if self.recheck else "NG" if self.ng else "-"


class PlcSim:
    """An asyncua client on one station object; `cycle()` runs one handshake and times it."""

    def __init__(
        self,
        endpoint: str,
        station: str,
        namespace: str = "urn:edgeinspect:line",
        poll_s: float = 0.001,
        certificate: Path | None = None,
        private_key: Path | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.station = station
        self.namespace = namespace
        self.poll_s = poll_s
        self._certificate, self._private_key = certificate, private_key
        self.client = Client(endpoint, timeout=5)
        self.nodes: dict = {}
        self.cycles = 0

    @classmethod
    async def when_up(cls, endpoint: str, station: str, timeout_s: float = 60.0, **kw) -> PlcSim:
        """Connected (entered) once the station server answers: it may still be starting, so retry until
        timeout_s, then raise what the last try raised."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await cls(endpoint, station, **kw).__aenter__()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)

    async def __aenter__(self) -> PlcSim:
        if self._certificate is not None:
            await self.client.set_security_string(
                f"Basic256Sha256,SignAndEncrypt,{self._certificate},{self._private_key}"
            )
        try:
            await self.client.connect()
        except (OSError, TimeoutError, ua.UaError) as exc:
            raise Unavailable(f"no OPC UA server at {self.endpoint}: {exc}") from exc
        ns = await self.client.get_namespace_index(self.namespace)
        names = ("Trigger", "ResultAck", "Recipe", "LotId", "TriggerReady", "ResultReady", "Heartbeat", *RESULT_NODES)
        names += ANOMALY_NODES
        self.nodes = {n: self.client.get_node(f"ns={ns};s={self.station}.{n}") for n in names}
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.disconnect()

    async def _write(self, name: str, value: object, vtype: ua.VariantType = ua.VariantType.Boolean) -> None:
        await self.nodes[name].write_value(ua.DataValue(ua.Variant(value, vtype)))

    async def read(self, name: str):
        return await self.nodes[name].read_value()

    async def wait(self, name: str, value: object, timeout_s: float) -> float:
        """Polls until the node holds `value`; returns the perf_counter time it was seen."""
        deadline = time.perf_counter() + timeout_s
        while True:
            if await self.nodes[name].read_value() == value:
                return time.perf_counter()
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{self.station}.{name} did not become {value} within {timeout_s:.1f}s")
            await asyncio.sleep(self.poll_s)

    async def cycle(
        self, *, ack: bool = True, result_timeout_s: float = 30.0, recipe: str = "", lot_id: str = ""
    ) -> PlcCycle:
        """TriggerReady -> Trigger -> ResultReady -> read results -> ResultAck -> TriggerReady."""
        await self.wait("TriggerReady", True, result_timeout_s)
        await self._write("Recipe", recipe, ua.VariantType.String)
        await self._write("LotId", lot_id, ua.VariantType.String)
        t0 = time.perf_counter()
        await self._write("Trigger", True)
        t_result = await self.wait("ResultReady", True, result_timeout_s)
        seen_at = time.time()
        values = await self.client.read_values([self.nodes[n] for n in RESULT_NODES])
        ok, ng, recheck, defect_class, report_id, cycle_id, error, busy = values
        anomaly = await self._anomaly()
        ack_ms = None
        await self._write("Trigger", False)
        if ack:
            t_ack = time.perf_counter()
            await self._write("ResultAck", True)
            ack_ms = (await self.wait("TriggerReady", True, result_timeout_s) - t_ack) * 1e3
            await self._write("ResultAck", False)
        self.cycles += 1
        return PlcCycle(
            cycle=self.cycles,
            ok=bool(ok),
            ng=bool(ng),
            recheck=bool(recheck),
            defect_class=str(defect_class or ""),
            report_id=str(report_id or ""),
            cycle_id=str(cycle_id or ""),
            error=int(error),
            busy_at_result=bool(busy),
            trigger_to_result_ms=(t_result - t0) * 1e3,
            ack_to_ready_ms=ack_ms,
            result_seen_at=seen_at,
            anomaly=anomaly,
        )

    async def _anomaly(self) -> dict:
        try:
            score, threshold, decided_by, regions = await self.client.read_values(
                [self.nodes[n] for n in ANOMALY_NODES]
            )
        except ua.UaError:  # a line server from before the gate's nodes
            return {}
        flat = [float(v) for v in regions or []]
        boxes = [flat[i : i + 4] for i in range(0, len(flat), 4)]
        return {"score": score, "threshold": threshold, "decided_by": decided_by, "regions": boxes}
