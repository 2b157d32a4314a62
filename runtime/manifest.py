"""The engine directory's `manifest.json`: the only contract between builder and runtime.

Stdlib only, so the runtime can read it on a device with nothing else installed. The builder
fills a `Manifest` and calls `save`; the runtime calls `load`, which refuses a manifest it
cannot run and names the `trtllm-build` command to re-run.

    ENGINE_DIR/
      manifest.json                 this file
      tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json
      llm.onnx (+ llm.onnx.data)    canonical graph (opset 24 profile)
      llm.ort.onnx (+ .data)        the ONNX Runtime form (graph optimisations applied offline)
      llm.plan                      the TensorRT engine (backend "tensorrt"), for one TensorRT version and GPU
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtllm.runtime import vision_section

FORMAT_VERSION = 4  # 2: the sampler takes penalties and min_p; 3: static-width logprob outputs;
# 4: with min_p and no top_k, top-p measures its mass over every min-p survivor (the sampler in the graph)
MANIFEST_NAME = "manifest.json"
SUPPORTED_BACKENDS = ("onnxruntime", "tensorrt")
DTYPES = ("float32", "float16", "bfloat16")  # trtllm-build's --dtype, --quantization and graph profiles
QUANTIZATIONS = ("none", "int8", "int4")
GRAPHS = ("modern", "legacy")


class ManifestError(ValueError):
    """The engine directory cannot be used by this runtime."""


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch_size: int
    max_input_len: int
    max_kv_cache_capacity: int
    max_lora_rank: int = 0


# numpy has no bfloat16: a bfloat16 cache is held as its bits (uint16), and the backends bind those
# buffers as bfloat16 (ONNX Runtime: an OrtValue typed so; TensorRT: by address)
# --kv-cache-dtype int8's rows are int8 bytes: head_dim values, then their float32 scale (ModelShape.kv_row)
KV_STORAGE = {"float32": "float32", "float16": "float16", "bfloat16": "uint16", "int8": "int8"}
BFLOAT16 = 16  # ONNX's TensorProto.BFLOAT16 (the runtime does not import onnx)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the runtime needs to size buffers: `[batch, num_kv_heads, capacity, kv_row]` per layer."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] | None = None  # the layers sliding_window applies to; None: all (Gemma 3 mixes)
    kv_dtype: str = "float32"  # the engine's KV type: --dtype's (float32, float16 or bfloat16), or int8
    # (kv_heads, head_dim) of each layer that keeps KV, in layer order, where they differ or not every layer
    # keeps its own (Gemma 4: full-attention layers' heads are wider, the last layers read earlier ones'
    # KV); None: every layer, num_kv_heads x head_dim
    kv_layers: tuple[tuple[int, int], ...] | None = None
    # the shape (after the batch) of each recurrent state buffer (past_state.i), float32: a Mamba-2 layer's
    # convolution inputs [conv_kernel - 1, conv_dim] and its SSM state [groups, heads / groups, head_dim,
    # state_size]. A state is one per sequence, not one per position: the features that keep KV by
    # position (saved system prompts, context reuse, prompts shared between rows, speculative decoding)
    # are left aside (docs/kv_cache.md). None: no recurrent layers
    state_shapes: tuple[tuple[int, ...], ...] | None = None

    @property
    def kv_row(self) -> int:
        """Elements of one KV slot row: head_dim, and an int8 cache's 4 bytes of float32 scale."""
        return self.head_dim + 4 if self.kv_dtype == "int8" else self.head_dim

    @property
    def num_kv_layers(self) -> int:
        """How many layers keep KV (past_key.0 .. past_key.{n-1}): one K and one V buffer each."""
        return self.num_layers if self.kv_layers is None else len(self.kv_layers)

    def kv_shapes(self) -> list[tuple[int, int]]:
        """(kv_heads, kv_row) of each KV layer's buffers, in their order."""
        extra = 4 if self.kv_dtype == "int8" else 0
        if self.kv_layers is None:
            return [(self.num_kv_heads, self.kv_row)] * self.num_layers
        return [(heads, dim + extra) for heads, dim in self.kv_layers]


