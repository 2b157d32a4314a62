"""Check an ONNX model against TensorRT's ONNX operator table (plugins/data/trt_onnx_ops.json).

What is checked, for the graph, every subgraph and every model-local function body:
  - the default-domain opset is within [opset_min, the ceiling of the TensorRT version linted for]
    (`opset_max_by_trt`: 20 before 10.15, 24 from 10.15 on);
  - each default-domain op is in the table and, for an older TensorRT, not newer than the op's
    `since_trt` tag (ops without a tag are in the 10.0 table, so every 10.x has them);
  - the dtype of the op's data input (the first; Where's 1 and 2) is one of the table's `types` (where
    shape inference knows it); a model ONNX shape inference cannot take is an issue itself (its types
    went unchecked);
  - the op's `constraints` (one checker per kind in _CHECKS; a kind without a checker is an error);
  - a node of another domain is a model-local function whose body passes the same lint (that is
    how TensorRT imports it when no plugin of that name is registered).
Only the graph proto is needed: a model with external data is loaded without it.

    python -m trtllm.plugins.lint MODEL.onnx [--trt-version 10.3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from importlib import resources

# Ops whose output is never a build-time constant even when every input is one.
_NOT_FOLDABLE = {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike",
                 "Multinomial", "Bernoulli", "If", "Loop", "Scan"}
# Inputs a `rank` constraint applies to (the table's notes name them; default: the first).
_RANK_INPUTS = {"Attention": (0, 1, 2, 3), "TensorScatter": (0, 1)}


@dataclass(frozen=True)
class LintIssue:
    node: str
    op: str
    message: str

    def __str__(self) -> str:
        return f"{self.node} [{self.op}]: {self.message}"


def load_table() -> dict:
    """The TensorRT ONNX operator table shipped as package data."""
    text = resources.files("trtllm.plugins").joinpath("data/trt_onnx_ops.json").read_text()
    return json.loads(text)


def lint_model(model, trt_version: str = "11.1") -> list[LintIssue]:
    """Issues that would stop TensorRT `trt_version` from parsing `model`; [] when clean."""
    import onnx

    saved = isinstance(model, (str, os.PathLike))
    if saved:
        model = onnx.load(os.fspath(model), load_external_data=False)
    linter = _Linter(model, load_table(), _parse_version(trt_version), saved)
    return linter.run()


def check_model(model, trt_version: str = "11.1") -> None:
    """Raise ValueError listing every lint issue."""
    issues = lint_model(model, trt_version)
    if issues:
        lines = "\n  ".join(str(issue) for issue in issues)
        raise ValueError(f"model fails the TensorRT {trt_version} op lint ({len(issues)} issues):\n  {lines}")


def _parse_version(text: str) -> tuple[int, ...]:
    try:
        version = tuple(int(part) for part in str(text).split("."))
    except ValueError:
        version = ()
    if len(version) < 2 or version < (10, 0):
        raise ValueError(f"trt_version must be 'MAJOR.MINOR' and >= 10.0 (the table has no older data), "
                         f"got {text!r}")
    return version


class _Scope:
    """Names known in one graph or function body: constants (with values where cheap) and types."""

    def __init__(self, parent: _Scope | None, types: dict, opset: int):
        self.consts: dict[str, object] = {}      # name -> numpy value, or None when not evaluated
        self.parent, self.types, self.opset = parent, types, opset

    def is_const(self, name: str) -> bool:
        return name in self.consts or bool(self.parent and self.parent.is_const(name))

    def value(self, name: str):
        return self.consts[name] if name in self.consts else (self.parent and self.parent.value(name))

    def type_of(self, name: str):
        """(dtype name, dims or None) when shape inference knows the value, else None."""
        return self.types.get(name) or (self.parent and self.parent.type_of(name))


class _Linter:
    def __init__(self, model, table: dict, version: tuple[int, ...], saved: bool = False):
        """`saved`: the model was read from a file without its weights (lint_model(path))."""
        self.model, self.table, self.version, self.saved = model, table, version, saved
        self.functions = {(f.domain, f.name, f.overload): f for f in model.functions}
        self.linted_functions: set = set()
        self.issues: list[LintIssue] = []
        unknown = {kind for spec in table["ops"].values() for kind in spec.get("constraints", {})} - set(_CHECKS)
        if unknown:
            raise ValueError(f"trt_onnx_ops.json has constraint kinds the lint does not implement: {sorted(unknown)}")

    def run(self) -> list[LintIssue]:
        opset = self._check_opset(self.model.opset_import, "graph")
        types = _infer_types(self.model, self.issues, self.saved)
        self._lint_graph(self.model.graph, "", _Scope(None, types, opset))
        return self.issues

    def _check_opset(self, opset_imports, where: str) -> int:
        versions = [o.version for o in opset_imports if o.domain in self.table["default_domains"]]
        opset = max(versions, default=self.table["opset_max"])
        lo, hi = self.table["opset_min"], opset_max(self.table, self.version)
        if not lo <= opset <= hi:
            self.issues.append(LintIssue(where, "opset", f"default-domain opset must be in [{lo}, {hi}] for TensorRT "
                                                         f"{'.'.join(map(str, self.version))}, got {opset}"))
        return opset

    def _lint_graph(self, graph, prefix: str, scope: _Scope) -> None:
        from onnx import numpy_helper

        for init in graph.initializer:         # values of external tensors are not loaded
            scope.consts[init.name] = None if init.data_location == init.EXTERNAL else numpy_helper.to_array(init)
        scope.consts.update((init.values.name, None) for init in graph.sparse_initializer)
        self._lint_nodes(graph.node, prefix, scope)

    def _lint_nodes(self, nodes, prefix: str, scope: _Scope) -> None:
        for index, node in enumerate(nodes):
            where = prefix + (node.name or f"{node.op_type}#{index}")
            if node.domain in self.table["default_domains"]:
                self._lint_op(node, where, scope)
            else:
                self._lint_call(node, where, scope)
            for attr in node.attribute:              # If/Loop/Scan bodies see the outer names
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    self._lint_graph(sub, f"{where}/{attr.name}/", _Scope(scope, scope.types, scope.opset))
            _fold(node, scope)

    def _lint_op(self, node, where: str, scope: _Scope) -> None:
        spec = self.table["ops"].get(node.op_type)
        issue = lambda message: self.issues.append(LintIssue(where, node.op_type, message))  # noqa: E731
        if spec is None:
            why = "is unsupported by TensorRT" if node.op_type in self.table["unsupported"] else "is not in TensorRT's ONNX op table"
            return issue(f"{node.op_type} {why}")
        since = spec.get("since_trt")
        if since and self.version < _parse_version(since):
            return issue(f"{node.op_type} needs TensorRT >= {since}, linting for "
                         f"{'.'.join(map(str, self.version))}")
        allowed = [self.table["type_aliases"].get(t, t) for t in spec["types"]]
        for i in DATA_INPUTS.get(node.op_type, (0,)):
            dtype = _dtype(scope, node, i) if i < len(node.input) and node.input[i] else None
            if dtype is not None and dtype not in allowed:
                issue(f"input {i} has dtype {dtype}, TensorRT supports {spec['types']}")
        for kind, arg in spec.get("constraints", {}).items():
            for message in _CHECKS[kind](node, arg, scope, self.table):
                issue(message)

    def _lint_call(self, node, where: str, scope: _Scope) -> None:
        key = (node.domain, node.op_type, node.overload)
        function = self.functions.get(key)
        if function is None:
            return self.issues.append(LintIssue(where, f"{node.domain}::{node.op_type}", (
                f"domain {node.domain!r} is not a TensorRT op and the model has no local function for it "
                "(TensorRT would need a registered plugin)")))
        if key in self.linted_functions:             # one body, linted once (types of its first call)
            return
        self.linted_functions.add(key)
        fprefix = f"{node.domain}::{node.op_type}/"
        opset = self._check_opset(function.opset_import, fprefix.rstrip("/"))
        types = _infer_function_types(self.model, function, node, scope)
        self._lint_nodes(function.node, fprefix, _Scope(None, types, opset))


# The inputs whose dtype the table's `types` list: input 0 unless another holds the op's data type
# (Where's input 0 is its condition, always BOOL).
DATA_INPUTS = {"Where": (1, 2)}


def opset_max(table: dict, version: tuple[int, ...]) -> int:
    """The newest default-domain opset TensorRT `version` parses: the ceiling of the newest
    `opset_max_by_trt` key <= version, never above the table's own opset_max."""
    ceilings = table["opset_max_by_trt"]["ceilings"]
    known = [(_parse_version(since), ceiling) for since, ceiling in ceilings.items()]
    return min(max((k for k in known if k[0] <= version), default=min(known))[1], table["opset_max"])


