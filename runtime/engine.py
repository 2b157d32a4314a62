"""The Engine protocol: one step of the compiled graph, backend-agnostic numpy in and out.

    StepInputs                         engine.step()                 StepOutputs
    input_ids    [B,S] int64   ──►  decoder + KV update + sampler ──► token_ids       [B]   int64
    position_ids [B,S] int64        KV: per layer K,V numpy views    top_logprobs    [B,K] f32
    write_index  [B]   int64        [B, kv_heads, capacity, head]    top_logprob_ids [B,K] int64
    last_index   [B]   int64        (the KV manager's), updated      logits          [B,V] f32 (on request)
    sampling     SamplingBatch      in place
    lora         {name: array}      LoRA engines: lora_a/lora_b per layer and site (runtime/lora.py)
    verify_index [B,T] int64        EAGLE engines: positions   ──►  verify_ids  [B,T]   int64 (sampled)
                                    to verify (default [B,0])     hidden      [B,S,H] f32 (EAGLE: draft's input)
                                    prompt_logits engines: positions whose logits come out (prompt_logprobs)
    verify_uniform [B,T] f32        their random numbers (samples_verified: verify_sampler or eagle.verify
                                    "sampled"; older EAGLE engines: argmax)
                                    eagle.logprobs, prompt_logits: ──► verify_logits [B,T,V] f32 (on request)
    tree_mask    [B,S,T] bool       EAGLE tree engines: which of the step's last T slots each token
                                    sees (default [B,S,0]: causal)

`load_engine(engine_dir)` picks the backend named in the manifest through BACKENDS, a registry
of import paths, so each backend imports its own library (onnxruntime or tensorrt) only when used.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from trtllm.runtime import interrupt, lora
from trtllm.runtime import manifest as manifest_mod
from trtllm.runtime.sampling import SamplingBatch

BACKENDS = {
    "onnxruntime": "trtllm.runtime.backends.onnxruntime:OnnxRuntimeEngine",
    "tensorrt": "trtllm.runtime.backends.tensorrt:TensorRTEngine",
}


@dataclass(frozen=True, slots=True)
class StepInputs:
    input_ids: np.ndarray
    position_ids: np.ndarray
    write_index: np.ndarray
    last_index: np.ndarray
    sampling: SamplingBatch
    lora: dict | None = None
    verify_index: np.ndarray | None = None  # EAGLE and prompt_logits engines: int64 [B, T] (None: [B, 0])
    tree_mask: np.ndarray | None = None  # EAGLE tree engines: bool [B, S, T] (None: [B, S, 0], causal)
    verify_uniform: np.ndarray | None = None  # samples_verified engines: f32 [B, T] (None: 0s)
    prompt: bool = False  # the tokens come from the request (prefill), not from generation
    # vision-language engines: the step's image tokens' embeddings f32 [N, H] and their (row, position
    # in the step) int64 [N, 2] (None: N = 0)
    image_embeds: np.ndarray | None = None
    image_index: np.ndarray | None = None
    # engines whose images see themselves both ways (vision.bidirectional): for each image_index token,
    # the slots past its own it also sees, int64 [N] (None: 0s)
    image_ahead: np.ndarray | None = None
    # multimodal RoPE engines (manifest.vision.mrope_section): int64 [B], added to each row's text tokens'
    # slots for their rotary positions (None: 0s); and the step's tokens whose three positions are given
    # whole: (row, position in the step) int64 [M, 2] and (temporal, height, width) int64 [M, 3] (None: M = 0)
    rope_delta: np.ndarray | None = None
    rope_index: np.ndarray | None = None
    rope_positions: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class StepOutputs:
    token_ids: np.ndarray
    top_logprobs: np.ndarray
    top_logprob_ids: np.ndarray
    logits: np.ndarray | None = None  # asked for (want_logits): [B,V]; valid until the engine's next step
    verify_ids: np.ndarray | None = None  # samples_verified engines: the sampler's token at each verify_index position
    # eagle.logprobs and prompt_logits engines, asked for (want_logits): the verify_index positions'
    # [B,T,V]; valid until the engine's next step
    verify_logits: np.ndarray | None = None
    hidden: np.ndarray | None = None      # EAGLE engines: eagle_hidden, every position


class Engine(Protocol):
    manifest: manifest_mod.Manifest
    engine_dir: Path  # where its files are (bundled LoRA adapters)

    def step(self, inputs: StepInputs, kv: Sequence[np.ndarray], want_logits: bool = False) -> StepOutputs:
        """One graph run; `kv` = [K0, V0, K1, V1, ...], each contiguous [B, kv_heads, capacity,
        kv_row], written in place at write_index.."""

    def close(self) -> None: ...

    # Optional: make_kv_cache(model, num_slots, capacity) -> a KVCacheManager whose view() gives what
    # step() binds (the TensorRT backend keeps the cache in device memory). Default: host numpy.
    # (kv_cache.for_engine asks for it.)
    # Optional: numerics, a string naming what besides the engine's files decides the low bits of its
    # results (library versions, the CPU's code path): saved system-prompt KV is keyed by it too.
    # Optional: kv_memory() -> {name: bytes}, the backend's own KV-sized buffers, for the profile's
    # kv_cache section (the TensorRT legacy graph's present_copy_bytes). Default: none.
    # Optional: device_memory() -> the profile's peak_gpu_memory_* or peak_unified_memory_* keys (the
    # TensorRT backend). Default: none (ONNX Runtime's memory is the CPU's, peak_cpu_memory_*).


def load_engine(engine_dir, **options) -> Engine:
    m = manifest_mod.load(engine_dir)
    module_name, cls_name = BACKENDS[m.backend].split(":")
    # an interrupt inside a C extension's initialisation (onnxruntime's) comes out as its ImportError,
    # "initialization failed": under trtllm-run it waits for the import, then interrupts
    with interrupt.held():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != "onnxruntime":
                raise
            raise manifest_mod.ManifestError(
                f"{engine_dir} is an ONNX Runtime engine, but onnxruntime is not installed here (it installs with "
                f"trtllm-edge on Python >= 3.11; none before reads these graphs): pip install onnxruntime==1.32.0 "
                "on Python 3.11+, or build a TensorRT engine for this device") from None
    cls = getattr(module, cls_name)
    return cls(engine_dir, m, **options)


def vision_feeds(m: manifest_mod.Manifest, inputs: StepInputs, batch: int, zeros) -> dict:
    """A vision-language engine's image inputs of a step ({} where the manifest has no vision section):
    its image tokens' embeddings and their index, and on multimodal RoPE engines each row's shift and
    the tokens whose three positions come whole. A step without them gives empty ones: [0, H] (Qwen3-VL:
    H x (1 + its DeepStack layers)), [0, 2], [B] 0s (text alone: its slots), [0, 2], [0, 3]; Gemma 3's
    look-ahead of its image tokens (vision.bidirectional), 0s where none is given.
    `zeros(shape, dtype)` makes those (the ONNX Runtime engine keeps its own, bound step after step)."""
    io, v = m.io, m.vision
    if not v:
        return {}
    no_image = inputs.image_embeds is None
    width = m.model.hidden_size * (1 + v.get("deepstack_layers", 0))
    feeds = {io.image_embeds: zeros((0, width), np.float32) if no_image else inputs.image_embeds,
             io.image_index: zeros((0, 2), np.int64) if no_image else inputs.image_index}
    if v.get("bidirectional"):  # (an image's tokens without their look-ahead would be seen causally: wrong)
        if not no_image and inputs.image_ahead is None:
            raise ValueError("a step of image tokens on an engine whose images are seen both ways needs image_ahead")
        feeds[io.image_ahead] = zeros((0,), np.int64) if no_image else inputs.image_ahead
    if v.get("mrope_section"):
        given = inputs.rope_index is not None
        feeds[io.rope_delta] = zeros((batch,), np.int64) if inputs.rope_delta is None else inputs.rope_delta
        feeds[io.rope_index] = inputs.rope_index if given else zeros((0, 2), np.int64)
        feeds[io.rope_positions] = inputs.rope_positions if given else zeros((0, 3), np.int64)
    return feeds


def optional_inputs_mismatch(inputs: set[str], m: manifest_mod.Manifest) -> str:
    """The LoRA, EAGLE and image inputs the graph has against those the manifest's sections make the
    runtime feed, or "" (an input left unfed failed every request in ONNX Runtime)."""
    io, e = m.io, m.eagle
    prefixes = (io.lora_a.split("{")[0], io.lora_b.split("{")[0])
    lora_inputs = {name for name in inputs if name.startswith(prefixes)}
    if m.lora and lora_inputs != set(lora.base_adapter(m).arrays):
        return "the graph's LoRA inputs are not those of the manifest's lora.sites and limits.max_lora_rank"
    if lora_inputs and not m.lora:
        return "the graph has LoRA inputs, and the manifest no lora section"
    mrope = bool(m.vision.get("mrope_section"))
    for name, fed, section in ((io.image_embeds, bool(m.vision), "vision section"),
                               (io.image_index, bool(m.vision), "vision section"),
                               (io.image_ahead, bool(m.vision.get("bidirectional")), "vision.bidirectional"),
                               (io.rope_delta, mrope, "vision.mrope_section"),
                               (io.rope_index, mrope, "vision.mrope_section"),
                               (io.rope_positions, mrope, "vision.mrope_section"),
                               (io.verify_index, bool(e) or m.prompt_logits, "eagle section or prompt_logits"),
                               (io.verify_uniform, m.samples_verified, "verify_sampler or eagle.verify"),
                               (io.tree_mask, bool(e.get("tree")), "eagle.tree")):
        if (name in inputs) != fed:
            return (f"the graph has {'no' if fed else 'an'} input {name!r}, which the manifest's {section} "
                    f"{'calls for' if fed else 'does not call for'}")
    return ""