@dataclass(frozen=True, slots=True)
class GraphIO:
    """Names of the graph's inputs and outputs. `{i}` in a KV name is the layer index."""

    input_ids: str = "input_ids"              # int64 [batch, seq]
    position_ids: str = "position_ids"        # int64 [batch, seq]
    write_index: str = "write_index"          # int64 [batch]: KV slot of the first new token
    last_index: str = "last_index"            # int64 [batch]: which of the seq positions gives logits
    past_key: str = "past_key.{i}"            # kv_dtype [batch, kv_heads, capacity, kv_row]
    past_value: str = "past_value.{i}"
    present_key: str = "present_key.{i}"      # the same buffer, updated in place
    present_value: str = "present_value.{i}"
    past_state: str = "past_state.{i}"        # f32 [batch, *model.state_shapes[i]]: recurrent layers' state,
    present_state: str = "present_state.{i}"  # the same buffer, written whole (zero taken where write_index is 0)
    logit_bias: str = "logit_bias"            # f32 [batch, vocab]
    penalty_bias: str = "penalty_bias"        # f32 [batch, vocab]: frequency/presence, -inf = banned
    seen: str = "seen"                        # bool [batch, vocab]: prompt + output tokens
    repetition_penalty: str = "repetition_penalty"  # f32 [batch]
    min_p: str = "min_p"                      # f32 [batch]
    temperature: str = "temperature"          # f32 [batch]
    top_k: str = "top_k"                      # int64 [batch]
    top_p: str = "top_p"                      # f32 [batch]
    uniform: str = "uniform"                  # f32 [batch]
    logits: str = "logits"                    # f32 [batch, vocab] at last_index
    token_ids: str = "token_ids"              # int64 [batch]
    top_logprobs: str = "top_logprobs"        # f32 [batch, K = min(max_num_logprobs, max_top_k)]
    top_logprob_ids: str = "top_logprob_ids"  # int64 [batch, K]; a step's rows keep their first k
    lora_a: str = "lora_a.{i}.{module}"       # [1 or batch, in, rank]: LoRA engines only (manifest.lora)
    lora_b: str = "lora_b.{i}.{module}"       # [1 or batch, rank, out], alpha/r folded in
    verify_index: str = "verify_index"        # int64 [batch, T]: EAGLE engines only (manifest.eagle), the
    verify_ids: str = "verify_ids"            # positions whose sampled tokens come out as int64 [batch, T]
    verify_uniform: str = "verify_uniform"    # f32 [batch, T]: the random number of each (eagle.verify "sampled")
    verify_logits: str = "verify_logits"      # f32 [batch, T, vocab]: their logits (eagle.logprobs engines)
    tree_mask: str = "tree_mask"              # bool [batch, seq, T]: EAGLE engines (eagle.tree): token s sees slot
                                              # write_index + seq - T + t iff [b, s, t]; T = 0: causal
    eagle_hidden: str = "eagle_hidden"        # f32 [batch, seq, H]: the draft head's fc(aux hidden states)
    hidden_in: str = "hidden_in"              # draft graph: f32 [batch, seq, H] in,
    draft_hidden: str = "draft_hidden"        # f32 [batch, H] out (at last_index, before the final norm)
    draft_ids: str = "draft_ids"              # int64 [batch]: the drafted token (a target vocabulary id)
    draft_top_ids: str = "draft_top_ids"      # int64 [batch, 1 + T, K]: the K best at last_index and at
    draft_top_logprobs: str = "draft_top_logprobs"  # draft_index, best first, and their f32 log-probabilities
    draft_index: str = "draft_index"          # int64 [batch, T]: draft tree nodes (eagle.tree engines), whose
    draft_node_hidden: str = "draft_node_hidden"  # f32 [batch, T, H] hidden states come out too
    image_embeds: str = "image_embeds"        # f32 [N, H (Qwen3-VL: H x (1 + deepstack_layers))]: vision-language
                                              # engines only (manifest.vision), the
    image_index: str = "image_index"          # image tokens' embeddings, and int64 [N, 2] their (row, position
                                              # in the step); N = 0 in a step without one
    image_ahead: str = "image_ahead"          # int64 [N]: engines whose images see themselves both ways (Gemma 3:
                                              # vision.bidirectional), the slots past its own each image token
                                              # also sees (the rest of its image), in image_index's order
    rope_delta: str = "rope_delta"            # int64 [batch]: multimodal RoPE engines (Qwen2-VL): added to a
                                              # text token's slot for its three rotary positions
    rope_index: str = "rope_index"            # int64 [M, 2]: (row, position in the step) of the tokens whose
    rope_positions: str = "rope_positions"    # three positions, int64 [M, 3], are given whole (M = 0: none)
    generated: str = "generated"              # int64 [1], graphs on plugins/cpu's MatMul kernels: 1 when the
                                              # step's tokens were generated, 0 for a prompt (kernel path per role)

    def state_pairs(self, num_states: int) -> list[tuple[str, str]]:
        """(past, present) names of the recurrent state buffers, in the KV manager's order (model.state_shapes)."""
        return [(self.past_state.format(i=i), self.present_state.format(i=i)) for i in range(num_states)]

    def kv_pairs(self, num_layers: int) -> list[tuple[str, str]]:
        """(past, present) names in the order of the KV manager's buffers: K0, V0, K1, V1, ..."""
        return [(past.format(i=i), present.format(i=i)) for i in range(num_layers)
                for past, present in ((self.past_key, self.present_key), (self.past_value, self.present_value))]