def _fold(node, scope: _Scope) -> None:
    """Record node outputs that are build-time constants (a Constant, or all inputs constant)."""
    if node.op_type == "Constant":
        scope.consts[node.output[0]] = _constant_value(node)
    elif node.op_type not in _NOT_FOLDABLE and node.input and all(not i or scope.is_const(i) for i in node.input):
        scope.consts.update((out, None) for out in node.output)


def _constant_value(node):
    from onnx import helper, numpy_helper

    attr = node.attribute[0] if len(node.attribute) == 1 else None      # a Constant has exactly one
    if attr is None or attr.ref_attr_name or attr.name in ("sparse_value", "value_string", "value_strings"):
        return None
    value = helper.get_attribute_value(attr)
    return numpy_helper.to_array(value) if attr.name == "value" else value


# --- types from shape inference ---------------------------------------------------------------

def _infer_types(model, issues: list | None = None, saved: bool = False) -> dict:
    """name -> (dtype name, dims tuple or None) for every typed value in the graph and subgraphs.
    `issues`: where a whole model's inference failing is reported (a model in memory past 2 GiB
    cannot be serialised for it): without it the dtype, rank and shape checks see only the graph's
    inputs, outputs and initializers, and would pass what they could not check."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception as e:  # noqa: BLE001 - a function body's is a best effort; the lint still runs
        if issues is not None:
            fix = ("the model is not valid ONNX" if saved else
                   "lint the saved file (lint_model(path), without its weights: past 2 GiB a model in memory cannot "
                   "be serialised for it)")
            issues.append(LintIssue("graph", "shape inference", f"ONNX shape inference failed ({type(e).__name__}: "
                                    f"{str(e).splitlines()[0][:200] if str(e) else ''}), so dtypes, ranks and shapes "
                                    f"went unchecked: {fix}"))
    types: dict = {}
    _collect_types(model.graph, types)
    return types


def _infer_function_types(model, function, call, scope: _Scope) -> dict:
    """Types inside a function body: infer a throwaway graph of its nodes, typed from the call site."""
    import onnx
    from onnx import helper

    inputs = []
    for formal, actual in zip(function.input, call.input):
        known = scope.type_of(actual) if actual else None
        if known is None:
            return {}
        dtype, dims = known
        inputs.append(helper.make_tensor_value_info(formal, getattr(onnx.TensorProto, dtype), dims))
    graph = helper.make_graph(list(function.node), "body", inputs,
                              [helper.make_empty_tensor_value_info(name) for name in function.output])
    opsets = list(function.opset_import) + [o for o in model.opset_import
                                            if o.domain not in {f.domain for f in function.opset_import}]
    wrapper = helper.make_model(graph, opset_imports=opsets, functions=list(model.functions),
                                ir_version=model.ir_version)
    return _infer_types(wrapper)


def _collect_types(graph, types: dict) -> None:
    from onnx import TensorProto

    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor = info.type.tensor_type
        if info.type.HasField("tensor_type") and tensor.elem_type:
            dims = None
            if tensor.HasField("shape"):
                dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
            types[info.name] = (TensorProto.DataType.Name(tensor.elem_type), dims)
    for init in graph.initializer:
        types[init.name] = (TensorProto.DataType.Name(init.data_type), tuple(init.dims))
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _collect_types(sub, types)


def _dtype(scope: _Scope, node, index: int):
    known = scope.type_of(node.input[index]) if _present(node.input, index) else None
    return known[0] if known else None


# --- constraint checks: one per kind in the table; each yields messages ------------------------

def _attr(node, name: str, scope: _Scope):
    """The attribute's value, else the ONNX schema default, else None (also for attribute refs)."""
    from onnx import defs, helper

    found = [a for a in node.attribute if a.name == name]
    if not found:
        try:
            found = [defs.get_schema(node.op_type, scope.opset, "").attributes[name].default_value]
        except Exception:  # noqa: BLE001 - unknown op/attribute: nothing to compare
            return None
    if found[0].ref_attr_name or not found[0].type:
        return None
    value = helper.get_attribute_value(found[0])
    return value.decode() if isinstance(value, bytes) else value


