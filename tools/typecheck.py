"""Runs pyright over the `edgeinspect` package in place and fails on any import it cannot resolve.

The role folders live inside the package (edgeinspect/services, /models, /rag), so pyright reads the checkout as
it is, with the settings in pyproject.toml's [tool.pyright] (the same an IDE picks up): no copy, no import hook.

Only unresolved imports fail the run (reportMissingImports, "unknown import symbol"); the other diagnostics of
pyright's basic mode are counted per rule and printed, so they can be worked down without blocking CI.

    .venv/bin/python tools/typecheck.py            # exit 1 on an unresolved import
    .venv/bin/python tools/typecheck.py --all      # also list every other diagnostic
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def is_import_failure(diag: dict) -> bool:
    rule = diag.get("rule", "")
    return rule == "reportMissingImports" or "is unknown import symbol" in diag.get("message", "")


def run(root: Path, python: str) -> tuple[list[dict], list[dict]]:
    """(import failures, every other diagnostic) of one pyright run over the package at root."""
    pyright = shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")
    if pyright is None:
        raise SystemExit("pyright is not installed: .venv/bin/pip install -e '.[dev]'")
    cmd = [pyright, "--outputjson", "--pythonpath", python, "-p", str(root / "pyproject.toml")]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"pyright did not report (exit {proc.returncode}): {proc.stderr.strip()[-500:]}") from exc
    print(f"pyright: {report.get('summary', {}).get('filesAnalyzed')} files analysed", file=sys.stderr)
    diags = report.get("generalDiagnostics", [])
    failures = [d for d in diags if is_import_failure(d)]
    return failures, [d for d in diags if not is_import_failure(d)]


def source_path(file: str, root: Path = ROOT) -> str:
    """A diagnostic's file relative to the checkout."""
    try:
        return str(Path(file).relative_to(root.resolve()))
    except ValueError:
        return file


def _where(diag: dict) -> str:
    line = diag.get("range", {}).get("start", {}).get("line", 0) + 1
    return f"{source_path(diag['file'])}:{line}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list every diagnostic, not only the per-rule counts")
    args = parser.parse_args(argv)
    failures, others = run(ROOT, sys.executable)
    counts = Counter(d.get("rule", "(no rule)") for d in others)
    print(f"pyright: {len(failures)} unresolved imports; other diagnostics by rule: {dict(counts.most_common())}")
    if args.all:
        for d in others:
            print(f"  {_where(d)}: {d.get('rule', '')}: {d['message'].splitlines()[0]}")
    for d in failures:
        print(f"UNRESOLVED {_where(d)}: {d['message'].splitlines()[0]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
