"""scripts/trt_compare.py (the Polygraphy comparison in scripts/trt_acceptance.sh), run here on an
ONNX Runtime engine: its compiled form against llm.onnx. On a TensorRT machine the same code compares
llm.plan."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("polygraphy")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import trt_compare  # noqa: E402


def test_compiled_form_matches_the_canonical_graph(tiny_engine, tmp_path):
    report = trt_compare.compare(tiny_engine("llama"), atol=1e-3, rtol=0.01)
    assert report["ok"], report
    assert [s["step"] for s in report["steps"]] == ["prefill", "decode"]
    assert all(s["max_abs_logit_error"] < 1e-4 for s in report["steps"])


def test_a_corrupted_compiled_form_is_caught(tiny_engine, tmp_path):
    """The deliberately wrong variant: weights of the compiled form perturbed."""
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    data = engine / "llm.ort.onnx.data"
    weights = np.fromfile(data, np.float32)
    weights[len(weights) // 2:] *= 1.5
    weights.tofile(data)
    assert trt_compare.main([str(engine), "--json", str(tmp_path / "r.json")]) == 1


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-3), ("float16", 0.05)])
def test_lora_engines_are_compared_with_an_adapter(dtype, atol, tiny_checkpoint, tmp_path):
    """LoRA engines get a random adapter on every projection (both forms take it in the engine's dtype)."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime import manifest as mf

    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), dtype=dtype,
                               max_lora_rank=4, max_input_len=64, max_kv_cache_capacity=128, verify=False),
                   log=lambda m: None)
    assert trt_compare.lora_feeds(mf.load(engine))
    report = trt_compare.compare(engine, atol=atol, rtol=0.01)
    assert report["ok"], report


@pytest.mark.parametrize("dtype, atol", [("float32", 1e-3), ("float16", 0.05)])
def test_quantized_engines_are_compared_with_llm_onnx_as_written(dtype, atol, tiny_checkpoint, tmp_path):
    """int4 (float32, and W4A16): the reference runs llm.onnx with ONNX Runtime's optimisations off,
    as TensorRT computes it; with them on, DequantizeLinear + MatMul became MatMulNBits with int8
    activations, 0.2-0.3 off our kernels' logits (the wrong variant)."""
    import onnxruntime as ort

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), dtype=dtype,
                               quantization="int4", max_input_len=64, max_kv_cache_capacity=128, verify=False),
                   log=lambda m: None)
    assert trt_compare.compare(engine, atol=atol, rtol=0.01)["ok"]
    if dtype == "float32":
        fused = lambda path: lambda: ort.InferenceSession(path, providers=["CPUExecutionProvider"])  # noqa: E731
        trt_compare.as_written, plain = fused, trt_compare.as_written
        try:
            assert not trt_compare.compare(engine, atol=atol, rtol=0.01)["ok"]
        finally:
            trt_compare.as_written = plain


def test_eagle_engines_compare_their_eagle_outputs(tiny_checkpoint, tmp_path):
    """EAGLE engines verify every prompt position: verify_ids and eagle_hidden are compared too."""
    from tests.eagle_drafts import random_draft
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    draft = random_draft(tiny_checkpoint("llama"), tmp_path / "draft", aux=[0, 1, 1])
    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), eagle=str(draft),
                               max_input_len=64, max_kv_cache_capacity=128, verify=False), log=lambda m: None)
    report = trt_compare.compare(engine, atol=1e-3, rtol=0.01)
    assert report["ok"], report
    assert all(s["verify_ids_equal"] and s["max_abs_eagle_hidden_error"] < 1e-3 for s in report["steps"])


def test_a_bfloat16_engine_is_refused_with_the_reason(tiny_checkpoint, tmp_path, capsys):
    """Its reference would be llm.onnx on ONNX Runtime, which has no bfloat16 CPU kernels."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), dtype="bfloat16",
                               max_input_len=32, max_kv_cache_capacity=64, verify=False), log=lambda m: None)
    assert trt_compare.main([str(engine)]) == 2
    assert "ONNX Runtime has no bfloat16 CPU kernels" in capsys.readouterr().err
    with pytest.raises(ValueError, match="compare a float16 build"):
        trt_compare.compare(engine, atol=0.05, rtol=0.01)
