"""LoRA adapters at run time (DESIGN.md §4): switching adapters is binding other arrays, never a rebuild.

A LoRA engine (`trtllm-build --max-lora-rank R`) has, per layer i and projection (PEFT's module
name, e.g. self_attn.q_proj), the inputs lora_a.{i}.{module} [n, in, r] and lora_b.{i}.{module}
[n, r, out], and adds (x @ lora_a) @ lora_b to that projection's columns of its fused projection
(builder/decoder.py `lora_sites`; a mixture of experts' dense MLP, shared expert, router and routed
experts are on some layers only; runtime/lora_experts.py reads the experts'). A PEFT adapter becomes those arrays once, when it is loaded:
lora_a = A^T, lora_b = scale * B^T with PEFT's scale (alpha / r, or alpha / sqrt(r) with rsLoRA);
a module it does not adapt gets rank 0 (its delta is zero).

TensorRT Edge-LLM's processed adapters (process-lora's processed_adapter_model.safetensors with
config.json) are read too: their matrices transposed back, their B already scaled.

A step's rows may use different adapters (`StepAdapters`): when they share one, or none, its own
[1, ...] arrays are bound as they are (n = 1 broadcasts over the batch); otherwise each row's
arrays, zero-padded to the step's largest rank, are stacked to n = batch.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtllm.plugins.cpu import LORA_LOWERING
from trtllm.runtime.lora_experts import ExpertTensors, stacked_arrays
from trtllm.runtime.manifest import Manifest, lora_projections

# the adapter files' names, patterns and readers (runtime/lora_files.py); the names and readers imported
# from here by the builder, the server and the tests too
from trtllm.runtime.lora_files import (CONFIG_NAME, KEY, PROCESSED_CONFIG_NAME, PROCESSED_KEY, PROCESSED_NAME,  # noqa: F401
                                       ROUTED, VISION_MODULES, WEIGHTS_NAME, AdapterError, adapter_files, key_pattern,
                                       module_scale, pattern_value, processed_config, read_config, read_safetensors,
                                       targeted)


@dataclass(frozen=True)
class Adapter:
    """One adapter as graph inputs: input name -> [1, in, r] / [1, r, out] in the engine's dtype."""

    name: str
    digest: str   # sha256 of `arrays`: what saved system-prompt KV is keyed by
    arrays: dict[str, np.ndarray]
    rank: int     # the largest rank of its modules


def dtype_of(manifest: Manifest) -> np.dtype:
    """LoRA inputs are float16 in a float16 engine, else float32 (a bfloat16 engine's too: numpy has no
    bfloat16); the graph casts them to the type it computes in (builder/decoder.py, lora_type)."""
    return np.dtype(np.float16 if manifest.dtype == "float16" else np.float32)


def load_adapter(name: str, path: str | Path, manifest: Manifest) -> Adapter:
    """Read a PEFT LoRA adapter and turn it into this engine's LoRA inputs (AdapterError if it does
    not fit: a module the graph has no site for, a shape of another model, a rank above the engine's)."""
    try:
        return convert(name, path, manifest)
    except AdapterError:
        raise
    except Exception as e:  # a malformed file the checks did not foresee still fails only its requests
        raise AdapterError(f"{path} cannot be read as a LoRA adapter ({type(e).__name__}: {e})") from None


