#!/usr/bin/env bash
# The image's wheelhouse: this project's wheel and every wheel it needs, CPU torch included, in compose/wheels/
# (the build context), so `docker build -f compose/Dockerfile .` installs with `pip install --no-index` and never
# reaches a package index. Run it where pip reaches one (here: the local index in pip's config; a plant: any
# connected machine of the same architecture), then carry the folder to an air-gapped site: see compose/DEPLOY.md.
#   tools/wheelhouse.sh                  # compose/wheels, torch 2.13.0 CPU
#   WHEELS=/some/dir TORCH_VERSION=2.13.0 tools/wheelhouse.sh
# The HailoRT wheel (Hailo's developer zone) goes into the same folder by hand; it is never removed here.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-compose/wheels}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
# Where the CPU build of torch comes from: pip's own configuration (here it finds 2.13.0+cpu in /opt/wheels), or
# on a machine that reaches the internet TORCH_INDEX=https://download.pytorch.org/whl/cpu (PyPI's x86 torch is the
# CUDA build, ~2.5 GB of nvidia-* wheels more).
TORCH_INDEX=${TORCH_INDEX:-}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$WHEELS"
# The project's own wheel, fresh every time (an old one of the same version would be installed instead), built
# from a clean copy: an in-tree build keeps build/lib/, and a module moved or deleted since would stay in the wheel.
rm -f "$WHEELS"/edgeinspect-*.whl
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
tar -c --exclude=__pycache__ --exclude='*.pyc' pyproject.toml README.md edgeinspect | tar -x -C "$src"
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$WHEELS" "$src"
# One resolution with torch pinned beside the project (a separate torch pass would let `torch>=2.4` resolve to the
# newest CUDA build and its ~2.5 GB of nvidia-* wheels).
"$PY" -m pip wheel --quiet --wheel-dir "$WHEELS" --find-links "$WHEELS" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} \
  "torch==${TORCH_VERSION}" "$(ls "$WHEELS"/edgeinspect-*.whl)"
if ls "$WHEELS" | grep -q '^nvidia_'; then
  echo "the wheelhouse got CUDA torch (nvidia-* wheels): rerun with TORCH_INDEX=https://download.pytorch.org/whl/cpu" >&2
  exit 1
fi
# Check the set is complete the way the image installs it: offline, from this folder only.
"$PY" -m pip install --quiet --dry-run --ignore-installed --no-index --find-links "$WHEELS" \
  "torch==${TORCH_VERSION}" "$(ls "$WHEELS"/edgeinspect-*.whl)" >/dev/null
echo "$(ls "$WHEELS"/*.whl | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1) in $WHEELS"
