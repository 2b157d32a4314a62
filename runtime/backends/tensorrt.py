"""TensorRT backend (NVIDIA GPUs and Jetson): runs `llm.plan` with cuda-python buffers and streams.

`tensorrt` and `cuda` are imported only when an engine is loaded. The KV cache lives on the device
(DeviceKVCache: the same slot books as the host KV manager, device storage) and is bound in place:

    step(S > 1) -> optimization profile 0 (prefill)    step(S == 1) -> profile 1 (decode)
    host inputs --H2D--> preallocated device inputs ─┐
    KV slots [start:stop] = base + start * slot_bytes ├─> execute_async_v3 ─> token ids, logprobs --D2H--> host
    present_* bound to the same address as past_* ───┘   (legacy graphs: present_* -> scratch, copied back)

A plan is tied to the TensorRT version and GPU it was built with; loading it anywhere else is
refused with the build command to re-run.
"""
from __future__ import annotations

import dataclasses
import weakref
from pathlib import Path
from typing import NamedTuple

import numpy as np

from trtllm.runtime import lora
from trtllm.runtime.engine import StepInputs, StepOutputs, optional_inputs_mismatch, vision_feeds
from trtllm.runtime.kv_cache import KVCacheManager, kv_storage, layer_rows, saved_form
from trtllm.runtime.manifest import Manifest, ManifestError, ModelShape, plan_pending, rebuild_hint

PREFILL, DECODE = 0, 1  # the builder's profile order (builder/tensorrt.py)
ALIGNMENT = 256         # TensorRT: every tensor address must be 256-byte aligned


_loggers: dict[int, object] = {}


def shared_logger(trt):
    """One trt.Logger for the process (per tensorrt module): TensorRT keeps the first logger a
    builder or runtime was given, and warns when another comes."""
    if id(trt) not in _loggers:
        _loggers[id(trt)] = trt.Logger(trt.Logger.WARNING)
    return _loggers[id(trt)]


def trt_rebuild_hint(engine_dir) -> str:
    return rebuild_hint(engine_dir, "tensorrt")


def import_tensorrt(engine_dir):
    try:
        import tensorrt as trt
    except ImportError:
        raise ManifestError(f"{engine_dir} is a TensorRT engine, but TensorRT does not import here; install "
                            f"TensorRT (on Jetson: JetPack's python3-libnvinfer) or "
                            f"{rebuild_hint(engine_dir, 'onnxruntime')}") from None
    return trt


def deserialize(trt, path: Path, engine_dir, advice: str = "") -> tuple:
    """(runtime, engine, execution context) of the plan at `path`, or ManifestError: one that does
    not deserialize names the build to re-run; one without a context (TensorRT says why in its log:
    most often the device memory its activations take) says so, then `advice`."""
    runtime = trt.Runtime(shared_logger(trt))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise ManifestError(f"TensorRT could not deserialize {path}; {trt_rebuild_hint(engine_dir)}")
    context = engine.create_execution_context()
    if context is None:
        raise ManifestError(f"TensorRT could not create an execution context for {path} (its error is above; "
                            f"usually too little free device memory){advice}")
    return runtime, engine, context


def held_dtype(trt, dtype) -> np.dtype:
    """The numpy type that holds a tensor of TensorRT's `dtype`: trt.nptype's, and for bfloat16 (a
    bfloat16 engine's KV, which nptype refuses: numpy has none) its bits, as kv_cache.kv_storage."""
    if dtype == getattr(trt, "bfloat16", None):
        return np.dtype(np.uint16)
    return np.dtype(trt.nptype(dtype))


class DeviceView(NamedTuple):
    """Slots [start, stop) of one layer's K or V buffer: contiguous device memory."""

    ptr: int
    shape: tuple[int, ...]
    nbytes: int


