#!/usr/bin/env bash
# The one GPU run of issue 59: the `gpu`-marked tests and bench/gpu.py on a CUDA box, JSON under bench/results/.
#
#   bash tools/gpu_check.sh            # from the repository root, on the GPU box (about 5-7 minutes on an H100)
#
# The box brings torch (2.11 + CUDA 13 on the lent H100s) and Python 3.12, and no package registry. What else
# edgeinspect imports must come with the working tree as wheels for that Python, in shared/wheels/ (or
# $EDGEINSPECT_WHEELS); made on a machine with a registry by:
#   pip download -d shared/wheels --python-version 3.12 --platform manylinux2014_x86_64 --only-binary=:all: \
#     transformers tokenizers safetensors huggingface-hub pydantic pydantic-settings pydantic-core pyyaml regex \
#     numpy pillow zstandard protobuf grpcio grpcio-health-checking grpcio-reflection structlog prometheus-client \
#     typer rich cryptography opentelemetry-api opentelemetry-sdk pytest pytest-timeout pytest-asyncio \
#     onnx onnxruntime-gpu
# (never torch: the box's own CUDA build stays). Pure-Python ones are small; the compiled ones are per-Python.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=bench/results
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)

"$PY" - <<'PY' || { echo "gpu_check: no usable CUDA torch here" >&2; exit 2; }
import torch
assert torch.cuda.is_available(), f"torch {torch.__version__} sees no CUDA device"
print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__, "cuda", torch.version.cuda)
PY

need="transformers tokenizers safetensors pydantic pydantic_settings yaml numpy PIL zstandard google.protobuf grpc structlog prometheus_client pytest pytest_timeout pytest_asyncio"
missing=$("$PY" -c "import importlib.util,sys; print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))" $need)
if [ -n "$missing" ]; then
  wheels=${EDGEINSPECT_WHEELS:-shared/wheels}
  if [ -d "$wheels" ]; then
    echo "gpu_check: installing from $wheels (missing: $missing)"
    "$PY" -m pip install --no-index --find-links "$wheels" --no-deps --quiet "$wheels"/*.whl
  else
    echo "gpu_check: missing Python packages: $missing; carry their wheels in shared/wheels (see this script's header)" >&2
    exit 3
  fi
fi
# edgeinspect itself: the tree's own package layout (setuptools package-dir), without touching torch
"$PY" -m pip install --no-deps --no-build-isolation --no-index -e . --quiet 2>/dev/null \
  || echo "gpu_check: editable install failed; relying on PYTHONPATH"

set +e
timeout 240 "$PY" -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider -rs \
  --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
timeout 300 "$PY" -m bench.gpu --out "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu_bench.log"
bench_rc=${PIPESTATUS[0]}
set -e
"$PY" - "$OUT" "$tests_rc" "$bench_rc" "$start" <<'PY'
import json, sys, time
from pathlib import Path
out, tests_rc, bench_rc, start = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
summary = {"tests_rc": tests_rc, "bench_rc": bench_rc, "wall_s": round(time.time() - start)}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
print("gpu_check:", summary)
PY
exit $(( tests_rc != 0 || bench_rc != 0 ))
