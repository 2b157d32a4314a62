"""trtllm::Sample as an ONNX model-local function whose body is standard opset-24 ops.

The body follows reference.py step by step (the step numbers below are the reference's). Only ops
of TensorRT's ONNX table are used (plugins/lint.py checks it): no Multinomial, no RandomUniform;
the one TopK has a constant K = M < 3840 and sorted=1; CumSum axes and Reduce* axes are Constants.
M is baked into the body (`make_function(max_top_k)`), so one model uses one M.

    logits, logit_bias -> x --LogSoftmax--> logprobs --GatherElements(ids[:, :K])--> top_logprobs
                          x --TopK(M)--> sx, ids           (one TopK serves logprobs and sampling)
                          x == sx[:, 0] --first index--> greedy
    sx, temperature, top_k, top_p --> threshold thr (steps 5-8)
    x >= thr, exp((x - max) / t) --> w --CumSum--> c --first c > uniform * c[-1]--> token
    where(temperature == 0, greedy, token) -> token_ids

"First index where cond" is ReduceMin(where(cond, arange(V), V)), not ArgMax, because TensorRT
does not promise which index ArgMax/TopK return for ties.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtllm.plugins.sample import schema

DOMAIN = schema.DOMAIN
OP = schema.OP


class _Body:
    """Collects body nodes; each op names its output after the variable in the reference."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []

    def const(self, name: str, value) -> str:
        tensor = numpy_helper.from_array(np.asarray(value), name)
        self.nodes.append(helper.make_node("Constant", [], [name], name=f"{name}/Constant", value=tensor))
        return name

    def op(self, op_type: str, *inputs: str, out: str | list[str], **attrs) -> str | list[str]:
        outs = [out] if isinstance(out, str) else out
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=f"{outs[0]}/{op_type}", **attrs))
        return out


def make_function(max_top_k: int) -> onnx.FunctionProto:
    """The FunctionProto trtllm::Sample with M = max_top_k baked in."""
    schema.check_max_top_k(max_top_k)
    b = _Body()
    _constants(b, max_top_k)
    b.op("Add", "logits", "logit_bias", out="x")                                  # [B, V]  step 1
    _logprobs_and_greedy(b)                                                         # steps 2-3
    _threshold(b)                                                                   # steps 4-8
    _draw(b)                                                                        # steps 9-10
    return helper.make_function(
        DOMAIN, OP, list(schema.INPUT_NAMES), list(schema.OUTPUT_NAMES), b.nodes,
        opset_imports=[helper.make_opsetid("", schema.OPSET)],
        attributes=list(schema.ATTRIBUTES),
        doc_string=f"Sampling with temperature, top-k, top-p and logit bias; max_top_k={max_top_k} "
                   "(see trtllm/plugins/sample/reference.py).",
    )


def _constants(b: _Body, max_top_k: int) -> None:
    b.const("axes_1", np.array([1], np.int64))       # Unsqueeze/Reduce*/Slice axes: constants
    b.const("axis_1", np.array(1, np.int64))          # CumSum axis: a constant scalar
    b.const("zero_i", np.array([0], np.int64))
    b.const("zero_i_s", np.array(0, np.int64))
    b.const("one_i", np.array(1, np.int64))
    b.const("one_i_1d", np.array([1], np.int64))
    b.const("last_start", np.array([-1], np.int64))
    b.const("int64_max", np.array([np.iinfo(np.int64).max], np.int64))
    b.const("zero_f", np.array(0, np.float32))
    b.const("one_f", np.array(1, np.float32))
    b.const("neg_inf", np.array(-np.inf, np.float32))
    b.const("max_top_k", np.array([max_top_k], np.int64))                       # TopK K, [1]
    b.const("arange_m", np.arange(max_top_k, dtype=np.int64)[None, :])          # [1, M]


def _logprobs_and_greedy(b: _Body) -> None:
    """TopK of x once; logprobs gathered at its first K ids; greedy = first index of max x."""
    b.op("LogSoftmax", "x", out="logprobs", axis=-1)                                # [B, V]
    b.op("TopK", "x", "max_top_k", out=["sx", "sx_ids"], axis=-1, largest=1, sorted=1)  # [B, M]
    b.op("Slice", "sx_ids", "zero_i", "num_logprobs", "axes_1", out="top_logprob_ids")  # [B, K]
    b.op("GatherElements", "logprobs", "top_logprob_ids", out="top_logprobs", axis=1)
    b.op("Slice", "sx", "zero_i", "one_i_1d", "axes_1", out="xmax")              # [B, 1]
    # arange(V) and V for "first index where", in int32: Where + ReduceMin over int32 take
    # 70 us instead of 170 us at V = 49152 on ONNX Runtime (V < 2**31 always).
    # (Range runs in int64 and is cast after: with a static V, ONNX Runtime's shape inference
    # rejects a Range fed by Cast(Shape) as mixing types.)
    b.op("Shape", "x", out="vocab_i64", start=1, end=2)                             # [1]
    b.op("Squeeze", "vocab_i64", "zero_i", out="vocab")                             # []
    b.op("Range", "zero_i_s", "vocab", "one_i", out="arange_i64")                   # [V]
    b.op("Cast", "arange_i64", out="arange_v", to=TensorProto.INT32)
    b.op("Cast", "vocab_i64", out="vocab_1d", to=TensorProto.INT32)                 # [1]
    b.op("Equal", "x", "xmax", out="is_max")                                        # [B, V]
    _first_true(b, "is_max", out="greedy")                                          # [B]


