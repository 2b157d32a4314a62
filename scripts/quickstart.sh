#!/usr/bin/env bash
# The main job on a fresh machine: set up, fetch the demo model, build its engine on the embedded
# default (ONNX Runtime, CPU), answer examples/input.json and print the answers.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TRTLLM_VENV="$(realpath -m "${TRTLLM_VENV:-$ROOT/.venv}")"
bash "$ROOT/scripts/setup.sh"
BIN="$TRTLLM_VENV/bin"
# (--if-changed: a second run keeps the engine its first built, unless the code or the model changed)
"$BIN/trtllm-build" --model "$ROOT/models/smollm2-135m-instruct" --output "$ROOT/engines/smollm2-135m-instruct" --if-changed
for left in "$ROOT"/engines/.smollm2-135m-instruct.partial-*; do  # (a build killed with SIGKILL cannot remove its own)
    [ -e "$left" ] && echo "[quickstart] $left is what a killed build left: remove it (rm -rf) when no build runs" >&2
done
"$BIN/trtllm-run" "$ROOT/examples/input.json" --engine "$ROOT/engines/smollm2-135m-instruct" \
    --output "$ROOT/out/answers.json" --profile "$ROOT/out/profile.json"
