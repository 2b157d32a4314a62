"""ONNX Runtime backend: the embedded default, on any CPU.

KV buffers (the KV manager's numpy arrays) are wrapped as OrtValues without a copy, and each layer's
`present_*` output is bound to the same OrtValue as its `past_*` input, so TensorScatter
(GroupQueryAttention in the lowered form, ScatterND in the legacy graph) writes the new positions in
place: no per-step copy or concatenation of the cache.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import platform
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from trtllm.plugins import cpu as cpu_kernels
from trtllm.runtime import hugepages, lora
from trtllm.runtime.engine import StepInputs, StepOutputs, optional_inputs_mismatch, vision_feeds
from trtllm.runtime.manifest import BFLOAT16, Manifest, ManifestError, ModelShape, rebuild_hint


PROMPT, GENERATED = np.zeros(1, np.int64), np.ones(1, np.int64)  # the `generated` input's two values


SHARED_THREADS: list[int] = []  # the size of the process's shared pool of workers, once made


def session_options(num_threads: int | None = None, spin: bool = True, shared: bool = False) -> ort.SessionOptions:
    """`shared`: on the process's one shared pool of `num_threads` workers (ONNX Runtime's global
    thread pool, made by the first such session; its size is then fixed, and its workers spin), else
    on a pool of its own. Two engines that take turns, a draft model's and the model's, each with a
    pool of its own, fight for the cores: a pool's workers spin for a while after its step, while the
    other's step wants them (on 2 cores the demo's int4 draft took 10.4 ms a step beside the float32
    model's pool, 7.1 ms on one pool). Once the shared pool is made, every later session of the
    process must run on it too (ONNX Runtime refuses a pool of its own then)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if SHARED_THREADS or shared and spin:
        if not SHARED_THREADS:
            ort.set_global_thread_pool_sizes(num_threads or 0, 1)  # (0: ONNX Runtime's default, one per core)
            SHARED_THREADS.append(num_threads or 0)
        opts.use_per_session_threads = False
        opts.intra_op_num_threads = opts.inter_op_num_threads = 0  # (the pool's: others would be warned of)
    else:
        opts.intra_op_num_threads = num_threads or 0  # (0: ONNX Runtime's default, one per core)
        opts.inter_op_num_threads = 1
    if not spin:  # (its workers sleep between a step's parallel parts instead of busy-waiting: trtllm-run --no-spin)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return opts


def kv_value(buf: np.ndarray, kv_dtype: str) -> ort.OrtValue:
    """An OrtValue over a KV buffer, no copy: a bfloat16 cache's bits (uint16, see
    kv_cache.kv_storage) are typed bfloat16 for the graph."""
    if kv_dtype == "bfloat16":
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buf, BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(buf)


