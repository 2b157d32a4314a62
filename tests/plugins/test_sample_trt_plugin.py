"""plugins/sample/trt_plugin.py without TensorRT: lazy imports, the error without tensorrt, and the
register/impl pair checked against tensorrt.plugin's signature rules on a stub `tensorrt.plugin`."""
from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
import types
import typing

import numpy as np
import numpy.typing as npt
import pytest

from trtllm.plugins.sample import schema, trt_plugin


def test_importing_the_module_imports_nothing_heavy():
    code = ("import sys, json, trtllm.plugins, trtllm.runtime, trtllm.plugins.sample.trt_plugin; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorrt', 'torch', 'triton', 'onnx'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == []


def test_package_import_does_not_import_the_plugin():
    code = ("import sys, trtllm.plugins, trtllm.plugins.sample, trtllm.runtime; "
            "print('trtllm.plugins.sample.trt_plugin' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "False", proc.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt is installed")
def test_register_without_tensorrt_fails_with_one_clear_line():
    with pytest.raises(ImportError) as info:
        trt_plugin.register()
    message = str(info.value)
    assert "\n" not in message and "tensorrt.plugin" in message and "No module named 'tensorrt'" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_register_with_tensorrt_but_no_tensorrt_plugin_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))   # TensorRT < 10.6
    with pytest.raises(ImportError, match=r"tensorrt >= 10\.6 with tensorrt\.plugin"):
        trt_plugin.register()


class _Desc:
    def __init__(self, shape_expr=(), dtype="float32"):
        self.shape_expr, self.dtype = list(shape_expr), dtype


class _Tensor:
    pass


@pytest.fixture
def stub_trtp(monkeypatch):
    """A stub tensorrt + tensorrt.plugin that records what register() defines."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    trt = types.ModuleType("tensorrt")
    trt.int64, trt.float32, trt.int32, trt.bool = "int64", "float32", "int32", "bool"
    trtp = types.ModuleType("tensorrt.plugin")
    trtp.TensorDesc, trtp.Tensor, trtp.defined = _Desc, _Tensor, {}
    trtp.from_shape_expr = lambda shape, dtype: (tuple(shape), dtype)

    def decorator(kind):
        def wrap(plugin_id):
            def record(fn):
                trtp.defined[(kind, plugin_id)] = fn
                return fn
            return record
        return wrap

    trtp.register, trtp.impl = decorator("register"), decorator("impl")
    trt.plugin = trtp
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", trtp)
    monkeypatch.setattr(trt_plugin, "_registered", False)
    trt_plugin.register()
    trt_plugin.register()                                        # idempotent
    return trtp


def field_value(annotation, data: np.ndarray):
    """What QDP's _TemplatePluginCreator.create_plugin makes of a plugin field: astype for an
    NDArray annotation, else annotation(data), which NumPy >= 2.4 refuses for a 1-element array."""
    if typing.get_origin(annotation) is np.ndarray:
        return data.astype(typing.get_args(typing.get_args(annotation)[1])[0])
    if data.ndim:
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")
    return annotation(data)


def test_register_describes_static_width_outputs(stub_trtp):
    assert set(stub_trtp.defined) == {("register", "trtllm::Sample"), ("impl", "trtllm::Sample")}
    describe = stub_trtp.defined[("register", "trtllm::Sample")]
    annotation = inspect.signature(describe).parameters["max_top_k"].annotation
    inputs = [_Desc(("B", "V"))] + [_Desc(("B",))] * (len(schema.INPUTS) - 1)
    seen = schema.INPUT_NAMES.index("seen")
    inputs[seen] = _Desc(("B", "V"), "int32")  # (the graph casts it: TensorRT plugins take no BOOL tensor)
    for max_top_k, width in ((16, 16), (1024, 50)):
        field = np.array([max_top_k], np.int32)  # how the ONNX parser passes an INT attribute
        assert describe(*inputs, max_top_k=field_value(annotation, field)) == (
            (("B",), "int64"), (("B", width), "float32"), (("B", width), "int64"))
    inputs[seen] = _Desc(("B", "V"), "bool")
    with pytest.raises(ValueError, match="takes seen as int32 .*got bool"):
        describe(*inputs, max_top_k=field_value(annotation, np.array([16], np.int32)))


def test_signatures_follow_tensorrt_plugin_rules(stub_trtp):
    """tensorrt.plugin _validate: TensorDesc inputs then attributes, a Tuple of one TensorDesc per
    output; impl = the same inputs, the attributes it uses, then exactly `outputs, stream`."""
    describe = inspect.signature(stub_trtp.defined[("register", "trtllm::Sample")])
    params = list(describe.parameters.values())
    assert [p.name for p in params] == [*schema.INPUT_NAMES, "max_top_k"]
    assert all(p.annotation is _Desc for p in params[:-1])
    assert params[-1].annotation == npt.NDArray[np.int32]  # a 1-D int32 array attribute (see field_value)
    assert typing.get_origin(describe.return_annotation) is tuple
    assert typing.get_args(describe.return_annotation) == (_Desc,) * len(schema.OUTPUTS)
    impl = inspect.signature(stub_trtp.defined[("impl", "trtllm::Sample")])
    assert list(impl.parameters) == [*schema.INPUT_NAMES, "max_top_k", "outputs", "stream"]
    assert impl.parameters["max_top_k"].annotation == npt.NDArray[np.int32]
    assert impl.parameters["stream"].annotation is int
    assert typing.get_args(impl.parameters["outputs"].annotation) == (_Tensor,)
