"""The `edgeinspect` command: one entry point, one sub-command group per concern.

Sub-command modules import their heavy dependencies (torch, faiss, cv2) inside the commands, so `--help` is fast.
"""

from __future__ import annotations

import typer

from edgeinspect.bench_cli import bench_command
from edgeinspect.models.cli import app as model_app
from edgeinspect.models.planner_cli import plan_command
from edgeinspect.rag.cli import app as kb_app
from edgeinspect.security_cli import certs_app, token_app
from edgeinspect.services.cli import demo_command, inspect_command, serve_command, up_command
from edgeinspect.services.deploy.cli import app as deploy_app
from edgeinspect.services.deploy.healthcheck import healthcheck_command
from edgeinspect.services.evaluation.cli import eval_command
from edgeinspect.services.evaluation.rollout_cli import app as rollout_app
from edgeinspect.services.ingest.cli import ingest_command
from edgeinspect.services.line.cli import app as line_app
from edgeinspect.services.reports_cli import app as reports_app
from edgeinspect.services.status_cli import status_command
from edgeinspect.services.verify import verify_command

app = typer.Typer(
    name="edgeinspect",
    help="On-prem visual inspection: DeepSeek-VL split across edge boxes, grounded in your defect specs.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
app.add_typer(model_app, name="model", help="Checkpoints: generate a tiny one, inspect, export the vision tower.")
app.command("plan")(plan_command)
app.add_typer(deploy_app, name="deploy", help="Plant inventory -> compose files, role settings, k3s manifests.")
app.command("healthcheck")(healthcheck_command)
app.add_typer(certs_app, name="certs", help="The plant CA: make it, issue box certificates, check expiry.")
app.add_typer(token_app, name="token", help="Public API bearer tokens: create one (its hash goes in the config).")
app.add_typer(kb_app, name="kb", help="Knowledge base of defect specs: index a folder, search, stats, verify.")
app.add_typer(reports_app, name="reports", help="Stored reports: list, show, export (CSV/JSON), review.")
app.command("ingest")(ingest_command)
app.add_typer(line_app, name="line", help="The production line: play the PLC side of the OPC UA handshake.")
app.command("serve")(serve_command)
app.command("up")(up_command)
app.command("inspect")(inspect_command)
app.command("status")(status_command)
app.command("demo")(demo_command)
app.command("bench")(bench_command)
app.command("verify")(verify_command)
app.command("eval")(eval_command)
app.add_typer(rollout_app, name="rollout", help="Model versions: shadow a candidate, promote it, roll it back.")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