def _input_name(node, index: int, scope: _Scope) -> str:
    from onnx import defs

    try:
        formal = defs.get_schema(node.op_type, scope.opset, "").inputs[index].name
    except Exception:  # noqa: BLE001 - variadic or unknown: the index alone is enough
        return f"input {index}"
    return f"input {index} ({formal})"


def _present(names, index: int) -> bool:
    return index < len(names) and bool(names[index])


def _check_attr_equals(node, arg, scope, table):
    for name, want in arg.items():
        got = _attr(node, name, scope)
        if got is not None and got != want:
            yield f"attribute {name} must be {want!r}, got {got!r}"


def _check_attr_in(node, arg, scope, table):
    for name, allowed in arg.items():
        got = _attr(node, name, scope)
        if got is not None and got not in allowed:
            yield f"attribute {name} must be one of {allowed}, got {got!r}"


def _check_forbidden_inputs(node, arg, scope, table):
    yield from (f"{_input_name(node, i, scope)} is not supported by TensorRT" for i in arg if _present(node.input, i))


def _check_forbidden_outputs(node, arg, scope, table):
    yield from (f"output {i} ({node.output[i]!r}) is not supported by TensorRT"
                for i in arg if _present(node.output, i))


def _check_forbidden_attrs(node, arg, scope, table):
    yield from (f"attribute {a.name} is not supported by TensorRT" for a in node.attribute if a.name in arg)


