"""Helpers the engine tests share: greedy generation through the scheduler, engines loaded with
ONNX Runtime's graph optimisations off, and a saved system prompt's round trip through trtllm-run."""
from __future__ import annotations

import json
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


def check_batched_and_restored(run_cli, engine, tmp_path) -> None:
    """trtllm-run end to end: two requests sharing a saved system prompt answer in one batch as each
    does alone, and a later run reads the saved KV back for both (the reused tokens double: the
    first run shares the prompt between them) with the same answers, warning of nothing."""
    requests = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
                 "save_system_prompt_kv_cache": True} for text in ("hello there", "a longer question, with words")]

    def answers(batch_size, reqs, *extra):
        result, body = run_cli(engine, {"batch_size": batch_size, "temperature": 0, "max_generate_length": 8,
                                        "requests": reqs}, *extra)
        assert result.exit_code == 0 and "warning" not in result.output, result.output
        return [r["output_text"] for r in body["responses"]]

    profile = tmp_path / "profile.json"
    cache = ["--kv-cache-dir", str(tmp_path / "kv"), "--profile", str(profile)]
    batched = answers(2, requests, *cache)
    shared = json.loads(profile.read_text())["prefill"]["reused_tokens"]  # the second request shares the first's
    assert batched == [answers(1, [r])[0] for r in requests]
    assert answers(2, requests, *cache) == batched  # a new run: the saved KV, read back for both
    assert json.loads(profile.read_text())["prefill"]["reused_tokens"] == 2 * shared > 0


@contextmanager
def unoptimized_sessions():
    """Engines loaded inside run the graph as written (ORT's graph optimisations off), as TensorRT
    would parse it: ORT's fusions cannot hide a wrong decomposition."""
    import onnxruntime as ort

    from trtllm.runtime.backends import onnxruntime as backend

    original = backend.session_options

    def plain(*args, **kwargs):
        opts = original(*args, **kwargs)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return opts

    backend.session_options = plain
    try:
        yield
    finally:
        backend.session_options = original


class MemoryPrefixes:
    """An in-memory saved-prefix store (runtime/prefix_cache.py's interface). It checks that what it
    restores has the layout the scheduler asks for (the model's KV, or the draft head's)."""

    def __init__(self):
        self.saved = {}

    def load(self, prefix_ids, adapter=None, expect=None):
        kv = self.saved.get((tuple(prefix_ids), adapter))
        if kv is not None and expect is not None:
            assert (kv.shape, kv.dtype) == (tuple(expect[0]), np.dtype(expect[1])), (kv.shape, kv.dtype, expect)
        return kv

    def save(self, prefix_ids, kv, adapter=None):
        self.saved[(tuple(prefix_ids), adapter)] = kv.copy()

    def has(self, prefix_ids, adapter=None):
        return (tuple(prefix_ids), adapter) in self.saved


def resized(engine_dir) -> None:
    """After a test rewrote an engine's graph files: the manifest's `sizes` of them as they are now
    (the runtime refuses a graph of another size than the build wrote)."""
    from pathlib import Path

    from trtllm.builder.engine_dir import binary_sizes

    path = Path(engine_dir) / "manifest.json"
    raw = json.loads(path.read_text())
    raw["sizes"] = binary_sizes(Path(engine_dir))
    path.write_text(json.dumps(raw, indent=2) + "\n")