@dataclass(frozen=True, slots=True)
class Manifest:
    architecture: str
    backend: str
    dtype: str
    limits: Limits
    model: ModelShape
    eos_token_ids: tuple[int, ...]
    max_top_k: int
    max_num_logprobs: int = 50
    quantization: str = "none"
    quantization_scheme: dict = field(default_factory=dict)  # bits, block size, method (builder/quantize.py)
    pad_token_id: int = 0
    io: GraphIO = field(default_factory=GraphIO)
    files: dict[str, str] = field(default_factory=dict)
    build_config: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    build_id: str = ""  # fresh per build: saved KV of one build is never reused by another
    lowerings: tuple[str, ...] = ()  # backend-specific ops the compiled form uses (e.g. GroupQueryAttention)
    graph_profile: str = "modern"  # llm.onnx's op set: "modern" (opset 24) or "legacy" (opset 20, TensorRT 10.3)
    tensorrt: dict = field(default_factory=dict)  # TensorRT builds: version, GPU, profiles (builder/tensorrt.py)
    lora: dict = field(default_factory=dict)  # LoRA engines: sites, dtype, bundled adapters (runtime/lora.py)
    eagle: dict = field(default_factory=dict)  # EAGLE engines: the draft graph, its shape and files (builder/eagle.py)
    # vision-language engines: the vision graph, the image tokens, the pixels' preprocessing (builder/vision.py)
    vision: dict = field(default_factory=dict)
    # the graph gives the logits of the positions verify_index names (verify_logits): prompt_logprobs
    prompt_logits: bool = False
    # and samples them, each with its own random number (verify_uniform in, verify_ids out): prompt
    # lookup speculates rows that sample (EAGLE engines say so in eagle.verify)
    verify_sampler: bool = False
    # the graphs', weights' and other binaries' sizes in bytes, by path in the engine directory
    # (builder/engine_dir.py binary_sizes): a file of another size is refused at load (an engine
    # copied in part). Engines built before it have none.
    sizes: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def logprob_width(self) -> int:
        """K: the graph's static width of top_logprobs / top_logprob_ids."""
        return min(self.max_num_logprobs, self.max_top_k)

    @property
    def samples_verified(self) -> bool:
        """The graph draws the verify_index positions' tokens (verify_uniform, verify_ids)."""
        return self.verify_sampler or self.eagle.get("verify") == "sampled"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def model_shape(raw: dict) -> ModelShape:
    """manifest.json's "model": JSON's lists (sliding layers, KV layers, state shapes) back to the tuples they
    were written from."""
    def rows(value):  # a list of lists -> a tuple of tuples (anything else as it is, for check() to name)
        return tuple(tuple(x) if isinstance(x, list) else x for x in value) if isinstance(value, list) else value

    layers = raw.get("sliding_layers")
    return ModelShape(**{**raw, "sliding_layers": tuple(layers) if isinstance(layers, list) else layers,
                         "kv_layers": rows(raw.get("kv_layers")), "state_shapes": rows(raw.get("state_shapes"))})