def cpu_signature() -> str:
    """This CPU's instruction sets: ONNX Runtime's MLAS and our kernels pick their code by them."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1] for ln in f if ln.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:16]
    return f"cpu {platform.machine()} {digest}"


ORT_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "bfloat16": "tensor(bfloat16)",
             "int8": "tensor(int8)"}


def graph_mismatch(session, m: Manifest, draft: bool = False) -> str:
    """Where the graph and the manifest disagree on what the runtime sizes and binds (an edited or
    mixed-up engine directory), or "": ONNX Runtime would fail every step instead, or worse.
    `draft`: the EAGLE head's graph, under its own model shape (DraftEngine)."""
    inputs = {i.name: i for i in session.get_inputs()}
    outputs = {o.name: o for o in session.get_outputs()}
    io, model = m.io, m.model
    for name in (io.input_ids, io.position_ids, io.write_index, io.last_index) + ((io.hidden_in,) if draft else ()):
        if name not in inputs:
            return f"the graph has no input {name!r}"
    logprobs = not draft and (m.prompt_logits or isinstance(m.eagle, dict) and m.eagle.get("logprobs"))
    for name in (io.draft_ids, io.draft_hidden) if draft else (io.token_ids, io.top_logprobs) + (
            (io.verify_logits,) if logprobs else ()):
        if name not in outputs:
            return f"the graph has no output {name!r}"
    if not draft:
        problem = optional_inputs_mismatch(set(inputs), m)
        if problem:
            return problem
    layers = sum(1 for name in inputs if name.startswith(io.past_key.split("{")[0]))
    if layers != model.num_kv_layers or io.past_key.format(i=0) not in inputs:
        said = "model.num_layers" if model.kv_layers is None else "model.kv_layers gives"
        return f"the graph has {layers} layers' {io.past_key!r} inputs, the manifest says {said} {model.num_kv_layers}"
    for i, (heads, row) in enumerate(model.kv_shapes()):
        kv = inputs.get(io.past_key.format(i=i))
        if kv is None:
            return f"the graph has no input {io.past_key.format(i=i)!r}"
        want = [None, heads, None, row]  # [batch, kv heads, capacity, head_dim (+ 4: int8)]
        if len(kv.shape) != 4 or any(w is not None and isinstance(d, int) and d != w for d, w in zip(kv.shape, want)):
            return f"{kv.name} is {kv.shape}, the manifest says [batch, {heads}, capacity, {row}]"
        if kv.type != ORT_TYPES[model.kv_dtype]:
            return f"{kv.name} is {kv.type}, the manifest says model.kv_dtype {model.kv_dtype}"
    states = model.state_shapes or ()
    given = sum(1 for name in inputs if name.startswith(io.past_state.split("{")[0]))
    if given != len(states):
        return f"the graph has {given} {io.past_state!r} inputs, the manifest's model.state_shapes {len(states)}"
    for i, shape in enumerate(states):
        state = inputs.get(io.past_state.format(i=i))
        if state is None or list(state.shape[1:]) != list(shape) or state.type != "tensor(float)":
            return (f"the graph's {io.past_state.format(i=i)!r} is not float32 [batch, {', '.join(map(str, shape))}] "
                    "(model.state_shapes)")
    embeds = model.hidden_size * (1 + m.vision.get("deepstack_layers", 0)) if m.vision else None
    for name, width, what in () if draft else ((io.logits, model.vocab_size, "model.vocab_size"),
                                               (io.top_logprobs, m.logprob_width, "min(max_num_logprobs, max_top_k)"),
                                               (io.image_embeds, embeds, "model.hidden_size x (1 + "
                                                                         "vision.deepstack_layers)")):
        shape = (outputs.get(name) or inputs.get(name)).shape if name in outputs or name in inputs else None
        if shape and isinstance(shape[-1], int) and shape[-1] != width:
            return f"{name} is {shape[-1]} wide, the manifest says {what} {width}"
    return ""


def without_our_kernels(m: Manifest) -> str:
    """The options that build this engine on ONNX Runtime's own kernels: --cpu-kernels onnxruntime,
    and in place of what only ours run (bfloat16, an int8 KV cache, integer activations, quantized
    float16) what theirs do."""
    words = ["--dtype float16"] if m.dtype == "bfloat16" else []
    if m.model.kv_dtype == "int8":
        words.append("--kv-cache-dtype auto")
    if m.build_config.get("activations", "float32") != "float32":
        words.append("--activations float32")
    if m.quantization != "none" and m.dtype == "float16":
        words.append("--dtype float32")
    return " ".join(words + ["--cpu-kernels onnxruntime"])


