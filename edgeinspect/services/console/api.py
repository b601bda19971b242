"""The console's side of the public gRPC API: the logged-in user's token on every call, on a gateway that answers
(a pair: the other one when the first is gone, services/common/gateways.py)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edgeinspect.services.common.channel import make_channel
from edgeinspect.services.common.gateways import AsyncGatewayFailover, gateway_addresses
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

SERVICE = "edgeinspect.v1.InspectionService"


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

    async def cluster_line(self, token: str) -> str:
        """One line on the cluster: the gateway's GetClusterStatus where it has one, else its health."""
        try:
            status = await self._call("GetClusterStatus", inspection_pb2.ClusterStatusRequest(), token, 3.0)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.PERMISSION_DENIED):
                return f"gateway: {exc.code().name.lower()}"
        else:
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
        try:
            health = await self.gateways.call(
                lambda channel, left: health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=SERVICE), timeout=left
                ),
                3.0,
            )
        except grpc.aio.AioRpcError as exc:
            return f"gateway unreachable ({exc.code().name.lower()})"
        return "gateway " + health_pb2.HealthCheckResponse.ServingStatus.Name(health.status).lower().replace("_", " ")

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