def save(manifest: Manifest, engine_dir: str | os.PathLike) -> Path:
    """Write manifest.json atomically (a reader never sees half a file)."""
    path = Path(engine_dir) / MANIFEST_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def staged_for(engine_dir: str | os.PathLike) -> Path:
    """The engine directory a build or plan step is staging (`.NAME.partial-XXXX` beside it, a plan
    step's `.plan.partial-XXXX` inside it): what a command the user is told to run must name."""
    path = Path(engine_dir)
    if path.name.startswith(".plan.partial-"):
        return path.parent
    if path.name.startswith(".") and ".partial-" in path.name:
        return path.with_name(path.name[1:path.name.rindex(".partial-")])
    return path


def rebuild_hint(engine_dir: str | os.PathLike, backend: str | None = None) -> str:
    """The build command to run again: the checkpoint and options its manifest records, where it
    reads (`<checkpoint>` else); a TensorRT engine's names its backend (else a machine without a GPU
    would build an ONNX Runtime engine in its place)."""
    hint = f"rebuild it: {build_command(engine_dir, backend)}"
    if backend != "tensorrt":
        return hint
    return hint + f" (on this machine), or only its plan: python -m trtllm.builder.plan {staged_for(engine_dir)}"


def export_hint(engine_dir: str | os.PathLike) -> str:
    """The plan step's: an exported directory it cannot take is copied or exported again (the plan
    step is what the TensorRT rebuild hint would say to run)."""
    return (f"copy the exported directory here again whole, or export it again (Python >= 3.11, no GPU "
            f"needed): {build_command(engine_dir, 'tensorrt')} --plan-later")


TENSORRT_ONLY = ("sampling_plugin", "workspace_gib", "opt_level")  # options trtllm-build takes with TensorRT alone
PROFILE_ALIASES = {"jetson-orin-jp6": "tensorrt-legacy"}  # configs/ holds a file for the name on the right

# build_config's keys that are trtllm-build options, in its --help's order, with trtllm-build's
# defaults where no profile sets them (builder/config.py's BuildConfig): an option at its profile's
# value is left out of the command
BUILD_OPTIONS = {"backend": "auto", "dtype": "float32", "quantization": "none", "cpu_kernels": "auto",
                 "activations": "float32", "kv_cache_dtype": "auto", "graph": "modern", "max_batch_size": 8,
                 "max_input_len": 2048, "max_kv_cache_capacity": 4096, "workspace_gib": 4.0, "opt_level": 3,
                 "sampling_plugin": False, "plan_later": False, "max_lora_rank": 0, "eagle": None}


def build_command(engine_dir: str | os.PathLike, backend: str | None = None) -> str:
    """`trtllm-build` with the checkpoint and the options the engine's manifest records (an int4
    engine rebuilt as the hint said was float32), else with `<checkpoint>`; `backend` in place of
    the recorded one."""
    from importlib import resources

    try:
        raw = json.loads((Path(engine_dir) / MANIFEST_NAME).read_bytes().decode("utf-8"))
        model, given = raw["source"]["model"], raw["build_config"]
        assert isinstance(model, str) and isinstance(given, dict)
    except Exception:  # noqa: BLE001 - unreadable, or not this format: the checkpoint is the user's to name
        return (f"trtllm-build --model <checkpoint> --output {staged_for(engine_dir)}"
                + (f" --backend {backend}" if backend else ""))
    profile = given.get("profile") or "cpu-default"
    words = ["trtllm-build", "--model", model, "--output", str(staged_for(engine_dir))]
    try:  # the profile's values: those the command need not repeat
        name = PROFILE_ALIASES.get(profile, profile)
        baseline = {**BUILD_OPTIONS, **json.loads(resources.files("trtllm.configs").joinpath(f"{name}.json")
                                                  .read_text(encoding="utf-8"))}
    except Exception:  # noqa: BLE001 - a profile file of the build machine's: every option, then
        baseline = {}
    if profile != "cpu-default":
        words += ["--profile", str(profile)]
    for key in BUILD_OPTIONS:
        value = backend if key == "backend" and backend else given.get(key)
        if value is None or value is False or key in baseline and value == baseline[key]:
            continue
        if key == "plan_later" or backend not in (None, "tensorrt") and key in TENSORRT_ONLY:
            continue  # (a rebuild makes a whole engine; one for ONNX Runtime takes no TensorRT option)
        words += ["--" + key.replace("_", "-")] + ([] if value is True else [str(value)])
    for name, path in given.get("lora") or ():
        words += ["--lora", f"{name}={path}"]
    return " ".join(shlex.quote(w) for w in words)


