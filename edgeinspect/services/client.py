"""A small synchronous client of the public InspectionService, for the CLI and scripts."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
from google.protobuf.json_format import MessageToDict

from edgeinspect.services.common.findings import ok_cut
from edgeinspect.services.common.gateways import GatewayFailover, gateway_addresses
from edgeinspect.v1 import inspection_pb2, inspection_pb2_grpc

TOKEN_ENV = "EDGEINSPECT_TOKEN"
CA_ENV = "EDGEINSPECT_CA"  # the CA of a TLS gateway, for every command built on this client


def resolve_token(token: str | None, token_file: Path | None) -> str:
    """The bearer token to present: --token, else $EDGEINSPECT_TOKEN, else the token file `up` wrote; "" if none."""
    if token:
        return token
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    if token_file is not None and token_file.is_file():
        return token_file.read_text().strip()
    return ""


class InspectionClient:
    """`address`: one gateway, or a pair (or more) as "a:50051,b:50051": every call goes to the one that answered
    last and moves on to the next on UNAVAILABLE with the same request and idempotency key
    (services/common/gateways.py). `ca`: verify the gateways' TLS certificate against it (a gateway with
    `server.tls`); None: $EDGEINSPECT_CA, else plaintext."""

    def __init__(self, address: str | Sequence[str], token: str, timeout_s: float = 600.0, ca: Path | None = None):
        from edgeinspect.services.common.channel import channel_options

        options = channel_options(64)  # the roles' own limits and keepalive (a dead gateway noticed in ~40 s)
        env_ca = os.environ.get(CA_ENV)
        ca = ca if ca is not None else (Path(env_ca) if env_ca else None)
        creds = grpc.ssl_channel_credentials(root_certificates=Path(ca).read_bytes()) if ca is not None else None
        self.channels: list[grpc.Channel] = []

        def connect(target: str) -> inspection_pb2_grpc.InspectionServiceStub:
            channel = (
                grpc.insecure_channel(target, options=options)
                if creds is None
                else grpc.secure_channel(target, creds, options=options)
            )
            self.channels.append(channel)
            return inspection_pb2_grpc.InspectionServiceStub(channel)

        self.gateways = GatewayFailover(gateway_addresses(address), connect)
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        self.timeout_s = timeout_s

    @property
    def stub(self) -> inspection_pb2_grpc.InspectionServiceStub:
        """The gateway in use now (a call made on it directly does not move on: use `call`)."""
        return self.gateways.ends[self.gateways.order()[0]]

    def call(self, method: str, request, timeout_s: float | None = None):
        """One unary call of the public API on a gateway that answers (see the class)."""
        return self.gateways.call(
            lambda stub, left: getattr(stub, method)(request, metadata=self.metadata, timeout=left),
            self.timeout_s if timeout_s is None else timeout_s,
        )

    def __enter__(self) -> InspectionClient:
        return self

    def __exit__(self, *exc) -> None:
        for channel in self.channels:
            channel.close()

    def inspect(
        self,
        image: bytes,
        *,
        station: str = "",
        part: str = "",
        prompt: str = "",
        idempotency_key: str = "",
        max_new_tokens: int = 0,
        on_delta: Callable[[str], None] | None = None,
    ) -> inspection_pb2.DefectReport:
        request = inspection_pb2.InspectRequest(
            image=image,
            station=station,
            part=part,
            prompt=prompt,
            idempotency_key=idempotency_key or uuid.uuid4().hex,  # what makes a retry on another gateway safe
            max_new_tokens=max_new_tokens,
        )
        if on_delta is None:
            return self.call("Inspect", request)
        return self.gateways.call(lambda stub, left: self._stream(stub, request, left, on_delta), self.timeout_s)

    def _stream(self, stub, request, timeout_s: float, on_delta: Callable[[str], None]) -> inspection_pb2.DefectReport:
        report = None
        for event in stub.InspectStream(request, metadata=self.metadata, timeout=timeout_s):
            if event.HasField("delta"):
                on_delta(event.delta.text)
            elif event.HasField("decision"):  # the line has its verdict; the explanation streams on
                verdict = inspection_pb2.Verdict.Name(event.decision.verdict).removeprefix("VERDICT_")
                on_delta(f"[decided at takt: {verdict}; the VLM explains]\n")
            else:
                report = event.report
        if report is None:
            raise RuntimeError("the gateway closed the stream without a report")
        return report

    def get(self, report_id: str) -> inspection_pb2.DefectReport:
        return self.call("GetReport", inspection_pb2.GetReportRequest(report_id=report_id), timeout_s=30)


def report_to_dict(report: inspection_pb2.DefectReport) -> dict:
    return MessageToDict(report, preserving_proto_field_name=True)


VERDICT_STYLE = {"VERDICT_OK": "green", "VERDICT_DEFECT": "red", "VERDICT_UNCERTAIN": "yellow"}


def print_report(report: inspection_pb2.DefectReport) -> None:
    """The report as a readable table: verdict coloured, defects, references, timings."""
    from rich.console import Console
    from rich.table import Table

    verdict = inspection_pb2.Verdict.Name(report.verdict)
    table = Table(title=f"Report {report.report_id}", show_header=False)
    table.add_row(
        "verdict",
        f"[{VERDICT_STYLE.get(verdict, 'white')}]{verdict.removeprefix('VERDICT_')}[/]"
        + (f"  ({report.verdict_reason})" if report.verdict_reason else ""),
    )
    explanation = explanation_line(report)
    if explanation:
        table.add_row("explanation", explanation)
    table.add_row("station / part", f"{report.station or '-'} / {report.part or '-'}")
    if report.HasField("anomaly"):
        a = report.anomaly
        decided = inspection_pb2.DecidedBy.Name(a.decided_by).removeprefix("DECIDED_BY_").lower()
        score = f"score {a.score:.3g} (OK below {ok_cut(a):.3g}), " if a.bank_id else ""
        table.add_row(
            "anomaly gate", f"{score}policy {a.policy}, decided by {decided}" + (f": {a.note}" if a.note else "")
        )
    for d in report.defects:
        table.add_row("defect", f"{d.defect_class} ({d.severity}) at {d.location}: {d.evidence}")
    table.add_row("description", report.description[:300])
    for r in report.references:
        table.add_row("reference", f"{r.doc_id} / {r.section} (score {r.score:.2f}, index {r.index_version})")
    table.add_row(
        "model",
        f"{report.model.checkpoint_fingerprint}  {', '.join(report.model.partition)}  codec {report.model.codec}",
    )
    table.add_row("tokens", f"{report.prompt_tokens} prompt, {len(report.generated_token_ids)} generated")
    table.add_row("timings", ", ".join(f"{t.stage} {t.compute_ms + t.wire_ms:.0f} ms" for t in report.timings))
    Console().print(table)


def explanation_line(report: inspection_pb2.DefectReport) -> str:
    """Where a report decided at takt stands ("" for one decided and explained at once)."""
    state = report.explanation
    if state == inspection_pb2.EXPLANATION_PENDING:
        return (
            f"pending: the verdict went to the line at once; `edgeinspect reports show {report.report_id[:12]}` later"
        )
    if state == inspection_pb2.EXPLANATION_DONE:
        vlm = inspection_pb2.Verdict.Name(report.vlm_verdict).removeprefix("VERDICT_")
        return f"done after the decision (the VLM's own verdict: {vlm})"
    if state == inspection_pb2.EXPLANATION_FAILED:
        return f"failed: {report.explanation_error}"
    return ""
