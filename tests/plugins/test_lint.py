"""plugins/lint.py: the TensorRT ONNX op lint on hand-made models and on trtllm::Sample."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from trtllm.plugins import lint  # noqa: E402
from trtllm.plugins.sample import body  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=(), opset=24, functions=(), extra_opsets=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*spec) for spec in inputs],
                              [helper.make_tensor_value_info(*spec) for spec in outputs], list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in extra_opsets]
    return helper.make_model(graph, opset_imports=opsets, functions=list(functions), ir_version=10)


def _ops(issues):
    return {issue.op for issue in issues}


def _attention_model(opset, past=False, **attrs):
    qkv = [(name, F, [1, 4, 3, 8]) for name in ("q", "k", "v")]
    inputs = ["q", "k", "v"] + (["", "past_k", "past_v"] if past else [])
    extra = [("past_k", F, [1, 4, 2, 8]), ("past_v", F, [1, 4, 2, 8])] if past else []
    node = helper.make_node("Attention", inputs, ["y"], name="/attn", **attrs)
    return _model([node], qkv + extra, [("y", F, None)], opset=opset)


def _topk_model(k, sorted_=1, k_as_input=False):
    inits = [] if k_as_input else [numpy_helper.from_array(np.array([k], np.int64), "k")]
    inputs = [("x", F, [1, 5000])] + ([("k", I64, [1])] if k_as_input else [])
    node = helper.make_node("TopK", ["x", "k"], ["vals", "ids"], name="/topk", sorted=sorted_)
    return _model([node], inputs, [("vals", F, None), ("ids", I64, None)], inits)


@pytest.mark.parametrize("trt_version, opset", [("11.1", 24), ("10.3", 20)])
@pytest.mark.parametrize("vocab_size", [None, 49152])
def test_sample_model_is_clean(trt_version, opset, vocab_size):
    assert lint.lint_model(body.make_model(1024, vocab_size, opset=opset), trt_version) == []


def test_sample_model_at_opset_24_is_too_new_for_trt_10_3():
    """Both the graph and the function body declare their opset; each is checked."""
    issues = lint.lint_model(body.make_model(64), "10.3")
    assert _ops(issues) == {"opset"} and {i.node for i in issues} == {"graph", "trtllm::Sample"}
    model = body.make_model(64, opset=20)
    model.functions[0].CopyFrom(body.make_function(64))          # an opset-24 body in an opset-20 graph
    assert [(i.node, i.op) for i in lint.lint_model(model, "10.3")] == [("trtllm::Sample", "opset")]


@pytest.mark.parametrize("opset", [23, 24])
def test_attention_needs_trt_10_14(opset):
    model = _attention_model(opset)
    assert lint.lint_model(model, "11.1") == []
    issues = lint.lint_model(model, "10.3")
    attention = [issue for issue in issues if issue.op == "Attention"]
    assert _ops(issues) == {"opset", "Attention"}
    assert "10.14" in attention[0].message and attention[0].node == "/attn"
    assert _ops(lint.lint_model(model, "10.14")) == {"opset"}     # the op is there, opset 23+ is not


@pytest.mark.parametrize("opset, trt_version, ok", [
    (20, "10.0", True), (20, "10.3", True), (20, "11.1", True), (21, "10.3", False), (21, "10.14", False),
    (21, "10.15", True), (24, "10.13", False), (24, "10.15", True), (24, "11.1", True),
])
def test_opset_ceiling_depends_on_the_trt_version(opset, trt_version, ok):
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="/relu")], [("x", F, [2])], [("y", F, None)],
                   opset=opset)
    issues = lint.lint_model(model, trt_version)
    assert (issues == []) == ok, issues
    if not ok:
        assert _ops(issues) == {"opset"} and f"[9, 20] for TensorRT {trt_version}, got {opset}" in issues[0].message


def test_opset_ceilings_are_table_data(monkeypatch):
    """The ceilings live in trt_onnx_ops.json with where they come from; the lint reads them."""
    table = lint.load_table()
    entry = table["opset_max_by_trt"]
    assert entry["ceilings"] == {"10.0": 20, "10.15": 24} and "10.0/10.1" in entry["notes"]
    entry["ceilings"] = {"10.0": 20, "10.5": 22}
    monkeypatch.setattr(lint, "load_table", lambda: table)
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, None)], opset=22)
    assert _ops(lint.lint_model(model, "10.3")) == {"opset"} and lint.lint_model(model, "10.5") == []


def test_attention_constraints():
    issues = lint.lint_model(_attention_model(24, past=True, softcap=1.0), "11.1")
    messages = " | ".join(issue.message for issue in issues)
    assert "past_key" in messages and "past_value" in messages and "softcap" in messages, messages


def test_multinomial_and_seeded_random_fail():
    multinomial = _model([helper.make_node("Multinomial", ["x"], ["y"], name="/m")], [("x", F, [1, 8])],
                         [("y", TensorProto.INT32, None)])
    issues = lint.lint_model(multinomial)
    assert _ops(issues) == {"Multinomial"} and "unsupported" in issues[0].message
    random = _model([helper.make_node("RandomUniformLike", ["x"], ["y"], seed=1.0)], [("x", F, [1, 8])],
                    [("y", F, None)])
    assert "seed" in lint.lint_model(random)[0].message


@pytest.mark.parametrize("model, needle", [
    (_topk_model(4, sorted_=0), "sorted"), (_topk_model(4000), "4000"),
    (_topk_model(4, k_as_input=True), "constant"),
])
def test_topk_constraints(model, needle):
    issues = lint.lint_model(model)
    assert _ops(issues) == {"TopK"} and needle in issues[0].message, issues


@pytest.mark.parametrize("dtype, ok", [(TensorProto.INT8, False), (TensorProto.FLOAT, True), (TensorProto.INT64, True)])
def test_where_checks_its_data_inputs_not_its_condition(dtype, ok):
    """Where's types are its data's (inputs 1 and 2); its condition, input 0, is BOOL. Only input 0
    was checked, so INT8 data (a quantized type: Q/DQ only) passed."""
    node = helper.make_node("Where", ["c", "x", "y"], ["z"], name="/w")
    model = _model([node], [("c", TensorProto.BOOL, [4]), ("x", dtype, [4]), ("y", dtype, [4])], [("z", dtype, None)],
                   opset=20)
    for version in ("10.3", "11.1"):
        issues = lint.lint_model(model, version)
        assert (issues == []) if ok else (_ops(issues) == {"Where"} and "input 1 has dtype INT8" in issues[0].message), issues


def test_a_model_shape_inference_cannot_take_is_an_issue_not_a_pass(monkeypatch):
    """A model in memory past 2 GiB cannot be serialised for ONNX shape inference: the dtype checks
    then see only the graph's inputs, and a DOUBLE inside passed. It is reported instead."""
    node = helper.make_node("Cast", ["x"], ["d"], to=TensorProto.DOUBLE)
    model = _model([node, helper.make_node("Abs", ["d"], ["y"], name="/abs")], [("x", F, [4])],
                   [("y", TensorProto.DOUBLE, None)])
    assert "Abs" in _ops(lint.lint_model(model))

    def too_big(*args, **kwargs):
        raise ValueError("Message onnx.ModelProto exceeds maximum protobuf size of 2GB")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", too_big)
    issues = lint.lint_model(model)
    assert any(i.op == "shape inference" and "exceeds maximum protobuf size" in i.message
               and "lint the saved file" in i.message for i in issues), issues


