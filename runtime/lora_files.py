"""A LoRA adapter's files as trtllm reads them (runtime/lora.py makes them graph inputs): PEFT's
adapter_config.json and adapter_model.safetensors (a directory, a .zip or the files themselves), and
TensorRT Edge-LLM's processed adapters; their names and key patterns, the config's checks (what it
targets, its scales), and safetensors read without torch."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from trtllm.runtime.lora_experts import moe_parameters
from trtllm.runtime.manifest import whole

CONFIG_NAME, WEIGHTS_NAME = "adapter_config.json", "adapter_model.safetensors"
# TensorRT Edge-LLM's process-lora output: the PEFT config copied as config.json, and each module's
# lora_A as [in, r] and lora_B as [r, out], B already times alpha / r, keys without base_model.model.
PROCESSED_CONFIG_NAME, PROCESSED_NAME = "config.json", "processed_adapter_model.safetensors"
PROCESSED_KEY = re.compile(r"model\.layers\.(\d+)\.([\w.]+?)\.lora_([AB])\.weight")
# PEFT's key for a LoRA matrix of a decoder layer's projection, e.g.
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight ([r, in]; lora_B is [out, r])
PEFT_DEFAULTS = {"r": 8, "lora_alpha": 8}  # LoraConfig's, where adapter_config.json leaves them out
KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.([\w.]+?)\.lora_([AB])\.weight")
# A vision-language model's language model is under another name (lora.prefix: InternVL's
# model.language_model); its vision encoder takes no adapter
VISION_MODULES = re.compile(r"base_model\.model\.model\.(vision_tower|multi_modal_projector|visual)\..*")


def key_pattern(prefix: str) -> re.Pattern:
    """KEY for a model whose decoder layers are `{prefix}.layers` (PEFT's names: base_model.model. first)."""
    return KEY if prefix == "model" else re.compile(
        rf"base_model\.model\.{re.escape(prefix)}\.layers\.(\d+)\.([\w.]+?)\.lora_([AB])\.weight")
# A mixture of experts' routed experts and router (transformers' and PEFT's names): the experts
# where the engine has their sites (runtime/lora_experts.py), the router never
ROUTED = re.compile(r"(?:mlp|block_sparse_moe|feed_forward)\.(?:experts\b.*|gate|router\b.*|input_linear|output_linear)"
                    r"|experts\b.*|router\.proj")  # (Gemma 4's, the layer's own; LFM2-MoE's under feed_forward)
SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}


class AdapterError(ValueError):
    """An adapter this engine cannot use; the message names the file and what is wrong."""


