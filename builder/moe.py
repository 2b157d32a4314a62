"""Mixture-of-experts MLPs (Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral, Granite MoE, Gemma 4's 26B-A4B,
LFM2-MoE, ERNIE 4.5 MoE, AFMoE): the spec, the checkpoint's names, and the graph.

Every class here routes the same way, written once:

    probs  = softmax(x @ router.T) in float32            [N, E]
    top, j = TopK(probs, k)                              (normalize: top /= sum(top))
    y      = sum over the k experts e = j of top_e * down_e(act(gate_e(x)) * up_e(x))
    (+ a shared expert's MLP on every token, times sigmoid(x @ shared_gate.T) where there is one)

Mixtral's and Granite MoE's softmax over the top-k logits alone is the normalized form (the same
values). Gemma 4 (`beside_dense`) runs its experts beside a dense MLP, each normed on its own
(Gemma4TextDecoderLayer): its experts read pre_feedforward_layernorm_2 of the residual stream, its
router a scale-less RMSNorm of it (DecoderWriter.experts_beside; the router's scale and 1/sqrt(H) are
folded into its weight), each chosen expert's weight is times its per_expert_scale after the
normalization (our kernel's expert_scale input; a Mul on the weights in standard ops), and the experts'
activation is GELU's tanh form (the spec's hidden_act). LFM2-MoE scores each expert by its logit's
sigmoid (`scoring`), chooses by the scores plus a bias (`selection_bias`), normalizes the chosen scores by
their sum + 1e-6 and scales them (`routed_scale`); AFMoE the same with its sum + 1e-20 (`norm_add`) and
shared experts. ERNIE 4.5 chooses by softmax scores plus a bias (its e_score_correction_bias) and
divides the chosen scores by their sum clamped below at `norm_min`. llm.onnx computes every expert on
every token and weights the k chosen ones (the rest get weight 0 and are masked, so one that overflows
in float16 adds nothing), in standard ops TensorRT parses: exact, and E / k times the chosen experts'
arithmetic. The ONNX Runtime form (float32 arithmetic) computes the chosen experts only, in one node
a layer: on our CPU kernels trtllm.cpu::MoE (plugins/cpu/moe.cc), which holds a 16-bit engine's experts
in their own type, or
MoEBlockQuant for int4/int8 experts quantized as the model's other projections (both graphs then
hold those: `dense_experts`); else com.microsoft MoE (its experts float32), or QMoE for int4
experts (moe_quant.py).

A LoRA engine (decoder.lora_sites) adds deltas to the router's logits (before the softmax), the shared
expert's projections and each routed expert's gate, up and down: on every expert in llm.onnx, on the
chosen ones inside our kernel (which takes the runtime's arrays as they are); ONNX Runtime's MoE node
takes none, so where it runs the experts they have no LoRA inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from trtllm.builder.checkpoint import Unsupported
from trtllm.builder.moe_quant import BLOCK, Experts, handed_on, quantize_experts, taken
from trtllm.builder.quantize import in_slices, pack_rows, swiglu_rows
from trtllm.plugins import cpu as cpu_kernels

F32 = TensorProto.FLOAT


@dataclass(frozen=True)
class MoE:
    num_experts: int
    top_k: int
    expert_size: int                     # each expert's intermediate width
    normalize: bool                      # the k chosen weights divided by their sum
    dense_layers: tuple[int, ...] = ()   # layers with a dense MLP (intermediate_size) instead
    shared_size: int = 0                 # a shared expert's intermediate width (0: none)
    shared_gate: bool = False            # ... times sigmoid(x @ shared_expert_gate.T) (Qwen2-MoE)
    shared_fused: bool = False           # the checkpoint holds its gate|up whole (Granite's shared_mlp): LoRA's names
    router_module: str = "mlp.gate"      # the router's module name in PEFT's keys (LoRA)
    beside_dense: bool = False           # Gemma 4: a dense MLP on every layer too, experts and router on
    #                                      the residual stream with norms of their own (module docstring)
    scoring: str = "softmax"             # the router's scores: softmax, or sigmoid each (LFM2-MoE: normalized
    #                                      by their sum + 1e-6)
    selection_bias: bool = False         # a bias added to the scores that choose the experts only (LFM2-MoE's
    #                                      expert_bias, a buffer: mlp.expert_bias)
    routed_scale: float = 1.0            # the chosen weights times this (LFM2-MoE's routed_scaling_factor)
    norm_min: float = 0.0                # the normalizing sum at least this (ERNIE 4.5's moe_norm_min clamps it)
    norm_add: float | None = None        # added to the normalizing sum (None: 1e-6 for sigmoid scores, as
    #                                      LFM2-MoE's; none for softmax ones; AFMoE's 1e-20)


def norm_epsilon(m: MoE) -> float:
    """What the chosen scores' sum gets added before it divides them."""
    return m.norm_add if m.norm_add is not None else 1e-6 if m.scoring == "sigmoid" else 0.0


