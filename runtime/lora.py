"""LoRA adapters at run time (DESIGN.md §4): switching adapters is binding other arrays, never a rebuild.

A LoRA engine (`trtllm-build --max-lora-rank R`) has, per layer i and site (qkv, o, gate_up, down:
builder/decoder.py `lora_sites`), the inputs lora_a.{i}.{site} [n, in, r] and lora_b.{i}.{site}
[n, r, out], and adds (x @ lora_a) @ lora_b to that site's projection. A PEFT adapter becomes those
arrays once, when it is loaded, with PEFT's scale (alpha / r, or alpha / sqrt(r) with rsLoRA) folded
into lora_b. Modules of one site sit side by side in lora_a and block-diagonally in lora_b:

    site qkv, adapter on q_proj and v_proj (rank 8 each):
        lora_a = [A_q^T  A_v^T]                       [in, 16]
        lora_b = [[s B_q^T   0   0      ]             [16, q + k + v]
                  [0         0   s B_v^T]]

A step's rows may use different adapters (`StepAdapters`): when they share one, or none, its own
[1, ...] arrays are bound as they are (n = 1 broadcasts over the batch; no adapter is rank 0);
otherwise each row's arrays, zero-padded to the step's largest rank, are stacked to n = batch.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtllm.runtime.manifest import Manifest

CONFIG_NAME, WEIGHTS_NAME = "adapter_config.json", "adapter_model.safetensors"
# PEFT's key for a LoRA matrix of a decoder layer's projection, e.g.
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight ([r, in]; lora_B is [out, r])
KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.((?:self_attn|mlp)\.\w+)\.lora_([AB])\.weight")
SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}


class AdapterError(ValueError):
    """An adapter this engine cannot use; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Adapter:
    """One adapter as graph inputs: input name -> [1, in, r] / [1, r, out] in the engine's dtype."""

    name: str
    digest: str   # sha256 of its config and weights: what saved system-prompt KV is keyed by
    arrays: dict[str, np.ndarray]
    rank: int     # the largest rank of its modules


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file as numpy arrays. Read here, not with safetensors' numpy
    loader, because numpy has no bfloat16 (that loader refuses it) and PEFT adapters trained in
    bfloat16 are common: bfloat16 is widened to float32 exactly (it is float32's upper half)."""
    data = path.read_bytes()
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise AdapterError(f"{path}: tensor {name} is {info['dtype']}; adapters must be float32, "
                                   "float16 or bfloat16")
            start, stop = info["data_offsets"]
            raw = np.frombuffer(data, dtype, (stop - start) // np.dtype(dtype).itemsize, 8 + size + start)
            if info["dtype"] == "BF16":
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            out[name] = raw.reshape(info["shape"])
    except AdapterError:
        raise
    except (ValueError, KeyError, TypeError) as e:  # JSON, offsets or shapes that do not add up
        raise AdapterError(f"{path} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    return out


def adapter_files(path: str | Path) -> tuple[Path, Path]:
    """(adapter_config.json, weights) of a PEFT adapter directory, or of a .safetensors file with
    adapter_config.json beside it."""
    p = Path(path)
    weights = p / WEIGHTS_NAME if p.is_dir() else p
    config = weights.parent / CONFIG_NAME
    if p.is_dir() and not weights.is_file():
        bin_file = p / "adapter_model.bin"
        hint = " (a PyTorch .bin: save it with safe_serialization=True)" if bin_file.is_file() else ""
        raise AdapterError(f"{p} has no {WEIGHTS_NAME}{hint}")
    if not weights.is_file():
        raise AdapterError(f"{p} does not exist: give a PEFT adapter directory or its .safetensors file")
    if not config.is_file():
        raise AdapterError(f"{config} is missing: a PEFT adapter keeps its rank and alpha there")
    return config, weights


def read_config(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise AdapterError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise AdapterError(f"{path} must hold a JSON object")
    problems = {
        "peft_type": cfg.get("peft_type", "LORA") != "LORA",
        "use_dora": bool(cfg.get("use_dora")),
        "modules_to_save": bool(cfg.get("modules_to_save")),
        "fan_in_fan_out": bool(cfg.get("fan_in_fan_out")),
        "bias": cfg.get("bias", "none") != "none",
    }
    for key, bad in problems.items():
        if bad:
            raise AdapterError(f"{path}: {key} = {cfg.get(key)!r} is not supported (plain LoRA on the decoder's "
                               "linear layers only: no DoRA, trained biases or fully saved modules)")
    for key in ("r", "lora_alpha"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise AdapterError(f"{path}: {key} must be a positive number, got {value!r}")
    return cfg


def pattern_value(patterns: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key matching the end of the module's name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def module_scale(cfg: dict, layer: int, module: str, rank: int) -> float:
    alpha = pattern_value(cfg.get("alpha_pattern"), f"model.layers.{layer}.{module}", cfg["lora_alpha"])
    return alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank


def load_adapter(name: str, path: str | Path, manifest: Manifest, dtype=np.float32) -> Adapter:
    """Read a PEFT LoRA adapter and turn it into this engine's LoRA inputs (AdapterError if it does
    not fit: a module the graph has no site for, a shape of another model, a rank above the engine's)."""
    if not manifest.lora:
        raise AdapterError(f"the engine was built without LoRA inputs; rebuild it with --max-lora-rank N "
                           f"(N >= the adapter's rank) to use adapter {name!r}")
    config_path, weights_path = adapter_files(path)
    cfg = read_config(config_path)
    tensors = read_safetensors(weights_path)
    digest = hashlib.sha256(config_path.read_bytes() + weights_path.read_bytes()).hexdigest()
    sites, max_rank = manifest.lora["sites"], manifest.limits.max_lora_rank
    site_of = {m[0]: site for site, s in sites.items() for m in s["modules"]}
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        m = KEY.fullmatch(key.replace(".default.", "."))
        if m is None or m[2] not in site_of:
            raise AdapterError(f"{weights_path}: tensor {key} is not a LoRA matrix of a layer's q/k/v/o, gate, up "
                               "or down projection, the modules this engine can adapt")
        layer = int(m[1])
        if layer >= manifest.model.num_layers:
            raise AdapterError(f"{weights_path}: tensor {key} is for layer {layer}; the model has "
                               f"{manifest.model.num_layers}")
        pairs.setdefault((layer, m[2]), {})[m[3]] = value
    arrays: dict[str, np.ndarray] = {}
    top = 0
    for layer in range(manifest.model.num_layers):
        for site, s in sites.items():
            parts = []  # (lo, hi, A [r, in], scale * B [out_m, r])
            for mod, lo, hi in s["modules"]:
                pair, where = pairs.get((layer, mod)), f"{weights_path}: layer {layer} {mod}"
                if pair is None:
                    continue
                if set(pair) != {"A", "B"}:
                    have = next(iter(pair))
                    raise AdapterError(f"{where} has lora_{have} without lora_{'B' if have == 'A' else 'A'}")
                a, b = pair["A"], pair["B"]
                r = a.shape[0]
                if a.shape != (r, s["in"]) or b.shape != (hi - lo, r):
                    raise AdapterError(f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit this "
                                       f"model ([r, {s['in']}] and [{hi - lo}, r]): an adapter for another model?")
                if r > max_rank:
                    raise AdapterError(f"{where} has rank {r}, above the engine's max_lora_rank {max_rank}; "
                                       f"rebuild with --max-lora-rank {r} or more")
                if not (np.isfinite(a).all() and np.isfinite(b).all()):
                    raise AdapterError(f"{where} holds NaN or infinite values")
                top = max(top, r)
                parts.append((lo, hi, a, module_scale(cfg, layer, mod, r) * b.astype(np.float32)))
            arrays.update(site_arrays(manifest, layer, site, s, parts, dtype))
    return Adapter(name=name, digest=digest, arrays=arrays, rank=top)


def site_arrays(manifest: Manifest, layer: int, site: str, s: dict, parts: list, dtype) -> dict:
    """One site's [1, in, R] and [1, R, out] (R = the sum of its modules' ranks; 0 when none)."""
    rank = sum(a.shape[0] for _, _, a, _ in parts)
    lora_a = np.zeros((1, s["in"], rank), np.float32)
    lora_b = np.zeros((1, rank, s["modules"][-1][2]), np.float32)
    col = 0
    for lo, hi, a, b in parts:
        r = a.shape[0]
        lora_a[0, :, col:col + r] = a.T
        lora_b[0, col:col + r, lo:hi] = b.T
        col += r
    io = manifest.io
    return {io.lora_a.format(i=layer, site=site): lora_a.astype(dtype),
            io.lora_b.format(i=layer, site=site): lora_b.astype(dtype)}


def base_adapter(manifest: Manifest, dtype=np.float32) -> Adapter:
    """No adapter: rank 0 at every site, so every delta is zero."""
    arrays = {}
    for layer in range(manifest.model.num_layers):
        for site, s in manifest.lora["sites"].items():
            arrays.update(site_arrays(manifest, layer, site, s, [], dtype))
    return Adapter(name="", digest="", arrays=arrays, rank=0)


class StepAdapters:
    """The LoRA inputs of one step, from its rows' adapters (None: no adapter; IDLE: an idle slot,
    whose output nobody reads). Mixed steps are stacked once per combination and then reused, so a
    decode step whose rows keep their adapters binds the same arrays again."""

    IDLE = object()
    CACHED = 4  # stacked combinations kept (a decode batch changes combination when a row finishes)

    def __init__(self, manifest: Manifest, dtype=np.float32):
        self.base = base_adapter(manifest, dtype)
        io, m = manifest.io, manifest
        self.a_names = {io.lora_a.format(i=i, site=site) for i in range(m.model.num_layers) for site in m.lora["sites"]}
        self.stacked: dict[tuple, dict[str, np.ndarray]] = {}

    def feeds(self, adapters: Sequence) -> dict[str, np.ndarray]:
        rows = [self.base if a is None else a for a in adapters]
        used = {id(a): a for a in rows if a is not self.IDLE}
        if len(used) <= 1:
            return next(iter(used.values()), self.base).arrays
        key = tuple(id(a) for a in rows)
        stacked = self.stacked.pop(key, None)
        if stacked is None:
            stacked = {name: self.stack([self.base if a is self.IDLE else a for a in rows], name,
                                        2 if name in self.a_names else 1) for name in self.base.arrays}
        self.stacked[key] = stacked  # most recently used last
        while len(self.stacked) > self.CACHED:
            del self.stacked[next(iter(self.stacked))]
        return stacked

    @staticmethod
    def stack(rows: list[Adapter], name: str, axis: int) -> np.ndarray:
        """Row b's [1, in, r_b] (or [1, r_b, out]: `axis` is r's) into [B, in, R], zero beyond r_b:
        zero columns of lora_a meet zero rows of lora_b, so padding adds nothing."""
        parts = [a.arrays[name] for a in rows]
        shape = list(parts[0].shape)
        shape[0], shape[axis] = len(parts), max(p.shape[axis] for p in parts)
        out = np.zeros(shape, parts[0].dtype)
        for b, p in enumerate(parts):
            index = (b, slice(None), slice(0, p.shape[2])) if axis == 2 else (b, slice(0, p.shape[1]))
            out[index] = p[0]
        return out


class AdapterSet:
    """The adapters one run may name: the engine's bundled ones (ENGINE_DIR/lora/NAME) and the input
    file's `available_lora_weights` (which win on a shared name; relative paths are from the input
    file's directory). Each is loaded on first use and kept; a failure is remembered too, so every
    request naming it fails with the same message and the others run."""

    def __init__(self, manifest: Manifest, dtype, paths: dict[str, Path]):
        self.manifest, self.dtype, self.paths = manifest, dtype, paths
        self.loaded: dict[str, Adapter | AdapterError] = {}

    @classmethod
    def for_run(cls, engine, engine_dir, available: dict[str, str], input_dir=".") -> "AdapterSet":
        m = engine.manifest
        paths = {name: Path(engine_dir) / rel for name, rel in m.lora.get("adapters", {}).items()}
        paths.update({name: Path(input_dir) / p for name, p in available.items()})  # an absolute p stays p
        return cls(m, getattr(engine, "lora_dtype", np.float32), paths)

    def get(self, name: str) -> Adapter:
        if name not in self.loaded:
            try:
                self.loaded[name] = load_adapter(name, self.paths[name], self.manifest, self.dtype)
            except AdapterError as e:
                self.loaded[name] = e
        found = self.loaded[name]
        if isinstance(found, AdapterError):
            raise found
        return found