def convert(name: str, path: str | Path, manifest: Manifest) -> Adapter:
    if not manifest.lora:
        raise AdapterError(f"the engine was built without LoRA inputs; rebuild it with --max-lora-rank N "
                           f"(N >= the adapter's rank) to use adapter {name!r}")
    config_path, weights_path = adapter_files(path)
    try:  # each file read once: a trainer may rewrite them while we convert
        parts = (config_path.read_bytes(), weights_path.read_bytes())
    except OSError as e:
        raise AdapterError(f"{path} cannot be read ({e})") from None
    cfg = read_config(config_path, parts[0])
    tensors = read_safetensors(weights_path, parts[1])
    dtype = dtype_of(manifest)
    max_rank = manifest.limits.max_lora_rank
    known: dict[str, list[int]] = {}  # module -> the layers with its inputs
    on_experts: list[str] = []  # the modules with an adapter per routed expert (our names: PEFT's are others)
    for layer, module, _, _, n_experts in projections(manifest):
        known.setdefault(module, []).append(layer)
        if n_experts and module not in on_experts:
            on_experts.append(module)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    processed = processed_config(config_path)
    experts = ExpertTensors(str(weights_path))
    prefix = manifest.lora.get("prefix", "model")
    if processed and prefix != "model":  # (its keys name the decoder's layers as a text model's)
        raise AdapterError(f"{weights_path}: an Edge-LLM processed adapter, and this vision-language engine reads "
                           f"PEFT adapters of the whole model only (modules under {prefix}): give the PEFT adapter it "
                           "was made from")
    for key, value in tensors.items():
        if VISION_MODULES.fullmatch(key):
            raise AdapterError(f"{weights_path}: tensor {key} adapts the vision encoder, which takes no LoRA here "
                               f"(an adapter may adapt the language model's {', '.join(known)}): train it with "
                               "target_modules naming the language model's modules only")
        m = (PROCESSED_KEY if processed else key_pattern(prefix)).fullmatch(key.replace(".default.", "."))
        routed = m is not None and m[2] not in known and ROUTED.fullmatch(m[2]) is not None
        if routed and on_experts and not processed and int(m[1]) in known[on_experts[0]] \
                and experts.take(int(m[1]), m[2], m[3], value):
            continue  # (checked against the config as PEFT does, per expert, below)
        if m is not None and m[2] in on_experts:  # (our name for them, not one of PEFT's)
            raise AdapterError(f"{weights_path}: tensor {key} is in neither of PEFT's forms of the experts' LoRA (a "
                               "pair per expert, mlp.experts.{e}.gate_proj ..., or target_parameters' stacked "
                               "mlp.experts): docs/lora.md")
        if routed:
            router = any(part in ("gate", "router") for part in m[2].split(".")[:2])
            why = ("Edge-LLM's processed adapters are read on the dense projections only" if processed else
                   "this engine has no LoRA inputs on its router: it was built before trtllm-edge took them (rebuild "
                   "it), or the adapter names it otherwise (transformers 4's Granite MoE router.layer)" if router else
                   f"layer {m[1]} has no experts" if on_experts else
                   "this engine has no LoRA inputs on its experts: ONNX Runtime's MoE node runs them (build it with "
                   "our CPU kernels, trtllm-build --cpu-kernels auto), or it was built before trtllm-edge took them "
                   "(rebuild it)")
            raise AdapterError(f"{weights_path}: tensor {key} adapts a mixture of experts' "
                               f"{'router' if router else 'routed experts'}; LoRA on it is not supported here"
                               f"{'; ' + why if why else ''} (an adapter may adapt {', '.join(known)}): train it "
                               "with target_modules naming those only")
        if m is None and prefix != "model" and KEY.fullmatch(key.replace(".default.", ".")):
            raise AdapterError(f"{weights_path}: tensor {key} names the language model as a model of its own; this "
                               f"vision-language engine takes PEFT adapters of the whole model, whose names are "
                               f"base_model.model.{prefix}.layers...: train it on the whole model")
        if m is None or m[2] not in known:
            raise AdapterError(f"{weights_path}: tensor {key} is not a LoRA matrix of a module this engine can "
                               f"adapt ({', '.join(known)})")
        layer = int(m[1])
        if layer >= manifest.model.num_layers:
            raise AdapterError(f"{weights_path}: tensor {key} is for layer {layer}; the model has "
                               f"{manifest.model.num_layers}")
        if layer not in known[m[2]]:  # a mixture of experts' dense MLP or shared expert, on a layer without it
            raise AdapterError(f"{weights_path}: tensor {key} is for layer {layer}, which has no {m[2]} (the "
                               f"layers with one: {known[m[2]]})")
        if not targeted(cfg, layer, m[2], prefix):  # PEFT would leave it out; applying it would compute something else
            raise AdapterError(f"{weights_path}: tensor {key} is for a module that {config_path} does not target "
                               f"(target_modules {cfg.get('target_modules')!r}, layers_to_transform "
                               f"{cfg.get('layers_to_transform')!r}); PEFT would not load it: fix the config or "
                               "remove the tensor")
        pairs.setdefault((layer, m[2]), {})[m[3]] = value
    if not pairs and not experts:  # (an export that saved nothing, or under names of its own: the base model)
        raise AdapterError(f"{weights_path} holds no LoRA matrices")
    for (layer, _, e), peft in experts.names.items():  # PEFT's check, as for any Linear
        if not targeted(cfg, layer, peft):
            raise AdapterError(f"{weights_path}: layer {layer}'s {peft} tensors are for a module that {config_path} "
                               f"does not target (target_modules {cfg.get('target_modules')!r}); PEFT would not "
                               "load them")
    stacked = experts.pairs(manifest.lora["sites"], cfg, max_rank) if experts else {}
    arrays: dict[str, np.ndarray] = {}
    top = 0
    for layer, mod, n_in, n_out, n_experts in projections(manifest):
        if n_experts:  # an adapter per routed expert (runtime/lora_experts.py)
            a, b = stacked_arrays(stacked.get((layer, mod), [None] * n_experts), n_in, n_out)
            top = max(top, a.shape[-1])
            arrays.update(module_arrays(manifest, layer, mod, a, b, dtype, stacked=True))
            continue
        pair = pairs.get((layer, mod))
        if pair is not None and processed:
            pair = unprocessed(pair, cfg["r"], n_in, n_out)
        if pair is None:  # not adapted: rank 0
            a, b = np.zeros((0, n_in)), np.zeros((n_out, 0))
        else:
            a, b = checked_pair(pair, f"{weights_path}: layer {layer} {mod}", n_in, n_out, max_rank)
            declared = pattern_value(cfg.get("rank_pattern"), f"{prefix}.layers.{layer}.{mod}", cfg["r"])
            if a.shape[0] != declared:  # PEFT scales by the declared rank, and would not load this either
                raise AdapterError(f"{weights_path}: layer {layer} {mod} has rank {a.shape[0]}, but {config_path} "
                                   f"says {declared} (r or rank_pattern)")
            top = max(top, a.shape[0])
            # (processed: B holds Edge-LLM's alpha / r already, what its engine computes with)
            b = (1.0 if processed else module_scale(cfg, layer, mod, a.shape[0], prefix)) * b.astype(np.float32)
            rope = manifest.lora.get("interleaved_rope")  # its rotary_dim: q and k rows as the build ordered them
            if rope and mod in ("self_attn.q_proj", "self_attn.k_proj"):
                b = b[rope_pair_order(n_out, manifest.model.head_dim, rope)]
        arrays.update(module_arrays(manifest, layer, mod, a, b, dtype))
    return Adapter(name=name, digest=arrays_digest(arrays), arrays=arrays, rank=top)


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """sha256 of the converted arrays, names, dtypes and shapes: what the engine computes with, so a
    changed file or a changed conversion (a later trtllm-edge's scaling) is another key for saved KV."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        head = f"{name}\0{a.dtype.str}\0{a.shape}".encode()
        for part in (head, a.tobytes()):  # each after its length: no two splits of one byte string match
            h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def unprocessed(pair: dict, r: int, n_in: int, n_out: int) -> dict:
    """PEFT's A [r, in] and B [out, r] of a processed pair: process-lora transposed A unless its
    in was the config's r, and B unless its out was (a square matrix it left as it was)."""
    out = dict(pair)
    for ab, side in (("A", n_in), ("B", n_out)):
        if ab in out and out[ab].ndim == 2 and side != r:
            out[ab] = out[ab].T
    return out


