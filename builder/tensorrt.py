"""The TensorRT half of trtllm-build: canonical ONNX -> `llm.plan`, on the machine that will run it.

Written against TensorRT's documented Python API (10.x >= 10.3 and 11.x); `tensorrt` is imported
only inside these functions, so the builder imports without it.

    llm.onnx --OnnxParser--> strongly typed network --2 optimization profiles--> llm.plan
                             (precision comes from      0 prefill [B, 1..max_input_len]
                              the ONNX: TensorRT 11      1 decode  [B, 1]
                              removed the precision      KV [B, kv_heads, capacity, head_dim],
                              flags)                     capacity static (TensorScatter needs it)

Everything up to `build_plan` is pure Python (profile shapes from the limits, the manifest's
`tensorrt` section) and is tested without TensorRT.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from trtllm.runtime.backends.tensorrt import ALIGNMENT
from trtllm.runtime.kv_cache import kv_storage
from trtllm.runtime.manifest import GraphIO, Limits, ModelShape, lora_projections

PLAN_NAME = "llm.plan"
VISION_PLAN_NAME = "vision.plan"  # a vision-language engine's image encoder (vision.onnx's plan)


class TensorRTUnavailable(RuntimeError):
    """TensorRT or a CUDA GPU is missing on this machine."""


@dataclass(frozen=True)
class Profile:
    """One optimization profile: (min, opt, max) per input shape."""

    name: str
    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]

    def to_json(self) -> dict:
        return {"name": self.name, "shapes": {k: [list(d) for d in v] for k, v in self.shapes.items()}}


def optimization_profiles(limits: Limits, model: ModelShape, io: GraphIO, lora: dict | None = None,
                          eagle: bool = False, vision: dict | None = None) -> list[Profile]:
    """The prefill and decode profiles for every graph input, sized from the build limits, in the
    order the runtime indexes them (runtime/backends/tensorrt.py PREFILL, DECODE).

    Batch is 1..max_batch_size in both (the runtime batches whichever KV slots are busy). Prefill
    takes 1..max_input_len new tokens per row, decode exactly 1, so TensorRT can pick kernels for
    each. The KV capacity is static at max_kv_cache_capacity: TensorScatter (IKVCacheUpdateLayer)
    needs a static sequence axis on the cache, and the runtime allocates it at that size.
    LoRA inputs (manifest `lora`): 1 (one adapter for the batch) to batch rows, rank 0 (none) to
    max_lora_rank, optimised for one shared adapter of the full rank.
    EAGLE engines: verify_index [B, T], T 0 (a plain step) up to the step's tokens, and tree_mask
    [B, S, T] likewise; a verification step has more than one token, so it runs in the prefill profile.
    Vision-language engines (manifest `vision`): image_embeds [N, hidden (Qwen3-VL: x (1 + its DeepStack
    layers))] and image_index [N, 2] (Gemma 3: and image_ahead [N]), N 0 (a step without image tokens) up
    to every token of the step;
    multimodal RoPE (Qwen-VL): rope_delta [B], and rope_index [M, 2] and rope_positions [M, 3] as N.
    """
    b, s_max, cap = limits.max_batch_size, limits.max_input_len, limits.max_kv_cache_capacity
    vocab = model.vocab_size

    def batch(*rest):  # min batch 1, opt and max the full batch
        return ((1, *rest), (b, *rest), (b, *rest))

    profiles = []
    for name, seq in (("prefill", ((1, 1), (b, max(1, s_max // 2)), (b, s_max))), ("decode", ((1, 1), (b, 1), (b, 1)))):
        shapes = {io.input_ids: seq, io.position_ids: seq}
        for n in (io.write_index, io.last_index, io.repetition_penalty, io.temperature, io.min_p, io.top_k,
                  io.top_p, io.uniform):
            shapes[n] = batch()
        for n in (io.logit_bias, io.penalty_bias, io.seen):
            shapes[n] = batch(vocab)
        for i, (heads, row) in enumerate(model.kv_shapes()):  # (each layer that keeps KV, in its shape: Gemma 4)
            shapes[io.past_key.format(i=i)] = batch(heads, cap, row)
            shapes[io.past_value.format(i=i)] = batch(heads, cap, row)
        r = limits.max_lora_rank
        for i, module, n_in, n_out, experts in lora_projections(lora or {}, model.num_layers):
            e = (experts,) if experts else ()  # (an adapter per routed expert)
            shapes[io.lora_a.format(i=i, module=module)] = ((1, *e, n_in, 0), (1, *e, n_in, r), (b, *e, n_in, r))
            shapes[io.lora_b.format(i=i, module=module)] = ((1, *e, 0, n_out), (1, *e, r, n_out), (b, *e, r, n_out))
        if vision:
            most, width = seq[2][0] * seq[2][1], model.hidden_size * (1 + vision.get("deepstack_layers", 0))
            shapes[io.image_embeds] = ((0, width), (most // 2, width), (most, width))
            shapes[io.image_index] = ((0, 2), (most // 2, 2), (most, 2))
            if vision.get("bidirectional"):  # (Gemma 3: each image token's look-ahead)
                shapes[io.image_ahead] = ((0,), (most // 2,), (most,))
            if vision.get("mrope_section"):
                shapes[io.rope_delta] = batch()
                shapes[io.rope_index] = ((0, 2), (most // 2, 2), (most, 2))
                shapes[io.rope_positions] = ((0, 3), (most // 2, 3), (most, 3))
        if eagle:
            shapes[io.verify_index] = shapes[io.verify_uniform] = ((1, 0), (b, 0), (b, seq[2][1]))
            # a tree over the step's tokens: [B, S, 0] (a plain step, a chain) to [B, S, S]
            shapes[io.tree_mask] = tuple((*d, t) for d, t in zip(seq, (0, 0, seq[2][1])))
        profiles.append(Profile(name, shapes))
    return profiles


def vision_profiles(vision: dict, onnx_path: Path) -> list[Profile]:
    """vision.onnx's one profile, each input's axes from the graph: InternVL's and Idefics3's tiles
    [tiles, 3, H, W], 1 to the tiles the runtime encodes at once (runtime/media.py tiles_a_run: Gemma 3's
    one image, as a profile for 4 would size TensorRT's workspace for 4 x 16 heads' [4096, 4096] scores,
    4 GiB); Qwen's
    patches (one image a run), merge x merge of them up to an image of max_pixels, and Qwen2.5-VL's
    windows (a merge unit at least each) of up to window_size / patch_size squared patches; Gemma 4's
    patches (one image a run), up to vision.max_patches."""
    import onnx

    from trtllm.runtime.media import tiles_a_run

    pre = vision["preprocess"]
    if "merge_size" in pre:
        unit = pre["merge_size"] ** 2
        patches = max(unit, pre["max_pixels"] // pre["patch_size"] ** 2 // unit * unit)
        widest = (vision["window_size"] // pre["patch_size"]) ** 2 if vision.get("window_size") else 1
        axes = {"patches": (unit, max(unit, patches // 2 // unit * unit), patches),
                "windows": (1, max(1, patches // unit // 2), patches // unit), "window_width": (1, widest, widest)}
    elif "max_soft_tokens" in pre:  # Gemma 4: an image's own patches, k x k of them a token, up to max_patches
        unit, most = pre["pooling_kernel_size"] ** 2, vision["max_patches"]
        axes = {"patches": (unit, max(unit, most // 2 // unit * unit), most)}
    else:
        axes = {"tiles": (1, tiles_a_run(vision), tiles_a_run(vision))}
    shapes = {}
    for t in onnx.load(str(onnx_path), load_external_data=False).graph.input:
        dims = [(d.dim_value,) * 3 if d.HasField("dim_value") else axes[d.dim_param] for d in t.type.tensor_type.shape.dim]
        shapes[t.name] = tuple(tuple(d[k] for d in dims) for k in range(3))
    return [Profile("vision", shapes)]


def draft_profiles(limits: Limits, draft: ModelShape, io: GraphIO) -> list[Profile]:
    """The EAGLE draft head's prefill (catching up on a prompt or a verified run of tokens, or
    expanding a draft tree's nodes) and decode (one drafted token) profiles, as the model's."""
    b, s_max, cap = limits.max_batch_size, limits.max_input_len, limits.max_kv_cache_capacity
    kv = ((1, draft.num_kv_heads, cap, draft.head_dim), (b, draft.num_kv_heads, cap, draft.head_dim),
          (b, draft.num_kv_heads, cap, draft.head_dim))
    profiles = []
    for name, hi, opt in (("prefill", s_max, max(1, s_max // 2)), ("decode", 1, 1)):
        seq = ((1, 1), (b, opt), (b, hi))
        shapes = {io.input_ids: seq, io.position_ids: seq, io.write_index: ((1,), (b,), (b,)),
                  io.last_index: ((1,), (b,), (b,)), io.hidden_in: tuple((*d, draft.hidden_size) for d in seq),
                  io.past_key.format(i=0): kv, io.past_value.format(i=0): kv,
                  # draft trees: the nodes' outputs (0 to the step's tokens) and the tree's slots
                  # (0 to max_input_len: a tree's expansions together fit in a step of the model)
                  io.draft_index: ((1, 0), (b, 0), (b, hi)),
                  io.tree_mask: tuple((*d, t) for d, t in zip(seq, (0, 0, s_max)))}
        profiles.append(Profile(name, shapes))
    return profiles


def aligned_capacity(capacity: int, spec, dtype: str, log=print, draft=None) -> int:
    """The largest KV capacity <= `capacity` whose per-slot bytes are a multiple of ALIGNMENT: the
    runtime binds slot ranges of one buffer, at base + start * slot_bytes (and of the EAGLE `draft`
    head's KV buffers too, which have the same capacity)."""
    step = 1
    for s in (spec, draft) if draft is not None else (spec,):
        for heads, dim in s.kv_layers() or [(s.num_kv_heads, s.head_dim)]:  # (each layer's shape: Gemma 4)
            row = heads * dim * kv_storage(dtype).itemsize  # bytes per position per slot
            step = math.lcm(step, ALIGNMENT // math.gcd(ALIGNMENT, row))
    aligned = capacity // step * step
    if aligned < 1:
        raise ValueError(f"--max-kv-cache-capacity {capacity} is below the {step} positions a KV slot needs to "
                         f"stay {ALIGNMENT}-byte aligned")
    if aligned != capacity:
        log(f"KV capacity {capacity} -> {aligned} so each slot is a multiple of {ALIGNMENT} bytes")
    return aligned


def workspace_bytes(gib: float) -> int:
    return int(gib * (1 << 30))


def import_tensorrt():
    """`tensorrt`, or TensorRTUnavailable with one line saying what to do."""
    try:
        import tensorrt as trt
    except ImportError as e:  # also raised when the wheel is there but its native libraries are not
        raise TensorRTUnavailable(f"TensorRT's Python package does not import here ({e}); on Jetson it comes "
                                  "with JetPack (python3-libnvinfer), elsewhere install it from NVIDIA; or build "
                                  "with --backend onnxruntime") from None
    return trt


def minor_version(trt) -> str:
    """"MAJOR.MINOR" of an imported tensorrt module: what the op lint and the graph choice go by."""
    return ".".join(trt.__version__.split(".")[:2])


def gpu_info() -> dict:
    """The current CUDA device, as recorded in the manifest and checked by the runtime."""
    from trtllm.runtime.backends import cuda

    return cuda.device_info()


def availability() -> tuple[bool, str]:
    """(usable, why): TensorRT imports and a CUDA GPU is present."""
    try:
        trt = import_tensorrt()
    except TensorRTUnavailable:
        return False, "TensorRT is not installed"
    try:
        gpu = gpu_info()
    except Exception as e:  # noqa: BLE001 - no driver, no cuda-python, no device: all mean "no GPU"
        return False, f"TensorRT {trt.__version__} imports but no CUDA GPU is usable ({e})"
    return True, f"TensorRT {trt.__version__} on {gpu['name']} (sm_{gpu['compute_capability'].replace('.', '')})"


def static_shape(shape: tuple[int, ...], name: str, profiles: list[Profile]) -> tuple[int, ...]:
    """`shape` (-1 = dynamic) with every axis that all profiles give one value made that value."""
    out = list(shape)
    for axis, dim in enumerate(shape):
        values = {dims[axis] for p in profiles for dims in p.shapes[name]}
        if dim == -1 and len(values) == 1:
            out[axis] = values.pop()
    return tuple(out)


def pinned_model(onnx_path: Path, profiles: list[Profile], sample_plugin: bool = False) -> bytes:
    """The graph (its weights left in their external files) with every input axis the profiles fix
    written as that number, above all the KV capacity: the ONNX leaves it symbolic (ONNX Runtime
    engines size it per run), but TensorRT's KV update (IKVCacheUpdateLayer, from TensorScatter)
    takes a cache input whose sequence axis is static when the parser imports the node. With
    `sample_plugin`, each trtllm::Sample node takes `seen` as int32 (plugin_inputs)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    if sample_plugin:
        plugin_inputs(model.graph)
    for t in model.graph.input:
        if t.name not in profiles[0].shapes:
            continue
        dims = t.type.tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims)
        for d, value, was in zip(dims, static_shape(shape, t.name, profiles), shape):
            if was == -1 and value != -1:
                d.dim_value = value  # (replaces the symbolic dim_param)
    return model.SerializeToString()


def plugin_inputs(graph) -> None:
    """Cast `seen` to int32 before each trtllm::Sample node, in place: TensorRT plugins take no BOOL
    tensor (schema.PLUGIN_SEEN), and the network's input stays BOOL."""
    from onnx import TensorProto, helper

    from trtllm.plugins.sample import schema

    at, nodes, cast = schema.INPUT_NAMES.index("seen"), [], {}
    for node in graph.node:
        if node.domain == schema.DOMAIN and node.op_type == schema.OP:
            seen = node.input[at]
            if seen not in cast:  # (one Cast per value, before its first reader: the graph stays sorted)
                cast[seen] = f"{seen}.{schema.PLUGIN_SEEN}"
                nodes.append(helper.make_node("Cast", [seen], [cast[seen]], name=f"{node.name}/seen_cast",
                                              to=TensorProto.INT32))
            node.input[at] = cast[seen]
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def build_plan(onnx_path: Path, profiles: list[Profile], *, workspace_gib: float, opt_level: int,
               timing_cache: Path | None, log=print, sample_plugin: bool = False) -> bytes:
    """Parse `onnx_path` (its external data next to it) and build a serialized engine (with
    `sample_plugin`, trtllm::Sample nodes as the registered plugin: pinned_model)."""
    trt = import_tensorrt()
    from trtllm.runtime.backends.tensorrt import shared_logger

    logger = shared_logger(trt)
    builder = trt.Builder(logger)
    # Strongly typed: the ONNX's own dtypes decide precision. Always on (flag ignored) in TensorRT 11.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    log(f"TensorRT {trt.__version__}: parsing {onnx_path.name}")
    # (the path: where the graph's external weights are)
    if not parser.parse(pinned_model(onnx_path, profiles, sample_plugin), str(onnx_path)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        raise RuntimeError("TensorRT's ONNX parser rejected the graph:\n" + "\n".join(
            f"  {e.node_name()} [{e.node_operator()}]: {e.desc()}" for e in errors))
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    missing = [t.name for t in inputs if t.name not in profiles[0].shapes]
    if missing:
        raise RuntimeError(f"no optimization profile shapes for the network inputs {missing}")
    shape_tensors = [t.name for t in inputs if t.is_shape_tensor]
    if shape_tensors:  # their int64 profile values need TensorRT >= 10.11; our graphs avoid them
        raise RuntimeError(f"the graph has shape-tensor inputs {shape_tensors}, which trtllm-edge does not bind")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes(workspace_gib))
    config.builder_optimization_level = opt_level
    if hasattr(trt.BuilderFlag, "MONITOR_MEMORY"):  # 10.6+: reports build-time memory use (the workspace bounds it)
        config.set_flag(trt.BuilderFlag.MONITOR_MEMORY)
    # TF32 is on by default, strongly typed or not: float32 MatMuls would round their inputs to 10-bit
    # mantissas (the demo model's logits 0.05 off, past the build check's 1e-3). Float32 means float32.
    config.clear_flag(trt.BuilderFlag.TF32)
    cache_bytes = timing_cache.read_bytes() if timing_cache and timing_cache.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)  # None when TensorRT cannot read the bytes at all
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        # A cache from another TensorRT or GPU is refused, a corrupt one unreadable: start afresh (and
        # overwrite it below). (Polygraphy starts afresh only from a missing or unreadable file.)
        log(f"TensorRT: timing cache {timing_cache} is unreadable or from another TensorRT version or GPU; "
            "starting a new one")
        cache = config.create_timing_cache(b"")
        if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
            log("TensorRT: refused a new timing cache too; building without one (the file is left as it is)")
            cache = None
    for prof in profiles:
        p = builder.create_optimization_profile()
        for name, (lo, opt, hi) in prof.shapes.items():
            p.set_shape(name, lo, opt, hi)
        if config.add_optimization_profile(p) < 0:
            raise RuntimeError(f"TensorRT refused the {prof.name} optimization profile (see its log above)")

    log(f"TensorRT: building {len(profiles)} optimization profiles ({', '.join(p.name for p in profiles)}), "
        f"optimization level {opt_level}, workspace {workspace_gib:g} GiB"
        + (f", timing cache {timing_cache}" if timing_cache else ""))
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError("TensorRT failed to build the engine (see its log above); lower --max-batch-size, "
                           "--max-input-len or --max-kv-cache-capacity if it ran out of memory")
    if timing_cache and cache is not None:
        try:  # (the plan is built: a cache that cannot be saved costs the next build's time, not this one)
            timing_cache.parent.mkdir(parents=True, exist_ok=True)
            timing_cache.write_bytes(bytes(memoryview(cache.serialize())))
        except OSError as e:
            log(f"TensorRT: the timing cache could not be saved to {timing_cache} ({e.strerror or e}); the engine "
                "is built, the next build times its layers again")
    return bytes(memoryview(plan))


def manifest_section(trt_version: str, gpu: dict, profiles: list[Profile], graph: str, lint_version: str,
                     plugins: list[str] = ()) -> dict:
    """What the runtime checks before it deserializes a plan (plans are tied to both) and uses to
    bind: profile order, and whether the KV update is in place (modern graph) or a copy (legacy)."""
    return {"version": trt_version, "gpu": gpu, "graph": graph, "lint_version": lint_version,
            "kv_update": "in_place" if graph == "modern" else "copy", "plugins": list(plugins),
            "profiles": [p.to_json() for p in profiles]}
