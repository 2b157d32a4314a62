#!/usr/bin/env bash
# The TensorRT acceptance run: the one script for a machine with TensorRT and a CUDA GPU (an x86
# box with an NVIDIA GPU, or a Jetson). Nothing here can run on our CPU-only machines.
#
#   bash scripts/trt_acceptance.sh [PROFILE]      PROFILE: tensorrt-modern | tensorrt-legacy (default:
#                                                 modern when TensorRT >= 10.15, else legacy)
# It
#   1. makes .venv-trt with the system site-packages (JetPack installs tensorrt there) and installs
#      trtllm-edge with its builder, test and tensorrt extras;
#   2. builds the demo model twice from the same checkpoint: a TensorRT engine with PROFILE and an
#      ONNX Runtime engine with the same dtype and graph;
#   3. answers examples/input.json with both and reports which responses are identical;
#   4. compares llm.plan with llm.onnx on ONNX Runtime through Polygraphy (scripts/trt_compare.py:
#      prefill on profile 0, decode on profile 1; greedy token, logits, KV);
#   5. runs the tests that need TensorRT or a GPU (markers trt and gpu), including the Triton kernel.
# Results go to out/trt-acceptance/. Exit status: non-zero when a build, a run or a check fails;
# 3 when everything ran but the kernel check, which needs torch with CUDA (TRTLLM_TORCH: its wheel).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${TRTLLM_TRT_VENV:-$ROOT/.venv-trt}"
OUT="$ROOT/out/trt-acceptance"
ENGINES="$ROOT/engines/trt-acceptance"
MODEL="$ROOT/models/smollm2-135m-instruct"
mkdir -p "$OUT" "$ENGINES"

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
# The builder needs torch (CPU is enough). The Triton kernel check needs a CUDA torch: on Jetson that
# is NVIDIA's wheel for the JetPack (PyPI's aarch64 torch has no Tegra CUDA); point TRTLLM_TORCH at it.
"$PY" -m pip install -q --disable-pip-version-check "${TRTLLM_TORCH:-torch==2.13.0}"
# cuda-python 12.x for CUDA 12 stacks (JetPack 6), 13 for a CUDA 13 driver (JetPack 7, Thor; driver
# >= 580): an extra each, as docs/tensorrt.md says.
TRT_EXTRA=tensorrt
if command -v nvidia-smi > /dev/null && nvidia-smi 2>/dev/null | grep -Eq "CUDA Version: *(1[3-9]|[2-9][0-9])\."; then
    TRT_EXTRA=tensorrt-cuda13
fi
"$PY" -m pip install -q --disable-pip-version-check -e "$ROOT[build,test,$TRT_EXTRA,kernels]"
"$PY" -c "import tensorrt" 2>/dev/null || {
    echo "error: TensorRT does not import in $VENV (on Jetson: sudo apt install python3-libnvinfer;" \
         "elsewhere install TensorRT's wheel from NVIDIA's index)" >&2; exit 2; }
"$PY" "$ROOT/scripts/fetch_demo_model.py"

TRT_VERSION="$("$PY" -c 'import tensorrt; print(tensorrt.__version__)')"
PROFILE="${1:-$("$PY" -c 'import tensorrt; v = tuple(map(int, tensorrt.__version__.split(".")[:2])); print("tensorrt-modern" if v >= (10, 15) else "tensorrt-legacy")')}"
GRAPH="$("$PY" -c "import json, sys; from trtllm.builder.config import profile_defaults; print(profile_defaults('$PROFILE')['graph'])")"
echo "[acceptance] TensorRT $TRT_VERSION, profile $PROFILE (graph $GRAPH)"
"$PY" -c 'from trtllm.builder.tensorrt import gpu_info; print("[acceptance] GPU", gpu_info())'

"$VENV/bin/trtllm-build" --model "$MODEL" --output "$ENGINES/demo-trt" --profile "$PROFILE" \
    --timing-cache "$ENGINES/timing.cache" 2>&1 | tee "$OUT/build-trt.log"
"$VENV/bin/trtllm-build" --model "$MODEL" --output "$ENGINES/demo-ort" --profile "$PROFILE" \
    --backend onnxruntime 2>&1 | tee "$OUT/build-ort.log"

"$VENV/bin/trtllm-run" examples/input.json --engine "$ENGINES/demo-trt" --output "$OUT/trt.json" \
    --profile "$OUT/trt-profile.json"
"$VENV/bin/trtllm-run" examples/input.json --engine "$ENGINES/demo-ort" --output "$OUT/ort.json" \
    --profile "$OUT/ort-profile.json"
"$PY" - "$OUT/ort.json" "$OUT/trt.json" <<'EOF'
import json, sys
ort, trt = (json.load(open(p))["responses"] for p in sys.argv[1:3])
same = [a["output_text"] == b["output_text"] for a, b in zip(ort, trt)]
for i, (a, b) in enumerate(zip(ort, trt)):
    if a["output_text"] != b["output_text"]:
        n = next((k for k, (x, y) in enumerate(zip(a["output_text"], b["output_text"])) if x != y),
                 min(len(a["output_text"]), len(b["output_text"])))
        print(f"[acceptance] response {i} differs from character {n}: ort {a['output_text'][n:n+40]!r} "
              f"trt {b['output_text'][n:n+40]!r}")
print(f"[acceptance] {sum(same)}/{len(same)} responses identical between ONNX Runtime and TensorRT "
      "(float16 engines may diverge late in a long greedy answer; see docs/tensorrt.md)")
EOF

"$PY" scripts/trt_compare.py "$ENGINES/demo-trt" --json "$OUT/trt_compare.json"
"$PY" -m pytest -q -m "trt or gpu" tests/ 2>&1 | tee "$OUT/pytest.log"
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    "$PY" scripts/gpu_kernel_check.py "$OUT/kernel.json"
else
    echo "[acceptance] NOT RUN: the Triton kernel check (scripts/gpu_kernel_check.py) needs torch with CUDA;" \
         "install NVIDIA's torch wheel for this JetPack (TRTLLM_TORCH=/path/to/torch.whl) and re-run" >&2
    exit 3
fi
echo "[acceptance] done: results in $OUT"
