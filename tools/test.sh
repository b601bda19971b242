#!/usr/bin/env bash
# Sets up and runs the default test suite (slow suites deselected; run them with: .venv/bin/pytest -m slow).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # Real camera streams for the ingest tests (ffmpeg, an RTSP server), ip/tc for the multi-box tests.
  need=""
  command -v ffmpeg >/dev/null || need="$need ffmpeg"
  dpkg -s rtsp-server-perl >/dev/null 2>&1 || need="$need rtsp-server-perl"
  command -v ip >/dev/null || need="$need iproute2"
  # A real MQTT broker (and its clients) for the line-output tests.
  command -v mosquitto >/dev/null || need="$need mosquitto mosquitto-clients"
  # The console's browser tests drive Debian's chromium through Playwright.
  command -v chromium >/dev/null || need="$need chromium"
  # kubectl (Debian's kubernetes-client) renders the kustomize base; a real Prometheus (with promtool) scrapes
  # the embedded stack in the metrics tests.
  command -v kubectl >/dev/null || need="$need kubernetes-client"
  command -v prometheus >/dev/null || need="$need prometheus"
  # A real PostgreSQL for the shared report store of a gateway pair (tests start their own server as `postgres`).
  dpkg -s postgresql >/dev/null 2>&1 || need="$need postgresql"
  # Our C kernels as an ARM box builds and runs them: Debian's aarch64 cross compiler, run under qemu-user.
  command -v aarch64-linux-gnu-gcc >/dev/null || need="$need gcc-aarch64-linux-gnu"
  command -v qemu-aarch64 >/dev/null || need="$need qemu-user"
  if [ -n "$need" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
  fi
fi
bash tools/setup.sh
export HF_HUB_OFFLINE=1
# No unresolved import across the packages, as a static tool (pyright) sees the edgeinspect tree.
.venv/bin/python tools/typecheck.py
.venv/bin/pytest -q -m "not slow" "$@"
[ $# -eq 0 ] && [ "$(uname -m)" = x86_64 ] || exit 0
# The paths a smaller CPU takes, run on this one: the tests of paths chosen by the instruction set again with it
# capped (EDGEINSPECT_CPU_ISA builds our kernels for that level and hides the flags above it; torch's ATen and oneDNN
# take their own caps). avx2: what an AVX2-only box runs; generic (SSE4.2): the plain C loops an ARM box compiles.
capped() {
  echo "== cpu_paths tests with the instruction set capped at $1 =="
  EDGEINSPECT_CPU_ISA=$1 ATEN_CPU_CAPABILITY=$2 ONEDNN_MAX_CPU_ISA=$3 .venv/bin/pytest -q -m "cpu_paths and not slow"
}
if grep -qw avx512f /proc/cpuinfo; then capped avx2 avx2 AVX2; fi
if grep -qw avx2 /proc/cpuinfo; then capped generic default SSE41; fi
# The model path as an arm64 box runs it (torch's and ONNX Runtime's aarch64 builds, our NEON kernels, generate() as
# the oracle there), under qemu-user: tools/arm64_env.py builds its Python once (~1.2 GB); where it cannot (no
# network), the test skips.
echo "== the model path on arm64, emulated =="
.venv/bin/python tools/arm64_env.py || echo "no emulated arm64 Python (see above): tests/test_arm64_model.py skips"
.venv/bin/pytest -q -m slow tests/test_arm64_model.py