def read_safetensors(path: Path, data: bytes | None = None) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file as numpy arrays. Read here, not with safetensors' numpy
    loader, because numpy has no bfloat16 (that loader refuses it) and PEFT adapters trained in
    bfloat16 are common: bfloat16 is widened to float32 exactly (it is float32's upper half).
    `data`: the file's bytes, read already."""
    try:
        data = path.read_bytes() if data is None else data
        size = int.from_bytes(data[:8], "little")
        if len(data) < 8 or 8 + size > len(data):  # (a slice past the end would read a shorter header)
            raise ValueError(f"its header length {size} runs past the end of its {len(data)} bytes")
        header = json.loads(data[8:8 + size])
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise AdapterError(f"{path}: tensor {name} is {info['dtype']}; adapters must be float32, "
                                   "float16 or bfloat16")
            start, stop = info["data_offsets"]
            if not 0 <= start <= stop:  # numpy would read a count of -1 as "to the end"
                raise ValueError(f"tensor {name} has data_offsets {[start, stop]}")
            raw = np.frombuffer(data, dtype, (stop - start) // np.dtype(dtype).itemsize, 8 + size + start)
            if info["dtype"] == "BF16":
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            out[name] = raw.reshape(info["shape"])
    except AdapterError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # unreadable, or parts that do not add up
        raise AdapterError(f"{path} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    return out


def adapter_files(path: str | Path) -> tuple[Path, Path]:
    """(adapter_config.json, weights) of a PEFT adapter directory, or of a .safetensors file with
    adapter_config.json beside it; or Edge-LLM's processed adapter (config.json beside it: the
    config's name says which, `processed`)."""
    p = Path(path)
    weights = p / WEIGHTS_NAME if p.is_dir() else p
    if p.is_dir() and not weights.is_file() and (p / PROCESSED_NAME).is_file():
        weights = p / PROCESSED_NAME
    config = weights.parent / (PROCESSED_CONFIG_NAME if weights.name == PROCESSED_NAME else CONFIG_NAME)
    if not p.is_dir() and not config.is_file() and (weights.parent / PROCESSED_CONFIG_NAME).is_file():
        config = weights.parent / PROCESSED_CONFIG_NAME  # a processed adapter under a name of its own
    if p.is_dir() and not weights.is_file():
        bin_file = p / "adapter_model.bin"
        hint = " (a PyTorch .bin: save it with safe_serialization=True)" if bin_file.is_file() else ""
        raise AdapterError(f"{p} has no {WEIGHTS_NAME}{hint}")
    if not weights.is_file():
        raise AdapterError(f"{p} does not exist: give a PEFT adapter directory or its .safetensors file")
    if weights.suffix == ".bin" or zipped(weights):  # (torch.save writes a zip archive)
        raise AdapterError(f"{p} is a PyTorch .bin: save the adapter with safe_serialization=True")
    if not config.is_file():
        raise AdapterError(f"{config} is missing: a PEFT adapter keeps its rank and alpha there (an Edge-LLM "
                           f"processed adapter in {PROCESSED_CONFIG_NAME})")
    return config, weights


def processed_config(config: Path) -> bool:
    """Whether adapter_files found Edge-LLM's processed adapter (its config.json) rather than PEFT's."""
    return config.name == PROCESSED_CONFIG_NAME


def zipped(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def read_config(path: Path, data: bytes | None = None) -> dict:
    try:
        cfg = json.loads(path.read_bytes() if data is None else data)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    init = str(cfg.get("init_lora_weights", True)).lower()
    problems = {  # settings that change what the adapter computes beyond W x + s B A x
        "peft_type": (cfg.get("peft_type", "LORA") != "LORA", "only LoRA adapters"),
        "use_dora": (bool(cfg.get("use_dora")), "no DoRA"),
        "modules_to_save": (bool(cfg.get("modules_to_save")), "no fully saved modules"),
        "fan_in_fan_out": (bool(cfg.get("fan_in_fan_out")), "Conv1D layouts are not this model's"),
        "bias": (cfg.get("bias", "none") != "none", "no trained biases"),
        "lora_bias": (bool(cfg.get("lora_bias")), "no trained biases"),
        "use_bdlora": (bool(cfg.get("use_bdlora")), "no block-diagonal LoRA"),
        "alora_invocation_tokens": (bool(cfg.get("alora_invocation_tokens")),
                                    "activated LoRA applies from its invocation tokens on; this engine would apply it everywhere"),
        "layer_replication": (bool(cfg.get("layer_replication")), "its layer numbers are of a model with replicated layers"),
        "use_qalora": (bool(cfg.get("use_qalora")), "QALoRA pools its inputs in groups first"),
        "arrow_config": (bool(cfg.get("arrow_config")), "Arrow routes among several adapters per token"),
        "monteclora_config": (bool(cfg.get("monteclora_config")), "MonteCLoRA samples its weights"),
        "trainable_token_indices": (bool(cfg.get("trainable_token_indices")), "it retrains embedding rows too"),
        "target_parameters": (bool(cfg.get("target_parameters")) and not moe_parameters(cfg["target_parameters"]),
                              "of a model's parameters, only a mixture of experts' are adapted here: its experts' "
                              "gate_up_proj and down_proj, its router's weight"),
        "kasa_config": (bool(cfg.get("kasa_config")), "KaSA truncates the base weights and scales by a learned diagonal"),
        # (EVA is not here: it sets lora_A and the ranks, which it saves in rank_pattern and
        # alpha_pattern, and leaves the base weights alone)
        "init_lora_weights": (init.startswith(("pissa", "corda", "olora", "loftq", "lora_ga")),
                              "this initialisation also rewrites the base weights; save the adapter with PEFT's "
                              "path_initial_model_for_weight_conversion to make it a plain LoRA"),
    }
    for key, (bad, why) in problems.items():
        if bad:
            raise AdapterError(f"{path}: {key} = {cfg.get(key)!r} is not supported ({why})")
    positive(cfg.setdefault("r", PEFT_DEFAULTS["r"]), f"{path}: r")  # absent: PEFT's LoraConfig default
    finite(cfg.setdefault("lora_alpha", PEFT_DEFAULTS["lora_alpha"]), f"{path}: lora_alpha")  # (PEFT takes any sign)
    layers = cfg.get("layers_to_transform")
    if layers is not None and not (whole(layers, 0) or isinstance(layers, list) and all(whole(i, 0) for i in layers)):
        raise AdapterError(f"{path}: layers_to_transform must be a layer index or a list of them, got {layers!r}")
    for key in ("target_modules", "exclude_modules", "layers_pattern"):
        value = cfg.get(key)
        if value is not None and not isinstance(value, str) and not (
                isinstance(value, list) and all(isinstance(t, str) for t in value)):
            raise AdapterError(f"{path}: {key} must be a module name pattern or a list of names, got {value!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        patterns = cfg.get(key) or {}
        if not isinstance(patterns, dict):
            raise AdapterError(f"{path}: {key} must be an object of module pattern -> number, got {patterns!r}")
        for pattern, value in patterns.items():
            (positive if key == "rank_pattern" else finite)(value, f"{path}: {key}[{pattern!r}]")
            try:
                re.compile(pattern)
            except re.error as e:
                raise AdapterError(f"{path}: {key} key {pattern!r} is not a valid regular expression ({e})") from None
    return cfg


def targeted(cfg: dict, layer: int, module: str, prefix: str = "model") -> bool:
    """Whether PEFT puts a LoRA on {prefix}.layers.{layer}.{module} (its check_target_module_exists):
    not if exclude_modules names it; target_modules a regular expression over the whole name,
    "all-linear", or names the module's name is or ends with; and then, for a name it ends with,
    the layer among layers_to_transform (none or [] is every layer; layers_pattern names the
    segment before the index). Without target_modules, the tensors say."""
    name, targets = f"{prefix}.layers.{layer}.{module}", cfg.get("target_modules")
    excluded = cfg.get("exclude_modules")
    if excluded and (re.fullmatch(excluded, name) if isinstance(excluded, str) else
                     name in excluded or any(name.endswith("." + e) for e in excluded)):
        return False
    if targets is None or any(f"{name}.weight".endswith(t) for t in cfg.get("target_parameters") or ()):
        return True  # (a mixture of experts' router, as target_parameters names its weight)
    if isinstance(targets, str):
        return targets.lower() == "all-linear" or re.fullmatch(targets, name) is not None
    if name in targets:
        return True
    if not any(name.endswith("." + t) for t in targets):
        return False
    layers = cfg.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    patterns = cfg.get("layers_pattern")
    patterns = [patterns] if isinstance(patterns, str) else patterns or []
    if patterns and not any(re.match(rf"(?:^|.*?\.){p}\.\d+\.", name) for p in patterns):
        return False
    return layer == layers if isinstance(layers, int) else layer in layers


def positive(value, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
        raise AdapterError(f"{where} must be a positive number, got {value!r}")


def finite(value, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise AdapterError(f"{where} must be a finite number, got {value!r}")


def pattern_value(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key matching the end of the module's name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def module_scale(cfg: dict, layer: int, module: str, rank: int, prefix: str = "model") -> float:
    alpha = pattern_value(cfg.get("alpha_pattern"), f"{prefix}.layers.{layer}.{module}", cfg["lora_alpha"])
    return alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
