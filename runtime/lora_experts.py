"""LoRA adapters on a mixture of experts' routed experts: the engine's inputs
lora_a.{i}.mlp.experts.{gate,up,down}_proj [1, E, in, r] and lora_b [1, E, r, out] (an adapter per
expert; runtime/lora.py makes the rest), from either of PEFT's forms:

- per expert, as PEFT adapts transformers 4's experts (a Linear each):
  model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj (Mixtral's block_sparse_moe.experts.{e}.w1,
  w3, w2), lora_A [r, in] and lora_B [out, r] as for any projection;
- stacked, as PEFT adapts transformers 5's experts, whose projections are one parameter each
  (target_parameters: mlp.experts.gate_up_proj [E, 2I, H] and down_proj [E, H, I]; Granite MoE's
  under block_sparse_moe, Gemma 4's the layer's own, experts.gate_up_proj): a ParamWrapper's lora_A
  [r E, in], expert e's rows e r .. e r + r, and lora_B [out, r E], expert e's columns j E + e (PEFT's
  get_delta_weight), under the keys mlp.experts[.base_layer...] (one wrapper nests in the other), told
  apart by their shapes. Its gate|up pair gives the gate and up modules the same lora_A and each its half of lora_B.
"""
from __future__ import annotations

import re

import numpy as np

# the experts' module under its holder (Gemma 4's are the layer's own, beside its dense mlp: experts.gate_up_proj;
# LFM2-MoE's under feed_forward)
EXPERTS = r"(?:(?:mlp|block_sparse_moe|feed_forward)\.)?experts"
PER_EXPERT = re.compile(EXPERTS + r"\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)")
STACKED = re.compile(EXPERTS + r"(?:\.base_layer)*")
NAMES = {"gate_proj": "gate_proj", "w1": "gate_proj", "up_proj": "up_proj", "w3": "up_proj", "down_proj": "down_proj",
         "w2": "down_proj"}
# target_parameters naming a mixture of experts' parameters: its experts' (by suffix, as PEFT matches
# them) and its router's weight (anything else there is refused: runtime/lora.read_config)
PARAMETERS = ("gate_up_proj", "down_proj", "gate.weight", "router.weight")
MODULE = "mlp.experts.{}"  # the engine's module names (builder/decoder.py lora_sites)


def moe_parameters(targets) -> bool:
    """Whether target_parameters names only a mixture of experts' parameters (what this engine adapts)."""
    return bool(targets) and all(isinstance(t, str) and t.endswith(PARAMETERS) for t in targets)


