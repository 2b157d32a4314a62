"""A bfloat16 graph run in float32 by ONNX Runtime, whose CPU kernels have no bfloat16: the stand-in's
way to execute a bfloat16 plan, and the tests' way to check a bfloat16 llm.onnx numerically (a
float16 one too, `kind`: ONNX Runtime runs those itself, with its own float16 arithmetic).

The model of a strongly typed bfloat16 network: each node computes in float32 (as TensorRT's
bfloat16 kernels accumulate) and every value the graph types bfloat16 is rounded to bfloat16
(nearest, ties to even) where a node makes it. Initializers and bfloat16 inputs hold bfloat16
values, widened exactly; the graph's bfloat16 inputs and outputs become float32.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BF16, F16, F32 = TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT


def emulate(model: onnx.ModelProto, rounding: bool = True, kind: int = BF16) -> onnx.ModelProto:
    """The float32 model that rounds where `model` holds bfloat16 (see the module docstring).
    rounding=False rounds only the graph's bfloat16 outputs (the KV cache, which the step's own
    queries read after its write) and computes the rest in float32 from the bfloat16 weights: what
    our CPU kernels compute, for a check of the graph's arithmetic at float32 tolerance. `kind`: the
    16-bit type (BFLOAT16, FLOAT16)."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    stored = {v.name for v in graph.output if v.type.tensor_type.elem_type == kind}
    out = onnx.ModelProto()
    out.CopyFrom(inferred)
    g = out.graph
    del g.value_info[:]
    for init in g.initializer:
        if init.data_type == kind:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for v in [*g.input, *g.output]:
        if v.type.tensor_type.elem_type == kind:
            v.type.tensor_type.elem_type = F32
    nodes = []
    for node in g.node:
        for attr in node.attribute:
            if attr.name == "to" and attr.i == kind:
                attr.i = F32
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == kind:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float32)))
        rounded = []
        for k, name in enumerate(node.output):
            if name in stored or (rounding and name and types.get(name) == kind):
                node.output[k] = f"{name}/float32"
                rounded.append(name)
        nodes.append(node)
        for name in rounded:
            nodes.append(helper.make_node("Cast", [f"{name}/float32"], [f"{name}/bfloat16"], to=kind))
            nodes.append(helper.make_node("Cast", [f"{name}/bfloat16"], [name], to=F32))
    del g.node[:]
    g.node.extend(nodes)
    return out