def ort_node_takes(spec) -> bool:
    """Whether ONNX Runtime's MoE / QMoE node routes this model's experts as transformers does: SiLU
    experts in place of the MLP, softmax scores, no selection bias nor scale (else, without our kernel,
    llm.onnx's standard ops run them)."""
    m = spec.moe
    return (m is not None and spec.hidden_act == "silu" and not m.beside_dense and m.scoring == "softmax"
            and not m.selection_bias and m.routed_scale == 1.0 and not m.norm_min and not norm_epsilon(m))


def kernel_takes(spec, quant) -> bool:
    """Whether our kernels run this model's experts (trtllm.cpu::MoE, float ones; MoEBlockQuant, int4
    or int8 in blocks of 32): hidden size and expert width multiples of 32 (its blocks of inputs)."""
    return (spec.moe is not None and (quant is None or (quant.bits in (4, 8) and quant.block_size == 32))
            and spec.hidden_size % 32 == 0 and spec.moe.expert_size % 32 == 0)


def positive(config, key: str) -> int:
    value = getattr(config, key, None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Unsupported(f"config.{key} must be a positive integer, got {value!r}")
    return value


def positive_number(config, key: str, default: float | None = None) -> float:
    """config.key as a finite positive float (Granite's multipliers, a router's scale); `default` where absent."""
    value = getattr(config, key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise Unsupported(f"config.{key} must be a positive number, got {value!r}")
    return float(value)


def leading_dense(config) -> tuple[int, ...]:
    """The first config.num_dense_layers layers, which keep a dense MLP (LFM2-MoE's, AFMoE's)."""
    dense = int(getattr(config, "num_dense_layers", 0) or 0)
    if not 0 <= dense <= config.num_hidden_layers:
        raise Unsupported(f"config.num_dense_layers must be in [0, {config.num_hidden_layers}], got {dense}")
    return tuple(range(dense))


# A shared expert the checkpoint holds as mlp.shared_experts (ERNIE 4.5's, AFMoE's): (ours, the checkpoint's)
# for DecoderSpec.module_names, which renames its weights and names its LoRA modules
SHARED_EXPERTS_NAMES = tuple((f"mlp.shared_expert.{n}_proj", f"mlp.shared_experts.{n}_proj")
                             for n in ("gate", "up", "down"))


def moe_from_config(config, experts_key: str, size_key: str, normalize: bool, shared_size: int = 0,
                    shared_gate: bool = False, dense_layers: tuple[int, ...] = (), shared_fused: bool = False,
                    router_module: str = "mlp.gate", top_k_key: str = "num_experts_per_tok",
                    beside_dense: bool = False, **routing) -> MoE:
    """The MoE section of a config; refuses what the graph does not route the way transformers does.
    (Mixtral's router_jitter_noise is ignored, as transformers does outside training.)"""
    num, k = positive(config, experts_key), positive(config, top_k_key)
    if k > num:
        raise Unsupported(f"config.{top_k_key} ({k}) must be at most config.{experts_key} ({num})")
    return MoE(num_experts=num, top_k=k, expert_size=positive(config, size_key), normalize=bool(normalize),
               dense_layers=dense_layers, shared_size=shared_size, shared_gate=shared_gate, shared_fused=shared_fused,
               router_module=router_module, beside_dense=beside_dense, **routing)


def qwen_dense_layers(config) -> tuple[int, ...]:
    """The layers Qwen's MoE classes give a dense MLP: those in mlp_only_layers, and those off the
    decoder_sparse_step (a config without these keys: none). The other classes read neither key."""
    step = getattr(config, "decoder_sparse_step", 1) or 1
    only = set(getattr(config, "mlp_only_layers", None) or ())
    return tuple(i for i in range(config.num_hidden_layers) if i in only or (i + 1) % step)


# A MoE layer's weights under the names MoEWriter reads, from each class's own:
#   mlp.router.weight [E, H]; mlp.experts.gate_up_proj [E, 2I, H] (gate rows, then up);
#   mlp.experts.down_proj [E, H, I]; mlp.shared_expert.{gate,up,down}_proj.weight; mlp.shared_expert_gate.weight
ROUTER_NAMES = ("mlp.gate.weight", "mlp.router.weight", "block_sparse_moe.router.weight", "mlp.router.gate.weight")


def canonical_names(w, spec) -> None:
    """Rename (in place: checkpoint.Weights) each MoE layer's weights to the names above: Qwen's and OLMoE's
    router `gate`, Granite MoE's block_sparse_moe and shared_mlp (its input_linear holds gate|up), Gemma 4's
    router and experts beside its MLP (gemma4_names)."""
    for i in range(spec.num_layers):
        if i in spec.moe.dense_layers:
            continue
        p = f"model.layers.{i}"
        if spec.moe.beside_dense:
            gemma4_names(w, p, spec.hidden_size)
        router = [n for n in ROUTER_NAMES if f"{p}.{n}" in w]
        if len(router) != 1:
            raise Unsupported(f"layer {i}: expected one MoE router weight of {ROUTER_NAMES}, found {router}")
        w.rename(f"{p}.{router[0]}", f"{p}.mlp.router.weight")
        for part in ("gate_up_proj", "down_proj"):
            if f"{p}.block_sparse_moe.experts.{part}" in w:
                w.rename(f"{p}.block_sparse_moe.experts.{part}", f"{p}.mlp.experts.{part}")
        bias = f"{p}.mlp.gate.moe_statics.e_score_correction_bias"
        if bias in w:  # (ERNIE 4.5's selection bias, [1, E])
            w.derive(f"{p}.mlp.expert_bias", bias, lambda a: a.reshape(-1))
            del w[bias]
        if f"{p}.shared_mlp.input_linear.weight" in w:
            w.split(f"{p}.shared_mlp.input_linear.weight",
                    [f"{p}.mlp.shared_expert.gate_proj.weight", f"{p}.mlp.shared_expert.up_proj.weight"], 2)
            w.rename(f"{p}.shared_mlp.output_linear.weight", f"{p}.mlp.shared_expert.down_proj.weight")
        e, i2, h = w.shape(f"{p}.mlp.experts.gate_up_proj")
        if (e, i2, h) != (spec.moe.num_experts, 2 * spec.moe.expert_size, spec.hidden_size):
            raise Unsupported(f"layer {i}: experts.gate_up_proj is {(e, i2, h)}, the config says "
                              f"{(spec.moe.num_experts, 2 * spec.moe.expert_size, spec.hidden_size)}")


def gemma4_names(w, p: str, hidden: int) -> None:
    """Gemma 4's layer p: router.proj times its scale and 1/sqrt(H) per input column (Gemma4TextRouter
    scales its normed input so) as mlp.router; experts.* as mlp.experts.*; per_expert_scale as
    mlp.router.expert_scale (each chosen expert's weight times it, after the normalization: MoEWriter)."""
    scale = w.pop(f"{p}.router.scale") * np.float32(hidden ** -0.5)
    w[f"{p}.mlp.router.weight"] = w.pop(f"{p}.router.proj.weight") * scale[None, :]
    w[f"{p}.mlp.router.input_scale"] = scale  # (what a LoRA delta on router.proj reads its input times)
    w.rename(f"{p}.router.per_expert_scale", f"{p}.mlp.router.expert_scale")
    w.rename(f"{p}.experts.gate_up_proj", f"{p}.mlp.experts.gate_up_proj")
    w.rename(f"{p}.experts.down_proj", f"{p}.mlp.experts.down_proj")


def experts_module(layer):
    """A transformers decoder layer's routed experts (their stacked parameters), or None: under its mlp,
    Granite MoE's block_sparse_moe, LFM2-MoE's feed_forward, or the layer's own (Gemma 4's, beside its
    dense mlp)."""
    holders = (layer, *(getattr(layer, name, None) for name in ("mlp", "block_sparse_moe", "feed_forward")))
    return next((h.experts for h in holders if getattr(h, "experts", None) is not None), None)


def check_modules(layers, spec) -> None:
    """Refuse expert biases (gpt-oss has them; none of the classes here do)."""
    for layer in layers:
        experts = experts_module(layer)
        if experts is None:
            continue
        if any(getattr(experts, n, None) is not None for n in ("gate_up_proj_bias", "down_proj_bias")):
            raise Unsupported("expert biases are not supported")


class MoEWriter:
    """The MoE half of DecoderWriter's MLP (see the module docstring); reads g, spec, w, dtype, ftype,
    storage, half, quant, ort_form, native_moe, dense_experts, handoff, hand_on, lora_rank and sites, and
    DecoderWriter's fw, linear, fused_proj, lora, lora_pair, gated, generated_input and quantize_weight."""

    def moe(self, i: int, x: str, router_x: str | None = None) -> str:
        """Layer i's mixture of experts of x [B,S,H] (its shared expert's MLP added); the router reads
        router_x where given (Gemma 4's), else x."""
        g, m = self.g, self.spec.moe
        p, name = f"model.layers.{i}.mlp", f"/model/layers.{i}/mlp"
        # the router in the graph's type, as transformers' Linear (never quantized: it picks the
        # experts); its softmax in float32
        router_x = router_x or x
        logits = self.float_linear(f"{name}/router", router_x, f"{p}.router")
        if m.beside_dense and self.lora_rank:  # (Gemma 4: router.proj's input is router_x times its scale, folded
            # into the weight: its LoRA delta reads the scaled input)
            router_x = g.op("Mul", f"{name}/router/lora/Scale", [router_x, self.fw(
                f"{p}.router.input_scale", self.w[f"{p}.router.input_scale"])])
        logits = self.lora(f"{name}/router", router_x, logits, i, "router")
        # (ONNX Runtime's MoE node routes by softmax alone, and has GELU's erf form only: Gemma 4's and
        # LFM2-MoE's experts take the standard ops' form without our kernel)
        if self.ort_form and self.ftype == F32 and (self.native_moe or ort_node_takes(self.spec)):
            y = self.kernel_moe(i, x, logits) if self.native_moe else self.ort_moe(i, x, logits)
            return y if not m.shared_size else self.shared_expert(i, x, y)
        if self.ftype != F32:
            logits = g.op("Cast", f"{name}/router/Cast", [logits], to=F32)
        top, chosen, probs = self.routed(i, logits)
        zeros = g.op("ConstantOfShape", f"{name}/router/Zeros", [g.op("Shape", f"{name}/router/Shape", [probs])])
        # [B,S,E]: each token's weight per expert (0 where not chosen), and which were chosen
        weights = g.op("ScatterElements", f"{name}/router/Weights", [zeros, chosen, top], axis=-1)
        ones = g.op("ConstantOfShape", f"{name}/router/Ones", [g.op("Shape", f"{name}/router/TopShape", [top])],
                    value=helper.make_tensor("value", F32, [1], [1.0]))
        picked = g.op("ScatterElements", f"{name}/router/Picked", [zeros, chosen, ones], axis=-1)
        # every expert on every token: [B,1,S,H] @ [E,H,2I] -> [B,E,S,2I] -> [B,E,S,I] @ [E,I,H] -> [B,E,S,H]
        xe = g.op("Unsqueeze", f"{name}/experts/Unsqueeze", [x, g.const([1])])
        y = self.expert_matmul(f"{name}/experts/gate_up", xe, f"{p}.experts.gate_up_proj")
        y = self.expert_lora(f"{name}/experts/gate_up", xe, y, i, "experts_gate_up")
        gate, up = g.op("Split", f"{name}/experts/Split", [y, g.const([m.expert_size] * 2)], num_outputs=2, axis=-1)
        act = self.gated(f"{name}/experts", gate, up)
        y = self.expert_lora(f"{name}/experts/down", act, self.expert_matmul(f"{name}/experts/down", act,
                                                                              f"{p}.experts.down_proj"), i, "experts_down")

        def per_expert(t: str, what: str) -> str:  # [B,S,E] -> [B,E,S,1]
            t = g.op("Transpose", f"{name}/experts/{what}/Transpose", [t], perm=[0, 2, 1])
            return g.op("Unsqueeze", f"{name}/experts/{what}/Unsqueeze", [t, g.const([-1])])
        w = per_expert(weights, "weights")
        if self.ftype != F32:  # transformers casts the chosen weights to the model's type
            w = g.op("Cast", f"{name}/experts/weights/Cast", [w], to=self.ftype)
        y = g.op("Mul", f"{name}/experts/Weighted", [y, w])
        keep = g.op("Greater", f"{name}/experts/Keep", [per_expert(picked, "picked"), g.const(0.5, np.float32)])
        y = g.op("Where", f"{name}/experts/Where", [keep, y, g.const(0.0, self.dtype)])
        y = g.op("ReduceSum", f"{name}/experts/ReduceSum", [y, g.const([1])], keepdims=0)
        return y if not m.shared_size else self.shared_expert(i, x, y)

    def routed(self, i: int, logits: str) -> tuple[str, str, str]:
        """The standard ops' routing of float32 logits [B,S,E]: (the chosen weights and experts [B,S,k],
        the scores [B,S,E]); as transformers': softmax (or each logit's sigmoid), the k largest (of the
        scores plus a selection bias), normalized (a sigmoid's sum + 1e-6), times each expert's scale."""
        g, m = self.g, self.spec.moe
        name = f"/model/layers.{i}/mlp"
        probs = (g.op("Sigmoid", f"{name}/router/Sigmoid", [logits]) if m.scoring == "sigmoid" else
                 g.op("Softmax", f"{name}/router/Softmax", [logits], axis=-1))
        keys = probs if not m.selection_bias else g.op("Add", f"{name}/router/SelectionBias", [
            probs, self.router_vector(i, "expert_bias")])
        top, chosen = g.op("TopK", f"{name}/router/TopK", [keys, g.const([m.top_k])], num_outputs=2, axis=-1)
        if m.selection_bias:  # (the chosen experts' own scores)
            top = g.op("GatherElements", f"{name}/router/Chosen", [probs, chosen], axis=-1)
        if m.normalize:
            total = g.op("ReduceSum", f"{name}/router/ReduceSum", [top, g.const([-1])], keepdims=1)
            if norm_epsilon(m):
                total = g.op("Add", f"{name}/router/Epsilon", [total, g.const(norm_epsilon(m), np.float32)])
            if m.norm_min:  # (ERNIE 4.5: torch.clamp(sum, min=moe_norm_min))
                total = g.op("Max", f"{name}/router/NormMin", [total, g.const(m.norm_min, np.float32)])
            top = g.op("Div", f"{name}/router/Div", [top, total])
        if self.expert_scales(i) is not None:  # (each chosen weight times its expert's, in float32 as transformers)
            top = g.op("Mul", f"{name}/router/ExpertScale", [top, g.op("Gather", f"{name}/router/ExpertScale/Gather", [
                self.router_vector(i, "router.expert_scale"), chosen], axis=0)])
        return top, chosen, probs

    def expert_scales(self, i: int) -> np.ndarray | None:
        """Layer i's factor on each chosen expert's weight, after the normalization (Gemma 4's
        per_expert_scale, LFM2-MoE's routed_scaling_factor E times), or None: the routing's last step
        in both forms (routed; our kernel's expert_scale input)."""
        m = self.spec.moe
        if m.beside_dense:
            return self.w[f"model.layers.{i}.mlp.router.expert_scale"]
        return np.full(m.num_experts, m.routed_scale) if m.routed_scale != 1.0 else None

    def router_vector(self, i: int, key: str) -> str:
        """A float32 [E] weight of layer i's routing: `router.expert_scale` (expert_scales) or `expert_bias`
        (LFM2-MoE's selection bias)."""
        values = self.expert_scales(i) if key == "router.expert_scale" else self.w[f"model.layers.{i}.mlp.{key}"]
        return self.g.weight(f"model.layers.{i}.mlp.{key}", np.asarray(values, np.float32))

    def expert_lora(self, name: str, x: str, y: str, i: int, site: str) -> str:
        """y [B,E,S,out] + each expert's LoRA delta of x [B,1|E,S,in]: (x @ lora_a_e) @ lora_b_e, lora_a
        [1|B,E,in,r] (a leading 1: one adapter for the batch), the site's modules side by side."""
        if not self.lora_rank or site not in self.sites:
            return y
        g, site_io, deltas = self.g, self.sites[site], []
        for module, lo, hi in site_io["modules"]:
            where = f"{name}/lora/{module.split('.')[-1]}"
            a, b = self.lora_pair(i, site_io, module, hi - lo, where)
            deltas.append(g.op("MatMul", f"{where}/MatMul_b", [g.op("MatMul", f"{where}/MatMul_a", [x, a]), b]))
        d = deltas[0] if len(deltas) == 1 else g.op("Concat", f"{name}/lora/Concat", deltas, axis=-1)
        return g.op("Add", f"{name}/lora/Add", [y, d])

    def kernel_lora(self, i: int, name: str) -> list[str]:
        """Our MoE kernel's LoRA inputs, as the runtime feeds them (none without expert sites): gate's,
        up's and down's lora_a and lora_b, each [n, E, in, r] and [n, E, r, out] (the kernel puts
        gate's and up's deltas in its own column order: no copy of them a step)."""
        if not self.lora_rank or "experts_gate_up" not in self.sites:
            return []
        return [t for site in ("experts_gate_up", "experts_down") for module, lo, hi in self.sites[site]["modules"]
                for t in self.lora_pair(i, self.sites[site], module, hi - lo, f"{name}/lora/{module.split('.')[-1]}")]

    def float_linear(self, name: str, x: str, prefix: str) -> str:
        """x @ W.T for the router and the shared expert's gate: never quantized (a few rows that
        decide, not compute; int4 would move which experts a token gets)."""
        if self.quant is None:
            return self.linear(name, x, prefix)
        return self.g.op("MatMul", f"{name}/MatMul", [x, self.fw(f"{prefix}.weight", self.w[f"{prefix}.weight"].T)])

    def expert_matmul(self, name: str, x: str, prefix: str) -> str:
        """x [B,1|E,S,K] @ each expert's W.T -> [B,E,S,N]. int4 (moe_quant.py): the codes dequantized
        as one 2-D DequantizeLinear [E*K, N] reshaped to [E,K,N], plus blocksum(x) @ the offsets
        [E, K/32, N] (run by ONNX Runtime here; TensorRT's int4 path wants a 2-D weight straight into a
        MatMul, so a TensorRT build of int4 experts is refused until it is proven there)."""
        g = self.g
        if self.quant is None:
            w_t = experts_in(self.w.rows(prefix), self.dtype, transposed=True)  # [E, K, N]
            return g.op("MatMul", f"{name}/MatMul", [x, self.fw(prefix, w_t)])
        e, n, k = self.w.shape(prefix)
        if self.dense_experts:  # each expert's [K, N] blocks stacked: [E*K, N], [E*K/32, N]
            codes, scale, offset = (None if parts[0] is None else np.concatenate(parts)
                                    for parts in zip(*self.expert_weights(prefix)))
            scale, offset = scale.astype(self.dtype), None if offset is None else offset.astype(self.dtype)
        else:
            codes, scale, offset = self.quantized_experts(prefix).canonical()
        weights = g.op("DequantizeLinear", f"{name}/DequantizeLinear",
                       [g.weight(f"{prefix}.weight_q{self.quant.bits}", codes), g.weight(f"{prefix}.weight_scale", scale)],
                       axis=0, block_size=BLOCK)
        weights = g.op("Reshape", f"{name}/Reshape", [weights, g.const([e, k, n])])
        y = g.op("MatMul", f"{name}/MatMul", [x, weights])
        if offset is None:  # int8: symmetric
            return y
        blocks = g.op("Reshape", f"{name}/offset/Reshape", [x, g.const([0, 0, 0, k // BLOCK, BLOCK])])
        sums = g.op("ReduceSum", f"{name}/offset/ReduceSum", [blocks, g.const([-1])], keepdims=0)
        extra = g.op("MatMul", f"{name}/offset/MatMul",
                     [sums, g.weight(f"{prefix}.weight_offset", offset.reshape(e, k // BLOCK, n))])
        return g.op("Add", f"{name}/offset/Add", [y, extra])

    def expert_weights(self, prefix: str) -> list[tuple]:
        """dense_experts: each expert of one projection quantized as the model's other projections
        (WeightWriter.quantize_weight, once for both writers): (codes [K, N], scale, offset or None)."""
        w = self.w.rows(prefix)  # (a held model's experts widened one at a time)
        return [self.quantize_weight(w[i], self.quant, [f"{prefix}.{i}"]) for i in range(w.shape[0])]

    def quantized_experts(self, prefix: str) -> Experts:
        """The int4 experts of one projection, quantized once for both of the build's writers (the
        first leaves them in hand_on, the second takes them from handoff)."""
        key = ("experts", prefix)
        if key in self.handoff:
            return taken(self.handoff.pop(key))
        made = quantize_experts(self.w.rows(prefix))  # (expert by expert: a held model's widened one at a time)
        if self.hand_on is not None:
            self.hand_on[key] = handed_on(made)
        return made

    def ort_moe(self, i: int, x: str, logits: str) -> str:
        """ONNX Runtime's form: its com.microsoft MoE node (QMoE for int4 experts: their codes and
        zero points, float32 scales and activations) computes only each token's chosen experts
        (softmax, top-k and the normalization inside it), gate|up interleaved row by row, its SwiGLU
        made the plain one (alpha 1, no +1 on up); [B,S,H] as [B*S,H] rows."""
        g, m = self.g, self.spec.moe
        if self.lora_rank and "experts_gate_up" in self.sites:
            raise ValueError("ONNX Runtime's MoE node takes no LoRA: the experts' sites go with our kernel")
        p, name = f"model.layers.{i}.mlp", f"/model/layers.{i}/mlp"
        w1, w2 = f"{p}.experts.gate_up_proj", f"{p}.experts.down_proj"
        rows = g.op("Reshape", f"{name}/experts/Rows", [x, g.const([-1, self.spec.hidden_size])])
        scores = g.op("Reshape", f"{name}/router/Rows", [logits, g.const([-1, m.num_experts])])
        pairs = np.stack([np.arange(m.expert_size), np.arange(m.expert_size) + m.expert_size], axis=1).reshape(-1)
        attrs = dict(domain="com.microsoft", k=m.top_k, normalize_routing_weights=int(m.normalize),
                     # (moe() sends only silu experts here)
                     activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0)
        if self.quant is None:
            y = g.op("MoE", f"{name}/experts/MoE", [rows, scores, self.fw(w1, self.w[w1][:, pairs]), "",
                                                     self.fw(w2, self.w[w2])], **attrs)
        else:
            (q1, s1, z1), (q2, s2, z2) = self.quantized_experts(w1).packed(pairs), self.quantized_experts(w2).packed()
            inputs = [rows, scores, g.weight(f"{w1}.qmoe_q4", q1), g.weight(f"{w1}.qmoe_scale", s1), "",
                      g.weight(f"{w2}.qmoe_q4", q2), g.weight(f"{w2}.qmoe_scale", s2), "", "", "", "",
                      g.weight(f"{w1}.qmoe_zero", z1), g.weight(f"{w2}.qmoe_zero", z2)]
            if not m.normalize:  # QMoE's CPU kernel (ONNX Runtime 1.32) normalizes its top-k weights even with
                # normalize_routing_weights 0 (checked against numpy); given the softmax as router_weights, it
                # weights by them as the attribute says
                inputs += ["", g.op("Softmax", f"{name}/router/RowSoftmax", [scores], axis=-1)]
            # (weights_prepacked 0: the raw layout above, not the default's "the provider's own")
            y = g.op("QMoE", f"{name}/experts/QMoE", inputs, expert_weight_bits=4, block_size=BLOCK,
                     accuracy_level=0, weights_prepacked=0, **attrs)
        return g.op("Reshape", f"{name}/experts/Unrows", [y, g.op("Shape", f"{name}/experts/Shape", [x])])

    def kernel_moe(self, i: int, x: str, logits: str) -> str:
        """Our kernel's form: one trtllm.cpu::MoE node (routing as ort_moe's node; float experts in
        the engine's type) or MoEBlockQuant (expert_weights packed as MatMulBlockQuant's), each
        expert's gate|up rows in the kernels' swiglu order."""
        g, m = self.g, self.spec.moe
        p, name = f"model.layers.{i}.mlp", f"/model/layers.{i}/mlp"
        w1, w2 = f"{p}.experts.gate_up_proj", f"{p}.experts.down_proj"
        order, attrs = swiglu_rows(m.expert_size), dict(domain=cpu_kernels.DOMAIN, k=m.top_k, normalize=int(m.normalize))
        if self.spec.hidden_act != "silu":  # (Gemma 4's GELU; other graphs keep the attribute out, as before it)
            attrs["activation"] = self.spec.hidden_act
        if m.scoring != "softmax":  # (LFM2-MoE's)
            attrs["scoring"] = m.scoring
        if m.norm_min:  # (ERNIE 4.5's)
            attrs["norm_min"] = float(m.norm_min)
        if m.norm_add is not None:  # (AFMoE's; without it the kernel adds LFM2-MoE's 1e-6 to sigmoid scores' sum)
            attrs["norm_epsilon"] = float(m.norm_add)
        if self.quant is None:
            kind = self.storage if self.half else np.float32
            gate_up = g.weight(w1, experts_in(self.w.rows(w1), kind, order))
            down = g.weight(w2, in_slices(self.w.rows(w2), kind))
            return g.op(cpu_kernels.MOE, f"{name}/experts/MoE", [x, logits, gate_up, down, self.generated_input(),
                                                                 *self.kernel_tail(i, name)], **attrs)
        inputs = [x, logits]
        for prefix, rows in ((w1, order), (w2, slice(None))):  # MatMulBlockQuant's packing, expert by expert
            packed = [pack_rows(*parts, self.quant.bits) for parts in self.expert_weights(prefix)]
            for what, arrays in zip(("q", "scale", "offset"), zip(*packed)):
                inputs.append("" if arrays[0] is None else g.weight(f"{prefix}.moe_{what}",
                                                                      np.stack(arrays)[:, rows]))
        # generated rows as exact as the engine's other projections: with integer activations those are
        # the same in any batch, and so the experts' must be (with float32 ones neither is: faster)
        return g.op(cpu_kernels.MOE_QUANT, f"{name}/experts/MoEBlockQuant",
                    [*inputs, self.generated_input(), *self.kernel_tail(i, name)],
                    bits=self.quant.bits, exact_rows=int(self.quant.activations != "float32"), **attrs)

    def kernel_tail(self, i: int, name: str) -> list[str]:
        """Our MoE kernel's inputs after `generated`: LoRA's six, then expert_scale (each chosen expert's
        weight times it: Gemma 4's per_expert_scale, LFM2-MoE's routed_scaling_factor) and selection_bias
        (LFM2-MoE's expert_bias) where the model has them ("" for those it leaves out)."""
        lora = self.kernel_lora(i, f"{name}/experts")
        scaled, biased = self.expert_scales(i) is not None, self.spec.moe.selection_bias
        if not (scaled or biased):
            return lora
        return [*(lora or [""] * 6), self.router_vector(i, "router.expert_scale") if scaled else "",
                *([self.router_vector(i, "expert_bias")] if biased else [])]

    def shared_expert(self, i: int, x: str, y: str) -> str:
        """y + the shared expert's MLP of x (times sigmoid(x @ shared_expert_gate.T) with shared_gate).
        A LoRA engine adds its deltas to gate|up, down and the gate (decoder.lora_sites' shared sites)."""
        g, m = self.g, self.spec.moe
        p, name = f"model.layers.{i}.mlp", f"/model/layers.{i}/mlp"
        s, e = f"{p}.shared_expert", f"{name}/shared_expert"
        if self.lora_rank:  # the delta joins gate|up before the activation, as in the dense MLP
            act = self.lora(f"{e}/gate_up_proj", x, self.fused_proj(f"{e}/gate_up_proj", x, f"{s}.gate_up_proj",
                                                                   [f"{s}.gate_proj", f"{s}.up_proj"]),
                            i, "shared_gate_up", gated=True)
            shared = self.lora(f"{e}/down_proj", act, self.linear(f"{e}/down_proj", act, f"{s}.down_proj"),
                               i, "shared_down")
        else:
            gate = self.linear(f"{e}/gate_proj", x, f"{s}.gate_proj")
            up = self.linear(f"{e}/up_proj", x, f"{s}.up_proj")
            shared = self.linear(f"{e}/down_proj", self.gated(e, gate, up), f"{s}.down_proj")
        if m.shared_gate:
            gate = self.float_linear(f"{name}/shared_expert_gate", x, f"{p}.shared_expert_gate")
            gate = self.lora(f"{name}/shared_expert_gate", x, gate, i, "shared_expert_gate")
            shared = g.op("Mul", f"{e}/Gated", [shared, g.op("Sigmoid", f"{name}/shared_expert_gate/Sigmoid", [gate])])
        return g.op("Add", f"{e}/Add", [y, shared])


def experts_in(rows, dtype, order: np.ndarray | None = None, transposed: bool = False) -> np.ndarray:
    """Stacked experts [E, N, K] (an array, or a held model's Weights.rows) in `dtype`, each expert's rows
    taken in `order` or each expert transposed ([E, K, N]): made expert by expert (a held model's widened
    one at a time), the values of np.asarray(rows)[:, order].astype(dtype) (or .transpose(0, 2, 1))."""
    e, n, k = rows.shape
    out = np.empty((e, k, n) if transposed else (e, n if order is None else len(order), k), dtype)
    for i in range(e):
        one = np.asarray(rows[i])
        out[i] = one.T if transposed else one if order is None else one[order]
    return out
