"""InspectionService: the public API. Translates protobuf <-> the Inspector and the report store."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from datetime import UTC

from edgeinspect.errors import Unavailable
from edgeinspect.services.gateway.inspection import Inspector
from edgeinspect.services.gateway.store import ReportStore
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc


class InspectionServicer(inspection_pb2_grpc.InspectionServiceServicer):
    def __init__(self, store: ReportStore):
        self.store = store
        self.inspector: Inspector | None = None

    def _ready(self) -> Inspector:
        if self.inspector is None:
            raise Unavailable("the gateway is still connecting to its vision and decoder nodes; retry shortly")
        return self.inspector

    async def Inspect(self, request, context) -> inspection_pb2.DefectReport:
        """Runs the inspection to the end and answers with the stored report."""
        report = None
        async with aclosing(self._ready().run(request)) as events:
            async for event in events:
                if event.HasField("report"):
                    report = event.report
        return report

    async def InspectStream(self, request, context):
        """Token deltas as they are generated, then the stored report."""
        # aclosing: a cancelled caller closes the generator now, which closes the stage streams now (not at GC).
        async with aclosing(self._ready().run(request)) as events:
            async for event in events:
                yield event

    async def GetReport(self, request, context) -> inspection_pb2.DefectReport:
        """A stored report by id."""
        return await asyncio.to_thread(self.store.get, request.report_id)

    async def ListReports(self, request, context) -> inspection_pb2.ListReportsResponse:
        """Stored reports, newest first, filtered and paginated."""
        since = request.since.ToDatetime(tzinfo=UTC) if request.HasField("since") else None
        until = request.until.ToDatetime(tzinfo=UTC) if request.HasField("until") else None
        reports, token = await asyncio.to_thread(
            self.store.list,
            station=request.station,
            part=request.part,
            verdict=request.verdict,
            since=since,
            until=until,
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return inspection_pb2.ListReportsResponse(reports=reports, next_page_token=token)
