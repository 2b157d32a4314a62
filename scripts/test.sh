#!/usr/bin/env bash
# Set up and run the whole test suite (CPU only; tiny models plus the demo model).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TRTLLM_VENV="$(realpath -m "${TRTLLM_VENV:-$ROOT/.venv}")"  # (a relative one: from here, not $ROOT)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "$TRTLLM_VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
