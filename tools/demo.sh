#!/usr/bin/env bash
# The main job on the embedded default: every role on this box as its own process, the generated tiny
# checkpoint, the shipped sample knowledge base; inspects the sample part and prints the report, then shows the
# anomaly gate: teaches the drawn sample part `board` (`edgeinspect anomaly sample` + `anomaly teach`), inspects a
# good and a defective frame and prints both verdicts with the score and where the heatmap peaks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export HF_HUB_OFFLINE=1
.venv/bin/edgeinspect demo "$@"
