"""trtllm::Sample as a TensorRT Quickly Deployable Plugin (tensorrt.plugin, JIT), on triton_kernel.

Importing this module imports nothing heavy: `register()` imports tensorrt, tensorrt.plugin, torch
and the Triton kernel, and registers the plugin. A TensorRT backend calls it before parsing (so the
parser can pick the plugin) and before deserializing an engine built with it (the JIT impl is a
Python callback, so the process running the engine needs it registered too).

How TensorRT's ONNX parser would pick it (onnx-tensorrt ModelImporter.cpp parseNode, and
onnxOpImporters.cpp FallbackPluginImporter / loadFields, TensorRT 10.x-11.x):

  * a node whose op_type has a model-local function goes to the plugin when the registry has a
    creator (op_type, plugin_version attr or "1", plugin_namespace attr); else the body is imported;
  * the plugin's attributes are read from the node by the names the creator declares (here only
    max_top_k; plugin_namespace / plugin_version are matching keys, not fields), INT as int32;
  * the layer must have as many outputs as the node.

Two facts of tensorrt.plugin (python/packaging/bindings_wheel/tensorrt/plugin/_lib.py,
_plugin_class.py) shaped the op's schema (revision 3): every QDP is plugin version "1" (so the node
says "1"), and QDPs cannot express outputs whose shape depends on an input's value (no shape
inputs; a size tensor would be an extra output the parser refuses), so the logprob outputs have
the static width min(50, max_top_k) and the runtime keeps the columns a request asked for.
No annotations import from __future__ here: tensorrt.plugin inspects the annotation objects.
"""
from trtllm.plugins.sample import schema

PLUGIN_ID = f"{schema.PLUGIN_NAMESPACE}::{schema.OP}"
_TYPESTR = {"float32": "<f4", "int64": "<i8", "int32": "<i4"}   # __cuda_array_interface__ typestrs
_registered = False


def register() -> None:
    """Register trtllm::Sample (JIT impl on the Triton kernel) with TensorRT; idempotent."""
    global _registered
    if _registered:
        return
    try:
        import tensorrt as trt
        import tensorrt.plugin as trtp
    except (ImportError, OSError) as e:
        raise ImportError(f"trtllm::Sample's TensorRT plugin needs tensorrt >= 10.6 with tensorrt.plugin "
                          f"(import failed: {str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    import torch

    from trtllm.plugins.sample import triton_kernel

    _define(trt, trtp, torch, triton_kernel)
    _registered = True


def _define(trt, trtp, torch, triton_kernel) -> None:
    """The @trtp.register and @trtp.impl pair (annotations are real objects: QDP inspects them).

    max_top_k is a 1-element int32 array, not an int: the ONNX parser hands an INT attribute over as
    an int32 field of length 1, and QDP's creator converts a field with its annotation, so `int`
    would be int(array([k])), which NumPy 2.4 refuses (an NDArray annotation is converted with astype)."""
    import numpy as np
    import numpy.typing as npt

    desc, tensor, attr = trtp.TensorDesc, trtp.Tensor, npt.NDArray[np.int32]

    @trtp.register(PLUGIN_ID)
    def describe(logits: desc, logit_bias: desc, penalty_bias: desc, seen: desc, repetition_penalty: desc,
                 temperature: desc, min_p: desc, top_k: desc, top_p: desc, uniform: desc,
                 max_top_k: attr) -> tuple[desc, desc, desc]:
        if seen.dtype != trt.int32:  # (a graph not cast for the plugin: builder/tensorrt.py plugin_inputs)
            raise ValueError(f"trtllm::Sample's plugin takes seen as int32 (TensorRT plugins take no BOOL "
                             f"tensor), got {seen.dtype}")
        batch = logits.shape_expr[0]
        width = schema.num_logprob_columns(int(max_top_k[0]))
        return (trtp.from_shape_expr((batch,), dtype=trt.int64),
                trtp.from_shape_expr((batch, width), dtype=trt.float32),
                trtp.from_shape_expr((batch, width), dtype=trt.int64))

    @trtp.impl(PLUGIN_ID)
    def run(logits: tensor, logit_bias: tensor, penalty_bias: tensor, seen: tensor, repetition_penalty: tensor,
            temperature: tensor, min_p: tensor, top_k: tensor, top_p: tensor, uniform: tensor,
            max_top_k: attr, outputs: tuple[tensor], stream: int) -> None:
        inputs = (logits, logit_bias, penalty_bias, seen, repetition_penalty, temperature, min_p, top_k, top_p,
                  uniform)
        # (seen comes as int32: the graph casts it, TensorRT plugins take no BOOL tensor)
        args = [_as_torch(torch, t, schema.PLUGIN_SEEN if name == "seen" else dtype)
                for t, (name, dtype, _) in zip(inputs, schema.INPUTS)]
        outs = [_as_torch(torch, t, dtype) for t, (_, dtype, _) in zip(outputs, schema.OUTPUTS)]
        triton_kernel.launch(*args, int(max_top_k[0]), outs, stream=stream)


def _as_torch(torch, tensor, dtype: str):
    """A zero-copy torch view of a trtp.Tensor, from its data pointer and shape (dtype from the schema)."""
    class _View:
        __cuda_array_interface__ = {"shape": tuple(int(d) for d in tensor.shape), "typestr": _TYPESTR[dtype],
                                    "data": (int(tensor.data_ptr), False), "strides": None, "version": 3}

    return torch.as_tensor(_View(), device="cuda")

