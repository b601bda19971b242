"""The console's pages (FastAPI + Jinja2, server-rendered). Every page is a call or two on the public gRPC API
made with the logged-in user's own token, so the gateway decides what that token may see and do."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import urlencode

import grpc
import jinja2
from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from google.protobuf.timestamp_pb2 import Timestamp

from edgeinspect.services.common.errors import bounded
from edgeinspect.services.console import views
from edgeinspect.services.console.api import GatewayApi
from edgeinspect.services.console.settings import ConsoleSettings
from edgeinspect.v1 import inspection_pb2

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
COOKIE = "edgeinspect_session"
MAX_QUIET_STATIONS = 32  # extra ListReports calls one stations poll may make
# gRPC status -> HTTP status of the page that shows it.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


@dataclass
class Session:
    token: str
    name: str
    role: str
    may_review: bool
    expires: float
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))


class LoginRequired(Exception):
    pass


def create_app(cfg: ConsoleSettings, api: GatewayApi) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await api.close()

    app = FastAPI(title="edgeinspect console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    # autoescape for every template: model text (description, evidence) and filters end up in the pages.
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    templates = Jinja2Templates(env=env)
    templates.env.globals.update(verdict=views.verdict_label, when=views.local_time, classes_of=views.classes_of)
    sessions: dict[str, Session] = {}

    def session_of(request: Request) -> Session:
        sid = request.cookies.get(COOKIE, "")
        session = sessions.get(sid)
        if session is None or session.expires < time.time():
            sessions.pop(sid, None)
            raise LoginRequired
        return session

    def page(request: Request, name: str, status: int = 200, **context) -> HTMLResponse:
        sid = request.cookies.get(COOKIE, "")
        context.setdefault("user", sessions.get(sid))
        return templates.TemplateResponse(request, name, context, status_code=status)

    @app.exception_handler(LoginRequired)
    async def _login_required(request: Request, exc: LoginRequired) -> Response:
        if request.method == "GET" and not request.url.path.endswith(("/live", "/image")):
            return RedirectResponse(f"/login?next={request.url.path}", status_code=303)
        return PlainTextResponse("log in first", status_code=401)

    @app.exception_handler(grpc.aio.AioRpcError)
    async def _rpc_error(request: Request, exc: grpc.aio.AioRpcError) -> Response:
        status = _HTTP_STATUS.get(exc.code(), 502)
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:  # token revoked since login
            sessions.pop(request.cookies.get(COOKIE, ""), None)
        message = bounded(exc.details() or exc.code().name)
        return page(request, "error.jinja", status, code=exc.code().name, message=message)

    @app.get("/healthz", response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok"

    @app.get("/")
    async def root() -> Response:
        return RedirectResponse("/stations", status_code=303)

    @app.get("/login", response_class=HTMLResponse)
    async def login_form(request: Request, next: str = "/stations") -> HTMLResponse:
        return page(request, "login.jinja", next=_local_path(next), error="")

    @app.post("/login")
    async def login(request: Request, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/stations"):
        try:
            caller = await api.caller(token.strip())
        except grpc.aio.AioRpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                return page(request, "login.jinja", 401, next=_local_path(next), error="This token is not accepted.")
            raise
        now = time.time()
        for stale in [k for k, v in sessions.items() if v.expires < now]:  # sessions live in memory only
            del sessions[stale]
        sid = secrets.token_urlsafe(32)
        sessions[sid] = Session(token.strip(), caller.name, caller.role, caller.may_review,
                                time.time() + cfg.session_ttl_s)  # fmt: skip
        response = RedirectResponse(_local_path(next), status_code=303)
        response.set_cookie(COOKIE, sid, httponly=True, samesite="strict", max_age=int(cfg.session_ttl_s))
        return response

    @app.post("/logout")
    async def logout(request: Request) -> Response:
        sessions.pop(request.cookies.get(COOKIE, ""), None)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    async def stations_context(session: Session) -> dict:
        since = Timestamp()
        since.FromDatetime(views.shift_start(datetime.now().astimezone(), cfg.shift_start_hour, cfg.shift_hours))
        latest, counts, cluster = await asyncio.gather(
            api.list_reports(session.token, inspection_pb2.ListReportsRequest(page_size=200)),
            api.aggregate(session.token, inspection_pb2.AggregateReportsRequest(since=since)),
            api.cluster(session.token),
        )
        stations: dict[str, list] = {}
        for report in latest.reports:
            frames = stations.setdefault(report.station, [])
            if len(frames) < cfg.frames_per_station:
                frames.append(report)
        shift = views.shift_counts(counts)
        # A station that is quiet while others are busy is not in the latest page: its own latest frames.
        quiet = [st for st in shift if st and st not in stations][:MAX_QUIET_STATIONS]
        pages = await asyncio.gather(*(
            api.list_reports(session.token, inspection_pb2.ListReportsRequest(station=st,
                                                                              page_size=cfg.frames_per_station))
            for st in quiet
        ))  # fmt: skip
        stations.update({st: list(answer.reports) for st, answer in zip(quiet, pages, strict=True)})
        return {"stations": sorted(stations.items()), "shift": shift, "cluster": cluster.line,
                "replicas": cluster.replicas, "gateways": cluster.gateways, "retrieval_index": cluster.retrieval_index,
                "shift_since": views.local_time(since)}  # fmt: skip

    @app.get("/stations", response_class=HTMLResponse)
    async def stations(request: Request) -> HTMLResponse:
        session = session_of(request)
        context = await stations_context(session)
        return page(request, "stations.jinja", refresh_s=cfg.refresh_s, **context)

    @app.get("/stations/live", response_class=HTMLResponse)
    async def stations_live(request: Request) -> HTMLResponse:
        session = session_of(request)
        try:
            context = await stations_context(session)
        except grpc.aio.AioRpcError as exc:
            # The poll swaps this in: say the data is stale rather than keep showing it as if live.
            line = f"gateway {exc.code().name.lower()} since {time.strftime('%H:%M:%S')}: no new reports shown"
            empty = {"stations": [], "shift": {}, "shift_since": "-", "stale": True,
                     "gateways": await api.gateway_rows()}  # fmt: skip
            return page(request, "station_cards.jinja", cluster=line, **empty)
        return page(request, "station_cards.jinja", **context)

    @app.get("/reports", response_class=HTMLResponse)
    async def reports(request: Request, page_token: str = "") -> HTMLResponse:
        session = session_of(request)
        params = {k: request.query_params.get(k, "") for k in views.FILTER_FIELDS}
        try:
            query = views.list_request(params, page_size=50, page_token=page_token)
        except ValueError as exc:
            return page(request, "reports.jinja", 400, params=params, reports=[], next_token="", error=str(exc))
        answer = await api.list_reports(session.token, query)
        query_string = urlencode({k: v for k, v in params.items() if v})
        return page(request, "reports.jinja", params=params, reports=answer.reports,
                    next_token=answer.next_page_token, error="", query=query_string)  # fmt: skip

    @app.get("/reports.csv")
    async def reports_csv(request: Request) -> Response:
        session = session_of(request)
        params = {k: request.query_params.get(k, "") for k in views.FILTER_FIELDS}
        try:
            query = views.list_request(params, page_size=500)
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        rows: list = []
        while len(rows) < cfg.export_limit:
            answer = await api.list_reports(session.token, query)
            rows += answer.reports
            if not answer.next_page_token:
                break
            query.page_token = answer.next_page_token
        headers = {"Content-Disposition": 'attachment; filename="edgeinspect-reports.csv"'}
        return Response(views.to_csv(rows[: cfg.export_limit]), media_type="text/csv", headers=headers)

    @app.get("/reports/{report_id}", response_class=HTMLResponse)
    async def report_page(
        request: Request, report_id: str, added: str = "", staged: str = "", promoted: str = ""
    ) -> HTMLResponse:
        session = session_of(request)
        report, thumb = await asyncio.gather(
            api.report(session.token, report_id), api.image(session.token, report_id, True)
        )
        return page(request, "report.jinja", r=report, frame_state=inspection_pb2.ImageState.Name(thumb.state),
                    boxes=views.defect_boxes(report), csrf=session.csrf, may_review=session.may_review,
                    is_admin=session.role == "admin", gate=views.gate_facts(report), added=added[:200],
                    staged=views.staged_version(staged), promoted=promoted[:200])  # fmt: skip

    @app.get("/reports/{report_id}/image")
    async def report_image(request: Request, report_id: str, thumb: int = 0, heatmap: int = 0) -> Response:
        session = session_of(request)
        image = await api.image(session.token, report_id, bool(thumb), bool(heatmap))
        if image.state != inspection_pb2.IMAGE_STATE_STORED:
            return PlainTextResponse(inspection_pb2.ImageState.Name(image.state), status_code=404)
        return Response(image.data, media_type=image.media_type or "application/octet-stream",
                        headers={"Cache-Control": "private, max-age=3600"})  # fmt: skip

    @app.get("/reports/{report_id}/spec/{n}", response_class=HTMLResponse)
    async def spec_page(request: Request, report_id: str, n: int) -> HTMLResponse:
        session = session_of(request)
        report = await api.report(session.token, report_id)
        if not 0 <= n < len(report.references):
            return page(request, "error.jinja", 404, code="NOT_FOUND", message="no such reference on this report")
        return page(request, "spec.jinja", r=report, ref=report.references[n])

    @app.post("/reports/{report_id}/review")
    async def review(
        request: Request,
        report_id: str,
        verdict: Annotated[str, Form()],
        csrf: Annotated[str, Form()] = "",
        classes: Annotated[str, Form()] = "",
        comment: Annotated[str, Form()] = "",
    ) -> Response:
        session = session_of(request)
        if not secrets.compare_digest(csrf, session.csrf):
            return page(request, "error.jinja", 403, code="FORBIDDEN", message="the form is stale: reload the page")
        if not session.may_review:
            return page(request, "error.jinja", 403, code="PERMISSION_DENIED",
                        message=f"a {session.role} token may view reports but not review them")  # fmt: skip
        if verdict not in ("ok", "defect"):
            return page(request, "error.jinja", 400, code="INVALID_ARGUMENT", message="verdict is ok or defect")
        wanted = [c.strip() for c in classes.split(",") if c.strip()]
        await api.review(session.token, inspection_pb2.ReviewReportRequest(
            report_id=report_id, verdict=views.VERDICTS[verdict], defect_classes=wanted, comment=comment))  # fmt: skip
        return RedirectResponse(f"/reports/{report_id}", status_code=303)

    @app.post("/reports/{report_id}/good-set")
    async def add_to_good_set(
        request: Request, report_id: str, csrf: Annotated[str, Form()] = "", stage: Annotated[str, Form()] = ""
    ) -> Response:
        """An admin's "this frame is good": the part's next bank version learns it (the gateway checks the role);
        with stage it is held back until promoted."""
        session = session_of(request)
        if not secrets.compare_digest(csrf, session.csrf):
            return page(request, "error.jinja", 403, code="FORBIDDEN", message="the form is stale: reload the page")
        version = await api.add_to_good_set(session.token, report_id, stage=bool(stage))
        query = {"added": f"{version.bank_id} (version {version.version}, {version.frames} good frames)"}
        if version.staged:
            query["staged"] = f"{version.part}:{version.version}"
        return RedirectResponse(f"/reports/{report_id}?{urlencode(query)}", status_code=303)

    @app.post("/reports/{report_id}/promote")
    async def promote_bank(
        request: Request,
        report_id: str,
        part: Annotated[str, Form()],
        version: Annotated[int, Form()],
        csrf: Annotated[str, Form()] = "",
        force: Annotated[str, Form()] = "",
    ) -> Response:
        """An admin's "go live": the staged bank version becomes current (refused when its go-live figures fail,
        unless forced; the error page says why)."""
        session = session_of(request)
        if not secrets.compare_digest(csrf, session.csrf):
            return page(request, "error.jinja", 403, code="FORBIDDEN", message="the form is stale: reload the page")
        bank = await api.promote_bank(session.token, part, version, force=bool(force))
        promoted = urlencode({"promoted": f"{bank.bank_id} (version {bank.version}) is live"})
        return RedirectResponse(f"/reports/{report_id}?{promoted}", status_code=303)

    return app


def _local_path(target: str) -> str:
    """Only same-site paths after login (no open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") else "/stations"
