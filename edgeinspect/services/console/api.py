"""The console's side of the public gRPC API: the logged-in user's token on every call, on a gateway that answers
(a pair: the other one when the first is gone, services/common/gateways.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.services.cluster_view import GatewayRow, ReplicaRow, replica_rows
from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.gateways import AsyncGatewayFailover, gateway_addresses
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

SERVICE = "edgeinspect.v1.InspectionService"
HEALTH_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class ClusterView:
    line: str  # serving / degraded / not serving, the plan, inspections in flight
    replicas: list[ReplicaRow]  # empty when the token may not read the cluster status
    gateways: list[GatewayRow]
    retrieval_index: str = ""  # the KB index searched


def cluster_line(status: inspection_pb2.ClusterStatus) -> str:
    """One line on the cluster: state, plan, load, and what is not healthy."""
    state = "serving" if status.serving else "not serving"
    if status.serving and status.degraded:
        state = "degraded"
    parts = [state, f"plan {status.plan or 'normal'}", f"{status.inflight} in flight"]
    if status.queued:
        parts.append(f"{status.queued} queued")
    down = [s.address for s in status.stages if s.state not in ("healthy", "")]
    if down:
        parts.append("stages not healthy: " + ", ".join(down))
    return " · ".join(parts)


class GatewayApi:
    """Thin async wrapper: requests in, protobuf answers out; grpc.aio.AioRpcError propagates to the app."""

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.channels: list[grpc.aio.Channel] = []

        def connect(target: str) -> grpc.aio.Channel:
            self.channels.append(make_channel(target))
            return self.channels[-1]

        self.gateways = AsyncGatewayFailover(gateway_addresses(address), connect)

    @staticmethod
    def _md(token: str) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {token}")]

    async def _call(self, method: str, request, token: str, timeout_s: float | None = None):
        def call(channel: grpc.aio.Channel, left: float):
            stub = inspection_pb2_grpc.InspectionServiceStub(channel)
            return getattr(stub, method)(request, metadata=self._md(token), timeout=left)

        return await self.gateways.call(call, timeout_s or self.timeout_s)

    async def caller(self, token: str) -> inspection_pb2.Caller:
        return await self._call("GetCaller", inspection_pb2.GetCallerRequest(), token)

    async def list_reports(self, token: str, request: inspection_pb2.ListReportsRequest):
        return await self._call("ListReports", request, token)

    async def report(self, token: str, report_id: str) -> inspection_pb2.DefectReport:
        return await self._call("GetReport", inspection_pb2.GetReportRequest(report_id=report_id), token)

    async def image(
        self, token: str, report_id: str, thumbnail: bool, heatmap: bool = False
    ) -> inspection_pb2.ReportImage:
        request = inspection_pb2.GetReportImageRequest(report_id=report_id, thumbnail=thumbnail, heatmap=heatmap)
        return await self._call("GetReportImage", request, token)

    async def add_to_good_set(
        self, token: str, report_id: str, stage: bool = False
    ) -> inspection_pb2.AnomalyBankVersion:
        # A teach runs features over the part's whole good set: allow it minutes, not the page's usual seconds.
        request = inspection_pb2.AddToGoodSetRequest(report_id=report_id, stage=stage)
        return await self._call("AddToGoodSet", request, token, timeout_s=600.0)

    async def promote_bank(
        self, token: str, part: str, version: int, force: bool = False
    ) -> inspection_pb2.AnomalyBankVersion:
        request = inspection_pb2.PromoteBankRequest(part=part, version=version, force=force)
        return await self._call("PromoteBank", request, token, timeout_s=60.0)

    async def aggregate(self, token: str, request: inspection_pb2.AggregateReportsRequest):
        return await self._call("AggregateReports", request, token)

    async def review(self, token: str, request: inspection_pb2.ReviewReportRequest) -> inspection_pb2.Review:
        return await self._call("ReviewReport", request, token)

    async def cluster(self, token: str) -> ClusterView:
        """The cluster for the stations page: a line on it, every replica of every role (the gateway's
        GetClusterStatus where this token may read it) and the gateways this console holds."""
        status, gateways = await asyncio.gather(self._status(token), self.gateway_rows())
        if isinstance(status, str):
            return ClusterView(status, [], gateways)
        return ClusterView(cluster_line(status), replica_rows(status), gateways, status.retrieval_index)

    async def _status(self, token: str) -> inspection_pb2.ClusterStatus | str:
        """The gateway's GetClusterStatus, else a word on its health."""
        try:
            return await self._call("GetClusterStatus", inspection_pb2.ClusterStatusRequest(), token, 3.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED):
                return f"gateway: {exc.code().name.lower()}"
        try:
            health = await self.gateways.call(
                lambda channel, left: health_pb2_grpc.HealthStub(channel).Check(  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Check
                    health_pb2.HealthCheckRequest(service=SERVICE), timeout=left
                ),
                3.0,
            )
        except grpc.aio.AioRpcError as exc:
            return f"gateway unreachable ({exc.code().name.lower()})"
        return "gateway " + health_pb2.HealthCheckResponse.ServingStatus.Name(health.status).lower().replace("_", " ")

    async def gateway_rows(self) -> list[GatewayRow]:
        """Each gateway this console holds: its health, and whether it is the one calls go to now."""

        async def health(channel: grpc.aio.Channel) -> str:
            request = health_pb2.HealthCheckRequest(service=SERVICE)
            try:
                check = health_pb2_grpc.HealthStub(channel).Check  # pyright: ignore[reportAttributeAccessIssue]  # typeshed's stub omits Check
                answer = await check(request, timeout=HEALTH_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                return f"unreachable ({exc.code().name.lower()})"
            return "serving" if answer.status == health_pb2.HealthCheckResponse.SERVING else "not serving"

        states = await asyncio.gather(*(health(c) for c in self.gateways.ends))
        current = self.gateways.order()[0]
        return [GatewayRow(a, s, i == current) for i, (a, s) in enumerate(zip(self.gateways.addresses, states,
                                                                                strict=True))]  # fmt: skip

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
