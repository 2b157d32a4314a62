"""A thin writer for ONNX graphs: named nodes, initializers and shape-tagged I/O.

Node names follow `/model/layers.{i}/attn/q_proj/MatMul`; a node's output is named after the
node (`<name>/output_0`), so a graph read in Netron maps back to the code that wrote it.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 24
DTYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
          np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.float16): TensorProto.FLOAT16,
          np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}
# --dtype's name -> the numpy type of its weights and KV cache (numpy's bfloat16 is ml_dtypes')
STORAGE = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


class GraphWriter:
    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.functions: list[onnx.FunctionProto] = []
        self._consts: dict[tuple, str] = {}

    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, elem_type: int, shape: list) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def weight(self, name: str, array: np.ndarray) -> str:
        # from_array handles ml_dtypes.int4 too (packed two per byte)
        # (order="C", not np.ascontiguousarray, which makes a 0-d array 1-d: a scalar must stay one, as
        # Range and Gather read it)
        self.initializers.append(numpy_helper.from_array(np.asarray(array, order="C"), name))
        return name

    def const(self, values, dtype=np.int64) -> str:
        """A small shared constant initializer (shapes, axes, scalars)."""
        arr = np.asarray(values, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.weight(f"/const/{len(self._consts)}", arr)
        return self._consts[key]

    def op(self, op_type: str, name: str, inputs: list[str], num_outputs: int = 1,
           outputs: list[str] | None = None, domain: str = "", **attrs) -> str | list[str]:
        """Add one node; returns its output name (or names when num_outputs > 1)."""
        outs = outputs or [f"{name}/output_{k}" for k in range(num_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def model(self, producer: str, extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
        """The model; the writer's initializers move into it (one weight copied at a time: make_graph
        and make_model each copied them all, three copies of the weights at the peak)."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs)
        opsets = [helper.make_opsetid("", OPSET)]
        opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
        model = helper.make_model(graph, opset_imports=opsets, producer_name=producer,
                                  functions=self.functions)
        del graph
        pending, self.initializers = self.initializers[::-1], []
        while pending:
            model.graph.initializer.append(pending.pop())
        model.ir_version = 11
        return model
