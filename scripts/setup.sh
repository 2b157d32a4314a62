#!/usr/bin/env bash
# Create .venv (if needed), install trtllm-edge with its builder, test and kernels extras, and build
# the native CPU kernel library.
# Idempotent: a second run only checks what is installed (no package index needed). Run by quickstart.sh
# and test.sh. PYTHON: the interpreter for a new venv (3.11+); TRTLLM_VENV: where the venv is.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$(realpath -m "${TRTLLM_VENV:-$ROOT/.venv}")"  # (absolute: test.sh runs it from $ROOT)
PY="${PYTHON:-python3}"  # the interpreter a new venv is made with
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
MAKING="$VENV/.trtllm-making"  # there while this script makes the venv: one it left half made is its own to remove
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    if [ ! -e "$MAKING" ]; then  # (someone else's environment: never removed)
        echo "[setup] $VENV/bin/python has no pip: add it ($VENV/bin/python -m ensurepip) or set TRTLLM_VENV" >&2
        exit 1
    fi
    echo "[setup] $VENV is half made (an interrupted setup): making it again"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    if ! new_enough "$PY"; then  # (transformers 5 needs 3.11; pip would say so only after torch)
        echo "[setup] $PY is $("$PY" --version 2>&1 || echo missing): Python 3.11 or newer is needed (PYTHON=python3.11 bash $0)" >&2
        exit 1
    fi
    echo "[setup] creating $VENV"
    mkdir -p "$VENV" && touch "$MAKING"
    "$PY" -m venv "$VENV"
    rm -f "$MAKING"
elif ! new_enough "$VENV/bin/python"; then
    echo "[setup] $VENV is $("$VENV/bin/python" --version 2>&1): Python 3.11 or newer is needed; remove it, or set TRTLLM_VENV" >&2
    exit 1
fi
# Installed once for this pyproject.toml (and checkout): a second run needs no package index.
STAMP="$VENV/.trtllm-setup"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1) $ROOT"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ] || ! "$VENV/bin/python" -c "import trtllm.builder.cli, torch" 2>/dev/null; then
    rm -f "$STAMP"
    # torch first and pinned: 2.13.0 is the CPU wheel on these machines; any other version pulls GBs of CUDA.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[build,test,kernels]"
    echo "$WANT" > "$STAMP"
else
    echo "[setup] $VENV is up to date"
fi
# The native CPU kernels (plugins/cpu): g++ and ONNX Runtime's headers (fetched once from Debian).
# Without them every engine still builds and runs on ONNX Runtime's own kernels (slower; no bfloat16)
# and the test suite says what is missing, so a failure here warns instead of stopping the setup.
"$VENV/bin/python" -m trtllm.plugins.cpu.build || echo "[setup] WARNING: the native CPU kernels did not build;" \
    "engines will use ONNX Runtime's own attention, sampler and MatMulNBits (slower; --dtype bfloat16 refused)" >&2
"$VENV/bin/python" "$ROOT/scripts/fetch_demo_model.py"
