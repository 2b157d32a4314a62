"""A thin writer for ONNX graphs: named nodes, initializers and shape-tagged I/O.

Node names follow `/model/layers.{i}/attn/q_proj/MatMul`; a node's output is named after the
node (`<name>/output_0`), so a graph read in Netron maps back to the code that wrote it.
"""
from __future__ import annotations

import sys
from pathlib import Path

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
# A weight of this many bytes or more goes to the data file (onnx.save_model's size_threshold, as save() used)
EXTERNAL_BYTES = 1024
# Weights of ALIGN_BYTES or more start at a PAGE boundary, as ONNX Runtime aligns those it saves
ALIGN_BYTES, PAGE = 1 << 20, 4096
# types from_array packs several to a byte (its bytes are not the array's)
PACKED = {getattr(TensorProto, t) for t in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2", "FLOAT6E2M3", "FLOAT6E3M2")
          if hasattr(TensorProto, t)}


class GraphWriter:
    def __init__(self, name: str):
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.functions: list[onnx.FunctionProto] = []
        self._consts: dict[tuple, str] = {}
        self._data = None  # store_in's data file, open while weights are written

    def store_in(self, graph_path: Path) -> None:
        """Write every weight of EXTERNAL_BYTES or more to the graph's data file (`graph_path` + ".data",
        which must not exist) as it is made, those held so far first: the writer then holds no weight
        bytes, where the whole model in memory was the build's peak (twice the weights with the model's
        own, three times with a copy being made). model() closes the file; save() writes the rest."""
        path = Path(f"{graph_path}.data")
        self._data = open(path, "xb")
        self.initializers = [self._stored(t) for t in self.initializers]

    def _stored(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """`tensor`, or where it is large, its bytes written to the data file and a new tensor naming
        them: a new one, as protobuf keeps a cleared field's bytes until the message goes."""
        if len(tensor.raw_data) < EXTERNAL_BYTES:
            return tensor
        return self._external(tensor.name, tensor.dims, tensor.data_type, tensor.raw_data)

    def _external(self, name: str, dims, data_type: int, data) -> onnx.TensorProto:
        offset = self._data.tell()
        if len(data) >= ALIGN_BYTES:  # (ONNX Runtime maps a weight at a page boundary, else reads it into memory)
            offset = -(-offset // PAGE) * PAGE
            self._data.seek(offset)
        self._data.write(data)
        stored = onnx.TensorProto(name=name, dims=dims, data_type=data_type, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", Path(self._data.name).name), ("offset", offset), ("length", len(data))):
            stored.external_data.add(key=key, value=str(value))
        return stored

    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, name: str, elem_type: int, shape: list) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def weight(self, name: str, array: np.ndarray) -> str:
        # from_array handles ml_dtypes.int4 too (packed two per byte)
        # (order="C", not np.ascontiguousarray, which makes a 0-d array 1-d: a scalar must stay one, as
        # Range and Gather read it)
        array = np.asarray(array, order="C")
        if self._data is not None and array.nbytes >= EXTERNAL_BYTES and sys.byteorder == "little":
            kind = helper.np_dtype_to_tensor_dtype(array.dtype)
            if kind not in PACKED:  # (its bytes as they lie, where from_array would copy them: a table once, not twice)
                self.initializers.append(self._external(name, array.shape, kind,
                                                        memoryview(array.reshape(-1).view(np.uint8))))
                return name
        tensor = numpy_helper.from_array(array, name)
        self.initializers.append(tensor if self._data is None else self._stored(tensor))
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
        if self._data is not None:
            self._data.close()
            self._data = None
        return model
