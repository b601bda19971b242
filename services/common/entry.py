"""The `python -m edgeinspect.services.<role> --config FILE` entry shared by every role."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path


def role_main(main: Callable[[Path | None], None], role: str) -> None:
    parser = argparse.ArgumentParser(description=f"edgeinspect {role} server")
    parser.add_argument("--config", type=Path, default=None, help="YAML settings (EDGEINSPECT_* env overrides)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(args.config)
