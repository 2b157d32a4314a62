#!/usr/bin/env bash
# Set up and run the whole test suite (CPU only; tiny models plus the demo model).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TRTLLM_VENV="$(realpath -m "${TRTLLM_VENV:-$ROOT/.venv}")"  # (a relative one: from here, not $ROOT)
bash "$ROOT/scripts/setup.sh"
args=()  # test paths as the caller named them, from the caller's directory (pytest runs from $ROOT)
prev=""
for arg in "$@"; do
    path="${arg%%::*}"  # (tests/x.py::test_y)
    case "$prev" in  # (an option's value is no test path: -k runtime, --deselect tests/x.py::t)
        -k|-m|-p|-o|-c|--deselect|--rootdir|--basetemp|--confcutdir|--junitxml|--durations|--maxfail) ;;
        *) if [ "${arg#-}" = "$arg" ] && [ -n "$path" ] && [ -e "$path" ]; then
               arg="$(realpath "$path")${arg:${#path}}"
           fi ;;
    esac
    args+=("$arg")
    prev="$arg"
done
cd "$ROOT"
exec "$TRTLLM_VENV/bin/python" -m pytest -q -p no:cacheprovider ${args[@]+"${args[@]}"}
