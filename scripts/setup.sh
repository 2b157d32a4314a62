#!/usr/bin/env bash
# Create .venv (if needed), install trtllm-edge with its builder, test and kernels extras, and build
# the native CPU kernel library.
# Idempotent: a second run only checks what is installed. Sourced by quickstart.sh and test.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(realpath -m "${TRTLLM_VENV:-$ROOT/.venv}")"  # (absolute: test.sh runs it from $ROOT)
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating $VENV"
    "$PY" -m venv "$VENV"
fi
# torch first and pinned: 2.13.0 is the CPU wheel on these machines; any other version pulls GBs of CUDA.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[build,test,kernels]"
# The native CPU kernels (plugins/cpu): g++ and ONNX Runtime's headers (fetched once from Debian).
# Without them quantized engines still build (on ONNX Runtime's MatMulNBits) and the test suite says
# what is missing, so a failure here warns instead of stopping the setup.
"$VENV/bin/python" -m trtllm.plugins.cpu.build || echo "[setup] WARNING: the native CPU kernels did not build;" \
    "int4/int8 engines will use ONNX Runtime's MatMulNBits (slower, int8 activations)" >&2
"$VENV/bin/python" "$ROOT/scripts/fetch_demo_model.py"
