"""Process entry shared by every role: settings from file + environment, JSON logs, serve, clean exit codes."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from edgeinspect.errors import EdgeInspectError
from edgeinspect.services.common.channel import client_tls_var
from edgeinspect.services.common.lifecycle import die_with_launcher
from edgeinspect.services.common.logging import configure_logging
from edgeinspect.services.common.tracing import setup_tracing, tracing_var

log = logging.getLogger(__name__)


def run_role(settings_cls, serve: Callable[[Any], Coroutine], role: str, config_path: Path | None) -> None:
    """Loads the role's settings, configures logging and serves; a startup error is one log line and exit 1.

    A role started by a launcher (`up`, LocalStack) ends with it, also when the launcher is SIGKILLed. `serve`
    closes what the role started before it returns, so the process then ends as any Python program does.
    """
    cfg = settings_cls.load(config_path)
    configure_logging(
        cfg.log_level,
        cfg.log_json,
        role=role,
        file=cfg.log_file,
        max_bytes=int(cfg.log_max_mb * 2**20),
        backups=cfg.log_backups,
    )
    die_with_launcher()
    tracing = setup_tracing(cfg.tracing, role)
    try:
        client_tls_var.set(getattr(cfg, "client_tls", None))  # before asyncio.run: its tasks copy this context
        tracing_var.set(tracing)
        # The imported modules (torch, transformers: ~400k objects) live as long as the process: kept out of every
        # collection, the one at interpreter exit included, which took seconds (10+ s on a loaded 2-core box) and
        # once made roles leave through os._exit to stop within a supervisor's grace.
        gc.freeze()
        asyncio.run(serve(cfg))
    except EdgeInspectError as exc:
        log.error("%s cannot start: %s", role, exc)
        raise SystemExit(1) from exc
    finally:
        if tracing is not None:
            tracing.shutdown()  # exports what is still queued


def role_main(main: Callable[[Path | None], None], role: str) -> None:
    """`python -m edgeinspect.services.<role> --config FILE`."""
    parser = argparse.ArgumentParser(description=f"edgeinspect {role} server")
    parser.add_argument("--config", type=Path, default=None, help="YAML settings (EDGEINSPECT_* env overrides)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(args.config)