def test_topk_with_small_constant_k_passes():
    assert lint.lint_model(_topk_model(3839)) == []


def test_reduce_axes_must_be_constant():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    as_input = _model([node], [("x", F, [2, 3]), ("axes", I64, [1])], [("y", F, None)])
    assert "axes" in lint.lint_model(as_input)[0].message
    folded = [helper.make_node("Constant", [], ["a0"], value=numpy_helper.from_array(np.array([1], np.int64))),
              helper.make_node("Identity", ["a0"], ["axes"]), node]   # a folded constant is fine
    assert lint.lint_model(_model(folded, [("x", F, [2, 3])], [("y", F, None)])) == []


def test_quantize_zero_point_and_outputs_and_dtype():
    zp = numpy_helper.from_array(np.array(3, np.int8), "zp")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    dq = _model([helper.make_node("DequantizeLinear", ["x", "scale", "zp"], ["y"])], [("x", TensorProto.INT8, [4])],
                [("y", F, None)], [zp, scale])
    assert "symmetric" in lint.lint_model(dq)[0].message
    ln = _model([helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv"])],
                [("x", F, [2, 4]), ("s", F, [4])], [("y", F, None), ("mean", F, None), ("inv", F, None)])
    assert "first 1 output" in lint.lint_model(ln)[0].message
    cumsum = _model([helper.make_node("CumSum", ["x", "axis"], ["y"])], [("x", I64, [2, 4])], [("y", I64, None)],
                    [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    assert "INT64" in lint.lint_model(cumsum)[0].message


def test_unknown_domain_without_function_fails():
    model = _model([helper.make_node("Mystery", ["x"], ["y"], domain="acme", name="/m")], [("x", F, [2])],
                   [("y", F, None)], extra_opsets=["acme"])
    issues = lint.lint_model(model)
    assert len(issues) == 1 and issues[0].op == "acme::Mystery" and "local function" in issues[0].message


def test_local_function_body_is_linted():
    fn = helper.make_function("acme", "Pick", ["x"], ["y"], [helper.make_node("Multinomial", ["x"], ["y"])],
                              opset_imports=[helper.make_opsetid("", 24)])
    model = _model([helper.make_node("Pick", ["x"], ["y"], domain="acme", name="/p")], [("x", F, [1, 8])],
                   [("y", TensorProto.INT32, None)], functions=[fn], extra_opsets=["acme"])
    issues = lint.lint_model(model)
    assert _ops(issues) == {"Multinomial"} and issues[0].node.startswith("acme::Pick/")


def test_opset_above_table_fails_and_bad_version_is_rejected():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, None)], opset=25)
    assert _ops(lint.lint_model(model)) == {"opset"}
    with pytest.raises(ValueError, match="trt_version"):
        lint.lint_model(model, "ten")


def test_every_constraint_kind_has_a_check():
    kinds = {kind for spec in lint.load_table()["ops"].values() for kind in spec.get("constraints", {})}
    assert kinds <= set(lint._CHECKS)


def test_check_model_raises_listing_issues():
    with pytest.raises(ValueError, match="TopK"):
        lint.check_model(_topk_model(4000))
    lint.check_model(body.make_model(64))


def test_path_with_external_data_and_cli(tmp_path, capsys):
    weights = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Unique", ["y"], ["u"])],
                   [("x", F, [1, 64])], [("u", F, None)], [weights])
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    (tmp_path / "m.onnx.data").write_bytes(b"")           # unreadable data must not matter
    assert _ops(lint.lint_model(path)) == {"Unique"}
    assert lint.main([str(path), "--trt-version", "10.3"]) == 1
    assert "Unique" in capsys.readouterr().out
    clean = tmp_path / "sample.onnx"
    onnx.save(body.make_model(32), clean)
    result = subprocess.run([sys.executable, "-m", "trtllm.plugins.lint", str(clean)], capture_output=True, text=True)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