def _check_const_inputs(node, arg, scope, table):
    for index in arg:
        if _present(node.input, index) and not scope.is_const(node.input[index]):
            yield (f"{_input_name(node, index, scope)} must be a build-time constant (initializer or "
                   f"Constant), got the computed tensor {node.input[index]!r}")


def _check_zero_point_zero(node, arg, scope, table):
    import numpy as np

    if _present(node.input, 2):
        value = scope.value(node.input[2])
        if value is None:
            yield f"{_input_name(node, 2, scope)} must be a constant of zeros the lint can read"
        elif np.any(np.asarray(value) != 0):
            yield f"{_input_name(node, 2, scope)} must be 0 (symmetric quantization)"


def _check_max_outputs(node, arg, scope, table):
    used = [i for i, name in enumerate(node.output) if name]
    if used and used[-1] >= arg:
        yield f"only the first {arg} output(s) are supported, got output {used[-1]} ({node.output[used[-1]]!r})"


def _check_seed_ignored(node, arg, scope, table):
    if any(attr.name == "seed" for attr in node.attribute):
        yield "TensorRT ignores seed, so the draws are not reproducible; feed random numbers as an input"


def _check_rank(node, arg, scope, table):
    for index in _RANK_INPUTS.get(node.op_type, (0,)):
        known = scope.type_of(node.input[index]) if _present(node.input, index) else None
        if known and known[1] is not None and len(known[1]) != arg:
            yield f"{_input_name(node, index, scope)} must be {arg}-D, got rank {len(known[1])}"


def _check_static_input_shape(node, arg, scope, table):
    known = scope.type_of(node.input[0]) if _present(node.input, 0) else None
    if known and known[1] is not None and None in known[1]:
        yield f"{_input_name(node, 0, scope)} must have static dimensions, got {known[1]}"


def _check_input_dtype(node, arg, scope, table):
    for index, want in arg.items():
        got = _dtype(scope, node, int(index))
        if got is not None and got != table["type_aliases"].get(want, want):
            yield f"{_input_name(node, int(index), scope)} must be {want}, got {got}"


def _check_k_max_exclusive(node, arg, scope, table):
    import numpy as np

    if not _present(node.input, 1):                  # TopK-1 had K as the attribute k
        k = _attr(node, "k", scope)
        if k is not None and k >= arg:
            yield f"K must be < {arg}, got {k}"
        return
    value = scope.value(node.input[1])
    if not scope.is_const(node.input[1]) or value is None:
        yield f"K must be a build-time constant below {arg} (an initializer or Constant), got {node.input[1]!r}"
    elif int(np.max(value)) >= arg:
        yield f"K must be < {arg}, got {int(np.max(value))}"


_CHECKS = {
    "attr_equals": _check_attr_equals, "attr_in": _check_attr_in, "const_inputs": _check_const_inputs,
    "forbidden_inputs": _check_forbidden_inputs, "forbidden_outputs": _check_forbidden_outputs,
    "forbidden_attrs": _check_forbidden_attrs, "input_dtype": _check_input_dtype,
    "k_max_exclusive": _check_k_max_exclusive, "max_outputs": _check_max_outputs, "rank": _check_rank,
    "seed_ignored": _check_seed_ignored, "static_input_shape": _check_static_input_shape,
    "zero_point_zero": _check_zero_point_zero,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trtllm.plugins.lint",
                                     description="Check an ONNX model against TensorRT's ONNX op table.")
    parser.add_argument("model", help="path to the .onnx file (external data is not read)")
    parser.add_argument("--trt-version", default="11.1", help="TensorRT version to lint for (default 11.1)")
    args = parser.parse_args(argv)
    try:
        issues = lint_model(args.model, args.trt_version)
    except (ValueError, OSError) as err:             # a bad version or an unreadable file: exit 2
        parser.error(str(err))
    for issue in issues:
        print(issue)
    print(f"{args.model}: {f'{len(issues)} issue(s)' if issues else 'ok'} for TensorRT {args.trt_version}")
    return 1 if issues else 0


if __name__ == "__main__":
    sys.exit(main())