class OnnxRuntimeEngine:
    draft_graph = False  # the EAGLE head's graph (DraftEngine): graph_mismatch checks its inputs and outputs

    def __init__(self, engine_dir, manifest: Manifest, num_threads: int | None = None, graph: str = "compiled",
                 huge_pages: bool = True, spin: bool = True, shared_threads: bool = False):
        """`shared_threads`: run on the process's shared pool of workers (session_options)."""
        self.manifest, self.engine_dir = manifest, Path(engine_dir)
        self.num_threads = num_threads  # (a vision-language engine's image encoder takes as many: runtime/media.py)
        path = Path(engine_dir) / manifest.files.get(graph, manifest.files.get("onnx", "llm.onnx"))
        if graph != "compiled" and manifest.model.kv_dtype == "int8":
            raise ManifestError(f"{engine_dir} keeps an int8 KV cache, which only its compiled form reads (our "
                                f"attention kernel); its standard-op {path.name} keeps a {manifest.dtype} one: load "
                                "graph='compiled'")
        if not path.is_file():
            raise ManifestError(f"{path} is missing; {rebuild_hint(engine_dir)}")
        opts = session_options(num_threads, spin, shared_threads)
        if cpu_kernels.needed_by(manifest.lowerings):  # attention or quantized MatMuls as plugins/cpu's kernels
            library = cpu_kernels.library()
            if library is None:
                raise ManifestError(f"{engine_dir} runs on trtllm-edge's native CPU kernels, "
                                    f"but {cpu_kernels.missing_hint()}; or rebuild the engine with "
                                    f"{without_our_kernels(manifest)}")
            try:
                opts.register_custom_ops_library(str(library))
            except Exception as e:  # noqa: BLE001 - ORT's Fail: a damaged file, another library by that name
                raise ManifestError(f"the native CPU kernel library {library} cannot be loaded ({str(e)[:200]}): "
                                    "rebuild it with `python -m trtllm.plugins.cpu.build --force`, or rebuild the "
                                    f"engine with {without_our_kernels(manifest)}") from e
            cpu_kernels.set_huge_pages(huge_pages)  # they copy their weights onto huge pages themselves
        before = hugepages.snapshot() if huge_pages else None
        try:
            self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - ORT's own error types (a truncated or corrupt model file)
            if isinstance(e, MemoryError):
                raise
            raise ManifestError(f"{path} cannot be loaded by ONNX Runtime ({type(e).__name__}: "
                                f"{str(e)[:300]}); {rebuild_hint(engine_dir)}") from e
        problem = graph_mismatch(self.session, manifest, draft=self.draft_graph)
        if problem:
            raise ManifestError(f"{path} does not match {Path(engine_dir) / 'manifest.json'} ({problem}); "
                                f"{rebuild_hint(engine_dir)}")
        # The packed weights ONNX Runtime just allocated, onto huge pages (see runtime/hugepages.py).
        self.huge_pages = hugepages.promote(before) if huge_pages else hugepages.Report(skipped="turned off")
        self.io = manifest.io
        # engines on plugins/cpu's MatMul kernels: whether a step's tokens are generated or a prompt's
        self.has_generated = self.io.generated in {i.name for i in self.session.get_inputs()}
        self.bindings: dict = {}
        self.bound: dict = {}    # per binding: input name -> (array, (pointer, shape, dtype)) bound now
        self.outputs: dict = {}  # per (binding, batch, K): numpy arrays the outputs are written to
        self.kv_root = None
        self.last_kv = self.last_binding = None
        self.no_adapter = lora.base_adapter(manifest).arrays if manifest.lora else {}
        # EAGLE engines' inputs for a step without them (verify_index [B, 0], verify_uniform [B, T],
        # tree_mask [B, S, 0]), one array per shape and dtype: the same object, so bound once
        self.zeros: dict[tuple, np.ndarray] = {}
        self.verify_buffer = np.empty(0, np.float32)  # verify_logits (EAGLE, prompt_logits), every binding's

    def binding_for(self, kv: Sequence[np.ndarray]):
        """An IOBinding with `kv` bound as both past_* and present_* (in place), made once per set
        of buffers: the scheduler reuses a few views (all slots, single slots) step after step."""
        if kv is self.last_kv:  # the KV manager hands out the same tuple for the same slots
            return self.last_binding
        root = kv[0] if kv[0].base is None else kv[0].base
        if root is not self.kv_root:  # a new KV manager: drop bindings that keep the old one alive
            self.bindings, self.kv_root, self.bound, self.outputs = {}, root, {}, {}
        key = (kv[0].ctypes.data, kv[0].shape)
        binding = self.bindings.get(key)
        if binding is None:
            binding = self.session.io_binding()
            model = self.manifest.model
            pairs = self.io.kv_pairs(model.num_kv_layers) + self.io.state_pairs(len(model.state_shapes or ()))
            for k, ((past, present), buf) in enumerate(zip(pairs, kv, strict=True)):
                if not buf.flags.c_contiguous:
                    raise ValueError(f"KV buffer for {past} must be C-contiguous")
                # (the recurrent states after the KV: float32 whatever the KV's type)
                value = kv_value(buf, model.kv_dtype if k < 2 * model.num_kv_layers else "float32")
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
            self.bindings[key] = binding
        self.last_kv, self.last_binding = kv, binding
        return binding

    @functools.cached_property
    def numerics(self) -> str:
        """What besides the engine's files decides the low bits of its results (saved system-prompt
        KV is keyed by it). Asked for by trtllm-run's prefix store only: not work for every load
        (the build's check, the EAGLE head, the benchmarks), as it hashes the kernel library."""
        kernels = cpu_kernels.fingerprint() if cpu_kernels.needed_by(self.manifest.lowerings) else "no trtllm.cpu"
        return f"onnxruntime {ort.__version__}; {kernels}; {cpu_signature()}"

    def zeros_of(self, shape: tuple, dtype) -> np.ndarray:
        key = (tuple(shape), np.dtype(dtype).str)
        if key not in self.zeros:
            self.zeros[key] = np.zeros(shape, dtype)
        return self.zeros[key]

    def step(self, inputs: StepInputs, kv: Sequence[np.ndarray], want_logits: bool = False) -> StepOutputs:
        b, io, s = self.binding_for(kv), self.io, inputs.sampling
        feeds = {
            io.input_ids: inputs.input_ids, io.position_ids: inputs.position_ids,
            io.write_index: inputs.write_index, io.last_index: inputs.last_index,
            io.logit_bias: s.logit_bias, io.penalty_bias: s.penalty_bias, io.seen: s.seen,
            io.repetition_penalty: s.repetition_penalty, io.temperature: s.temperature, io.min_p: s.min_p,
            io.top_k: s.top_k, io.top_p: s.top_p, io.uniform: s.uniform,
            **(inputs.lora or self.no_adapter),
        }
        if self.has_generated:
            feeds[io.generated] = PROMPT if inputs.prompt else GENERATED
        batch, m = inputs.input_ids.shape[0], self.manifest
        if m.eagle or m.prompt_logits:
            # no positions to verify (or score): [B, 0], and lm_head runs on the sampler's row alone
            feeds[io.verify_index] = inputs.verify_index if inputs.verify_index is not None \
                else self.zeros_of((batch, 0), np.int64)
        if m.samples_verified:
            feeds[io.verify_uniform] = inputs.verify_uniform if inputs.verify_uniform is not None \
                else self.zeros_of(feeds[io.verify_index].shape, np.float32)
        feeds.update(vision_feeds(m, inputs, batch, self.zeros_of))
        if m.eagle:
            if m.eagle.get("tree"):  # no tree: [B, S, 0], the causal mask alone
                feeds[io.tree_mask] = inputs.tree_mask if inputs.tree_mask is not None \
                    else self.zeros_of((batch, inputs.input_ids.shape[1], 0), np.bool_)
        # Inputs are bound without a copy (ORT reads the numpy buffer). The sampler's arrays are
        # the same buffers step after step (updated in place), and so are a LoRA batch's adapter
        # arrays, so they are bound only when the buffer changes: per-step Python work stays a few
        # small binds.
        # `bound` keeps each bound array (alive, so its memory is never reused by another) and its
        # key: the same object is the same memory, checked first because it is the common case
        # (the scheduler reuses its decode feeds and sampler views) and costs no ctypes lookup.
        bound = self.bound.setdefault(id(b), {})
        for name, array in feeds.items():
            held = bound.get(name)
            if held is not None and held[0] is array:
                continue
            key = (array.ctypes.data, array.shape, array.dtype.str)
            if held is None or held[1] != key or not array.flags.c_contiguous:
                array = np.ascontiguousarray(array)
                b.bind_cpu_input(name, array)
                key = (array.ctypes.data, array.shape, array.dtype.str)
            bound[name] = (array, key)
        outs = self.outputs.get((id(b), batch))
        if outs is None:
            k = m.logprob_width
            outs = {io.token_ids: np.empty(batch, np.int64),
                    io.top_logprobs: np.empty((batch, k), np.float32),
                    io.top_logprob_ids: np.empty((batch, k), np.int64),
                    io.logits: np.empty((batch, m.model.vocab_size), np.float32)}
            self.outputs[(id(b), batch)] = outs
        if bound.get("outputs") != batch:
            for name in (io.token_ids, io.top_logprobs, io.top_logprob_ids, io.logits):
                b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(outs[name]))
            bound["outputs"] = batch
        verify = self.bind_verify(b, bound, inputs.input_ids.shape[1], feeds[io.verify_index].shape[1]) \
            if m.eagle or m.prompt_logits else None
        self.session.run_with_iobinding(b)
        # Copies: the output buffers are reused by the next step. Rows keep the k logprobs asked for.
        # The logits are a view (B x V floats, read before the next step: a copy of 1.5 MB a step
        # at batch 8 cost 0.2-0.4 ms, for the few tokens drawn outside the top K).
        k = s.num_logprobs
        return StepOutputs(token_ids=outs[io.token_ids].copy(), top_logprobs=outs[io.top_logprobs][:, :k].copy(),
                           top_logprob_ids=outs[io.top_logprob_ids][:, :k].copy(),
                           logits=outs[io.logits] if want_logits else None,
                           **({} if verify is None else {
                               "verify_ids": None if verify[0] is None else verify[0].copy(),
                               "hidden": None if verify[1] is None else verify[1].copy(),
                               # (a view, not a copy: B x T x V floats; its rows are read before the next step)
                               "verify_logits": verify[2] if want_logits else None}))

    def bind_verify(self, b, bound: dict, seq: int, width: int) -> tuple[np.ndarray | None, ...]:
        """(verify_ids [B,T], eagle_hidden [B,S,H], verify_logits [B,T,V]): the verified positions'
        tokens, EAGLE's hidden states and the verified (or scored) positions' logits, each None
        where the graph has not got it.
        Their shapes change with the step, so they are bound whenever the shape is not the one
        bound. The logits are written where the sampler reads them, into a view of one buffer for
        every binding that only grows, by doubling (a buffer per shape would be new pages each time,
        and one per binding, one per batch width, would add up)."""
        io, m = self.io, self.manifest
        logits = m.prompt_logits or m.eagle.get("logprobs")
        size = bound["outputs"] * width * m.model.vocab_size
        if logits and self.verify_buffer.size < size:
            self.verify_buffer = np.empty(max(size, 2 * self.verify_buffer.size), np.float32)
        # (a plain engine's key leaves out seq: it has no per-position output, so a prompt's step
        # and a decode step of the same width bind nothing new)
        key = (bound["outputs"], seq if m.eagle else 0, width, id(self.verify_buffer))
        held = bound.get("verify")
        if held is None or held[0] != key:
            eagle = bool(m.eagle)
            arrays = (np.empty((key[0], width), np.int64) if m.samples_verified else None,
                      np.empty((key[0], seq, m.model.hidden_size), np.float32) if eagle else None,
                      # (the buffer grows only for a graph with the output: an older EAGLE engine's stays empty)
                      self.verify_buffer[:size].reshape(key[0], width, m.model.vocab_size) if logits else None)
            for name, array in zip((io.verify_ids, io.eagle_hidden, io.verify_logits), arrays):
                if array is not None:
                    b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
            held = bound["verify"] = (key, arrays)
        return held[1]

    def close(self) -> None:
        # Everything that holds the session (bindings) or the last run's arrays goes, not just the session.
        self.bindings, self.bound, self.outputs = {}, {}, {}
        self.kv_root = self.last_kv = self.last_binding = None
        self.session = None


