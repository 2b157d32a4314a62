"""trtllm.cpu::Sample as a one-node model, for its tests (and their run on the portable code path) and
scripts/bench_sampler.py."""
from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto, helper

from tests.plugins.cpu_ops import one_node_model, session
from trtllm.plugins import cpu
from trtllm.plugins.sample import schema

TYPES = {"float32": TensorProto.FLOAT, "bool": TensorProto.BOOL, "int64": TensorProto.INT64}


def kernel_model(max_top_k: int) -> bytes:
    inputs = [helper.make_tensor_value_info(name, TYPES[dtype], list(shape)) for name, dtype, shape in schema.INPUTS]
    outputs = [helper.make_tensor_value_info(name, TYPES[dtype], list(shape)) for name, dtype, shape in schema.OUTPUTS]
    node = helper.make_node(cpu.SAMPLE, list(schema.INPUT_NAMES), list(schema.OUTPUT_NAMES), domain=cpu.DOMAIN,
                            max_top_k=max_top_k)
    return one_node_model(node, inputs, outputs)


@functools.lru_cache(maxsize=None)
def sample_session(max_top_k: int, threads: int = 2):
    return session(kernel_model(max_top_k), threads)


def run_kernel(case: dict, max_top_k: int):
    return sample_session(max_top_k).run(None, {name: np.asarray(case[name]) for name in schema.INPUT_NAMES})
