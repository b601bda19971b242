"""structlog over stdlib logging: every record (ours or a library's) is one line with role + request id (and the
trace id inside a traced call)."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from pathlib import Path
from typing import Any, TextIO

import structlog

from edgeinspect.services.common.context import request_id_var
from edgeinspect.services.common.tracing import current_trace_id


class _RoleHandler(logging.StreamHandler):
    """The handler configure_logging installs; its type marks it so a second call replaces it."""


class _RoleFileHandler(logging.handlers.RotatingFileHandler):
    """configure_logging's handler for a log file: rotated at a size, so a role's log never fills its disk."""


def _file_handler(path: Path, max_bytes: int, backups: int) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    # delay: the file opens at the first record; a full disk drops records (logging's handleError), never the role
    return _RoleFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)


def _context_adder(role: str) -> structlog.types.Processor:
    def add_context(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
        event_dict.setdefault("role", role)
        event_dict.setdefault("request_id", request_id_var.get() or None)
        trace_id = current_trace_id()
        if trace_id is not None:  # inside a traced call: the line finds its trace
            event_dict.setdefault("trace_id", trace_id)
        return event_dict

    return add_context


def configure_logging(
    level: str = "INFO",
    json: bool = True,
    role: str = "",
    stream: TextIO | None = None,
    file: Path | None = None,
    max_bytes: int = 20 << 20,
    backups: int = 3,
) -> None:
    """Routes stdlib and structlog records to `stream` (stderr) as JSON lines (console text if not json), or with
    `file` to that file, rotated at `max_bytes` keeping `backups` old files (FILE.1 newest).

    Each line carries timestamp, level, logger, event, role and the current request id. Calling it again
    replaces the earlier configuration (tests, or a process that hosts several roles, may call it twice).
    """
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(),  # `extra={"report_id": ...}` becomes fields of the line, not lost
        _context_adder(role),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=file is None and (stream or sys.stderr).isatty())
    )
    final = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if json:
        final.append(structlog.processors.format_exc_info)
    formatter = structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=[*final, renderer])

    handler = _RoleHandler(stream or sys.stderr) if file is None else _file_handler(file, max_bytes, backups)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RoleHandler | _RoleFileHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())

    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