class DraftEngine(OnnxRuntimeEngine):
    """The draft head's ONNX Runtime session; its KV buffers are bound in place like the base's.

    It runs on the calling thread only: the head is one layer, and a thread pool of its own would
    fight the model's pool, whose workers spin for a while after each step, for the same cores
    (on 2 cores, 2 threads made a k=1 cycle 2.1x slower than 1)."""

    draft_graph = True

    def __init__(self, engine_dir, manifest: Manifest, huge_pages: bool = True, graph: str = "compiled", **_):
        """`graph`: "onnx", the head's ONNX graph itself (a TensorRT engine's, checked before its plan)."""
        e = manifest.eagle
        draft = dataclasses.replace(manifest, model=ModelShape(**e["model"]), files={graph: e[graph]},
                                    lowerings=tuple(e["lowerings"]), lora={}, eagle={})
        self.tree = bool(e.get("tree"))  # its graph takes draft trees (tree_mask, draft_index)
        self.top_k = e.get("top_k", 0)
        super().__init__(engine_dir, draft, num_threads=1, graph=graph, huge_pages=huge_pages)

    def draft(self, ids, hidden, positions, write_index, last_index, kv, prompt: bool = False, top: bool = False,
              nodes: np.ndarray | None = None, tree_mask: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """One draft step: (drafted token ids [B], the draft's hidden state at last_index [B,H]); with
        `top` also (the top_k best ids and their log-probabilities at last_index and at `nodes`
        [B,1+T,K], best first, and the hidden states at `nodes` [B,T,H]). Tree heads only: `nodes`
        (draft_index [B,T], default none) and `tree_mask` ([B,S,T'], default [B,S,0]: causal).
        `prompt`: the step runs over a prompt's pairs (see StepInputs.prompt)."""
        b, io = self.binding_for(kv), self.io
        batch, seq = ids.shape
        feeds = ((io.input_ids, ids), (io.hidden_in, hidden), (io.position_ids, positions),
                 (io.write_index, write_index), (io.last_index, last_index))
        if self.has_generated:
            feeds += ((io.generated, PROMPT if prompt else GENERATED),)
        if self.tree:
            nodes = np.zeros((batch, 0), np.int64) if nodes is None else nodes
            feeds += ((io.draft_index, nodes),
                      (io.tree_mask, np.zeros((batch, seq, 0), np.bool_) if tree_mask is None else tree_mask))
        held = [np.ascontiguousarray(a) for _, a in feeds]  # alive until the run is over
        for (name, _), array in zip(feeds, held):
            b.bind_cpu_input(name, array)
        outs = self.outputs.get((id(b), batch))
        if outs is None:
            outs = self.outputs[(id(b), batch)] = (np.empty(batch, np.int64),
                                                   np.empty((batch, self.manifest.model.hidden_size), np.float32))
            for name, array in zip((io.draft_ids, io.draft_hidden), outs):
                b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        t = 0 if nodes is None else nodes.shape[1]
        extra = (np.empty((batch, 1 + t, self.top_k), np.int64), np.empty((batch, 1 + t, self.top_k), np.float32),
                 np.empty((batch, t, self.manifest.model.hidden_size), np.float32))
        # (bound every run: their shapes follow the step's nodes; an older head has none)
        for name, array in zip((io.draft_top_ids, io.draft_top_logprobs, io.draft_node_hidden),
                               extra if self.top_k else ()):
            if name != io.draft_node_hidden or self.tree:
                b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        self.session.run_with_iobinding(b)
        return (outs[0].copy(), outs[1].copy()) + (extra if top else ())
