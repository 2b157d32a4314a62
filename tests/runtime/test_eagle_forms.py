"""EAGLE in other engine forms than test_eagle_cli.py's: the TensorRT backend (a fake), the legacy
graph, int4 and bfloat16; speculation changes no answer in each."""
from __future__ import annotations

import pytest

from tests import fakes
from tests.runtime.eagle_cli import LIMITS, REQUESTS, answers, same
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build
from trtllm.runtime import manifest as mf

pytest.importorskip("safetensors.numpy")
pytestmark = pytest.mark.hf


@pytest.mark.parametrize("batch_size", [4, 2])
def test_tensorrt_and_legacy_graph_give_the_same_answers(eagle_engine, tiny_checkpoint, run_cli, tmp_path, batch_size):
    """The TensorRT backend (tests/fakes: a strict stand-in that runs the plan's ONNX) builds the head's
    own plan and speculates with it; the legacy graph (opset 20) speculates on ONNX Runtime."""
    engine, draft = eagle_engine
    want, _ = answers(run_cli, engine, tmp_path, batch_size=batch_size)
    ckpt, root = str(tiny_checkpoint("llama")), tmp_path / "engines"
    legacy = build(BuildConfig(model=ckpt, output=str(root / "legacy"), eagle=str(draft), graph="legacy",
                               trt_version="10.3", backend="onnxruntime", **LIMITS), log=lambda m: None)
    got, profile = answers(run_cli, legacy, tmp_path, batch_size=batch_size)
    assert same(got, want) and profile["eagle_generation"]["drafted_tokens"] > 0
    with fakes.installed():
        trt = build(BuildConfig(model=ckpt, output=str(root / "trt"), eagle=str(draft), backend="tensorrt", **LIMITS),
                    log=lambda m: None)
        got, profile = answers(run_cli, trt, tmp_path, batch_size=batch_size)
        # a step wider than max_input_len (the prefill profile's top) is capped, not refused by TensorRT
        long = [{**r, "max_generate_length": 120, "ignore_eos": True} for r in REQUESTS[:2]]
        narrow, _ = answers(run_cli, trt, tmp_path, batch_size=batch_size, requests=long)
        wide, _ = answers(run_cli, trt, tmp_path, "--spec-draft-step", str(LIMITS["max_input_len"] + 10),
                          batch_size=batch_size, requests=long)
    assert same(got, want) and profile["eagle_generation"]["drafted_tokens"] > 0
    assert same(wide, narrow)
    m = mf.load(trt)
    assert m.eagle["draft_step"] == 4  # a GPU verifies several tokens for about the price of one
    assert (trt / m.eagle["plan"]).is_file() and [p["name"] for p in m.eagle["profiles"]] == ["prefill", "decode"]
    shapes = {p["name"]: p["shapes"] for p in m.tensorrt["profiles"]}
    assert shapes["prefill"]["verify_index"] == [[1, 0], [4, 0], [4, 96]]
    assert shapes["decode"]["verify_index"] == [[1, 0], [4, 0], [4, 1]]
    assert shapes["prefill"]["tree_mask"] == [[1, 1, 0], [4, 48, 0], [4, 96, 96]]
    assert shapes["decode"]["tree_mask"] == [[1, 1, 0], [4, 1, 0], [4, 1, 1]]
    # a GPU verifies draft trees by default (4 candidates per node); the head's plan takes them too
    assert {p["name"]: p["shapes"] for p in m.eagle["profiles"]}["prefill"]["tree_mask"] == [[1, 1, 0], [4, 48, 0],
                                                                                         [4, 96, 96]]
    assert m.eagle["tree"] is True and m.eagle["draft_top_k"] == 4 and profile["eagle_generation"]["draft_top_k"] == 4


def test_quantized_engine(eagle_engine, tiny_checkpoint, run_cli, tmp_path):
    """int4: the head is quantized as the model is (int4 layer, int8 lm_head) and keeps its token
    embedding in float16; speculation still changes no answer."""
    import onnx

    _, draft = eagle_engine
    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "int4"), eagle=str(draft),
                               quantization="int4", verify=False, **LIMITS), log=lambda m: None)  # tiny random weights: int4 is inexact
    graph = onnx.load(str(engine / mf.load(engine).eagle["onnx"]), load_external_data=False).graph
    types = {t.name: t.data_type for t in graph.initializer}
    assert types["model.embed_tokens.weight"] == onnx.TensorProto.FLOAT16
    assert any(n.op_type == "DequantizeLinear" for n in graph.node)
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0")
    got, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "3")
    assert same(got, plain) and profile["eagle_generation"]["drafted_tokens"] > 0


def test_bfloat16_engine(eagle_engine, tiny_checkpoint, run_cli, tmp_path):
    """--dtype bfloat16: the head's weights and KV in bfloat16 as the model's (our kernels, float32
    arithmetic); speculation still changes no answer."""
    _, draft = eagle_engine
    engine = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "bf16"), eagle=str(draft),
                               dtype="bfloat16", verify=False, **LIMITS), log=lambda m: None)
    manifest = mf.load(engine)
    assert manifest.model.kv_dtype == manifest.eagle["model"]["kv_dtype"] == "bfloat16"
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0")
    got, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "3")
    assert same(got, plain) and profile["eagle_generation"]["drafted_tokens"] > 0
