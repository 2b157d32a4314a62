"""trtllm::Sample as plain data: names, dtypes, shapes, attributes, limits (stdlib only).

B = batch, V = vocabulary, M = max_top_k attribute, K = min(50, M) logprob columns (static: callers
keep the first k <= K; a runtime K would make the outputs' shape depend on an input's value, which
TensorRT can only build as a shape tensor and its Python plugins cannot express at all).
"""
from __future__ import annotations

import numbers

DOMAIN = "trtllm"
OP = "Sample"
DOMAIN_VERSION = 3          # the op's revision: 2 added penalties and min_p, 3 static-width logprobs
OPSET = 24                  # default-domain opset of the body (our graphs use opset 24)
PLUGIN_NAMESPACE = "trtllm"
PLUGIN_VERSION = "1"        # tensorrt.plugin registers every plugin as version "1"

MAX_NUM_LOGPROBS = 50       # K = min(50, M): the logprobs TopK's constant K
TRT_TOPK_LIMIT = 3840       # TensorRT TopK needs K < 3840, so M must be < 3840
DEFAULT_MAX_TOP_K = 1024    # callers use min(DEFAULT_MAX_TOP_K, V)

# (name, dtype, shape); dtypes are numpy names, shapes use the symbols above.
INPUTS = (
    ("logits", "float32", ("B", "V")),
    ("logit_bias", "float32", ("B", "V")),    # dense, added first; -inf bans a token
    ("penalty_bias", "float32", ("B", "V")),  # added after the repetition penalty; no NaN or +inf
    ("seen", "bool", ("B", "V")),             # prompt + output tokens: the repetition penalty applies
                                              # (int32 0/1 where the TensorRT plugin takes it: PLUGIN_SEEN)
    ("repetition_penalty", "float32", ("B",)),  # > 0; 1 = disabled
    ("temperature", "float32", ("B",)),       # >= 0; 0 = greedy
    ("min_p", "float32", ("B",)),             # [0, 1]; 0 = disabled
    ("top_k", "int64", ("B",)),               # 0 = disabled; 1..M
    ("top_p", "float32", ("B",)),             # (0, 1]; 1 = disabled
    ("uniform", "float32", ("B",)),           # [0, 1): the caller's random draw
)
OUTPUTS = (
    ("token_ids", "int64", ("B",)),
    ("top_logprobs", "float32", ("B", "K")),
    ("top_logprob_ids", "int64", ("B", "K")),
)
# name -> (type, meaning); all are declared on the FunctionProto and set on the call node.
ATTRIBUTES = {
    "max_top_k": ("int", "M: top-k limit and the min-p/top-p candidate set; 1 <= M < 3840"),
    "plugin_namespace": ("string", "TensorRT plugin namespace, always 'trtllm'"),
    "plugin_version": ("string", "TensorRT plugin version, always PLUGIN_VERSION ('1')"),
}

# TensorRT plugins take no BOOL (nor UINT8) tensors (PluginTensorDesc::type: "kBOOL and kUINT8 are
# not supported"), so a --sampling-plugin graph casts `seen` to int32 before the node; the body and
# the Triton kernel take either.
PLUGIN_SEEN = "int32"

INPUT_NAMES = tuple(name for name, _, _ in INPUTS)
OUTPUT_NAMES = tuple(name for name, _, _ in OUTPUTS)


def check_max_top_k(max_top_k: int) -> None:
    """Raise unless max_top_k is a valid M (an int in [1, 3840))."""
    if (isinstance(max_top_k, bool) or not isinstance(max_top_k, numbers.Integral)
            or not 1 <= max_top_k < TRT_TOPK_LIMIT):
        raise ValueError(f"max_top_k must be an int in [1, {TRT_TOPK_LIMIT}), got {max_top_k!r}")


def num_logprob_columns(max_top_k: int) -> int:
    """K: the width of top_logprobs / top_logprob_ids for M = max_top_k."""
    return min(MAX_NUM_LOGPROBS, max_top_k)
