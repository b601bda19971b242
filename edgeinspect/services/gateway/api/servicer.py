"""InspectionService: the public API. Translates protobuf <-> the version router (one Inspector per model version)
and the report store."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from google.protobuf.timestamp_pb2 import Timestamp

from edgeinspect.errors import PermissionDenied, Unavailable
from edgeinspect.services.gateway import teaching
from edgeinspect.services.gateway.api.callers import caller_of, may_review
from edgeinspect.services.gateway.api.requests import (
    check_inspect,
    check_promote_bank,
    check_teach_from_reports,
    time_arg,
)
from edgeinspect.services.gateway.api.status import cluster_status
from edgeinspect.services.gateway.backlog import BacklogGuard
from edgeinspect.services.gateway.decode.step_spans import annotate_report, annotate_request
from edgeinspect.services.gateway.disk import DiskGuard
from edgeinspect.services.gateway.reports.images import ReportImages
from edgeinspect.services.gateway.reports.store import ReportStore
from edgeinspect.services.gateway.rollout.manager import VersionRouter
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc


def _timestamp(us: int) -> Timestamp:
    ts = Timestamp()
    ts.FromMicroseconds(us)
    return ts


class InspectionServicer(inspection_pb2_grpc.InspectionServiceServicer):
    def __init__(
        self,
        store: ReportStore,
        disk: DiskGuard | None = None,
        backlog: BacklogGuard | None = None,
        images: ReportImages | None = None,
    ):
        self.store = store
        self.images = images or ReportImages(store)  # frames here, else from the gateway of the pair that holds them
        self.disk = disk  # free-space floors: below one, new inspections are refused and reads go on
        self.backlog = backlog  # the line's outbox per station: full, that station's inspections are refused
        self.versions: VersionRouter | None = None  # set once the live version's Inspector is connected

    def _ready(self) -> VersionRouter:
        if self.versions is None:
            raise Unavailable("the gateway is still connecting to its vision and decoder nodes; retry shortly")
        return self.versions

    async def _run(self, request: inspection_pb2.InspectRequest):
        """The inspection's events, once the request is valid, every disk is above its floor and the line's outputs
        have room for the station's result."""
        versions, req = self._ready(), check_inspect(request)
        if self.disk is not None:
            await self.disk.admit()
        if self.backlog is not None:
            await self.backlog.admit(req.station)
        return versions.run(req)

    async def Inspect(self, request, context) -> inspection_pb2.DefectReport:
        """Runs the inspection and answers with the stored report; a decision made at takt is the answer at once
        (its explanation goes on in the gateway: services/gateway/explain.py)."""
        report = None
        annotate_request(request)
        async with aclosing(await self._run(request)) as events:
            async for event in events:
                if event.HasField("report") or event.HasField("decision"):
                    report = event.report if event.HasField("report") else event.decision
                    annotate_report(report)
                if event.HasField("decision"):
                    break
        return report

    async def InspectStream(self, request, context):
        """Token deltas as they are generated, then the stored report."""
        # aclosing: a cancelled caller closes the generator now, which closes the stage streams now (not at GC).
        annotate_request(request)
        async with aclosing(await self._run(request)) as events:
            async for event in events:
                if event.HasField("report") or event.HasField("decision"):
                    annotate_report(event.report if event.HasField("report") else event.decision)
                yield event

    async def GetReport(self, request, context) -> inspection_pb2.DefectReport:
        """A stored report by id, with its latest review."""
        return await asyncio.to_thread(self.store.get, request.report_id)

    async def ListReports(self, request, context) -> inspection_pb2.ListReportsResponse:
        """Stored reports, newest first, filtered and paginated."""
        reports, token = await asyncio.to_thread(
            self.store.list,
            station=request.station,
            part=request.part,
            verdict=request.verdict,
            since=time_arg(request, "since"),
            until=time_arg(request, "until"),
            page_size=request.page_size,
            page_token=request.page_token,
            camera_id=request.camera_id,
            defect_class=request.defect_class,
            review=request.review,
        )
        return inspection_pb2.ListReportsResponse(reports=reports, next_page_token=token)

    async def GetReportImage(self, request, context) -> inspection_pb2.ReportImage:
        """The report's frame, thumbnail or anomaly heatmap as kept by the frame store (EXPIRED once pruned); a
        pair's gateway reads one that the other gateway holds from it, as the same caller."""
        report_id = await asyncio.to_thread(self.store.resolve, request.report_id)  # a unique prefix will do
        answer = await self.images.image(report_id, request.thumbnail, request.heatmap, context.invocation_metadata())
        out = inspection_pb2.ReportImage(report_id=report_id, state=answer.state, data=answer.data)
        if answer.frame is not None:
            out.image_sha256 = answer.frame.sha256
            out.media_type = answer.frame.media_type
            out.width, out.height = answer.frame.width, answer.frame.height
        return out

    async def AggregateReports(self, request, context) -> inspection_pb2.AggregateReportsResponse:
        """Counts per station and time bucket, by verdict and by defect class."""
        rows = await asyncio.to_thread(
            self.store.aggregate,
            station=request.station,
            part=request.part,
            camera_id=request.camera_id,
            since=time_arg(request, "since"),
            until=time_arg(request, "until"),
            bucket_s=request.bucket_seconds,
        )
        return inspection_pb2.AggregateReportsResponse(
            counts=[
                inspection_pb2.ReportCounts(
                    station=r["station"],
                    bucket_start=_timestamp(r["bucket_start_us"]),
                    total=r["total"],
                    by_verdict=r["by_verdict"],
                    by_class=r["by_class"],
                    reviewed=r["reviewed"],
                    disagreed=r["disagreed"],
                )
                for r in rows
            ]
        )

    async def ReviewReport(self, request, context) -> inspection_pb2.Review:
        """Stores the caller's review of a report as its own record."""
        caller = caller_of(context)
        if not may_review(caller.role):
            raise PermissionDenied(f"role {caller.role!r} may view reports but not review them (operator or admin)")
        return await asyncio.to_thread(
            self.store.review,
            request.report_id,
            request.verdict,
            list(request.defect_classes),
            request.comment,
            caller.name,
            caller.role,
        )

    async def GetCaller(self, request, context) -> inspection_pb2.Caller:
        """The presented token's name and role."""
        caller = caller_of(context)
        return inspection_pb2.Caller(name=caller.name, role=caller.role, may_review=may_review(caller.role))

    async def GetClusterStatus(self, request, context) -> inspection_pb2.ClusterStatus:
        """Every stage endpoint (range, health, ban reason, load), the plan in force, vision/retrieval, admission."""
        status = await cluster_status(self._ready().live())
        if self.disk is not None:  # readiness stays SERVING for reads; the notes say why inspections are refused
            status.notes.extend(await asyncio.to_thread(self.disk.notes))
        if self.backlog is not None:  # likewise for a station whose results the line's outputs cannot take now
            status.notes.extend(await asyncio.to_thread(self.backlog.notes))
        return status

    async def AddToGoodSet(self, request, context) -> inspection_pb2.AnomalyBankVersion:
        """A report's frame joins its part's good set (a new bank version). Admin only (METHOD_ROLES)."""
        return await teaching.add_to_good_set(self.store, self._ready().live(), request.report_id, request.stage)

    async def TeachFromReports(self, request, context) -> inspection_pb2.AnomalyBankVersion:
        """Teaches a part afresh from a station's last N reports reviewed OK. Admin only (METHOD_ROLES)."""
        req = check_teach_from_reports(request)
        return await teaching.teach_from_reports(
            self.store, self._ready().live(), req.station, req.part, req.last_n, req.stage
        )

    async def PromoteBank(self, request, context) -> inspection_pb2.AnomalyBankVersion:
        """A part's staged bank version becomes current (go-live figures checked unless forced). Admin only."""
        req = check_promote_bank(request)
        return await teaching.promote_bank(self._ready().live(), req.part, req.version, req.force)