class DeviceKVCache(KVCacheManager):
    """KVCacheManager with device storage; read/write copy one slot to and from the host. Each buffer
    has its layer's shape (model.kv_layers: Gemma 4's layers differ), `shapes[i]` and `slot_bytes[i]`."""

    def __init__(self, model: ModelShape, num_slots: int, capacity: int, stream):
        self.stream = stream
        self.scratch = None  # (copy_positions': one slot's worth of the widest buffer per slot, made on first use)
        super().__init__(model, num_slots, capacity)

    def allocate(self, num_slots: int, capacity: int):
        from trtllm.runtime.backends import cuda

        self.itemsize = kv_storage(self.model.kv_dtype).itemsize
        self.shapes = [(num_slots, heads, capacity, row) for heads, row in self.model.kv_shapes() for _ in "kv"]
        self.slot_bytes = [int(np.prod(shape[1:])) * self.itemsize for shape in self.shapes]
        for shape, size in zip(self.shapes, self.slot_bytes):
            if size % ALIGNMENT:  # every slot's view is a bound address
                raise ManifestError(f"a KV slot of {shape[1:]} {self.model.kv_dtype} is not a multiple of {ALIGNMENT} "
                                    "bytes, which TensorRT needs for each bound address; rebuild the engine")
        buffers = [cuda.DeviceBuffer(int(np.prod(shape)) * self.itemsize) for shape in self.shapes]
        weakref.finalize(self, lambda bs=buffers: [b.close() for b in bs])
        return buffers

    def grow(self, capacity: int) -> None:
        """Never needed: the plan's capacity is static, and the cache is allocated at it (make_kv_cache)."""
        if min(capacity, self.limit) > self.capacity:
            raise RuntimeError(f"the TensorRT KV cache cannot grow past the plan's capacity {self.capacity}")

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)

    def view(self, start: int, stop: int) -> list[DeviceView]:
        return [DeviceView(b.ptr + start * slot, (stop - start, *shape[1:]), (stop - start) * slot)
                for b, shape, slot in zip(self.buffers, self.shapes, self.slot_bytes)]

    def layers(self):
        """Per buffer: (buffer, kv_heads, capacity, row elements, slot bytes)."""
        return [(b, shape[1], shape[2], shape[3], slot) for b, shape, slot in zip(self.buffers, self.shapes, self.slot_bytes)]

    def _rows(self, slot: int, length: int):
        """Per buffer: kv_heads rows of `length` positions inside one slot (pitch = capacity)."""
        return [(b.ptr + slot * size, cap * dim * self.itemsize, length * dim * self.itemsize, heads)
                for b, heads, cap, dim, size in self.layers()]

    def clear(self, start: int, stop: int) -> None:
        """Slots start..stop-1 zeroed on the device, in stream order (KVCacheManager.clear's reason: a
        failed row's KV may be NaN; the host version assigned into the buffers, which fails here)."""
        for b, size in zip(self.buffers, self.slot_bytes):
            self.stream.zero(b.ptr + start * size, (stop - start) * size)

    def copy_positions(self, dst, src, start: int, stop: int) -> None:
        """KVCacheManager.copy_positions on the device, in stream order: per buffer, the sources'
        positions into a scratch buffer first (slots trade places), then into the destinations; one
        strided copy each way per slot (kv_heads rows of stop - start positions)."""
        from trtllm.runtime.backends import cuda

        if self.scratch is None:  # (never short: at most every slot is a source)
            self.scratch = cuda.DeviceBuffer(len(self.owners) * max(self.slot_bytes))
            weakref.finalize(self, self.scratch.close)
        for b, heads, cap, dim, size in self.layers():
            pitch, width, offset = cap * dim * self.itemsize, (stop - start) * dim * self.itemsize, start * dim * self.itemsize
            for i, s in enumerate(src):
                self.stream.copy_2d(self.scratch.ptr + i * size + offset, pitch,
                                    b.ptr + int(s) * size + offset, pitch, width, heads, "d2d")
            for i, d in enumerate(dst):
                self.stream.copy_2d(b.ptr + int(d) * size + offset, pitch,
                                    self.scratch.ptr + i * size + offset, pitch, width, heads, "d2d")

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """On the device, in stream order (it went to the host and back)."""
        self.copy_positions(np.array([dst]), np.array([src]), 0, length)

    def move_position(self, slot: int, src: int, dst: int) -> None:
        """On the device, in stream order (the next step sees it): one strided copy per buffer."""
        for b, heads, cap, dim, size in self.layers():
            row, pitch = dim * self.itemsize, cap * dim * self.itemsize
            base = b.ptr + slot * size
            self.stream.copy_2d(base + dst * row, pitch, base + src * row, pitch, row, heads, "d2d")

    def read(self, slot: int, length: int) -> np.ndarray:
        rows = []
        for (src, pitch, row, heads), (_, _, _, dim, _) in zip(self._rows(slot, length), self.layers()):
            out = np.empty((heads, length, dim), kv_storage(self.model.kv_dtype))
            self.stream.copy_2d(out.ctypes.data, row, src, pitch, row, heads, "d2h")
            rows.append(out)
        self.stream.sync()
        return saved_form(self.model, rows)

    def write(self, slot: int, kv: np.ndarray) -> None:
        rows = [np.ascontiguousarray(r, kv_storage(self.model.kv_dtype)) for r in layer_rows(self.model, kv)]
        for (dst, pitch, row, heads), data in zip(self._rows(slot, kv.shape[2]), rows):
            self.stream.copy_2d(dst, pitch, data.ctypes.data, row, row, heads, "h2d")
        self.stream.sync()


