"""The TensorRT backend on a real TensorRT + CUDA GPU (marked trt; skipped where either is missing).
scripts/trt_acceptance.sh runs it on the target machine; everywhere else tests/fakes stand in
(tests/runtime/test_tensorrt_engine.py)."""
from __future__ import annotations

import pytest

from trtllm.builder import tensorrt as trt_build
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build

pytestmark = pytest.mark.trt
usable, why = trt_build.availability()
if not usable:
    pytest.skip(f"needs TensorRT and a CUDA GPU: {why}", allow_module_level=True)

from tests.runtime.test_tensorrt_engine import LIMITS, PAYLOAD, same  # noqa: E402


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tensorrt_engine_matches_onnxruntime(tiny_checkpoint, tmp_path, run_cli, arch):
    version = trt_build.import_tensorrt().__version__.split(".")
    graph = "modern" if (int(version[0]), int(version[1])) >= (10, 15) else "legacy"
    ckpt = str(tiny_checkpoint(arch))
    build(BuildConfig(model=ckpt, output=str(tmp_path / "ort"), backend="onnxruntime", **LIMITS), log=print)
    build(BuildConfig(model=ckpt, output=str(tmp_path / "trt"), backend="tensorrt", graph=graph,
                      trt_version=".".join(version[:2]), **LIMITS), log=print)
    want = run_cli(tmp_path / "ort", PAYLOAD)[1]["responses"]
    got = run_cli(tmp_path / "trt", PAYLOAD)[1]["responses"]
    same(got, want)
