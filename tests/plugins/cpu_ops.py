"""Shared by the trtllm.cpu op tests: one-node models, sessions with the library registered, a run of
the same checks on the portable code path, and the attention op's error against its reference."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import numpy as np
from onnx import TensorProto, helper

from trtllm.plugins import cpu

ROOT = Path(__file__).resolve().parents[2]


def one_node_model(node, inputs: list, outputs: list, initializers: list = ()) -> bytes:
    """A model of one trtllm.cpu node: value infos in, value infos out, initializers."""
    graph = helper.make_graph([node], "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24), helper.make_opsetid(cpu.DOMAIN, 1)])
    model.ir_version = 11
    return model.SerializeToString()


def session(model: bytes, threads: int = 2) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.register_custom_ops_library(str(cpu.library()))
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def on_portable_path(module: str, expression: str, kernel: str = "generic"):
    """`expression` evaluated after `from tests.plugins.<module> import *`, with TRTLLM_CPU_KERNEL=generic
    forcing the portable C++ (what a CPU without AVX-512 runs; `kernel="avx512"`: AVX-512 without
    VNNI); the library makes that choice once per process, hence a new one. Returns the expression's
    value (through JSON)."""
    code = (f"import json, sys; sys.path.insert(0, '.'); from tests.plugins.{module} import *; "
            f"print(json.dumps({expression}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "TRTLLM_CPU_KERNEL": kernel}, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def portable_only() -> bool:
    """Whether this process's library runs its portable code alone (a CPU other than x86, or
    TRTLLM_CPU_KERNEL=generic): its float16 MatMul's logits measured up to 6.1e-5 from transformers'
    where the AVX-512 and AVX2 paths keep 2e-5, and test_quantized allows it that (the cause is not
    found). Its decode and prefill rows also take one path."""
    import ctypes

    library = cpu.library()
    return library is not None and ctypes.CDLL(str(library)).trtllm_cpu_kernel_path() == 1


def bf16_step(x: np.ndarray) -> np.ndarray:
    """A bfloat16 step (8 significant bits) at each |x|."""
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(x), 1e-30))) - 7)


def relative_error(out: tuple, ref: tuple, kv) -> float:
    """The op's (y, key, value) against the reference's: the largest error relative to its bound (pass:
    <= 1): y 1e-5; the caches 1e-5 in float32, half a step of a 16-bit cache (`kv` its type)."""
    (y, key, value), (ref_y, ref_k, ref_v) = out, ref
    errors = [np.abs(y - ref_y).max() / 1e-5]
    for got, want in ((key, ref_k), (value, ref_v)):
        got = np.asarray(got, np.float64)
        if kv == TensorProto.FLOAT:
            errors.append(np.abs(got - want).max() / 1e-5)
            continue
        step = bf16_step(want) if kv == TensorProto.BFLOAT16 else \
            np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
        errors.append((np.abs(got - want) / step).max() / 0.501)
    return float(np.max(errors))  # a NaN anywhere: NaN, which fails