def rope_pair_order(width: int, head_dim: int, rotary_dim: int) -> np.ndarray:
    """Row order of a q or k projection [width = heads x head_dim] whose RoPE turns the pairs (2i, 2i + 1)
    of each head's first rotary_dim (ERNIE 4.5, Helium), for a graph that turns (i, i + rotary_dim / 2):
    row i of a head takes 2i, row i + rotary_dim / 2 takes 2i + 1, the rest stay. Scores are the same,
    q and k being reordered alike; the build reorders the weights, and this the adapters' lora_B."""
    head = np.concatenate([np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2), np.arange(rotary_dim, head_dim)])
    return (np.arange(width // head_dim)[:, None] * head_dim + head).ravel()


def projections(manifest: Manifest) -> Iterator[tuple[int, str, int, int, int]]:
    """(layer, PEFT module, in, out, experts) of every LoRA input pair of a LoRA engine, layer by
    layer (experts: E on a mixture of experts' routed experts, an adapter each; else 0)."""
    return lora_projections(manifest.lora, manifest.model.num_layers)


def checked_pair(pair: dict, where: str, n_in: int, n_out: int, max_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """A module's lora_A [r, in] and lora_B [out, r], or AdapterError saying what does not fit."""
    if set(pair) != {"A", "B"}:
        have = next(iter(pair))
        raise AdapterError(f"{where} has lora_{have} without lora_{'B' if have == 'A' else 'A'}")
    a, b = pair["A"], pair["B"]
    r = a.shape[0] if a.ndim == 2 else -1
    if r < 1 or a.shape != (r, n_in) or b.shape != (n_out, r):
        raise AdapterError(f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit this model "
                           f"([r, {n_in}] and [{n_out}, r]): an adapter for another model?")
    if r > max_rank:
        raise AdapterError(f"{where} has rank {r}, above the engine's max_lora_rank {max_rank}; "
                           f"rebuild with --max-lora-rank {r} or more")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise AdapterError(f"{where} holds NaN or infinite values")
    return a, b


def module_arrays(manifest: Manifest, layer: int, module: str, a: np.ndarray, b: np.ndarray, dtype,
                  stacked: bool = False) -> dict:
    """PEFT's A [r, in] and (scaled) B [out, r] as the graph's lora_a [1, in, r] and lora_b [1, r, out];
    `stacked`: the experts' a [E, in, r] and b [E, r, out] as [1, E, in, r] and [1, E, r, out]."""
    io = manifest.io
    a, b = (a, b) if stacked else (a.T, b.T)
    return {io.lora_a.format(i=layer, module=module): np.ascontiguousarray(a[None], dtype),
            io.lora_b.format(i=layer, module=module): np.ascontiguousarray(b[None], dtype)}


def base_adapter(manifest: Manifest) -> Adapter:
    """No adapter: rank 0 on every module, so every delta is zero."""
    dtype = dtype_of(manifest)
    arrays = {}
    for layer, mod, n_in, n_out, experts in projections(manifest):
        if experts:
            arrays.update(module_arrays(manifest, layer, mod, np.zeros((experts, n_in, 0)),
                                        np.zeros((experts, 0, n_out)), dtype, stacked=True))
        else:
            arrays.update(module_arrays(manifest, layer, mod, np.zeros((0, n_in)), np.zeros((n_out, 0)), dtype))
    return Adapter(name="", digest="", arrays=arrays, rank=0)


class StepAdapters:
    """The LoRA inputs of a step over KV slots [start, start + len(rows)), from its rows' adapters
    (None: no adapter; IDLE: an idle slot, whose output nobody reads).

    Rows that share one adapter (or none) bind its own [1, ...] arrays. Mixed rows bind views of
    per-slot buffers [num_slots, in, R] and [num_slots, R, out], R the largest rank written so far
    (zero beyond each adapter's): a slot's rows are rewritten only when its adapter changes, so an
    in-flight batch copies one adapter per admitted request, not the batch per step. Without our
    LoraAdd kernel (the standard-op form: the legacy graph, --cpu-kernels onnxruntime, TensorRT),
    several rows sharing an adapter bind the per-slot buffers too: a [1, ...] adapter makes MatMul
    fold the batch into one product whose rounding depends on the batch's size, and a row's tokens
    must not depend on its neighbours."""

    IDLE = object()

    def __init__(self, manifest: Manifest, num_slots: int):
        self.base = base_adapter(manifest)
        self.shared_exact = LORA_LOWERING in manifest.lowerings  # LoraAdd: a shared adapter per row alike
        self.a_names = {manifest.io.lora_a.format(i=i, module=mod) for i, mod, _, _, _ in projections(manifest)}
        self.num_slots = num_slots
        self.held: list = [None] * num_slots  # the adapter each slot's buffer rows hold
        self.buffers: dict[str, np.ndarray] = {}
        # The same view objects step after step while no slot changes, new ones after a change: the
        # TensorRT backend uploads an input again only when its array object is another one.
        self.views: dict[tuple[int, int], dict[str, np.ndarray]] = {}

    def feeds(self, start: int, adapters: Sequence) -> dict[str, np.ndarray]:
        rows = [self.base if a is None else a for a in adapters]
        used = {id(a): a for a in rows if a is not self.IDLE}
        only = next(iter(used.values()), self.base)
        if len(used) <= 1 and (only is self.base or self.shared_exact or len(rows) == 1):
            return only.arrays
        self.fit(used.values())
        for slot, adapter in enumerate(rows, start):
            if adapter is not self.IDLE and self.held[slot] is not adapter:
                self.write(slot, adapter)
                self.views = {}  # new view objects: a backend that copies inputs by identity copies again
        span = (start, start + len(rows))
        if span not in self.views:
            self.views[span] = {name: buf[span[0]:span[1]] for name, buf in self.buffers.items()}
        return self.views[span]

    def rank_axis(self, name: str) -> int:
        """lora_a [n, (E,) in, r]: its last axis; lora_b [n, (E,) r, out]: the one before."""
        return self.base.arrays[name].ndim - (1 if name in self.a_names else 2)

    def fit(self, adapters) -> None:
        """Buffers at least as wide as these adapters' ranks, growing (content kept) when one is wider."""
        for name, base in self.base.arrays.items():
            axis = self.rank_axis(name)
            need = max(a.arrays[name].shape[axis] for a in adapters)
            old = self.buffers.get(name)
            if old is not None and old.shape[axis] >= need:
                continue
            shape = list(base.shape)
            shape[0], shape[axis] = self.num_slots, need
            new = np.zeros(shape, base.dtype)
            if old is not None:
                new[(slice(None),) * axis + (slice(0, old.shape[axis]),)] = old
            self.buffers[name] = new
            self.views = {}

    def write(self, slot: int, adapter: Adapter) -> None:
        for name, buf in self.buffers.items():
            src = adapter.arrays[name][0]
            buf[slot] = 0
            buf[slot][(slice(None),) * (self.rank_axis(name) - 1) + (slice(0, src.shape[self.rank_axis(name) - 1]),)] = src
        self.held[slot] = adapter


class AdapterSet:
    """The adapters one run may name: the engine's bundled ones (ENGINE_DIR/lora/NAME) and the input
    file's `available_lora_weights` (which win on a shared name; relative paths are from the input
    file's directory). Each is loaded on first use and kept; a failure is remembered too, so every
    request naming it fails with the same message and the others run."""

    def __init__(self, manifest: Manifest, paths: dict[str, Path], given: frozenset[str] = frozenset()):
        self.manifest, self.paths = manifest, paths
        self.given = given  # the names the input file's available_lora_weights gives (its value to fix)
        self.loaded: dict[str, Adapter | AdapterError] = {}

    @classmethod
    def for_run(cls, engine, available: dict[str, str], input_dir=".") -> "AdapterSet":
        m = engine.manifest
        paths = {name: Path(engine.engine_dir) / rel for name, rel in m.lora.get("adapters", {}).items()}
        paths.update({name: Path(input_dir) / p for name, p in available.items()})  # an absolute p stays p
        return cls(m, paths, frozenset(available))

    def preload(self, names) -> None:
        """Load these (the engine's bundled ones a run names) now, while its files are checked to be
        one build's; a failure is kept for the requests naming it, as get() keeps it."""
        for name in sorted(names):
            if name in self.paths:
                try:
                    self.get(name)
                except AdapterError:
                    pass

    def get(self, name: str) -> Adapter:
        if name not in self.loaded:
            try:
                self.loaded[name] = load_adapter(name, self.paths[name], self.manifest)
            except AdapterError as e:
                self.loaded[name] = e
        found = self.loaded[name]
        if isinstance(found, AdapterError):
            raise found
        return found
