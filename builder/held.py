"""A checkpoint whose float weights are all bfloat16 (or all float16), held in that type: half the memory
of transformers' float32 model, and the float32 model to everything the build computes with it.

Most releases are bfloat16, and the build's reference is transformers in float32. Holding that model
whole took 4 bytes a parameter, and was an int4 build's peak (an 8B model: 32 GB before any
temporaries). A 16-bit value widens to float32 exactly, so the float32 model is the held one with
each weight widened where it is used:
- transformers' forward: each layer (a child of a ModuleList) and each other module with weights of its
  own gets its weights in float32 for its forward, and its held ones back after it (float32_forward).
  A layer's modules may read each other's weights (LFM2's convolution reads its conv's), which a
  layer's whole widening covers.
- the buffers: those the checkpoint holds are widened; those a module computes as it is made (RoPE's
  inverse frequencies, Gemma's embedding scale, Gemma 4's per-layer scalars) are made again as the
  float32 model makes them, where a 16-bit load would have rounded them (float32_buffers);
- the graph's weights: checkpoint.state_dict_numpy gives each in float32 when it is read
  (checkpoint.Weights), never all at once.
tests/builder/test_held.py checks transformers' logits bit for bit against the float32 model's, on
every architecture of tests/tiny_models.py.

The build holds a checkpoint so when it can (held_dtype, still_wide): safetensors of one 16-bit type
(with float32 tensors where the 16-bit load keeps them float32) and no packed GPTQ/AWQ projections.
A vision-language model's language model is held, its encoders widened (loaded). A bundled LoRA
adapter's check merges it into a float32 copy (widened); the EAGLE reference widens the rows of
the embedding it reads.
"""
from __future__ import annotations

from pathlib import Path

import torch

from trtllm.builder.weight_files import float_counts

HELD = {"BF16": torch.bfloat16, "F16": torch.float16}


def held_dtype(source) -> tuple[torch.dtype | None, list[str]]:
    """(the 16-bit type of a checkpoint directory's safetensors, from their headers; the names of its
    float32 tensors, which the model must keep in float32 when it loads it in that type: still_wide).
    (None, []) where there is no one 16-bit type, or where that is not known."""
    names: dict[str, list[str]] = {}
    counts = float_counts(Path(str(source)).expanduser(), names)
    sixteen = [kind for kind in counts or () if kind in HELD]
    if len(sixteen) != 1 or set(counts) - {sixteen[0], "F32"}:
        return None, []
    return HELD[sixteen[0]], names.get("F32", [])


def still_wide(model, names: list[str]) -> bool:
    """Whether the checkpoint's float32 tensors are float32 in the model loaded in a 16-bit type (LFM2-MoE's
    expert biases are, as transformers loads buffers; a float32 norm would be rounded)."""
    state = model.state_dict()
    wide = [k for k, v in state.items() if v.dtype == torch.float32]

    def kept(name: str) -> bool:
        if name in state:
            return state[name].dtype == torch.float32
        # a name transformers maps as it loads (ERNIE 4.5 MoE's moe_statics, under its gate in the model): a
        # float32 entry of the same layer with the same last name
        parts = name.split(".")
        layer = ".".join(parts[:3]) + "." if parts[:2] == ["model", "layers"] else ""
        return any(k.startswith(layer) and k.endswith("." + parts[-1]) for k in wide)

    return all(kept(name) for name in names)


def loaded(load_in, source, hold: bool, language=None):
    """load_in(dtype) -> (model, loading info), in the checkpoint's 16-bit type and held where it can be
    (held_dtype, still_wide: info["held"] names the type), else in float32. `language(model)`: a
    vision-language model's modules to hold (its decoder and head); the rest, its encoders (small beside
    it), is widened for good, as their code reads their weights' type to cast what it is given (SigLIP's
    and Qwen-VL's pixels, to their patch embedding's type)."""
    dtype, wide = held_dtype(source) if hold else (None, [])
    model, info = load_in(dtype or torch.float32)
    if dtype is None:
        return model, info
    if not still_wide(model, wide):  # (loaded again, in float32)
        del model
        return load_in(torch.float32)
    float32_buffers(model, dtype)
    parts = [model] if language is None else language(model)
    kept = {id(p) for part in parts for p in part.parameters()}
    for p in model.parameters():
        if id(p) not in kept and p.dtype == dtype:
            p.data = p.data.float()
    for part in parts:
        float32_forward(part, dtype)
    return model, {**info, "held": str(dtype).removeprefix("torch.")}


def float32_buffers(model, dtype: torch.dtype) -> None:
    """The buffers as the float32 load has them: the checkpoint's widened, the computed ones computed again
    in float32 (by a copy of the model made without its weights)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        made = dict(type(model)._from_config(model.config, dtype=torch.float32).named_buffers())
    stored = set(model.state_dict())
    for name, buffer in list(model.named_buffers()):
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if name not in stored:
            module._buffers[attr] = made[name].to(buffer.device)
        elif buffer.dtype == dtype:
            module._buffers[attr] = buffer.float()


def float32_forward(model, dtype: torch.dtype) -> None:
    """Forward hooks: each unit's held weights in float32 during its forward, the held tensors back after
    it (the same tensors: nothing is rounded, nothing copied to keep)."""
    units = [m for parent in model.modules() if isinstance(parent, torch.nn.ModuleList) for m in parent]
    inside = {id(m) for unit in units for m in unit.modules()}
    units += [m for m in model.modules() if id(m) not in inside and any(
        p is not None for p in m._parameters.values())]
    for unit in units:
        params = [p for p in (unit.parameters() if id(unit) in inside else unit._parameters.values())
                  if p is not None and p.dtype == dtype]
        if params:
            held: dict[int, torch.Tensor] = {}
            hooks = (unit.register_forward_pre_hook(lambda _m, _a, ps=params, held=held: widen(ps, held)),
                     unit.register_forward_hook(lambda _m, _a, _o, ps=params, held=held: narrow(ps, held)))
            unit._held_hooks = tuple(hook.id for hook in hooks)


def widen(params: list, held: dict) -> None:
    for p in params:
        if p.dtype != torch.float32:  # (a layer inside another widened unit: already float32)
            held[id(p)] = p.data
            p.data = p.data.float()


def narrow(params: list, held: dict) -> None:
    for p in params:
        if id(p) in held:
            p.data = held.pop(id(p))


def widened(model):
    """A copy of a model in float32 without the hooks above (a float32 model's plain copy): what a check
    merges a LoRA adapter into (PEFT's merge and ours write the sum into the weights, which the held
    type would round)."""
    import copy

    twin = copy.deepcopy(model)
    for module in twin.modules():
        for hook in getattr(module, "_held_hooks", ()):
            module._forward_pre_hooks.pop(hook, None)
            module._forward_hooks.pop(hook, None)
        module.__dict__.pop("_held_hooks", None)
    for p in twin.parameters():
        if p.dtype in HELD.values():
            p.data = p.data.float()
    return twin