class TensorRTEngine:
    top_k = 0  # the EAGLE head's draft_top_ids width (TensorRTDraftEngine)
    draft_graph = False  # the EAGLE head's plan (TensorRTDraftEngine): no LoRA or verification inputs

    def __init__(self, engine_dir, manifest: Manifest, **options):
        if plan_pending(manifest):  # (trtllm-build --plan-later)
            raise ManifestError(f"{engine_dir} was exported without its TensorRT plan (trtllm-build --plan-later): "
                                f"build it on this machine with python -m trtllm.builder.plan {engine_dir}")
        trt = import_tensorrt(engine_dir)
        from trtllm.runtime.backends import cuda

        self.trt, self.cuda, self.manifest, self.io = trt, cuda, manifest, manifest.io
        self.engine_dir = Path(engine_dir)
        self.check_plan(engine_dir, trt.__version__, cuda.device_info())
        path = Path(engine_dir) / manifest.files.get("plan", "llm.plan")
        if not path.is_file():
            raise ManifestError(f"{path} is missing; {trt_rebuild_hint(engine_dir)}")
        self.register_plugins(engine_dir)
        self.runtime, self.engine, self.context = deserialize(
            trt, path, engine_dir, ": free some, or rebuild for smaller limits (--max-batch-size, --max-input-len, "
            f"--max-kv-cache-capacity): {trt_rebuild_hint(engine_dir)}")
        self.stream = cuda.Stream()
        self.profile: int | None = None
        self.kv_pairs = self.io.kv_pairs(manifest.model.num_kv_layers)
        self.in_place = self.kv_in_place(engine_dir)
        kv_names = {name for pair in self.kv_pairs for name in pair}
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = {n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT}
        problem = "" if self.draft_graph else optional_inputs_mismatch(inputs, manifest)
        if problem:
            raise ManifestError(f"{path} does not match {self.engine_dir / 'manifest.json'} ({problem}); "
                                f"{trt_rebuild_hint(engine_dir)}")
        self.dtypes = {n: held_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        self.on_host = {n for n in names if self.engine.get_tensor_location(n) == trt.TensorLocation.HOST}
        self.buffers = {n: cuda.DeviceBuffer(self.max_bytes(n)) for n in names
                        if n not in kv_names and n not in self.on_host}
        self.scratch: dict[str, object] = {}   # legacy graphs: present_* outputs, copied back into the KV
        self.device_rows: dict[str, dict] = {}  # [B, V] sampler inputs: what each device row holds
        self.held: dict[str, np.ndarray] = {}   # LoRA inputs: the host array each device buffer holds
        self.no_adapter = lora.base_adapter(manifest).arrays if manifest.lora else {}
        self.peak_device_bytes = 0
        self.device_memory()

    def kv_in_place(self, engine_dir) -> bool:
        """Whether each present_* must share its past_* address (an in-place KV update) or needs a
        buffer of its own. The plan says, where TensorRT can tell (get_aliased_input_tensor), and
        binding otherwise is an API error; else the manifest (modern graph: in place; legacy: a copy)."""
        said = self.manifest.tensorrt.get("kv_update", "in_place") == "in_place"
        ask = getattr(self.engine, "get_aliased_input_tensor", None)
        if ask is None:
            return said
        aliased = [ask(present) == past for past, present in self.kv_pairs]
        if all(aliased) or not any(aliased):
            return all(aliased)
        raise ManifestError(f"{engine_dir}/{self.manifest.files.get('plan', 'llm.plan')} updates only some of its "
                            f"KV outputs in place; {trt_rebuild_hint(engine_dir)}")

    def check_plan(self, engine_dir, version: str, gpu: dict) -> None:
        built = self.manifest.tensorrt
        if built.get("version") != version:
            raise ManifestError(f"{engine_dir} was built with TensorRT {built.get('version')}, this machine has "
                                f"{version}: plans only run on the TensorRT version that built them; "
                                f"{trt_rebuild_hint(engine_dir)}")
        want = built.get("gpu", {})
        if (want.get("name"), want.get("compute_capability")) != (gpu["name"], gpu["compute_capability"]):
            raise ManifestError(f"{engine_dir} was built for {want.get('name')} (compute capability "
                                f"{want.get('compute_capability')}), this machine has {gpu['name']} "
                                f"({gpu['compute_capability']}); {trt_rebuild_hint(engine_dir)}")

    def register_plugins(self, engine_dir) -> None:
        """Plugins the plan was built with (a JIT plugin is a Python callback: this process needs it)."""
        for plugin in self.manifest.tensorrt.get("plugins", []):
            if plugin != "trtllm::Sample":
                raise ManifestError(f"{engine_dir} needs the TensorRT plugin {plugin}, unknown to this version; "
                                    f"{trt_rebuild_hint(engine_dir)}")
            from trtllm.plugins.sample import trt_plugin

            try:
                trt_plugin.register()
            except ImportError as e:
                raise ManifestError(f"{engine_dir} runs its sampler as a TensorRT plugin: {e}; install what it "
                                    "names (the plugin needs TensorRT >= 10.6's tensorrt.plugin, torch and triton), "
                                    f"or {trt_rebuild_hint(engine_dir)} without --sampling-plugin") from None

    def max_bytes(self, name: str) -> int:
        """The largest this tensor gets: the prefill profile's max shape (inputs) or the limits (outputs)."""
        m, io = self.manifest, self.io
        if self.engine.get_tensor_mode(name) == self.trt.TensorIOMode.INPUT:
            shape = tuple(self.engine.get_tensor_profile_shape(name, PREFILL)[2])  # a trt.Dims
        else:
            b, k, s, h = m.limits.max_batch_size, m.logprob_width, m.limits.max_input_len, m.model.hidden_size
            shape = {io.token_ids: (b,), io.top_logprobs: (b, k), io.top_logprob_ids: (b, k),
                     io.logits: (b, m.model.vocab_size), io.verify_ids: (b, s), io.eagle_hidden: (b, s, h),
                     io.draft_ids: (b,), io.draft_hidden: (b, h), io.draft_top_ids: (b, s + 1, self.top_k),
                     io.draft_top_logprobs: (b, s + 1, self.top_k), io.draft_node_hidden: (b, s, h)}[name]
        return int(np.prod(shape)) * self.dtypes[name].itemsize

    def make_kv_cache(self, model: ModelShape, num_slots: int, capacity: int) -> DeviceKVCache:
        # The plan's KV capacity is static (TensorScatter needs it), whatever the run asked for.
        kv = DeviceKVCache(model, num_slots, self.manifest.limits.max_kv_cache_capacity, self.stream)
        self.device_memory()
        return kv

    def device_memory(self) -> dict[str, float]:
        """The profile's peak_gpu_memory_* (peak_unified_memory_* on an integrated GPU, Jetson), as
        Edge-LLM writes them: the device's memory in use, the largest of what it was after loading,
        after the KV cache was allocated and now. Everything is allocated up front (the plan's
        static capacity, TensorRT's activations with the context), so that is the run's peak."""
        used, integrated = self.cuda.memory_in_use()
        self.peak_device_bytes = max(self.peak_device_bytes, used)
        key = "peak_unified_memory" if integrated else "peak_gpu_memory"
        return {f"{key}_bytes": self.peak_device_bytes, f"{key}_mb": self.peak_device_bytes / 2**20}

    def bind(self, name: str, array: np.ndarray, alive: list) -> None:
        array = np.ascontiguousarray(array, self.dtypes[name])
        alive.append(array)
        self.set_shape(name, array.shape)
        if name in self.on_host:  # shape tensors live in host memory (our graphs have none today)
            self.set_address(name, array.ctypes.data)
        else:
            if array.size:  # an empty input (EAGLE's verify_index [B, 0]) has nothing to copy
                self.stream.upload(self.buffers[name].ptr, array)
            self.set_address(name, self.buffers[name].ptr)

    def bind_held(self, name: str, array: np.ndarray, alive: list) -> None:
        """An input that stays the same host array for many steps (a batch's LoRA adapter): uploaded
        only when another array comes, so switching adapters costs one upload, keeping one nothing."""
        self.set_shape(name, array.shape)
        if self.held.get(name) is not array:
            host = np.ascontiguousarray(array, self.dtypes[name])
            alive.append(host)
            if host.size:
                self.stream.upload(self.buffers[name].ptr, host)
            self.held[name] = array
        self.set_address(name, self.buffers[name].ptr)

    def bind_vocab_rows(self, name: str, array: np.ndarray, version: np.ndarray) -> None:
        """A [B, V] sampler input, uploaded row by row and only where the device row holds something
        else: rows change only when a request is admitted or penalised (set_row / penalize bump the
        row's version), so a decode step without penalties uploads none of the B x V bytes. A device
        row records the version it took: a host row copied to another device row (a slot prefilled
        alone goes to device row 0) leaves the copy in its own device row stale, and it is seen so."""
        self.set_shape(name, array.shape)
        ptr, row_bytes = self.buffers[name].ptr, array.strides[0]
        base = array if array.base is None else array.base
        start = (array.ctypes.data - base.ctypes.data) // row_bytes
        held = self.device_rows.setdefault(name, {})   # device row -> (host base array, its row, version)
        for r in range(array.shape[0]):
            held_base, held_row, held_version = held.get(r, (None, None, None))
            if held_base is not base or held_row != start + r or held_version != version[r]:
                self.stream.upload(ptr + r * row_bytes, array[r])   # the host row outlives the sync
                held[r] = (base, start + r, int(version[r]))
        self.set_address(name, ptr)

    def set_address(self, name: str, ptr: int) -> None:
        if not self.context.set_tensor_address(name, ptr):
            raise RuntimeError(f"TensorRT rejected the address of {name}: the plan has no such tensor; "
                               "the engine directory's manifest and llm.plan disagree")

    def set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self.context.set_input_shape(name, tuple(shape)):
            lo, _, hi = self.engine.get_tensor_profile_shape(name, self.profile)
            raise RuntimeError(f"TensorRT rejected shape {tuple(shape)} for {name} (profile {self.profile} allows "
                               f"{tuple(lo)} to {tuple(hi)}); the engine's limits are in manifest.json")

    def step(self, inputs: StepInputs, kv: list[DeviceView], want_logits: bool = False) -> StepOutputs:
        io, s, ctx = self.io, inputs.sampling, self.context
        batch, seq = inputs.input_ids.shape
        self.set_profile(seq)
        alive: list = []  # host arrays of the copies, until the stream is synchronized
        feeds = {io.input_ids: inputs.input_ids, io.position_ids: inputs.position_ids,
                 io.write_index: inputs.write_index, io.last_index: inputs.last_index,
                 io.repetition_penalty: s.repetition_penalty, io.temperature: s.temperature, io.min_p: s.min_p,
                 io.top_k: s.top_k, io.top_p: s.top_p, io.uniform: s.uniform}
        if self.manifest.eagle:  # no positions to verify: [B, 0]
            feeds[io.verify_index] = inputs.verify_index if inputs.verify_index is not None \
                else np.zeros((batch, 0), np.int64)
            if self.manifest.samples_verified:
                feeds[io.verify_uniform] = inputs.verify_uniform if inputs.verify_uniform is not None \
                    else np.zeros(feeds[io.verify_index].shape, np.float32)
            if self.manifest.eagle.get("tree"):  # no tree: [B, S, 0], the causal mask alone
                feeds[io.tree_mask] = inputs.tree_mask if inputs.tree_mask is not None \
                    else np.zeros((batch, seq, 0), np.bool_)
        feeds.update(vision_feeds(self.manifest, inputs, batch, np.zeros))
        for name, array in feeds.items():
            self.bind(name, array, alive)
        for name, array in (inputs.lora or self.no_adapter).items():
            self.bind_held(name, array, alive)
        for name, array in ((io.logit_bias, s.logit_bias), (io.penalty_bias, s.penalty_bias), (io.seen, s.seen)):
            self.bind_vocab_rows(name, array, s.version)
        copies = self.bind_kv(kv)
        for name in (io.token_ids, io.top_logprobs, io.top_logprob_ids, io.logits) + \
                ((io.verify_ids, io.eagle_hidden) if self.manifest.eagle else ()):
            self.set_address(name, self.buffers[name].ptr)
        if not ctx.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT failed to enqueue the step (see its log)")
        for dst, src, nbytes in copies:
            self.stream.copy(dst, src, nbytes)
        k = self.manifest.logprob_width  # the plan's static logprob width
        out = {io.token_ids: np.empty(batch, self.dtypes[io.token_ids]),
               io.top_logprobs: np.empty((batch, k), self.dtypes[io.top_logprobs]),
               io.top_logprob_ids: np.empty((batch, k), self.dtypes[io.top_logprob_ids])}
        if want_logits:
            out[io.logits] = np.empty((batch, self.manifest.model.vocab_size), self.dtypes[io.logits])
        if self.manifest.eagle:
            out[io.verify_ids] = np.empty(feeds[io.verify_index].shape, self.dtypes[io.verify_ids])
            out[io.eagle_hidden] = np.empty((batch, seq, self.manifest.model.hidden_size), self.dtypes[io.eagle_hidden])
        for name, array in out.items():
            self.stream.download(array, self.buffers[name].ptr)
        self.stream.sync()
        kept = s.num_logprobs  # rows keep the logprobs they asked for
        return StepOutputs(token_ids=out[io.token_ids].astype(np.int64), top_logprobs=out[io.top_logprobs][:, :kept],
                           top_logprob_ids=out[io.top_logprob_ids][:, :kept].astype(np.int64),
                           logits=out.get(io.logits),
                           verify_ids=out[io.verify_ids].astype(np.int64) if io.verify_ids in out else None,
                           hidden=out.get(io.eagle_hidden))

    def set_profile(self, seq: int) -> None:
        profile = PREFILL if seq > 1 else DECODE
        if profile != self.profile:
            why = ""
            try:  # (TensorRT's binding raises where the C++ call says false: "Error in set optimization ...")
                switched = self.context.set_optimization_profile_async(profile, int(self.stream))
            except RuntimeError as e:
                switched, why = False, f": {e}"
            if not switched:  # (its log says why)
                raise RuntimeError(f"TensorRT refused to switch the execution context to optimization profile "
                                   f"{profile} ({'prefill' if profile == PREFILL else 'decode'}){why}")
            self.profile = profile

    def bind_kv(self, kv: list[DeviceView]) -> list[tuple[int, int, int]]:
        """Bind each layer's KV view as past_* and present_*; returns device copies to make after the run
        (legacy graphs only: their scatter is not in place, so present_* goes to scratch first)."""
        copies = []
        for (past, present), view in zip(self.kv_pairs, kv):
            self.set_shape(past, view.shape)
            self.set_address(past, view.ptr)
            if self.in_place:
                self.set_address(present, view.ptr)
                continue
            scratch = self.scratch.get(present)
            if scratch is None or scratch.nbytes < view.nbytes:
                if scratch is not None:
                    scratch.close()
                scratch = self.scratch[present] = self.cuda.DeviceBuffer(view.nbytes)
            self.set_address(present, scratch.ptr)
            copies.append((view.ptr, scratch.ptr, view.nbytes))
        return copies

    def kv_memory(self) -> dict[str, int]:
        """Legacy graphs write present_* apart and copy it into the KV: that copy's device bytes."""
        return {"present_copy_bytes": sum(b.nbytes for b in self.scratch.values())} if self.scratch else {}

    def close(self) -> None:
        if getattr(self, "stream", None) is None:
            return
        self.stream.sync()
        for buf in [*self.buffers.values(), *self.scratch.values()]:
            buf.close()
        self.buffers, self.scratch = {}, {}
        self.context = self.engine = None
        self.stream.close()
        self.stream = None


class TensorRTDraftEngine(TensorRTEngine):
    """The EAGLE draft head's plan (eagle/draft.plan): the same binding, its own KV and profiles."""

    draft_graph = True

    def __init__(self, engine_dir, manifest: Manifest, **_):
        e = manifest.eagle
        draft = dataclasses.replace(manifest, model=ModelShape(**e["model"]), files={"plan": e["plan"]},
                                    tensorrt={**manifest.tensorrt, "plugins": [], "profiles": e.get("profiles", [])},
                                    lora={}, eagle={})
        self.top_k = e.get("top_k", 0)  # draft_top_ids' width (0: a head built before draft trees)
        super().__init__(engine_dir, draft)

    def draft(self, ids, hidden, positions, write_index, last_index, kv, prompt: bool = False, top: bool = False,
              nodes: np.ndarray | None = None, tree_mask: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """As the ONNX Runtime head's draft() (runtime/backends/onnxruntime.py). `prompt` is for
        ONNX Runtime's integer-activation heads; TensorRT heads have none."""
        io = self.io
        batch, seq = ids.shape
        self.set_profile(seq)
        alive: list = []
        feeds = [(io.input_ids, ids), (io.hidden_in, hidden), (io.position_ids, positions),
                 (io.write_index, write_index), (io.last_index, last_index)]
        tree = self.top_k > 0  # (a head with draft_top_ids takes draft trees: TensorRT graphs always do)
        if tree:
            nodes = np.zeros((batch, 0), np.int64) if nodes is None else nodes
            feeds += [(io.draft_index, nodes),
                      (io.tree_mask, np.zeros((batch, seq, 0), np.bool_) if tree_mask is None else tree_mask)]
        for name, array in feeds:
            self.bind(name, array, alive)
        copies = self.bind_kv(kv)
        names = (io.draft_ids, io.draft_hidden)
        names += (io.draft_top_ids, io.draft_top_logprobs, io.draft_node_hidden) if tree else ()
        for name in names:
            self.set_address(name, self.buffers[name].ptr)
        if not self.context.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT failed to enqueue the draft step (see its log)")
        for dst, src, nbytes in copies:
            self.stream.copy(dst, src, nbytes)
        t, h = (0 if nodes is None else nodes.shape[1]), self.manifest.model.hidden_size
        out = [np.empty(batch, self.dtypes[io.draft_ids]), np.empty((batch, h), self.dtypes[io.draft_hidden])]
        if top and tree:
            out += [np.empty((batch, 1 + t, self.top_k), self.dtypes[io.draft_top_ids]),
                    np.empty((batch, 1 + t, self.top_k), self.dtypes[io.draft_top_logprobs]),
                    np.empty((batch, t, h), self.dtypes[io.draft_node_hidden])]
        for name, array in zip(names, out):
            self.stream.download(array, self.buffers[name].ptr)
        self.stream.sync()
        return tuple(a.astype(np.int64 if a.dtype.kind in "iu" else np.float32) for a in out)
