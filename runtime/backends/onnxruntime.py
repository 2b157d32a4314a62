"""ONNX Runtime backend: the embedded default, on any CPU.

KV buffers (the KV manager's numpy arrays) are wrapped as OrtValues without a copy, and each layer's
`present_*` output is bound to the same OrtValue as its `past_*` input, so TensorScatter
writes the new positions in place: no per-step copy or concatenation of the cache.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from trtllm.runtime.engine import StepInputs, StepOutputs
from trtllm.runtime.manifest import Manifest, ManifestError, rebuild_hint


def session_options(num_threads: int | None = None) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = num_threads or int(os.environ.get("TRTLLM_NUM_THREADS", 0)) or 0
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return opts


class OnnxRuntimeEngine:
    def __init__(self, engine_dir, manifest: Manifest, num_threads: int | None = None, graph: str = "compiled"):
        self.manifest = manifest
        path = Path(engine_dir) / manifest.files.get(graph, manifest.files.get("onnx", "llm.onnx"))
        if not path.is_file():
            raise ManifestError(f"{path} is missing; {rebuild_hint(engine_dir)}")
        self.session = ort.InferenceSession(str(path), session_options(num_threads),
                                            providers=["CPUExecutionProvider"])
        self.io = manifest.io
        self.bindings: dict = {}
        self.kv_root = None

    def binding_for(self, kv: list[np.ndarray]):
        """An IOBinding with `kv` bound as both past_* and present_* (in place), made once per set
        of buffers: the scheduler reuses a few views (all slots, single slots) step after step."""
        root = kv[0] if kv[0].base is None else kv[0].base
        if root is not self.kv_root:  # a new KV manager: drop bindings that keep the old one alive
            self.bindings, self.kv_root = {}, root
        key = (kv[0].ctypes.data, kv[0].shape)
        binding = self.bindings.get(key)
        if binding is None:
            binding = self.session.io_binding()
            names = []
            for i in range(self.manifest.model.num_layers):
                names += [(self.io.past_key.format(i=i), self.io.present_key.format(i=i)),
                          (self.io.past_value.format(i=i), self.io.present_value.format(i=i))]
            for (past, present), buf in zip(names, kv):
                if not buf.flags.c_contiguous:
                    raise ValueError(f"KV buffer for {past} must be C-contiguous")
                value = ort.OrtValue.ortvalue_from_numpy(buf)
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
            self.bindings[key] = binding
        return binding

    def step(self, inputs: StepInputs, kv: list[np.ndarray], want_logits: bool = False) -> StepOutputs:
        b, io, s = self.binding_for(kv), self.io, inputs.sampling
        feeds = {
            io.input_ids: inputs.input_ids, io.position_ids: inputs.position_ids,
            io.write_index: inputs.write_index, io.last_index: inputs.last_index,
            io.logit_bias: s.logit_bias, io.penalty_bias: s.penalty_bias, io.seen: s.seen,
            io.repetition_penalty: s.repetition_penalty, io.temperature: s.temperature, io.min_p: s.min_p,
            io.top_k: s.top_k, io.top_p: s.top_p, io.uniform: s.uniform,
            io.num_logprobs: np.array([s.num_logprobs], np.int64),
        }
        for name, array in feeds.items():
            b.bind_cpu_input(name, np.ascontiguousarray(array))
        batch, k = inputs.input_ids.shape[0], s.num_logprobs
        result = {
            io.token_ids: np.empty(batch, np.int64),
            io.top_logprobs: np.empty((batch, k), np.float32),
            io.top_logprob_ids: np.empty((batch, k), np.int64),
            io.logits: np.empty((batch, self.manifest.model.vocab_size), np.float32),
        }
        # Outputs go straight into numpy arrays we own: no copies, and no reliance on output order.
        for name, array in result.items():
            b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        self.session.run_with_iobinding(b)
        return StepOutputs(token_ids=result[io.token_ids], top_logprobs=result[io.top_logprobs],
                           top_logprob_ids=result[io.top_logprob_ids],
                           logits=result[io.logits] if want_logits else None)

    def close(self) -> None:
        self.bindings = {}
        self.session = None
