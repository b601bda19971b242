"""The `edgeinspect` command: one entry point, one sub-command group per concern, each in its own module here
(stack: serve/up/demo, inspect, reports, status, eval, rollout, deploy, healthcheck, ingest, line, kb, model, plan,
bench, security: certs/token, verify, anomaly; options: how every client command reaches the gateway). The logic
they call lives with its role (services/, models/, rag/).

Sub-command modules import their heavy dependencies (torch, faiss, cv2) inside the commands, so `--help` is fast.
A user error (a missing file, a refused token, an unreachable gateway, a bad checkpoint folder) ends as one line on
stderr and a non-zero exit, never a traceback: main() translates them (user_error_message) in one place.
"""

from __future__ import annotations

import sys

import typer

from edgeinspect import PROTOCOL_VERSION, __version__
from edgeinspect.cli.anomaly import app as anomaly_app
from edgeinspect.cli.bench import bench_command
from edgeinspect.cli.deploy import app as deploy_app
from edgeinspect.cli.eval import eval_command
from edgeinspect.cli.healthcheck import healthcheck_command
from edgeinspect.cli.ingest import ingest_command
from edgeinspect.cli.inspect import inspect_command
from edgeinspect.cli.kb import app as kb_app
from edgeinspect.cli.line import app as line_app
from edgeinspect.cli.model import app as model_app
from edgeinspect.cli.plan import plan_command
from edgeinspect.cli.reports import app as reports_app
from edgeinspect.cli.rollout import app as rollout_app
from edgeinspect.cli.security import certs_app, token_app
from edgeinspect.cli.stack import demo_command, serve_command, up_command
from edgeinspect.cli.status import status_command
from edgeinspect.cli.verify import verify_command

app = typer.Typer(
    name="edgeinspect",
    help="On-prem visual inspection: DeepSeek-VL split across edge boxes, grounded in your defect specs.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"edgeinspect {__version__} (protocol {PROTOCOL_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """On-prem visual inspection: DeepSeek-VL split across edge boxes, grounded in your defect specs."""


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
app.add_typer(anomaly_app, name="anomaly", help="The anomaly gate offline: teach a part from good frames, eval, banks.")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _rpc_message(exc) -> str:
    """A gRPC failure as the person at the terminal can act on it (the client side: their own addresses)."""
    import grpc

    code, details = exc.code(), _one_line(exc.details() or "")
    if code is grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the gateway (UNAVAILABLE: is it running, and is --gateway right?): {details}"
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return f"the gateway refused the token (UNAUTHENTICATED: check --token or --token-file): {details}"
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return f"this token may not do that (PERMISSION_DENIED): {details}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the gateway did not answer in time (DEADLINE_EXCEEDED): {details}"
    return f"{code.name}: {details}"


def user_error_message(exc: BaseException) -> str | None:
    """One line for an error the user can fix, or None for a bug (which keeps its traceback)."""
    from edgeinspect.errors import EdgeInspectError

    if isinstance(exc, EdgeInspectError):
        return _one_line(str(exc)) or exc.status.lower().replace("_", " ")
    if type(exc).__module__.startswith("grpc") and hasattr(exc, "code") and hasattr(exc, "details"):
        return _rpc_message(exc)
    if isinstance(exc, FileNotFoundError | IsADirectoryError | NotADirectoryError | PermissionError):
        if exc.filename:
            return f"{exc.filename}: {(exc.strerror or str(exc)).lower()}"
        return _one_line(str(exc))
    if type(exc).__name__ == "ValidationError" and type(exc).__module__.startswith("pydantic"):
        first = exc.errors()[0]  # type: ignore[attr-defined]
        where = ".".join(str(p) for p in first.get("loc", ())) or "settings"
        return f"invalid settings: {where}: {first.get('msg', '')} ({exc.error_count()} error(s) in all)"  # type: ignore[attr-defined]
    return None


def _is_usage_error(exc: BaseException) -> bool:
    """A ClickException (typer vendors click, so matched by what it has rather than by an import path)."""
    return any(c.__name__ == "ClickException" for c in type(exc).__mro__) and hasattr(exc, "format_message")


def main(argv: list[str] | None = None) -> None:
    try:
        rc = app(args=argv, prog_name="edgeinspect", standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except Exception as exc:
        if _is_usage_error(exc):  # typer's (vendored) click exceptions: a wrong option, a missing argument
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # type: ignore[attr-defined] (the help text itself, as typer prints it for a bare group)
                sys.exit(2)
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            sys.stderr.write(f"error: {_one_line(exc.format_message())}{hint}\n")  # type: ignore[attr-defined]
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        message = user_error_message(exc)
        if message is None:
            raise
        sys.stderr.write(f"error: {message}\n")
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
