#!/usr/bin/env bash
# Every check this project has for a CUDA GPU without TensorRT, as one run (a lent GPU's minutes are
# few): the device KV cache against the host one, the sampling kernel's parity, time per call and
# tuning, and the gpu-marked tests. Needs python3 with numpy, torch, triton, onnx, onnxruntime,
# cuda-python and pytest; uses this checkout's code without installing it.
#   bash scripts/gpu_checks.sh OUT_DIR     # JSON results and logs in OUT_DIR; exit 1 if any failed
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$out"
pkg=$(mktemp -d)  # the package `trtllm` as its subpackages' folders here (pyproject's package-dir)
mkdir "$pkg/trtllm"
for d in builder runtime plugins configs; do ln -s "$root/$d" "$pkg/trtllm/$d"; done
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
rc=0
python3 "$root/scripts/gpu_kv_check.py" "$out/gpu_kv_check.json" 2>&1 | tee "$out/kv.log" || rc=1
python3 "$root/scripts/gpu_kernel_check.py" "$out/gpu_kernel_check.json" --tune 2>&1 | tee "$out/kernel.log" || rc=1
(cd "$root" && python3 -m pytest -p no:cacheprovider -q -rs -m gpu tests/plugins/test_sample_triton.py) 2>&1 \
    | tee "$out/pytest.log" || rc=1
exit $rc
