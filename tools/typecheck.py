"""Runs pyright over the packages as the one `edgeinspect` tree and fails on any import it cannot resolve.

On disk, edgeinspect.services/.models/.rag are the top-level folders services/, models/, rag/ (setup.py maps them);
the editable install resolves that with an import hook static tools never run. So this copies the sources into
build/typecheck/edgeinspect/{<edgeinspect's own files>, services, models, rag} and points pyright at that tree:
every `edgeinspect.*` import then resolves the way the wheel lays it out.

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
# The folders setup.py maps into the namespace (edgeinspect.<name> -> <name>/).
MAPPED = ("services", "models", "rag")
# The generated protobuf modules are checked through their .pyi stubs; their bodies are protoc's, not ours.
EXCLUDE = ["**/__pycache__", "edgeinspect/v1/*_pb2*.py"]


def build_tree(dest: Path) -> Path:
    """dest/edgeinspect laid out as the wheel has it: copies of the Python sources (pyright does not enumerate
    symlinked folders, and a copy is a few MB); returns the tree."""
    pkg = dest / "edgeinspect"
    if pkg.exists():
        shutil.rmtree(pkg)
    keep_sources = shutil.ignore_patterns("__pycache__", "*.pyc", "sample_kb", "templates", "static", "*.onnx")
    shutil.copytree(ROOT / "edgeinspect", pkg, ignore=keep_sources)
    for name in MAPPED:
        shutil.copytree(ROOT / name, pkg / name, ignore=keep_sources)
    return pkg


def pyright_config(python: str) -> dict:
    return {
        "include": ["edgeinspect"],
        "exclude": EXCLUDE,
        "typeCheckingMode": "basic",
        "pythonVersion": "3.11",
        "reportMissingImports": "error",
        # Compiled third-party modules without stubs (cv2, faiss...) are resolved but not typed: not an import fault.
        "reportMissingModuleSource": "none",
    }


def is_import_failure(diag: dict) -> bool:
    rule = diag.get("rule", "")
    return rule == "reportMissingImports" or "is unknown import symbol" in diag.get("message", "")


def run(dest: Path, python: str) -> tuple[list[dict], list[dict]]:
    """(import failures, every other diagnostic) of one pyright run over the tree built at dest."""
    build_tree(dest)
    (dest / "pyrightconfig.json").write_text(json.dumps(pyright_config(python), indent=2))
    pyright = shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")
    if pyright is None:
        raise SystemExit("pyright is not installed: .venv/bin/pip install -e '.[dev]'")
    cmd = [pyright, "--outputjson", "--pythonpath", python, "-p", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"pyright did not report (exit {proc.returncode}): {proc.stderr.strip()[-500:]}") from exc
    print(f"pyright: {report.get('summary', {}).get('filesAnalyzed')} files analysed", file=sys.stderr)
    diags = report.get("generalDiagnostics", [])
    failures = [d for d in diags if is_import_failure(d)]
    return failures, [d for d in diags if not is_import_failure(d)]


def source_path(file: str, dest: Path) -> str:
    """The repository path of a file in the built tree: edgeinspect/services/x.py -> services/x.py."""
    try:
        rel = Path(file).relative_to(dest.resolve())
    except ValueError:
        return file
    parts = rel.parts[1:]
    return str(Path(*parts)) if parts and parts[0] in MAPPED else str(rel)


def _where(diag: dict, dest: Path) -> str:
    line = diag.get("range", {}).get("start", {}).get("line", 0) + 1
    return f"{source_path(diag['file'], dest)}:{line}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / "build" / "typecheck", help="where the tree goes")
    parser.add_argument("--all", action="store_true", help="list every diagnostic, not only the per-rule counts")
    args = parser.parse_args(argv)
    failures, others = run(args.dest, sys.executable)
    counts = Counter(d.get("rule", "(no rule)") for d in others)
    print(f"pyright: {len(failures)} unresolved imports; other diagnostics by rule: {dict(counts.most_common())}")
    if args.all:
        for d in others:
            print(f"  {_where(d, args.dest)}: {d.get('rule', '')}: {d['message'].splitlines()[0]}")
    for d in failures:
        print(f"UNRESOLVED {_where(d, args.dest)}: {d['message'].splitlines()[0]}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