class ExpertTensors:
    """An adapter's tensors on the routed experts, taken key by key, then each expert's PEFT pair."""

    def __init__(self, where: str):
        self.where = where  # the weights file, for messages
        self.per_expert: dict[tuple[int, str, int], dict[str, np.ndarray]] = {}  # (layer, module, e) -> {A, B}
        self.stacked: dict[tuple[int, str], dict[str, np.ndarray]] = {}  # (layer, key's module) -> {A, B}
        self.names: dict[tuple[int, str, int], str] = {}  # (layer, module, e) -> PEFT's module name

    def take(self, layer: int, module: str, ab: str, value: np.ndarray) -> bool:
        """Keep a tensor of the experts (True), or say it is none (False)."""
        if m := PER_EXPERT.fullmatch(module):
            at = (layer, MODULE.format(NAMES[m[2]]), int(m[1]))
            self.per_expert.setdefault(at, {})[ab], self.names[at] = value, module
            return True
        if STACKED.fullmatch(module):
            self.stacked.setdefault((layer, module), {})[ab] = value
            return True
        return False

    def __bool__(self) -> bool:
        return bool(self.per_expert or self.stacked)

    def pairs(self, sites: dict, cfg: dict, max_rank: int) -> dict[tuple[int, str], list]:
        """(layer, module) -> per expert, (A [r, in], PEFT's scale x B [out, r]) or None (not adapted),
        for the engine's expert sites (lora.AdapterError where they do not fit)."""
        from trtllm.runtime.lora import AdapterError, checked_pair, module_scale, pattern_value  # (it imports this)

        shapes = {m: (s["in"], hi - lo, s["experts"]) for s in sites.values() if "experts" in s
                  for m, lo, hi in s["modules"]}
        out: dict[tuple[int, str], list] = {}
        for (layer, module, e), pair in self.per_expert.items():
            n_in, n_out, experts = shapes[module]
            where = f"{self.where}: layer {layer} expert {e} {module}"
            if e >= experts:
                raise AdapterError(f"{where}: the model has {experts} experts")
            a, b = checked_pair(pair, where, n_in, n_out, max_rank)
            peft = self.names[(layer, module, e)]
            declared = pattern_value(cfg.get("rank_pattern"), f"model.layers.{layer}.{peft}", cfg["r"])
            if a.shape[0] != declared:
                raise AdapterError(f"{where} has rank {a.shape[0]}, but its config says {declared} (r or rank_pattern)")
            b = module_scale(cfg, layer, peft, a.shape[0]) * b.astype(np.float32)
            out.setdefault((layer, module), [None] * experts)[e] = (a, b)
        h, w, experts = shapes.get(MODULE.format("gate_proj"), (0, 0, 0))  # (gate|up: H in, I out, E)
        for (layer, key), pair in self.stacked.items():
            where = f"{self.where}: layer {layer} {key}"
            if set(pair) != {"A", "B"} or pair["A"].ndim != 2 or pair["B"].ndim != 2:
                raise AdapterError(f"{where} must have a 2-D lora_A and lora_B")
            a, b = pair["A"], pair["B"]
            kind = ("gate_up" if (a.shape[1], b.shape[0]) == (h, 2 * w) else
                    "down" if (a.shape[1], b.shape[0]) == (w, h) else None)
            r = a.shape[0] // experts
            if kind is None or a.shape[0] % experts or b.shape[1] != a.shape[0]:
                raise AdapterError(f"{where}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are not the stacked "
                                   f"LoRA of this model's {experts} experts (gate|up: [r x {experts}, {h}] and "
                                   f"[{2 * w}, r x {experts}]; down: [r x {experts}, {w}] and [{h}, r x {experts}])")
            # PEFT's rank_pattern and alpha_pattern name the parameter (model.layers.i.mlp.experts.down_proj)
            parameter = f"{key[:key.index('experts')]}experts.{'gate_up_proj' if kind == 'gate_up' else 'down_proj'}"
            declared = pattern_value(cfg.get("rank_pattern"), f"model.layers.{layer}.{parameter}", cfg["r"])
            if r != declared:
                raise AdapterError(f"{where} has rank {r} an expert, but its config says {declared} (r or rank_pattern)")
            if r > max_rank:
                raise AdapterError(f"{where} has rank {r}, above the engine's max_lora_rank {max_rank}; rebuild with "
                                   f"--max-lora-rank {r} or more")
            s = module_scale(cfg, layer, parameter, r)
            per = [(a.reshape(experts, r, -1)[e], s * b.astype(np.float32).reshape(b.shape[0], r, experts)[:, :, e])
                   for e in range(experts)]
            for name, rows in ((("gate_proj", slice(0, w)), ("up_proj", slice(w, 2 * w))) if kind == "gate_up"
                               else (("down_proj", slice(None)),)):
                if (layer, MODULE.format(name)) in out:
                    raise AdapterError(f"{where}: layer {layer}'s experts' {name} is adapted twice")
                out[(layer, MODULE.format(name))] = [(ae, be[rows]) for ae, be in per]
        for (layer, module), experts in out.items():
            if not all(np.isfinite(x).all() for pair in experts if pair for x in pair):
                raise AdapterError(f"{self.where}: layer {layer} {module} holds NaN or infinite values")
        return out


def stacked_arrays(experts: list, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Each expert's (A [r, in], B [out, r]) (None: not adapted) as [E, in, R] and [E, R, out], R the
    largest rank (the others zero beyond theirs)."""
    rank = max((a.shape[0] for pair in experts if pair for a in pair[:1]), default=0)
    a_all, b_all = np.zeros((len(experts), n_in, rank), np.float32), np.zeros((len(experts), rank, n_out), np.float32)
    for e, pair in enumerate(experts):
        if pair:
            a, b = pair
            a_all[e, :, :a.shape[0]], b_all[e, :a.shape[0]] = a.T, b.T
    return a_all, b_all
