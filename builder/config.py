"""BuildConfig: everything that decides what `trtllm-build` writes. One typed object, no string options.

A build profile (configs/*.json, or a path to such a file) supplies defaults for the target: backend,
dtype, graph profile, the TensorRT version the graph must parse on, limits and TensorRT build
options. Options given on the command line win over the profile.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from trtllm.runtime import strict_json
from trtllm.runtime.input_format import MAX_BATCH_SIZE
from trtllm.runtime.manifest import DTYPES, GRAPHS, PROFILE_ALIASES, QUANTIZATIONS  # what an engine may say

BACKENDS = ("auto", "onnxruntime", "tensorrt")
ACTIVATIONS = ("float32", "int16", "int8")  # quantized MatMuls' activations on our CPU kernels' decode steps
LM_HEAD_QUANTIZATIONS = ("auto", "int8", "int4")  # auto: int8 (a quantized engine's lm_head and token table)
KV_CACHE_DTYPES = ("auto", "int8")  # auto: --dtype's; int8: rows of int8 values and a scale (our attention kernel)
CPU_KERNELS = ("auto", "native", "onnxruntime")  # ONNX Runtime engines: plugins/cpu's kernels, or ORT's own
PROFILES = ("cpu-default", "tensorrt-modern", "tensorrt-legacy", "jetson-orin-jp6", "jetson-thor-jp7")
# DESIGN.md's device names for a profile that is ours under a graph's name (JetPack 6 is TensorRT 10.3)
MODERN_MIN_TRT = (10, 15)  # Attention (10.14) and TensorScatter, RotaryEmbedding, RMSNormalization (10.15)
PLUGIN_MIN_TRT = (10, 6)   # tensorrt.plugin (QDP), which --sampling-plugin registers


def legacy_profile_hint(version: str) -> str:
    """Which profile exports the legacy graph for a TensorRT too old for the modern one."""
    if (10, 13) <= parse_trt_version(version) < MODERN_MIN_TRT:
        return "--profile jetson-thor-jp7 (JetPack 7.0/7.1) or tensorrt-legacy"
    return "--profile tensorrt-legacy (jetson-orin-jp6 on JetPack 6)"
MAX_LIMIT = 2**31 - 1  # --max-batch-size, --max-input-len, --max-kv-cache-capacity
PROFILE_KEYS = {"description", "backend", "dtype", "graph", "trt_version", "max_batch_size", "max_input_len",
                "max_kv_cache_capacity", "max_lora_rank", "workspace_gib", "opt_level"}
PROFILE_TYPES = {**{k: str for k in ("description", "backend", "dtype", "graph", "trt_version")},
                 **{k: int for k in ("max_batch_size", "max_input_len", "max_kv_cache_capacity", "max_lora_rank",
                                     "opt_level")}, "workspace_gib": (int, float)}
MAX_LORA_RANK = 256
LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # bundled adapters live in ENGINE_DIR/lora/NAME


class ConfigError(ValueError):
    """A build option is invalid or not supported yet."""


class CheckpointError(ValueError):
    """The --model argument cannot be loaded (here, not in checkpoint.py, which loads torch: the CLI
    catches it before the build's imports are done)."""


class Unsupported(CheckpointError):
    """What an architecture's checks refuse in a checkpoint (builder/architectures): the build
    names --model (export.py), where any other error is the build's own."""


def listed(names, most: int = 5) -> str:
    """Names for a message: the first `most`, and how many more there are."""
    names = list(names)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def profile_defaults(name: str = "cpu-default") -> dict:
    """A build profile: a name from configs/ or a path to a JSON file of the same keys."""
    path = Path(name)
    if name in PROFILES:
        text = resources.files("trtllm.configs").joinpath(f"{PROFILE_ALIASES.get(name, name)}.json").read_text()
    elif path.suffix == ".json" and path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--profile {name}: cannot be read as UTF-8 text ({e})") from None
    elif path.suffix == ".json":
        raise ConfigError(f"--profile {name}: no such file" + (" (it is a directory)" if path.is_dir() else ""))
    else:
        raise ConfigError(f"--profile must be one of {', '.join(PROFILES)} or a .json file, got {name!r}")
    try:
        data = json.loads(text, object_pairs_hook=strict_json.object_hook)  # (json keeps a key's last value)
    except json.JSONDecodeError as e:
        raise ConfigError(f"--profile {name}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--profile {name}: must be a JSON object of build options, got {type(data).__name__}")
    if data.duplicates:
        raise ConfigError(f"--profile {name}: \"{data.duplicates[0]}\" is given twice")
    unknown = sorted(set(data) - PROFILE_KEYS)
    if unknown:
        raise ConfigError(f"--profile {name}: unknown keys {unknown}; allowed: {sorted(PROFILE_KEYS)}")
    for key, value in data.items():  # a profile's own mistakes name the profile, not a flag never given
        want = PROFILE_TYPES[key]
        if isinstance(value, bool) or not isinstance(value, want):
            kind = "a number" if want == (int, float) else {str: "a string", int: "an integer"}[want]
            raise ConfigError(f"--profile {name}: \"{key}\" must be {kind}, got {json.dumps(value)}")
    return data


def parse_trt_version(text: str) -> tuple[int, int]:
    """'10.3' or '10.15.1' (a full version) -> (major, minor); TensorRT 10.0 is the oldest we know."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+){0,2}", str(text))
    if not match or (int(match[1]), int(match[2])) < (10, 0):
        raise ConfigError(f"trt_version must be MAJOR.MINOR (or a full version) and >= 10.0, got {text!r}")
    return int(match[1]), int(match[2])


@dataclass(frozen=True)
class BuildConfig:
    model: str
    output: str
    backend: str = "auto"
    dtype: str = "float32"
    quantization: str = "none"
    max_batch_size: int = 8
    max_input_len: int = 2048
    max_kv_cache_capacity: int = 4096
    max_lora_rank: int = 0          # > 0: LoRA inputs in the graph, adapters of rank <= this at run time
    lora: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (name, PEFT dir) bundled into the engine
    eagle: str | None = None       # an EAGLE-3 draft head directory (builder/eagle.py)
    verify: bool = True
    profile: str = "cpu-default"
    graph: str = "modern"           # llm.onnx's op set: modern (opset 24) or legacy (opset 20, TensorRT 10.3)
    trt_version: str = "11.1"       # the oldest TensorRT the graph must parse on (the op lint's target)
    workspace_gib: float = 4.0      # TensorRT builder workspace
    opt_level: int = 3              # TensorRT builder_optimization_level, 0..5
    timing_cache: str | None = None  # TensorRT timing cache file, read and updated (faster rebuilds)
    sampling_plugin: bool = False   # TensorRT: trtllm::Sample as the Triton kernel plugin, not the ONNX body
    cpu_kernels: str = "auto"       # ONNX Runtime: native (plugins/cpu: attention, quantized MatMuls) or onnxruntime
    activations: str = "float32"    # int16/int8: quantized decode steps multiply quantized activations (plugins/cpu)
    kv_cache_dtype: str = "auto"    # int8: the KV cache as int8 rows with a float32 scale each (plugins/cpu attention)
    lm_head_quantization: str = "auto"  # --quantization's lm_head: int8 (auto), or int4 (fewer bytes a token)
    tensorrt_options: tuple[str, ...] = ()  # TensorRT-only flags given on the command line (--timing-cache, ...)
    plan_later: bool = False        # TensorRT: export all but the plan, built on the device (builder/plan.py)
    max_image_tiles: int | None = None  # vision-language models: at most this many tiles an image (None: the checkpoint's)
    max_image_pixels: int | None = None  # ... resized to their own grid (Qwen-VL): at most this many pixels an image
    max_image_tokens: int | None = None  # ... to a token budget (Gemma 4's max_soft_tokens)

    def __post_init__(self):
        for name, allowed in (("backend", BACKENDS), ("dtype", DTYPES), ("quantization", QUANTIZATIONS),
                              ("graph", GRAPHS), ("cpu_kernels", CPU_KERNELS), ("activations", ACTIVATIONS),
                              ("kv_cache_dtype", KV_CACHE_DTYPES), ("lm_head_quantization", LM_HEAD_QUANTIZATIONS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        for name in ("max_batch_size", "max_input_len", "max_kv_cache_capacity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer in [1, {MAX_LIMIT}] (TensorRT's "
                                  f"shapes are int32), got {value!r}")
        if self.max_batch_size > MAX_BATCH_SIZE:  # (rows past it would be built, and paid for, but never run)
            raise ConfigError(f"--max-batch-size must be at most {MAX_BATCH_SIZE}: trtllm-run runs at most that many "
                              f"rows at once (an input's batch_size is 1 to {MAX_BATCH_SIZE}, as Edge-LLM's), got "
                              f"{self.max_batch_size}")
        if isinstance(self.max_lora_rank, bool) or not isinstance(self.max_lora_rank, int) \
                or not 0 <= self.max_lora_rank <= MAX_LORA_RANK:
            raise ConfigError(f"--max-lora-rank must be an integer in [0, {MAX_LORA_RANK}], got {self.max_lora_rank!r}")
        names = [name for name, _ in self.lora]
        for name in names:
            if not LORA_NAME.fullmatch(name):
                raise ConfigError(f"--lora {name}=...: the name must be letters, digits, '.', '_' or '-' "
                                  "(it names a directory in the engine)")
        if len(set(names)) != len(names):
            raise ConfigError(f"--lora names must be distinct, got {names}")
        if self.max_image_tiles is not None and (isinstance(self.max_image_tiles, bool) or
                                                 not isinstance(self.max_image_tiles, int) or self.max_image_tiles < 1):
            raise ConfigError(f"--max-image-tiles must be an integer >= 1, got {self.max_image_tiles!r}")
        if self.max_image_pixels is not None and (isinstance(self.max_image_pixels, bool) or
                                                  not isinstance(self.max_image_pixels, int) or self.max_image_pixels < 1):
            raise ConfigError(f"--max-image-pixels must be an integer >= 1, got {self.max_image_pixels!r}")
        if self.max_image_tokens is not None and (isinstance(self.max_image_tokens, bool) or
                                                  not isinstance(self.max_image_tokens, int) or self.max_image_tokens < 1):
            raise ConfigError(f"--max-image-tokens must be an integer >= 1, got {self.max_image_tokens!r}")
        if self.eagle and self.max_input_len < 2:  # the head drafts from a prompt's second token on
            raise ConfigError(f"--eagle needs --max-input-len >= 2, got {self.max_input_len}")
        if self.max_input_len > self.max_kv_cache_capacity:
            raise ConfigError(f"--max-input-len must be <= --max-kv-cache-capacity "
                              f"({self.max_kv_cache_capacity}), got {self.max_input_len}")
        if not isinstance(self.opt_level, int) or not 0 <= self.opt_level <= 5:
            raise ConfigError(f"--opt-level must be an integer in [0, 5], got {self.opt_level!r}")
        if not isinstance(self.workspace_gib, (int, float)) or not 0 < self.workspace_gib < math.inf:
            raise ConfigError(f"--workspace-gib must be > 0, got {self.workspace_gib!r}")
        if parse_trt_version(self.trt_version) < MODERN_MIN_TRT and self.graph == "modern":
            raise ConfigError(f"the modern graph (opset 24 Attention, TensorScatter) needs TensorRT >= 10.15, but "
                              f"trt_version is {self.trt_version}; use --graph legacy (as --profile tensorrt-legacy does)")
        if self.tensorrt_options and self.backend == "onnxruntime":
            raise ConfigError(f"{', '.join(self.tensorrt_options)}: TensorRT build options, and the backend is "
                              "onnxruntime; drop them or use --backend tensorrt")
        if self.plan_later and self.backend != "tensorrt":
            raise ConfigError(f"--plan-later exports a TensorRT engine: it needs --backend tensorrt (or a TensorRT "
                              f"--profile), got --backend {self.backend}")
        if self.plan_later and self.timing_cache:
            raise ConfigError("--plan-later: --timing-cache is the plan step's (python -m trtllm.builder.plan "
                              "ENGINE_DIR --timing-cache FILE, on the device)")
        if self.timing_cache and Path(self.timing_cache).is_dir():  # (found before the build, not after it)
            raise ConfigError(f"--timing-cache {self.timing_cache} is a directory; name a file in it")
        if self.sampling_plugin and self.backend != "tensorrt":
            raise ConfigError("--sampling-plugin needs --backend tensorrt (it registers a TensorRT plugin)")
        if self.sampling_plugin and parse_trt_version(self.trt_version) < PLUGIN_MIN_TRT:
            raise ConfigError(f"--sampling-plugin needs TensorRT >= 10.6 (tensorrt.plugin), but trt_version is "
                              f"{self.trt_version}: leave it out (the in-graph sampler draws the same tokens)")
        if self.lm_head_quantization != "auto" and self.quantization == "none":
            raise ConfigError(f"--lm-head-quantization {self.lm_head_quantization} needs --quantization int8|int4 (it "
                              "picks how a quantized engine holds its lm_head), got --quantization none")
        if self.activations != "float32" and self.cpu_kernels == "onnxruntime":
            raise ConfigError(f"--activations {self.activations} is for our kernels: with --cpu-kernels onnxruntime, "
                              "MatMulNBits always quantizes activations to int8")
        if self.activations != "float32" and (self.quantization == "none" or self.backend == "tensorrt"):
            raise ConfigError(f"--activations {self.activations} needs --quantization int8|int4 on ONNX Runtime (our "
                              f"quantized kernel quantizes its activations), got --quantization {self.quantization} "
                              f"--backend {self.backend}")
        if self.cpu_kernels == "native" and (self.graph == "legacy" or self.backend == "tensorrt"):
            raise ConfigError(f"--cpu-kernels native runs the modern graph on ONNX Runtime, got --graph {self.graph} "
                              f"--backend {self.backend}")
        if self.kv_cache_dtype == "int8" and (self.backend == "tensorrt" or self.graph == "legacy"
                                              or self.cpu_kernels == "onnxruntime"):
            raise ConfigError(f"--kv-cache-dtype int8 is read by our CPU attention kernel alone: it needs ONNX "
                              f"Runtime, the modern graph and --cpu-kernels auto|native, got "
                              f"--backend {self.backend} --graph {self.graph} --cpu-kernels {self.cpu_kernels}")
        if self.graph == "legacy" and self.quantization != "none":
            from_profile = f" (--profile {self.profile} builds it, for TensorRT {self.trt_version})" \
                if self.profile not in (None, "cpu-default") else ""
            raise ConfigError(f"--quantization {self.quantization} needs the modern graph: block-wise and int4 "
                              f"DequantizeLinear are opset 21, the legacy graph is opset 20{from_profile}; a quantized "
                              "TensorRT engine needs TensorRT >= 10.15 (--profile tensorrt-modern)")
        if self.plan_later and self.dtype == "bfloat16" and self.verify:
            raise ConfigError("--plan-later --dtype bfloat16: the export checks llm.onnx through ONNX Runtime, which has "
                              "no bfloat16 kernels for its standard ops; export float16 (--dtype float16), or build on "
                              "the device in one go (no --plan-later), where TensorRT runs the check")
        self.refuse_dtype_combinations()

    def refuse_dtype_combinations(self, backend: str | None = None) -> None:
        """--dtype with what cannot run it fails loudly, never silently (`backend`: the one --backend
        auto picked, at build time; else the configured one)."""
        backend = backend or self.backend
        if self.dtype == "bfloat16" and backend == "onnxruntime" and \
                (self.graph == "legacy" or self.cpu_kernels == "onnxruntime"):
            raise ConfigError(f"--dtype bfloat16 on ONNX Runtime runs on our CPU kernels (ONNX Runtime has no "
                              f"bfloat16 CPU kernels), and they take the modern graph with --cpu-kernels "
                              f"auto|native, got --graph {self.graph} --cpu-kernels {self.cpu_kernels}; use "
                              "--dtype float16")
        if self.quantization != "none" and self.dtype == "bfloat16":
            raise ConfigError(f"--quantization {self.quantization} takes --dtype float32 or float16 (its scales are "
                              "float16 values, which bfloat16 does not hold), got bfloat16")
        if self.quantization != "none" and self.dtype == "float16" and backend == "onnxruntime" \
                and self.cpu_kernels == "onnxruntime":
            raise ConfigError(f"--quantization {self.quantization} --dtype float16 on ONNX Runtime runs on our CPU "
                              "kernels (float32 activations, a float16 KV cache); ONNX Runtime's own (MatMulNBits, "
                              "GroupQueryAttention) take one type for both: use --dtype float32 or --cpu-kernels "
                              "auto|native")

    def to_json(self) -> dict:
        return {k: (list(map(list, v)) if k == "lora" else v) for k, v in self.__dict__.items()}
