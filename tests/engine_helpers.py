"""Helpers the engine tests share: greedy generation through the scheduler, and engines loaded with
ONNX Runtime's graph optimisations off."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from trtllm.runtime import sampling
from trtllm.runtime.generate import RowState, run_rows


def run_greedy(engine, prompts: list[list[int]], n: int, adapters: list | None = None,
               num_slots: int | None = None) -> list[list[int]]:
    """n greedy tokens per prompt through the Scheduler, as trtllm-run does: all prompts in one batch,
    or `num_slots` at a time (in flight); `adapters`: each prompt's LoRA adapter (None: the base model)."""
    greedy = sampling.SamplingParams(temperature=0.0, max_new_tokens=n)
    rows = [RowState(prompt_ids=p, params=greedy, rng=np.random.default_rng(0), eos_ids=frozenset(), adapter=a)
            for p, a in zip(prompts, adapters or [None] * len(prompts))]
    run_rows(engine, rows, num_slots)
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
