"""trtllm::Sample as an ONNX model-local function whose body is standard opset-24 ops.

The body follows reference.py step by step (the step numbers below are the reference's). Only ops
of TensorRT's ONNX table are used (plugins/lint.py checks it): no Multinomial, no RandomUniform;
the two TopKs have constant K (min(50, M) and M, both < 3840) and sorted=1; CumSum axes and
Reduce* axes are Constants. M is baked into the body (`make_function(max_top_k)`), so one model
uses one M.

    logits, logit_bias -> x --LogSoftmax--> logprobs --TopK(K = min(50, M))--> top_logprobs, ids
    x, seen, repetition_penalty, penalty_bias -> y     (step 3; If: skipped when every r = 1)
    y --TopK(M)--> sy;  y == sy[:, 0] --first index--> greedy
    sy, temperature, min_p, top_k, top_p --> threshold thr (steps 5-9)
    y >= thr, exp((y - max y) / t) --> w --CumSum--> c --first weighted c > uniform * total--> token
        (c in float64 on ONNX Runtime; TensorRT's form: float32 with its rounding carried, _compensated)
    where(temperature == 0, greedy, token) -> token_ids

Two TopKs because the logprobs are of x (before the penalties) and the thresholds of y; the small
one costs little next to TopK(M). "First index where cond" is ReduceMin(where(cond, arange(V), V)),
not ArgMax, because TensorRT does not promise which index ArgMax/TopK return for ties.
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtllm.plugins.sample import schema

DOMAIN = schema.DOMAIN
OP = schema.OP
MIN_OPSET = 18   # the oldest opset where every op of the body has the signature used here


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


def make_function(max_top_k: int, opset: int = schema.OPSET, argmax: bool = False,
                  float64_draw: bool = False) -> onnx.FunctionProto:
    """The FunctionProto trtllm::Sample with M = max_top_k baked in; `opset` is the body's default-domain
    opset (the calling model's: 24, or 20 for the legacy graph). Every op of the body means the same
    from opset 18 (ReduceMax/ReduceMin axes as inputs) to 24.

    argmax=True (ONNX Runtime's form only): greedy is ArgMax(y, select_last_index=0), which ONNX Runtime
    defines as the first maximum, the same token as the portable ReduceMin(Where(...)) and a third
    of a millisecond cheaper per batch-8 step. TensorRT does not promise ArgMax's tie order.

    float64_draw=True (ONNX Runtime's form only): the draw's CDF in float64, as the reference's
    (TensorRT has no float64: `_draw`)."""
    schema.check_max_top_k(max_top_k)
    if not MIN_OPSET <= opset <= schema.OPSET:
        raise ValueError(f"opset must be in [{MIN_OPSET}, {schema.OPSET}], got {opset!r}")
    b = _Body()
    _constants(b, max_top_k)
    b.op("Add", "logits", "logit_bias", out="x")                                  # [B, V]  step 1
    _logprobs(b)                                                                    # step 2
    _penalties(b)                                                                   # step 3
    if not argmax:  # "first index where" serves greedy too; with ArgMax only the draw needs it
        _arange(b)
    # A batch of greedy rows skips steps 5-11 (the top-M sort, thresholds and the draw): an If on
    # "any row samples". Same tokens either way; about a millisecond per step saved on a CPU.
    b.op("ReduceMax", "temperature", out="t_max", keepdims=0)
    b.op("Greater", "t_max", "zero_f", out="any_sampling")
    greedy = functools.partial(_greedy, argmax=argmax)
    sampled = functools.partial(_sampled, greedy=greedy, arange=argmax, float64=float64_draw)
    b.op("If", "any_sampling", out="token_ids", then_branch=_branch("sampled", sampled),
         else_branch=_branch("greedy", lambda sub: greedy(sub, "token_ids_greedy")))
    return helper.make_function(
        DOMAIN, OP, list(schema.INPUT_NAMES), list(schema.OUTPUT_NAMES), b.nodes,
        opset_imports=[helper.make_opsetid("", opset)],
        attributes=list(schema.ATTRIBUTES),
        doc_string=f"Sampling with logit bias, repetition/frequency/presence penalties, temperature, "
                   f"min-p, top-k and top-p; max_top_k={max_top_k} (see trtllm/plugins/sample/reference.py).",
    )


def _constants(b: _Body, max_top_k: int) -> None:
    b.const("axes_1", np.array([1], np.int64))       # Unsqueeze/Reduce*/Slice axes: constants
    b.const("axis_1", np.array(1, np.int64))          # CumSum axis: a constant scalar
    b.const("zero_i", np.array([0], np.int64))
    b.const("zero_i_s", np.array(0, np.int64))
    b.const("one_i", np.array(1, np.int64))
    b.const("one_i_1d", np.array([1], np.int64))
    b.const("zero_f", np.array(0, np.float32))
    b.const("one_f", np.array(1, np.float32))
    b.const("neg_inf", np.array(-np.inf, np.float32))
    b.const("max_top_k", np.array([max_top_k], np.int64))                       # TopK K, [1]
    b.const("max_num_logprobs", np.array([schema.num_logprob_columns(max_top_k)], np.int64))
    b.const("arange_m", np.arange(max_top_k, dtype=np.int64)[None, :])          # [1, M]


def _logprobs(b: _Body) -> None:
    """Step 2: the K largest log_softmax(x); TopK of the logprobs themselves, so ties go lower id first."""
    b.op("LogSoftmax", "x", out="logprobs", axis=-1)                                # [B, V]
    b.op("TopK", "logprobs", "max_num_logprobs", out=["top_logprobs", "top_logprob_ids"], axis=-1, largest=1,
         sorted=1)                                                                  # [B, K = min(50, M)]


def _penalties(b: _Body) -> None:
    """Step 3: y = where(seen, where(x > 0, x / r, x * r), x) + penalty_bias."""
    # An If skips the repetition penalty's [B, V] ops when every row has r = 1 (then x_seen = x
    # exactly): they are about 4% of a batch-8 decode step on a CPU.
    b.op("Sub", "repetition_penalty", "one_f", out="r_minus_1")
    b.op("Abs", "r_minus_1", out="r_off_by")
    b.op("ReduceMax", "r_off_by", out="r_off_by_max", keepdims=0)
    b.op("Greater", "r_off_by_max", "zero_f", out="any_repetition")
    # Each branch ends in the Add of penalty_bias, so the plain one needs no copy of x (an Identity).
    b.op("If", "any_repetition", out="y", then_branch=_branch("repetition", _repetition, TensorProto.FLOAT),
         else_branch=_branch("no_repetition", lambda sub: sub.op("Add", "x", "penalty_bias", out="y_plain"),
                             TensorProto.FLOAT))                                    # [B, V]


def _repetition(b: _Body) -> str:
    """where(seen, where(x > 0, x / r, x * r), x) + penalty_bias."""
    # where(x > 0, x / r, x * r) as Min or Max: a Where on the 50/50 mask x > 0 costs 400 us on
    # ONNX Runtime at V = 49152 (it branches per element), Min + Max + a per-row Where 60 us.
    # x / r and x * r have the sign of x and rounding is monotonic, so for r >= 1 the wanted
    # one is the smaller (x / r <= x <= x * r for x > 0, the reverse for x <= 0) and for r < 1
    # the larger: bit-exact, zeros, -inf and overflow included (the test checks y bit for bit).
    b.op("Unsqueeze", "repetition_penalty", "axes_1", out="r2")                     # [B, 1]
    b.op("Div", "x", "r2", out="x_div")                                             # [B, V]
    b.op("Mul", "x", "r2", out="x_mul")
    b.op("Min", "x_div", "x_mul", out="x_rep_lo")
    b.op("Max", "x_div", "x_mul", out="x_rep_hi")
    b.op("GreaterOrEqual", "r2", "one_f", out="r_ge_1")                             # [B, 1]
    b.op("Where", "r_ge_1", "x_rep_lo", "x_rep_hi", out="x_rep")
    # (seen is bool, or int32 0/1 in a --sampling-plugin graph, whose plugin takes no BOOL tensor:
    # schema.PLUGIN_SEEN; the Cast of a bool is the identity)
    b.op("Cast", "seen", out="seen_bool", to=TensorProto.BOOL)
    b.op("Where", "seen_bool", "x_rep", "x", out="x_seen")
    return b.op("Add", "x_seen", "penalty_bias", out="y_repeated")


def _branch(name: str, build, dtype: int = TensorProto.INT64) -> onnx.GraphProto:
    """A subgraph for If: its nodes read the body's values by name; its one output is `build`'s."""
    sub = _Body()
    out = build(sub)
    return helper.make_graph(sub.nodes, name, [], [helper.make_tensor_value_info(out, dtype, None)])


def _sampled(b: _Body, greedy, arange: bool, float64: bool) -> str:
    """Steps 4-11: the top-M of y, greedy rows, thresholds and the draw."""
    if arange:
        _arange(b)
    b.op("TopK", "y", "max_top_k", out=["sy", "sy_ids"], axis=-1, largest=1, sorted=1)  # [B, M]
    b.op("Slice", "sy", "zero_i", "one_i_1d", "axes_1", out="ymax")              # [B, 1]
    greedy(b, "greedy", ymax="ymax")                       # [B]; the max comes from TopK, not a second pass
    _threshold(b)                                                                   # steps 5-9
    _draw(b, float64)                                                               # steps 10-11
    return "token_ids_sampled"


def _greedy(b: _Body, out: str, argmax: bool, ymax: str | None = None) -> str:
    """Step 4: the first index of max y; `ymax` [B, 1] when the caller already has it."""
    if argmax:
        return b.op("ArgMax", "y", out=out, axis=1, keepdims=0, select_last_index=0)
    if ymax is None:
        ymax = b.op("ReduceMax", "y", "axes_1", out=f"{out}_ymax", keepdims=1)      # [B, 1]
    b.op("Equal", "y", ymax, out=f"{out}_is_max")
    return _first_true(b, f"{out}_is_max", out=out)


def _arange(b: _Body) -> None:
    """arange(V) and V, for "first index where"."""
    # arange(V) and V for "first index where", in int32: Where + ReduceMin over int32 take
    # 70 us instead of 170 us at V = 49152 on ONNX Runtime (V < 2**31 always).
    # (Range runs in int64 and is cast after: with a static V, ONNX Runtime's shape inference
    # rejects a Range fed by Cast(Shape) as mixing types.)
    b.op("Shape", "y", out="vocab_i64", start=1, end=2)                             # [1]
    b.op("Squeeze", "vocab_i64", "zero_i", out="vocab")                             # []
    b.op("Range", "zero_i_s", "vocab", "one_i", out="arange_i64")                   # [V]
    b.op("Cast", "arange_i64", out="arange_v", to=TensorProto.INT32)
    b.op("Cast", "vocab_i64", out="vocab_1d", to=TensorProto.INT32)                 # [1]


def _first_true(b: _Body, cond: str, out: str) -> str:
    """[B] index of the first True in each row of cond [B, V] (V when none)."""
    b.op("Where", cond, "arange_v", "vocab_1d", out=f"{out}_or_v")
    b.op("ReduceMin", f"{out}_or_v", "axes_1", out=f"{out}_i32", keepdims=0)
    return b.op("Cast", f"{out}_i32", out=out, to=TensorProto.INT64)


def _threshold(b: _Body) -> None:
    """Steps 5-9: keep [B, V] = y >= thr, and d = (y - max y) / t [B, V]."""
    b.op("Unsqueeze", "temperature", "axes_1", out="t2")                            # [B, 1]
    b.op("Equal", "t2", "zero_f", out="t_is_zero")
    b.op("Where", "t_is_zero", "one_f", "t2", out="t_eff")                          # step 5
    b.op("Sub", "y", "ymax", out="y_shift")
    b.op("Div", "y_shift", "t_eff", out="d")                                        # [B, V]
    b.op("Exp", "d", out="exp_d")
    b.op("Sub", "sy", "ymax", out="sy_shift")                                       # step 6
    b.op("Div", "sy_shift", "t_eff", out="sd")                                      # [B, M]
    b.op("Exp", "sd", out="e")
    _min_p_and_top_k(b)                                                             # step 7
    b.op("Where", "in_k", "e", "zero_f", out="e_k")
    b.op("ReduceSum", "e_k", "axes_1", out="sum_k", keepdims=1)                     # step 8
    b.op("ReduceSum", "exp_d", "axes_1", out="sum_all", keepdims=1)
    # min-p alone: its survivors' mass over the whole vocabulary (they may be more than M)
    b.op("GreaterOrEqual", "d", "log_min_p", out="in_min_p_all")                    # [B, V]
    b.op("Where", "in_min_p_all", "exp_d", "zero_f", out="exp_min_p")
    b.op("ReduceSum", "exp_min_p", "axes_1", out="sum_min_p", keepdims=1)
    b.op("Where", "m_on", "sum_min_p", "sum_all", out="sum_unranked")
    b.op("Where", "k_on", "sum_k", "sum_unranked", out="denom")
    b.op("Div", "e_k", "denom", out="prob")
    b.op("CumSum", "prob", "axis_1", out="excl", exclusive=1)
    b.op("Unsqueeze", "top_p", "axes_1", out="p2")
    b.op("Less", "excl", "p2", out="in_p")
    b.op("Cast", "in_p", out="in_p_i", to=TensorProto.INT64)
    b.op("ReduceSum", "in_p_i", "axes_1", out="n_in_p", keepdims=1)
    b.op("Max", "n_in_p", "one_i", out="n")                                         # >= 1 even if top_p is 0
    b.op("Less", "p2", "one_f", out="p_on")
    b.op("Where", "p_on", "n", "max_top_k", out="n_eff")
    b.op("Min", "k_eff", "n_eff", out="num_kept")                                   # step 9
    b.op("Sub", "num_kept", "one_i", out="thr_idx")
    b.op("GatherElements", "sy", "thr_idx", out="thr_sorted", axis=1)              # [B, 1]
    b.op("Or", "restricted", "p_on", out="any_on")
    b.op("Where", "any_on", "thr_sorted", "neg_inf", out="thr")
    b.op("GreaterOrEqual", "y", "thr", out="keep")                                  # [B, V]


def _min_p_and_top_k(b: _Body) -> None:
    """Step 7: k_eff [B, 1] = min(top_k or M, count(sd >= log(min_p))), in_k [B, M], restricted [B, 1]."""
    b.op("Unsqueeze", "min_p", "axes_1", out="m2")                                  # [B, 1]
    b.op("Greater", "m2", "zero_f", out="m_on")
    b.op("Log", "m2", out="log_m2")
    # min_p = 0 keeps everything whatever Log(0) returns on the backend.
    b.op("Where", "m_on", "log_m2", "neg_inf", out="log_min_p")
    b.op("GreaterOrEqual", "sd", "log_min_p", out="in_min_p")                       # [B, M]
    b.op("Cast", "in_min_p", out="in_min_p_i", to=TensorProto.INT64)
    b.op("ReduceSum", "in_min_p_i", "axes_1", out="num_min_p", keepdims=1)          # >= 1 (sd[0] = 0)
    b.op("Unsqueeze", "top_k", "axes_1", out="k2")
    b.op("Greater", "k2", "zero_i", out="k_on")
    # Min keeps GatherElements in bounds for an invalid top_k > M (the reference rejects it).
    b.op("Min", "k2", "max_top_k", out="k_clamped")
    b.op("Where", "k_on", "k_clamped", "max_top_k", out="k_top")
    b.op("Min", "k_top", "num_min_p", out="k_eff")                                  # [B, 1]
    b.op("Or", "k_on", "m_on", out="restricted")
    b.op("Less", "arange_m", "k_eff", out="in_k")                                   # [B, M]


def _draw(b: _Body, float64: bool) -> None:
    """Steps 10-11: inverse CDF with the caller's uniform, then the greedy override. `float64`: the
    CDF summed in float64 as the reference sums (ONNX Runtime's form). TensorRT has no float64 (its
    parser casts DOUBLE down), so its form sums in float32 with the rounding carried along
    (`_compensated`): a plain float32 running sum near 3 takes nothing from a weight below 1.2e-7
    (with nothing restricted, 2e-4 of the demo model's mass could never be drawn)."""
    b.op("Where", "keep", "exp_d", "zero_f", out="w")                               # [B, V]
    # only weighted tokens, the total their largest running sum: reference.py step 10 says why
    b.op("Greater", "w", "zero_f", out="weighted")
    b.op("Unsqueeze", "uniform", "axes_1", out="u2")                                # [B, 1]
    if float64:
        b.op("Cast", "w", out="w_64", to=TensorProto.DOUBLE)
        b.op("Cast", "u2", out="u2_64", to=TensorProto.DOUBLE)
        b.op("Cast", "zero_f", out="zero_64", to=TensorProto.DOUBLE)
        b.op("CumSum", "w_64", "axis_1", out="c")
        b.op("Where", "weighted", "c", "zero_64", out="c_weighted")
        b.op("ReduceMax", "c_weighted", "axes_1", out="total", keepdims=1)          # [B, 1]
        b.op("Mul", "u2_64", "total", out="target")
        b.op("Greater", "c", "target", out="past_target")
        b.op("GreaterOrEqual", "c", "total", out="at_total")
    else:
        _compensated(b)
    b.op("Or", "past_target", "at_total", out="passed")
    b.op("And", "passed", "weighted", out="chosen")
    _first_true(b, "chosen", out="token")                                           # [B]
    b.op("Equal", "temperature", "zero_f", out="is_greedy")
    b.op("Where", "is_greedy", "greedy", "token", out="token_ids_sampled")


def _compensated(b: _Body) -> None:
    """Step 10 in float32 alone, as exact as the float64 sum: past_target = S > uniform * total and
    at_total = S >= total, S the running sum of w. CumSum's rounding is recovered from its own
    output: c[i] - c[i-1] is the amount that step added, computed with its own rounding error
    (TwoSum: exact where a large weight follows small ones, where the difference itself rounds), so
    w - that is what the addition lost, and c + CumSum(lost) is S, whatever order the backend's
    scan adds in (the differences telescope). The lost amounts are summed the same way once more
    (their own float32 sum drifts by up to a weight over a long flat tail), and what that loses is
    below 1e-12 of the total. The target u * total is kept as two float32 numbers: u and the
    total's leading part, each cut to float16's 11 bits, multiply exactly, even where a GPU fuses
    a product into an add; the rest of the product is small and rounds harmlessly. Compared as
    (c - t_hi) + (small terms), whose first difference is exact where the two are close."""
    b.const("minus_one_1d", np.array([-1], np.int64))
    b.const("to_end_1d", np.array([np.iinfo(np.int64).max], np.int64))
    b.const("no_index", np.array(-1, np.int32))
    b.const("down", np.array(2.0 ** -8, np.float32))  # the total (<= V) into float16's range, exactly
    b.const("up", np.array(2.0 ** 8, np.float32))
    b.op("CumSum", "w", "axis_1", out="c")                                          # [B, V]
    lost = _lost(b, "w", "c", "lost_c")
    b.op("CumSum", lost, "axis_1", out="c_fix")
    b.op("CumSum", _lost(b, lost, "c_fix", "lost_fix"), "axis_1", out="c_fix2")
    # the total: S at the last weighted token, each part gathered there
    b.op("Where", "weighted", "arange_v", "no_index", out="weighted_at")
    b.op("ReduceMax", "weighted_at", "axes_1", out="last_i32", keepdims=1)          # [B, 1]
    b.op("Cast", "last_i32", out="last", to=TensorProto.INT64)
    for part in ("c", "c_fix", "c_fix2"):
        b.op("GatherElements", part, "last", out=f"{part}_total", axis=1)           # [B, 1]
    b.op("Add", "c_fix_total", "c_fix2_total", out="fix_total")
    _leading(b, "u2", "u_hi", "u_lo")
    b.op("Mul", "c_total", "down", out="c_total_down")
    _leading(b, "c_total_down", "c_hi_down", "c_lo_down")
    b.op("Mul", "c_hi_down", "up", out="c_hi")
    b.op("Sub", "c_total", "c_hi", out="c_lo")
    b.op("Mul", "u_hi", "c_hi", out="t_hi")                                         # exact: 11 x 11 bits
    b.op("Mul", "u_hi", "c_lo", out="t_1")                                          # exact: 11 x 13 bits
    b.op("Mul", "u_lo", "c_hi", out="t_2")                                          # exact: 13 x 11 bits
    b.op("Mul", "u_lo", "c_lo", out="t_3")
    b.op("Mul", "u2", "fix_total", out="t_4")
    b.op("Add", "t_1", "t_2", out="t_12")
    b.op("Add", "t_3", "t_4", out="t_34")
    b.op("Add", "t_12", "t_34", out="t_lo")
    _above(b, ("c", "t_hi"), ("c_fix", "t_lo"), ("c_fix2", None), out="s_minus_target")
    b.op("Greater", "s_minus_target", "zero_f", out="past_target")
    _above(b, ("c", "c_total"), ("c_fix", "c_fix_total"), ("c_fix2", "c_fix2_total"), out="s_minus_total")
    b.op("GreaterOrEqual", "s_minus_total", "zero_f", out="at_total")


def _lost(b: _Body, w: str, c: str, out: str) -> str:
    """w - (c[i] - c[i-1]) (c[-1] = 0): what each addition of CumSum(w) = c rounded away. The
    difference d = c[i] - c[i-1] is exact only where c[i-1] >= c[i] / 2; its own rounding error
    (TwoSum: (c - (d - bd)) + (-c[i-1] - bd), bd = d - c) is taken off too."""
    b.op("Slice", c, "zero_i", "one_i_1d", "axes_1", out=f"{c}_first")             # [B, 1]
    b.op("Slice", c, "one_i_1d", "to_end_1d", "axes_1", out=f"{c}_next")            # [B, V-1]
    b.op("Slice", c, "zero_i", "minus_one_1d", "axes_1", out=f"{c}_prev")
    b.op("Sub", f"{c}_next", f"{c}_prev", out=f"{c}_d")
    b.op("Sub", f"{c}_d", f"{c}_next", out=f"{c}_bd")
    b.op("Sub", f"{c}_d", f"{c}_bd", out=f"{c}_d_back")
    b.op("Sub", f"{c}_next", f"{c}_d_back", out=f"{c}_d_err_a")
    b.op("Add", f"{c}_prev", f"{c}_bd", out=f"{c}_d_err_b_neg")
    b.op("Sub", f"{c}_d_err_a", f"{c}_d_err_b_neg", out=f"{c}_d_err")            # (c[i] - c[i-1]) - d, exactly
    zero_col = b.op("Sub", f"{c}_first", f"{c}_first", out=f"{c}_zero")           # [B, 1] (c[0] - 0 is exact)
    b.op("Concat", f"{c}_first", f"{c}_d", out=f"{c}_steps", axis=1)               # [B, V]
    b.op("Concat", zero_col, f"{c}_d_err", out=f"{c}_steps_err", axis=1)
    b.op("Sub", w, f"{c}_steps", out=f"{out}_rough")
    return b.op("Sub", f"{out}_rough", f"{c}_steps_err", out=out)


def _leading(b: _Body, x: str, hi: str, lo: str) -> None:
    """x = hi + lo exactly, hi x rounded to float16's 11 significant bits (|x| < 65504)."""
    b.op("Cast", x, out=f"{x}_half", to=TensorProto.FLOAT16)
    b.op("Cast", f"{x}_half", out=hi, to=TensorProto.FLOAT)
    b.op("Sub", x, hi, out=lo)


def _above(b: _Body, *pairs: tuple[str, str | None], out: str) -> str:
    """sum of (a - b) over pairs, the first (the large parts: exact where close) first."""
    terms = [b.op("Sub", a, c, out=f"{out}_{a}") if c else a for a, c in pairs]
    small = terms[1]
    for i, t in enumerate(terms[2:]):
        small = b.op("Add", small, t, out=f"{out}_small_{i}")
    return b.op("Add", terms[0], small, out=out)


def make_node(inputs: list[str], outputs: list[str], max_top_k: int,
              name: str = "/sampler/Sample") -> onnx.NodeProto:
    """The call node; pair it with make_function(max_top_k) in the model's functions."""
    schema.check_max_top_k(max_top_k)
    if len(inputs) != len(schema.INPUTS) or len(outputs) != len(schema.OUTPUTS):
        raise ValueError(f"Sample takes {len(schema.INPUTS)} inputs {schema.INPUT_NAMES} and "
                         f"{len(schema.OUTPUTS)} outputs {schema.OUTPUT_NAMES}, got {inputs} -> {outputs}")
    return helper.make_node(OP, inputs, outputs, name=name, domain=DOMAIN, max_top_k=max_top_k,
                            plugin_namespace=schema.PLUGIN_NAMESPACE, plugin_version=schema.PLUGIN_VERSION)


def has_float64_draw(fn: onnx.FunctionProto) -> bool:
    """Whether a trtllm::Sample body draws in float64 (ONNX Runtime's form); the draw is inside the
    If's sampling branch."""
    def nodes(graph_nodes):
        for n in graph_nodes:
            yield n
            for attr in n.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from nodes(attr.g.node)
    return any(n.op_type == "Cast" and n.output[0] == "w_64" for n in nodes(fn.node))


def with_float64_draw(model: onnx.ModelProto) -> bool:
    """Give `model`'s trtllm::Sample body the float64 draw, in place (ONNX Runtime compiles the
    canonical graph where no ONNX Runtime form is written: --graph legacy, a model neither our
    kernels nor GroupQueryAttention run); True if it had a float32 one."""
    for i, fn in enumerate(model.functions):
        if fn.domain != DOMAIN or fn.name != OP or has_float64_draw(fn):
            continue
        m = next(numpy_helper.to_array(n.attribute[0].t) for n in fn.node if n.output[0] == "max_top_k")
        opset = next(o.version for o in fn.opset_import if o.domain == "")
        argmax = any(n.op_type == "ArgMax" for n in fn.node)
        model.functions[i].CopyFrom(make_function(int(m[0]), opset, argmax, float64_draw=True))
        return True
    return False


def make_model(max_top_k: int, vocab_size: int | None = None, opset: int = schema.OPSET,
               argmax: bool = False, float64_draw: bool = False) -> onnx.ModelProto:
    """A one-node model (graph I/O named as the schema), for tests and benchmarks."""
    dims = {"B": "batch", "V": vocab_size or "vocab", "K": schema.num_logprob_columns(max_top_k)}
    dtypes = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "bool": TensorProto.BOOL}

    def info(name, dtype, shape):
        return helper.make_tensor_value_info(name, dtypes[dtype], [dims.get(s, s) for s in shape])

    graph = helper.make_graph(
        [make_node(list(schema.INPUT_NAMES), list(schema.OUTPUT_NAMES), max_top_k)], "sample",
        [info(*spec) for spec in schema.INPUTS], [info(*spec) for spec in schema.OUTPUTS])
    return helper.make_model(
        graph, functions=[make_function(max_top_k, opset, argmax, float64_draw)], ir_version=11,
        opset_imports=[helper.make_opsetid("", opset),
                       helper.make_opsetid(DOMAIN, schema.DOMAIN_VERSION)])