PLAN_PENDING = {"plan": "pending"}  # the tensorrt section of an engine exported without its plan (--plan-later)


def plan_pending(m: Manifest) -> bool:
    """Whether a TensorRT engine's plan is still to be built (python -m trtllm.builder.plan)."""
    return m.tensorrt == PLAN_PENDING


def load(engine_dir: str | os.PathLike, planning: bool = False) -> Manifest:
    """Read and check ENGINE_DIR/manifest.json. `planning`: for the TensorRT plan step
    (builder/plan.py), which writes the plans: they are not checked, and may be missing or damaged."""
    path = Path(engine_dir) / MANIFEST_NAME

    def hint(backend: str | None = None) -> str:  # (the plan step cannot mend an export: it is one)
        return export_hint(engine_dir) if planning else rebuild_hint(engine_dir, backend)

    if not path.is_file():
        raise ManifestError(f"{path} not found: {engine_dir} is not an engine directory; "
                            f"build one with trtllm-build --model <checkpoint> --output {engine_dir}")
    try:
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ManifestError(f"{path} is not valid JSON ({e}); {hint()}") from e
    if not isinstance(raw, dict):
        raise ManifestError(f"{path} must hold a JSON object, got {type(raw).__name__}; {hint()}")
    version = raw.get("format_version")
    if version is None:  # (another file written over it: a run's answers, say)
        raise ManifestError(f"{path} is not an engine manifest (it has no format_version); {hint()}")
    if version != FORMAT_VERSION:
        raise ManifestError(f"manifest.format_version must be {FORMAT_VERSION}, got {version!r}: "
                            f"the engine was built by another trtllm-edge version; {hint()}")
    backend = raw.get("backend")
    if backend not in SUPPORTED_BACKENDS:
        raise ManifestError(f"manifest.backend must be one of {SUPPORTED_BACKENDS}, got {backend!r}; "
                            f"{hint()}")
    try:
        manifest = Manifest(
            **{k: v for k, v in raw.items() if k not in ("limits", "model", "io", "eos_token_ids")},
            limits=Limits(**raw["limits"]),
            model=model_shape(raw["model"]),
            io=GraphIO(**raw.get("io", {})),
            eos_token_ids=tuple(raw["eos_token_ids"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ManifestError(f"{path} is malformed ({e}); {hint(backend)}") from e
    sections = (manifest.files, manifest.eagle, manifest.sizes)
    if planning and backend == "tensorrt" and all(isinstance(x, dict) for x in sections):
        plans = {manifest.files.get("plan"), manifest.eagle.get("plan"), manifest.files.get("vision_plan")}
        manifest = dataclasses.replace(manifest, tensorrt=dict(PLAN_PENDING),
                                       sizes={k: v for k, v in dict(manifest.sizes).items() if k not in plans})
    problem = check(manifest, Path(engine_dir))
    if problem:
        raise ManifestError(f"{path}: {problem}; {hint(backend)}")
    return manifest


def whole(value, least: int = 1) -> bool:
    """An integer (not a bool) of at least `least`: what a JSON count must be."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check(m: Manifest, engine_dir: Path) -> str:
    """What in a manifest no build writes (an edited or damaged file), or "": every number the
    runtime sizes buffers and loops by, every choice it branches on, and the files it reads. Whether
    the numbers match the graph is the backend's check (backends/onnxruntime.py)."""
    counts = [(f"limits.{k}", getattr(m.limits, k), 0 if k == "max_lora_rank" else 1) for k in Limits.__slots__]
    counts += [(f"model.{k}", getattr(m.model, k), 1)
               for k in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")]
    counts += [("max_top_k", m.max_top_k, 1), ("max_num_logprobs", m.max_num_logprobs, 1)]
    for name, value, least in counts:
        if not whole(value, least):
            return f"{name} must be an integer >= {least}, got {value!r}"
    model = m.model
    if m.limits.max_input_len > m.limits.max_kv_cache_capacity:
        return (f"limits.max_input_len ({m.limits.max_input_len}) must be at most limits.max_kv_cache_capacity "
                f"({m.limits.max_kv_cache_capacity})")
    if model.num_heads % model.num_kv_heads:
        return f"model.num_heads ({model.num_heads}) must be a multiple of model.num_kv_heads ({model.num_kv_heads})"
    if model.sliding_window is not None and not whole(model.sliding_window, 1):
        return f"model.sliding_window must be null or an integer >= 1, got {model.sliding_window!r}"
    if model.sliding_layers is not None and not all(whole(i, 0) and i < model.num_layers for i in model.sliding_layers):
        return f"model.sliding_layers must be layer indices below {model.num_layers}, got {list(model.sliding_layers)}"
    kv = model.kv_layers
    if kv is not None and not (isinstance(kv, tuple) and 1 <= len(kv) <= model.num_layers and all(
            isinstance(x, tuple) and len(x) == 2 and whole(x[0]) and whole(x[1]) and model.num_heads % x[0] == 0
            for x in kv)):
        return (f"model.kv_layers must be null or 1 to {model.num_layers} [kv_heads, head_dim] pairs, kv_heads "
                f"dividing model.num_heads {model.num_heads}, got {m.to_json()['model']['kv_layers']!r}")
    states = model.state_shapes
    if states is not None and not (isinstance(states, tuple) and states and all(
            isinstance(x, tuple) and x and all(whole(d) for d in x) for x in states)):
        return ("model.state_shapes must be null or a list of shapes (lists of integers >= 1), got "
                f"{m.to_json()['model']['state_shapes']!r}")
    if states is not None and m.backend != "onnxruntime":  # (the TensorRT engine binds no state buffers yet)
        return "model.state_shapes (recurrent layers) are run by the onnxruntime backend only"
    for name, value, allowed in (("model.kv_dtype", model.kv_dtype, tuple(KV_STORAGE)), ("dtype", m.dtype, DTYPES),
                                 ("quantization", m.quantization, QUANTIZATIONS),
                                 ("graph_profile", m.graph_profile, GRAPHS)):
        if value not in allowed:
            return f"{name} must be one of {list(allowed)}, got {value!r}"
    if model.kv_dtype == "int8" and m.backend != "onnxruntime":  # only our attention kernel reads int8 rows
        return f"model.kv_dtype int8 is for ONNX Runtime engines, got backend {m.backend!r}"
    for name, ids in (("eos_token_ids", m.eos_token_ids), ("pad_token_id", (m.pad_token_id,))):
        if not all(whole(t, 0) and t < model.vocab_size for t in ids):
            return f"{name} must be token ids below the vocabulary size {model.vocab_size}, got {m.to_json()[name]!r}"
    for name in ("prompt_logits", "verify_sampler"):
        if not isinstance(getattr(m, name), bool):
            return f"{name} must be true or false, got {getattr(m, name)!r}"
    if m.verify_sampler and not m.prompt_logits:
        return "verify_sampler needs prompt_logits: it samples the logits of the verify_index positions"
    for name, section in (("files", m.files), ("lora", m.lora), ("eagle", m.eagle), ("sizes", m.sizes),
                          ("vision", m.vision)):
        if not isinstance(section, dict):
            return f"{name} must be an object, got {type(section).__name__}"
    problem = check_eagle(m.eagle, model) or check_lora(m) or vision_section.check(m)
    if problem:
        return problem
    pending = plan_pending(m)  # (exported with --plan-later: the plan step writes it)
    named = [(f"files.{k}", v) for k, v in m.files.items() if not (pending and k in ("plan", "vision_plan"))]
    named += [(f"eagle.{k}", m.eagle.get(k)) for k in ("compiled", "plan") if k in m.eagle
              and not (pending and k == "plan")]
    named += [(f"lora.adapters.{k}", v) for k, v in m.lora.get("adapters", {}).items()]
    for where, name in named:
        # by its name, not where symlinks lead (a shared tokenizer may be one)
        if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
            return f"{where} must name a file inside the engine directory, got {name!r}"
        present = (engine_dir / name).is_dir() if where.startswith("lora.") else (engine_dir / name).is_file()
        if not present:  # (a bundled adapter is a directory)
            return f"{where}: {name} is missing"
    return check_sizes(m.sizes, engine_dir)


def check_sizes(sizes: dict, engine_dir: Path) -> str:
    """Each file the manifest gives a size for is there, of that size, or why not (one stat each)."""
    for name, size in sizes.items():
        if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
                or not whole(size, 0):
            return f"sizes must map files inside the engine directory to byte counts, got {name!r}: {size!r}"
        path = engine_dir / name
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            found = "missing" if actual is None else f"{actual:,} bytes"
            return (f"{name} is {found}, and the build wrote {size:,} bytes: the engine directory is incomplete "
                    "or damaged (an interrupted copy?): copy it again whole (`sha256sum -c checksums.sha256` "
                    "inside it checks every file)")
    return ""


def check_eagle(e: dict, model: ModelShape) -> str:
    """The EAGLE section's numbers and switches (builder/export.py's export_draft), or "". A key an
    earlier build did not write is left to the runtime's default for it."""
    if not e:
        return ""
    for name, least, most in (("draft_step", 1, None), ("top_k", 1, model.vocab_size),
                              ("draft_top_k", 1, e.get("top_k"))):
        value = e.get(name, least)
        if not whole(value, least) or (whole(most, 1) and value > most):
            return f"eagle.{name} must be an integer in [{least}, {most or 'any'}], got {value!r}"
    for name in ("tree", "logprobs"):
        if not isinstance(e.get(name, False), bool):
            return f"eagle.{name} must be true or false, got {e[name]!r}"
    if e.get("verify") not in (None, "sampled"):
        return f"eagle.verify must be \"sampled\" or absent, got {e['verify']!r}"
    aux = e.get("aux_layers", [0])
    if not isinstance(aux, list) or not aux or not all(whole(i, 0) and i < model.num_layers for i in aux):
        return f"eagle.aux_layers must be layer indices below {model.num_layers}, got {aux!r}"
    return ""


def lora_projections(lora: dict, num_layers: int):
    """(layer, PEFT module, in, out, experts) of every LoRA input pair a lora section's sites give,
    layer by layer; a site with "layers" is on those layers only, and one with "experts" (E) holds an
    adapter per routed expert, 0 elsewhere (builder/decoder.py's lora_sites)."""
    for layer in range(num_layers):
        for s in lora.get("sites", {}).values():
            if "layers" not in s or layer in s["layers"]:
                for module, lo, hi in s["modules"]:
                    yield layer, module, s["in"], hi - lo, s.get("experts", 0)


def check_lora(m: Manifest) -> str:
    """A LoRA section goes with a max_lora_rank, and the reverse."""
    if bool(m.lora) != bool(m.limits.max_lora_rank):
        return (f"limits.max_lora_rank is {m.limits.max_lora_rank} and the lora section is "
                f"{'present' if m.lora else 'empty'}: a LoRA engine has both, others neither")
    if not m.lora:
        return ""
    if not isinstance(m.lora.get("sites"), dict) or not isinstance(m.lora.get("adapters", {}), dict):
        return "lora must hold objects sites and adapters"
    for name, site in m.lora["sites"].items():  # builder/decoder.py's lora_sites
        modules = site.get("modules") if isinstance(site, dict) else None
        if not (isinstance(site, dict) and whole(site.get("in")) and isinstance(modules, list) and modules and all(
                isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and whole(e[1], 0) and whole(e[2])
                and e[1] < e[2] for e in modules)):
            return f"lora.sites.{name} must be {{\"in\": width, \"modules\": [[module, start, stop], ...]}}, got {site!r}"
        layers = site.get("layers", [0])
        if not (isinstance(layers, list) and layers and all(whole(i, 0) and i < m.model.num_layers for i in layers)):
            return f"lora.sites.{name}.layers must be a list of layer indices below {m.model.num_layers}, got {layers!r}"
        if not whole(site.get("experts", 1)):
            return f"lora.sites.{name}.experts must be the number of experts, got {site['experts']!r}"
    rope = m.lora.get("interleaved_rope")  # runtime/lora.py's rope_pair_order: an even rotary_dim <= head_dim
    if rope is not None and not (whole(rope) and rope % 2 == 0 and rope <= m.model.head_dim):
        return f"lora.interleaved_rope must be an even rotary width up to head_dim {m.model.head_dim}, got {rope!r}"
    return ""