def _first_true(b: _Body, cond: str, out: str) -> str:
    """[B] index of the first True in each row of cond [B, V] (V when none)."""
    b.op("Where", cond, "arange_v", "vocab_1d", out=f"{out}_or_v")
    b.op("ReduceMin", f"{out}_or_v", "axes_1", out=f"{out}_i32", keepdims=0)
    return b.op("Cast", f"{out}_i32", out=out, to=TensorProto.INT64)


def _threshold(b: _Body) -> None:
    """Steps 4-8: keep [B, V] = x >= thr, and d = (x - max x) / t [B, V]."""
    b.op("Unsqueeze", "temperature", "axes_1", out="t2")                            # [B, 1]
    b.op("Equal", "t2", "zero_f", out="t_is_zero")
    b.op("Where", "t_is_zero", "one_f", "t2", out="t_eff")                          # step 4
    b.op("Sub", "x", "xmax", out="x_shift")
    b.op("Div", "x_shift", "t_eff", out="d")                                        # [B, V]
    b.op("Exp", "d", out="exp_d")
    b.op("Sub", "sx", "xmax", out="sx_shift")                                       # step 5
    b.op("Div", "sx_shift", "t_eff", out="sd")
    b.op("Exp", "sd", out="e")                                                      # [B, M]
    b.op("Unsqueeze", "top_k", "axes_1", out="k2")                                  # step 6
    b.op("Greater", "k2", "zero_i", out="k_on")
    # Min keeps GatherElements in bounds for an invalid top_k > M (the reference rejects it).
    b.op("Min", "k2", "max_top_k", out="k_clamped")
    b.op("Where", "k_on", "k_clamped", "max_top_k", out="k_eff")                    # [B, 1]
    b.op("Less", "arange_m", "k_eff", out="in_k")                                   # [B, M]
    b.op("Where", "in_k", "e", "zero_f", out="e_k")
    b.op("ReduceSum", "e_k", "axes_1", out="sum_k", keepdims=1)                     # step 7
    b.op("ReduceSum", "exp_d", "axes_1", out="sum_all", keepdims=1)
    b.op("Where", "k_on", "sum_k", "sum_all", out="denom")
    b.op("Div", "e_k", "denom", out="prob")
    b.op("CumSum", "prob", "axis_1", out="excl", exclusive=1)
    b.op("Unsqueeze", "top_p", "axes_1", out="p2")
    b.op("Less", "excl", "p2", out="in_p")
    b.op("Cast", "in_p", out="in_p_i", to=TensorProto.INT64)
    b.op("ReduceSum", "in_p_i", "axes_1", out="n", keepdims=1)                      # >= 1
    b.op("Less", "p2", "one_f", out="p_on")
    b.op("Where", "p_on", "n", "max_top_k", out="n_eff")
    b.op("Min", "k_eff", "n_eff", out="num_kept")                                   # step 8
    b.op("Sub", "num_kept", "one_i", out="thr_idx")
    b.op("GatherElements", "sx", "thr_idx", out="thr_sorted", axis=1)              # [B, 1]
    b.op("Or", "k_on", "p_on", out="any_on")
    b.op("Where", "any_on", "thr_sorted", "neg_inf", out="thr")
    b.op("GreaterOrEqual", "x", "thr", out="keep")                                  # [B, V]


def _draw(b: _Body) -> None:
    """Steps 9-10: inverse CDF with the caller's uniform, then the greedy override."""
    b.op("Where", "keep", "exp_d", "zero_f", out="w")                               # [B, V]
    b.op("CumSum", "w", "axis_1", out="c")
    b.op("Slice", "c", "last_start", "int64_max", "axes_1", out="total")            # [B, 1]
    b.op("Unsqueeze", "uniform", "axes_1", out="u2")
    b.op("Mul", "u2", "total", out="target")
    b.op("Greater", "c", "target", out="past_target")
    b.op("GreaterOrEqual", "c", "total", out="at_total")
    b.op("Or", "past_target", "at_total", out="chosen")
    _first_true(b, "chosen", out="token")                                           # [B]
    b.op("Equal", "temperature", "zero_f", out="is_greedy")
    b.op("Where", "is_greedy", "greedy", "token", out="token_ids")


def make_node(inputs: list[str], outputs: list[str], max_top_k: int,
              name: str = "/sampler/Sample") -> onnx.NodeProto:
    """The call node; pair it with make_function(max_top_k) in the model's functions."""
    schema.check_max_top_k(max_top_k)
    if len(inputs) != len(schema.INPUTS) or len(outputs) != len(schema.OUTPUTS):
        raise ValueError(f"Sample takes {len(schema.INPUTS)} inputs {schema.INPUT_NAMES} and "
                         f"{len(schema.OUTPUTS)} outputs {schema.OUTPUT_NAMES}, got {inputs} -> {outputs}")
    return helper.make_node(OP, inputs, outputs, name=name, domain=DOMAIN, max_top_k=max_top_k,
                            plugin_namespace=schema.PLUGIN_NAMESPACE, plugin_version=schema.PLUGIN_VERSION)


def make_model(max_top_k: int, vocab_size: int | None = None) -> onnx.ModelProto:
    """A one-node model (graph I/O named as the schema), for tests and benchmarks."""
    dims = {"B": "batch", "V": vocab_size or "vocab", "K": "num_logprobs"}
    dtypes = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}

    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtypes[dtype], [dims.get(s, s) for s in shape])

    graph = helper.make_graph(
        [make_node(list(schema.INPUT_NAMES), list(schema.OUTPUT_NAMES), max_top_k)], "sample",
        [info(*spec) for spec in schema.INPUTS], [info(*spec) for spec in schema.OUTPUTS])
    return helper.make_model(
        graph, functions=[make_function(max_top_k)], ir_version=11,
        opset_imports=[helper.make_opsetid("", schema.OPSET),
                       helper.make_opsetid(DOMAIN, schema.DOMAIN_VERSION)])
