#!/usr/bin/env bash
# The main job on a fresh machine: set up, fetch the demo model, build its engine on the embedded
# default (ONNX Runtime, CPU), answer examples/input.json and print the answers.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TRTLLM_VENV="$(realpath -m "${TRTLLM_VENV:-$ROOT/.venv}")"
bash "$ROOT/scripts/setup.sh"
BIN="$TRTLLM_VENV/bin"
"$BIN/trtllm-build" --model "$ROOT/models/smollm2-135m-instruct" --output "$ROOT/engines/smollm2-135m-instruct"
"$BIN/trtllm-run" "$ROOT/examples/input.json" --engine "$ROOT/engines/smollm2-135m-instruct" \
    --output "$ROOT/out/answers.json" --profile "$ROOT/out/profile.json"
