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


# Ordered and grouped by what a newcomer does first: start the stack, inspect, watch it, then the tools.
START, OPERATE, DEPLOY, TOOLS = "Start here", "Run the line", "Deploy to a plant", "Tools"
COMMANDS = [  # (name, panel, command, one line for the list; None: the command's own docstring)
    ("up", START, up_command, "Start every role on this box (the embedded default)."),
    ("inspect", START, inspect_command, None),
    ("status", START, status_command, "Every replica's health, the plan in force, the inspections in flight."),
    ("demo", START, demo_command, "The embedded default end to end, the anomaly gate included."),
    ("ingest", OPERATE, ingest_command, None),
    ("eval", OPERATE, eval_command, None),
    ("serve", DEPLOY, serve_command, "Serve one role (vision, stage, retrieval, gateway, console, ingest)."),
    ("healthcheck", DEPLOY, healthcheck_command, "Exit 0 when a server's grpc.health.v1 Check says SERVING."),
    ("plan", TOOLS, plan_command, "Plan layer ranges over the decoder nodes and print them."),
    ("verify", TOOLS, verify_command, "Check the cluster's greedy tokens against a single-process reference."),
    ("bench", TOOLS, bench_command, None),
]
GROUPS = [  # (name, panel, sub-app, one line for the list)
    ("reports", START, reports_app, "Stored reports: list, show, export (CSV/JSON), review."),
    ("anomaly", OPERATE, anomaly_app, "The anomaly gate: teach a part from good frames, eval, banks."),
    ("kb", OPERATE, kb_app, "Knowledge base of defect specs: index a folder, search, stats, verify."),
    ("line", OPERATE, line_app, "The production line: play the PLC side of the OPC UA handshake."),
    ("rollout", OPERATE, rollout_app, "Model versions: shadow a candidate, promote it, roll it back."),
    ("deploy", DEPLOY, deploy_app, "Plant inventory -> compose files, role settings, k3s manifests."),
    ("certs", DEPLOY, certs_app, "The plant CA: make it, issue box certificates, check expiry."),
    ("token", DEPLOY, token_app, "Public API bearer tokens: create one (its hash goes in the config)."),
    ("model", TOOLS, model_app, "Checkpoints: generate a tiny one, inspect, export the vision tower."),
]
for name, panel, command, line in COMMANDS:
    app.command(name, rich_help_panel=panel, short_help=line)(command)
for name, panel, sub_app, line in GROUPS:
    app.add_typer(sub_app, name=name, rich_help_panel=panel, help=line)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _rpc_message(exc) -> str:
    """A gRPC failure as the person at the terminal can act on it (the client side: their own addresses)."""
    import grpc

    code, details = exc.code(), _one_line(exc.details() or "")
    if code is grpc.StatusCode.UNAVAILABLE and _gateway_answered(exc):
        role = next((r for r in ("vision", "stage", "retrieval", "gateway") if r in details.lower()), "")
        behind = f"its {role} node" if role and role != "gateway" else "a node behind it"
        return f"the gateway answered, but {behind} is unavailable (UNAVAILABLE): {details}"
    if code is grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the gateway (UNAVAILABLE: is it running, and is --gateway right?): {details}"
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return f"the gateway refused the token (UNAUTHENTICATED: check --token or --token-file): {details}"
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return f"this token may not do that (PERMISSION_DENIED): {details}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"the gateway did not answer in time (DEADLINE_EXCEEDED): {details}"
    return f"{code.name}: {details}"


def _gateway_answered(exc) -> bool:
    """Whether the failure came from a running gateway (its interceptor stamps every call it handles with the
    request id) rather than from the channel (nothing listening, refused, TLS)."""
    from edgeinspect.services.common.context import REQUEST_ID_KEY
    from edgeinspect.services.common.errors import ERROR_CODE_KEY

    try:
        metadata = (*(exc.initial_metadata() or ()), *(exc.trailing_metadata() or ()))
    except Exception:  # an error object without call metadata: the channel's own
        return False
    return any(key in (REQUEST_ID_KEY, ERROR_CODE_KEY) for key, _ in metadata)


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
