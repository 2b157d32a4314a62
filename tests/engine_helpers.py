"""Helpers the engine tests share: greedy generation through the scheduler, and engines loaded with
ONNX Runtime's graph optimisations off."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from trtllm.runtime import sampling
from trtllm.runtime.generate import RowState, run_batch


def run_greedy(engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """n greedy tokens per prompt, all prompts in one batch through the Scheduler, as trtllm-run does."""
    greedy = sampling.SamplingParams(temperature=0.0, max_new_tokens=n)
    rows = [RowState(prompt_ids=p, params=greedy, rng=np.random.default_rng(0), eos_ids=frozenset())
            for p in prompts]
    run_batch(engine, rows)
    return [r.output_ids for r in rows]


@contextmanager
def unoptimized_sessions():
    """Engines loaded inside run the graph as written (ORT's graph optimisations off), as TensorRT
    would parse it: ORT's fusions cannot hide a wrong decomposition."""
    import onnxruntime as ort

    from trtllm.runtime.backends import onnxruntime as backend

    original = backend.session_options

    def plain(num_threads=None):
        opts = original(num_threads)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return opts

    backend.session_options = plain
    try:
        yield
    finally:
        backend.session_options = original
