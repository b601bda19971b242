"""Runs pyright over the `edgeinspect` package in place: fails on any import it cannot resolve, and on more
diagnostics in the package than the count recorded here (a ratchet: the count may only go down).

The role folders live inside the package (edgeinspect/services, /models, /rag), so pyright reads the checkout as
it is, with the settings in pyproject.toml's [tool.pyright] (the same an IDE picks up): no copy, no import hook.

Two things fail the run (exit 1):
- an unresolved import (reportMissingImports, "unknown import symbol"), always;
- more of pyright's other basic-mode diagnostics in the package's own files than MAX_DIAGNOSTICS: a change that
  adds one must fix it (or another). They are counted per rule and printed; fixing some and lowering
  MAX_DIAGNOSTICS to the new count keeps them fixed. Where a library's stubs are wrong, an explicit
  `# pyright: ignore[ruleName]  # why` on that line is a fix; a bare one is not.

    .venv/bin/python tools/typecheck.py            # exit 1 on an unresolved import or a count above the ratchet
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
PACKAGE = "edgeinspect"
# The package's non-import diagnostics today (pyright 1.1.414, basic mode). Lower it as they are fixed (0 is the
# goal); raising it to let a change through undoes the ratchet.
MAX_DIAGNOSTICS = 127


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


def in_package(diag: dict, root: Path = ROOT) -> bool:
    """Whether the diagnostic is in the package's own files (product code), not a stub or a tool it reads."""
    return Path(source_path(diag.get("file", ""), root)).parts[:1] == (PACKAGE,)


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
    found = sum(in_package(d) for d in others)
    if found > MAX_DIAGNOSTICS:
        print(
            f"pyright: {found} diagnostics in {PACKAGE}/, more than the {MAX_DIAGNOSTICS} recorded in "
            f"tools/typecheck.py: fix the new ones (--all lists them), do not raise the number"
        )
    elif found < MAX_DIAGNOSTICS:
        print(f"pyright: {found} diagnostics in {PACKAGE}/: lower MAX_DIAGNOSTICS from {MAX_DIAGNOSTICS} to {found}")
    return 1 if failures or found > MAX_DIAGNOSTICS else 0


if __name__ == "__main__":
    sys.exit(main())
