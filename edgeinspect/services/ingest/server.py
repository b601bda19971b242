"""The ingest role's process shape, as every role has it: `serve(cfg)` runs it until SIGINT/SIGTERM (or the sources
end), `main(config)` is the process entry. `edgeinspect ingest` adds its console output around the same `run`."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path

from edgeinspect.services.ingest.camera import DecisionHook
from edgeinspect.services.ingest.config import IngestSettings
from edgeinspect.services.ingest.delivery import GrpcReportSink, ReportSummary
from edgeinspect.services.ingest.metrics import IngestMetrics
from edgeinspect.services.ingest.service import Ingestor, IngestResult


async def run(
    cfg: IngestSettings,
    *,
    dry_run: bool = False,
    max_reports: int | None = None,
    on_report: Callable[[ReportSummary], None] | None = None,
    on_decision: DecisionHook | None = None,
    on_start: Callable[[Ingestor], None] | None = None,
) -> IngestResult:
    """Follows the cameras until stopped (signal, `max_reports`, sources ended); metrics served while it runs."""
    from edgeinspect.services.common.metrics import serve_metrics

    metrics = IngestMetrics()
    metrics_http = None if dry_run else serve_metrics(cfg.server.metrics_port, cfg.server.host)
    sink = None if dry_run else GrpcReportSink(cfg.gateway, cfg.api_token, cfg.request_timeout_s, cfg.gateway_tls)
    ingestor = Ingestor(cfg, sink, metrics, on_report=on_report, on_decision=on_decision)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, ingestor.stop)
    if on_start is not None:
        on_start(ingestor)
    try:
        return await ingestor.run(max_reports=None if dry_run else max_reports)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if sink is not None:
            await sink.close()
        if metrics_http is not None:
            metrics_http.close()
        metrics.close()  # the default registry outlives one run (tests run more than one per process)


async def serve(cfg: IngestSettings) -> None:
    await run(cfg)


def main(config_path: Path | None = None) -> None:
    """Process entry: settings from the YAML file + environment, JSON logs, serve; exit 1 on a startup error."""
    from edgeinspect.services.common.entry import run_role

    run_role(IngestSettings, serve, "ingest", config_path)
