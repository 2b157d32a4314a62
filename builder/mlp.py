"""How DecoderWriter writes a layer's MLP (a mixture of experts' layers: builder/moe.py): gate and up, the
activation and down, as our fused kernels or standard ops, with LoRA's deltas; or, without a gate (Arcee,
Apertus), up, the activation and down. The activations: SiLU, GELU's tanh form (Gemma), ReLU squared
(Arcee) and xIELU with each layer's own parameters (Apertus).

A mixin of DecoderWriter (builder/decoder.py), whose __init__ sets what these methods read: g, spec, w,
dtype, ftype, storage, native, half, gqa, quant, lora_rank; linear, fused_proj, fused_linear, lora and
swiglu_matmul are its (and WeightWriter's); moe is MoEWriter's.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

F32 = TensorProto.FLOAT


class MLPWriter:
    """The MLP part of DecoderWriter (see the module docstring)."""

    def mlp(self, i: int, x: str) -> str:
        if self.spec.moe is not None and i not in self.spec.moe.dense_layers and not self.spec.moe.beside_dense:
            return self.moe(i, x)
        p, name = f"model.layers.{i}.mlp", f"/model/layers.{i}/mlp"
        if not self.spec.gated_mlp:  # (Arcee, Apertus) down(act(up(x))): LoRA's "up" site, then "down"
            up = self.lora(f"{name}/up_proj", x, self.linear(f"{name}/up_proj", x, f"{p}.up_proj"), i, "up")
            act = self.xielu(f"{name}/act", up, f"{p}.act_fn") if self.spec.hidden_act == "xielu" else \
                self.activation(f"{name}/act", up)
            down = self.linear(f"{name}/down_proj", act, f"{p}.down_proj")
            return self.lora(f"{name}/down_proj", act, down, i, "down")
        # ONNX Runtime's float form: two MatMuls cost less than one plus a Split (its copy). Not for
        # int4/int8: each quantized projection carries its own offset kernels (measured 6% slower).
        if self.lora_rank:  # the delta joins gate|up before the activation: LoRA's own node activates
            y = self.fused_proj(f"{name}/gate_up_proj", x, f"{p}.gate_up_proj", [f"{p}.gate_proj", f"{p}.up_proj"])
            act = self.lora(f"{name}/gate_up_proj", x, y, i, "gate_up", gated=True)
            down = self.linear(f"{name}/down_proj", act, f"{p}.down_proj")
            return self.lora(f"{name}/down_proj", act, down, i, "down")
        if (self.native or self.half) and self.spec.hidden_act == "silu":  # gate, up, silu(gate) * up: one node of ours
            act = self.swiglu_matmul(f"{name}/gate_up_proj", x, f"{p}.gate_up_proj",
                                     self.w[f"{p}.gate_proj.weight"], self.w[f"{p}.up_proj.weight"],
                                     parts=[f"{p}.gate_proj", f"{p}.up_proj"])
            return self.linear(f"{name}/down_proj", act, f"{p}.down_proj")
        if self.gqa and self.quant is None:
            gate = self.linear(f"{name}/gate_proj", x, f"{p}.gate_proj")
            up = self.linear(f"{name}/up_proj", x, f"{p}.up_proj")
        else:
            gate, up = self.fused_linear(f"{name}/gate_up_proj", x, f"{p}.gate_up_proj",
                                         [f"{p}.gate_proj", f"{p}.up_proj"])
        return self.linear(f"{name}/down_proj", self.gated(name, gate, up), f"{p}.down_proj")

    def gated(self, name: str, gate: str, up: str) -> str:
        """act(gate) * up: the gated MLP, act the spec's hidden_act."""
        return self.g.op("Mul", f"{name}/Mul", [self.activation(f"{name}/act", gate), up])

    def activation(self, name: str, x: str) -> str:
        """The spec's hidden_act of x."""
        if self.spec.hidden_act == "gelu_tanh":
            return self.gelu_tanh(name, x)
        if self.spec.hidden_act == "relu2":  # (Arcee) relu(x)^2
            r = self.g.op("Relu", f"{name}/Relu", [x])
            return self.g.op("Mul", f"{name}/Square", [r, r])
        # SiLU as x*sigmoid(x): Swish is only in TensorRT >= 11.0's parser.
        return self.g.op("Mul", f"{name}/Mul", [x, self.g.op("Sigmoid", f"{name}/Sigmoid", [x])])

    def xielu(self, name: str, x: str, p: str) -> str:
        """Apertus' xIELU with the layer's own parameters (module `p`: alpha_p and alpha_n through a softplus,
        beta, eps), as transformers' Python form computes it: expm1 as Exp - 1 (ONNX has no expm1), within
        float32's rounding of 1 where it matters (the x^2 / 2 that remains near 0 is a few 1e-8 off)."""
        g = self.g
        # (each a weight in the engine's type, as the model's others: a 16-bit engine's rounded to it)
        def value(v: str) -> float:
            return float(np.asarray(self.w[f"{p}.{v}"], np.float32).reshape(-1)[0].astype(self.storage))

        beta, eps = value("beta"), value("eps")
        alpha_p, alpha_n = (float(np.logaddexp(0.0, value("alpha_p"))),
                            beta + float(np.logaddexp(0.0, value("alpha_n"))))
        c = lambda v: g.const(v, self.dtype)  # noqa: E731
        linear = g.op("Mul", f"{name}/beta", [x, c(beta)])
        pos = g.op("Add", f"{name}/pos", [g.op("Mul", f"{name}/x2", [g.op("Mul", f"{name}/ap", [x, c(alpha_p)]), x]),
                                           linear])
        low = g.op("Sub", f"{name}/expm1", [g.op("Exp", f"{name}/Exp", [g.op("Min", f"{name}/Min", [x, c(eps)])]),
                                             c(1.0)])
        neg = g.op("Add", f"{name}/neg", [g.op("Mul", f"{name}/an", [g.op("Sub", f"{name}/less_x", [low, x]),
                                                                    c(alpha_n)]), linear])
        return g.op("Where", f"{name}/Where", [g.op("Greater", f"{name}/positive", [x, c(0.0)]), pos, neg])

    def gelu_tanh(self, name: str, x: str) -> str:
        """GELU's tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch computes it, in
        standard ops: Gelu(approximate=tanh) is opset 20, and TensorRT fuses this pattern itself. In
        float32 whatever the graph's type, as torch computes a 16-bit gelu (its constants rounded to
        bfloat16 would be 0.1-0.3% off)."""
        g, t = self.g, np.float32
        wide = self.ftype != F32
        if wide:
            x = g.op("Cast", f"{name}/Cast", [x], to=F32)
        cube = g.op("Mul", f"{name}/Cube", [g.op("Mul", f"{name}/Square", [x, x]), x])
        inner = g.op("Add", f"{name}/Inner", [x, g.op("Mul", f"{name}/Kappa", [cube, g.const(0.044715, t)])])
        tanh = g.op("Tanh", f"{name}/Tanh", [g.op("Mul", f"{name}/Beta", [inner, g.const((2 / np.pi) ** 0.5, t)])])
        half_x = g.op("Mul", f"{name}/Half", [x, g.const(0.5, t)])
        y = g.op("Mul", f"{name}/Mul", [half_x, g.op("Add", f"{name}/OnePlus", [tanh, g.const(1.0, t)])])
        return g.op("Cast", f"{name}/CastBack", [y], to=self.ftype) if wide else y
