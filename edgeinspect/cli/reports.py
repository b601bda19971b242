"""`edgeinspect reports list|show|export|review`: the stored reports from the terminal, over the public API."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path

import grpc
import typer

from edgeinspect.cli.options import CA, GATEWAY, TOKEN
from edgeinspect.cli.options import TOKEN_FILE_OPTION as TOKEN_FILE

app = typer.Typer(no_args_is_help=True, pretty_exceptions_show_locals=False)


class VerdictChoice(StrEnum):
    ok = "ok"
    defect = "defect"
    uncertain = "uncertain"


class ReviewChoice(StrEnum):
    reviewed = "reviewed"
    unreviewed = "unreviewed"
    disagreed = "disagreed"


class ReviewVerdict(StrEnum):
    ok = "ok"
    defect = "defect"


class _Api:
    """The public API with the resolved token; `call(name, request)`."""

    def __init__(self, gateway: str, token: str, token_file: Path, ca: Path | None) -> None:
        from edgeinspect.services.client import InspectionClient, resolve_token

        self.client = InspectionClient(gateway, resolve_token(token, token_file), ca=ca)

    def call(self, method: str, request, timeout_s: float = 60.0):
        try:
            return self.client.call(method, request, timeout_s=timeout_s)
        except grpc.RpcError as exc:
            typer.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
            raise typer.Exit(1) from None

    def __enter__(self) -> _Api:
        return self

    def __exit__(self, *exc) -> None:
        self.client.__exit__()


def _params(station, part, camera, verdict, defect_class, review, since, until) -> dict[str, str]:
    return {"station": station, "part": part, "camera_id": camera, "verdict": verdict.value if verdict else "",
            "defect_class": defect_class, "review": review.value if review else "", "since": since,
            "until": until}  # fmt: skip


def _reports(api: _Api, params: dict[str, str], limit: int):
    """Every report matching the filters, newest first, at most `limit` (pages of up to 500)."""
    from edgeinspect.services.console.views import list_request

    try:
        request = list_request(params, page_size=min(limit, 500))
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    out = []
    while len(out) < limit:
        answer = api.call("ListReports", request)
        out += answer.reports
        if not answer.next_page_token:
            break
        request.page_token = answer.next_page_token
    return out[:limit]


def _as_dict(report) -> dict:
    from edgeinspect.services.client import report_to_dict

    doc = report_to_dict(report)
    for key in ("generated_token_ids", "prompt_token_ids"):
        doc.pop(key, None)
    return doc


def _table(reports) -> None:
    from rich.console import Console
    from rich.table import Table

    from edgeinspect.services.console.views import classes_of, local_time, verdict_label
    from edgeinspect.v1 import inspection_pb2

    table = Table(title=f"{len(reports)} reports")
    for column in ("report", "when", "station", "camera", "part", "model", "reviewed", "classes"):
        table.add_column(column)
    for r in reports:
        reviewed = f"{verdict_label(r.review.verdict)} ({r.review.reviewer})" if r.HasField("review") else ""
        # A verdict decided at takt says whether its explanation is still coming (or never will).
        explaining = {
            inspection_pb2.EXPLANATION_PENDING: " (explaining)",
            inspection_pb2.EXPLANATION_FAILED: " (unexplained)",
        }
        table.add_row(r.report_id[:12], local_time(r.created_time), r.station, r.camera_id, r.part,
                      verdict_label(r.verdict) + explaining.get(r.explanation, ""), reviewed,
                      ", ".join(classes_of(r)))  # fmt: skip
    Console().print(table)


FILTERS = dict(
    station=typer.Option("", help="station id"),
    part=typer.Option("", help="part / product id"),
    camera=typer.Option("", help="camera id"),
    verdict=typer.Option(None, help="model verdict"),
    defect_class=typer.Option("", "--class", help="reports with at least one defect of this class"),
    review=typer.Option(None, help="review state"),
    since=typer.Option("", help="from this time (ISO 8601, naive = UTC), inclusive"),
    until=typer.Option("", help="to this time (ISO 8601), exclusive"),
)


@app.command("list")
def list_command(
    station: str = FILTERS["station"],
    part: str = FILTERS["part"],
    camera: str = FILTERS["camera"],
    verdict: VerdictChoice | None = FILTERS["verdict"],
    defect_class: str = FILTERS["defect_class"],
    review: ReviewChoice | None = FILTERS["review"],
    since: str = FILTERS["since"],
    until: str = FILTERS["until"],
    limit: int = typer.Option(50, min=1, help="most reports shown"),
    as_json: bool = typer.Option(False, "--json", help="JSON lines, one report each"),
    as_csv: bool = typer.Option(False, "--csv", help="CSV with a header row"),
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE,
    ca: Path | None = CA,
) -> None:
    """Stored reports, newest first, filtered."""
    from edgeinspect.services.console.views import to_csv

    params = _params(station, part, camera, verdict, defect_class, review, since, until)
    with _Api(gateway, token, token_file, ca) as api:
        reports = _reports(api, params, limit)
    if as_csv:
        sys.stdout.write(to_csv(reports))
    elif as_json:
        for r in reports:
            print(json.dumps(_as_dict(r)))
    else:
        _table(reports)


@app.command("export")
def export_command(
    station: str = FILTERS["station"],
    part: str = FILTERS["part"],
    camera: str = FILTERS["camera"],
    verdict: VerdictChoice | None = FILTERS["verdict"],
    defect_class: str = FILTERS["defect_class"],
    review: ReviewChoice | None = FILTERS["review"],
    since: str = FILTERS["since"],
    until: str = FILTERS["until"],
    out: Path | None = typer.Option(None, "--out", "-o", help="file to write (default: stdout)"),
    as_json: bool = typer.Option(False, "--json", help="JSON lines instead of CSV"),
    limit: int = typer.Option(1_000_000, min=1, help="most reports exported"),
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE,
    ca: Path | None = CA,
) -> None:
    """Every report matching the filters as CSV (or JSON lines)."""
    from edgeinspect.services.console.views import to_csv

    params = _params(station, part, camera, verdict, defect_class, review, since, until)
    with _Api(gateway, token, token_file, ca) as api:
        reports = _reports(api, params, limit)
    text = "".join(json.dumps(_as_dict(r)) + "\n" for r in reports) if as_json else to_csv(reports)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
        typer.echo(f"{len(reports)} reports -> {out}", err=True)


@app.command("show")
def show_command(
    report_id: str = typer.Argument(..., help="report id"),
    as_json: bool = typer.Option(False, "--json", help="the report as JSON"),
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE,
    ca: Path | None = CA,
) -> None:
    """One report with its review."""
    from rich.console import Console

    from edgeinspect.services.client import print_report
    from edgeinspect.services.console.views import local_time, verdict_label
    from edgeinspect.v1 import inspection_pb2

    with _Api(gateway, token, token_file, ca) as api:
        r = api.call("GetReport", inspection_pb2.GetReportRequest(report_id=report_id))
    if as_json:
        print(json.dumps(_as_dict(r), indent=2))
        return
    print_report(r)
    if r.HasField("review"):
        v = r.review
        who = f"{v.reviewer or '-'} ({v.reviewer_role})"
        Console().print(
            f"reviewed: {verdict_label(v.verdict)} {', '.join(v.defect_classes)} by {who}"
            f" at {local_time(v.created_time)}{'' if v.agrees else ' [bold]overrides the model[/bold]'}"
            + (f": {v.comment}" if v.comment else "")
        )


@app.command("review")
def review_command(
    report_id: str = typer.Argument(..., help="report id"),
    verdict: ReviewVerdict = typer.Option(..., help="your verdict"),
    classes: str = typer.Option("", help="comma-separated defect classes (DEFECT; empty: the model's)"),
    comment: str = typer.Option("", help="why"),
    as_json: bool = typer.Option(False, "--json", help="print the stored review as JSON"),
    gateway: str = GATEWAY,
    token: str = TOKEN,
    token_file: Path = TOKEN_FILE,
    ca: Path | None = CA,
) -> None:
    """Confirm or override a report's verdict (stored beside the report; needs a token that may review)."""
    from google.protobuf.json_format import MessageToDict

    from edgeinspect.services.console.views import VERDICTS, verdict_label
    from edgeinspect.v1 import inspection_pb2

    request = inspection_pb2.ReviewReportRequest(
        report_id=report_id, verdict=VERDICTS[verdict.value], comment=comment,
        defect_classes=[c.strip() for c in classes.split(",") if c.strip()],
    )  # fmt: skip
    with _Api(gateway, token, token_file, ca) as api:
        review = api.call("ReviewReport", request)
    if as_json:
        print(json.dumps(MessageToDict(review, preserving_proto_field_name=True), indent=2))
    else:
        agreement = "agrees with" if review.agrees else "overrides"
        typer.echo(f"review {review.review_id}: {verdict_label(review.verdict)} {agreement} the model's "
                   f"{verdict_label(review.model_verdict)}")  # fmt: skip
