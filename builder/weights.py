"""How DecoderWriter writes its weights: float (in the graph's dtype, or float16/bfloat16 values held
as float32 on our kernels), block-quantized for DequantizeLinear + MatMul (llm.onnx, and ONNX Runtime's
MatMulNBits fusion), or packed for our kernels (trtllm.cpu::MatMulBlockQuant, MatMulHalf); and a
quantized engine's int8 token embedding.

A mixin of DecoderWriter (builder/decoder.py), whose __init__ sets what these methods read: g (the
GraphWriter), spec, w (the weights), io, quant, half, native, dtype, storage, ort_form, half_embedding,
quantized (the cache of quantized weights), handoff and hand_on (quantize_weight's results, taken
from and left for the build's other writer), has_generated, grids (a GPTQ/AWQ checkpoint's) and
kept (the projections whose grid int4 or int8 kept).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from trtllm.builder import prequantized
from trtllm.builder.quantize import (QuantScheme, in_slices, pack_nibbles, pack_rows, quantize_rows, swiglu_rows,
                                     unpack_nibbles)
from trtllm.plugins import cpu as cpu_kernels

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


class WeightWriter:
    """The weight-writing half of DecoderWriter (see the module docstring)."""

    def fw(self, name: str, array: np.ndarray) -> str:
        """A float weight in the graph's dtype (`half`: the engine's float16 or bfloat16 values, held
        as float32); `array` may be a held weight's rows (Weights.rows), converted a slice at a time."""
        array = in_slices(array, self.storage if self.half else self.dtype)
        return self.g.weight(name, array.astype(self.dtype, copy=False))  # (a float32 table: not copied)

    def matmul(self, name: str, x: str, prefix: str, w: np.ndarray, rank: int = 3,
               parts: list[str] | None = None) -> str:
        """x @ w.T, with w.T stored as [in, out] (no Transpose); block-quantized when asked. `parts`:
        the projections w joins (default: prefix), whose checkpoint grids quantize_weight may keep. w
        may be a held weight's rows (Weights.rows: an lm_head), widened a slice at a time."""
        g, scheme = self.g, self.quant
        if self.half:
            return self.half_matmul(name, x, g.weight(f"{prefix}.weight", in_slices(w, self.storage)), w.shape[0])
        if scheme is None:
            w_t = in_slices(w, self.dtype, transposed=True)  # [in, out]
            return g.op("MatMul", f"{name}/MatMul", [x, self.fw(f"{prefix}.weight", w_t)])
        if prefix == "lm_head":
            scheme = scheme.for_lm_head()
        if self.native:  # the same weights, in the kernel's row-major layout: one node instead of six
            return self.block_quant(name, x, prefix, w, scheme, parts=parts)
        codes, scale, offset = self.quantized_weight(prefix, w, scheme, parts=parts)
        wq = self.dequantized(prefix, codes, scale, scheme)
        y = g.op("MatMul", f"{name}/MatMul", [x, wq])
        if offset is None:
            return y
        # x @ (s c + o) = x @ (s c) + blocksum(x) @ o, with blocksum over each block of inputs
        blocks = g.op("Reshape", f"{name}/offset/Reshape",
                      [x, g.const([0] * (rank - 1) + [w.shape[1] // scheme.block_size, scheme.block_size])])
        sums = g.op("ReduceSum", f"{name}/offset/ReduceSum", [blocks, g.const([-1])], keepdims=0)
        extra = g.op("MatMul", f"{name}/offset/MatMul", [sums, offset])
        return g.op("Add", f"{name}/offset/Add", [y, extra])

    def quantized_weight(self, prefix: str, w: np.ndarray, scheme: QuantScheme,
                         order: np.ndarray | None = None, parts: list[str] | None = None) -> tuple[str, str, str | None]:
        """w [out, in] quantized once per prefix: the initializers' names (codes, scale, offset or None),
        as DequantizeLinear takes them ([in, out]) or, on our kernels, packed by rows (pack_rows, its rows
        optionally reordered). A tied lm_head's are the quantized embedding's (quantized_embedding)."""
        if prefix in self.quantized:
            return self.quantized[prefix]
        g = self.g
        codes, scale, offset = self.quantize_weight(w, scheme, parts or [prefix], packed=self.native)
        if self.native:
            if order is not None:
                codes, scale = codes[order], scale[order]
                offset = None if offset is None else offset[order]
        else:  # in the graph's type, which DequantizeLinear gives its weights: float16 holds them exactly
            scale, offset = scale.astype(self.dtype), None if offset is None else offset.astype(self.dtype)
        names = (g.weight(f"{prefix}.weight_q{scheme.bits}", codes), g.weight(f"{prefix}.weight_scale", scale),
                 None if offset is None else g.weight(f"{prefix}.weight_offset", offset))
        self.quantized[prefix] = names
        return names

    def quantize_weight(self, w: np.ndarray, scheme: QuantScheme, parts: list[str], packed: bool = False):
        """quantize() of w [out, in] or, where its parts are a GPTQ/AWQ checkpoint's projections that
        the scheme's blocks hold, their own codes and scales (prequantized.on_blocks; `kept` lists
        those); `packed`: in our kernels' rows (pack_rows). An int4 weight is made once per build: where
        the build writes two graphs of the weights, the first leaves each result in `hand_on` and the
        second takes it from `handoff`, the same dict (int4's grid and offset searches are most of an int4
        build's time). A weight neither handed on nor taken is quantized straight into its packed rows
        (quantized, then packed, a table's codes were held twice over: 4.7 GB at once for gemma-4-E2B's
        per-layer table in int8)."""
        # (the same parts, shape and scheme are the same array in both writers: both read self.w)
        key = (tuple(parts), w.shape, scheme)
        # int4 only, its codes two to a byte (0.75 bytes a weight, in export's Handoff file): int8's
        # rounding is quick (the demo model's int8 build took as long with it, and 10% more memory)
        handed, taken = self.hand_on is not None and scheme.bits == 4, key in self.handoff
        if taken:
            (codes, scale, offset), kept = self.handoff.pop(key)
            made = unpack_nibbles(codes), scale, offset
        else:
            made, kept = self.quantize_new(w, scheme, parts, packed and not handed)
            if handed:
                codes, scale, offset = made
                self.hand_on[key] = (pack_nibbles(codes), scale, offset), kept
        if kept:
            self.kept.extend(parts)
        if packed and (taken or handed):  # (handed on in quantize()'s [in, out] layout)
            made = pack_rows(*made, scheme.bits, scheme.block_size)
        return made

    def quantize_new(self, w: np.ndarray, scheme: QuantScheme, parts: list[str], packed: bool = False):
        """(quantize_weight's result, packed where asked, and whether it is the checkpoint's own grid)."""
        grids = [self.grids.get(f"{p}.weight") for p in parts]
        if grids and all(grids):
            kept = prequantized.on_blocks(grids, np.asarray(w[:]).T, scheme)
            if kept is not None:
                return (pack_rows(*kept, scheme.bits, scheme.block_size) if packed else kept), True
        # (a slice at a time: a held table is not widened whole)
        return quantize_rows(w, scheme, packed=packed), False

    def dequantized(self, prefix: str, codes: str, scale: str, scheme: QuantScheme) -> str:
        """DequantizeLinear of a quantized weight [in, out], one node per weight (a tied lm_head and
        the canonical graph's embedding lookup share it)."""
        key = ("dequantized", prefix)
        if key not in self.quantized:
            self.quantized[key] = self.g.op("DequantizeLinear", f"/{prefix}/DequantizeLinear", [codes, scale],
                                            axis=0, block_size=scheme.block_size)
        return self.quantized[key]

    def half_matmul(self, name: str, x: str, w: str, n: int, **attrs) -> str:
        """x @ w.T as one trtllm.cpu::MatMulHalf node: w a float16 or bfloat16 [n, in] initializer."""
        return self.g.op(cpu_kernels.HALF, f"{name}/MatMulHalf", [x, w, self.generated_input()],
                         domain=cpu_kernels.DOMAIN, n=n, **attrs)

    def swiglu_matmul(self, name: str, x: str, prefix: str, gate: np.ndarray, up: np.ndarray,
                      parts: list[str] | None = None) -> str:
        """silu(x @ gate.T) * (x @ up.T) as one trtllm.cpu node (activation swiglu): the same
        weights as two projections (`parts`: their names), rows ordered as the kernel pairs them."""
        both, order = np.concatenate([gate, up]), swiglu_rows(gate.shape[0])
        if self.half:
            w = self.g.weight(f"{prefix}.weight", both[order].astype(self.storage))
            return self.half_matmul(name, x, w, both.shape[0], activation="swiglu")
        return self.block_quant(name, x, prefix, both, self.quant, order=order, activation="swiglu", parts=parts)

    def block_quant(self, name: str, x: str, prefix: str, w: np.ndarray, scheme: QuantScheme,
                    order: np.ndarray | None = None, parts: list[str] | None = None, **attrs) -> str:
        """x @ w.T as one trtllm.cpu::MatMulBlockQuant node: w [out, in] quantized, packed in the
        kernel's layout (pack_rows), its rows optionally reordered."""
        g = self.g
        packed, scale, offset = self.quantized_weight(prefix, w, scheme, order, parts)
        if scheme.activations != "float32":
            attrs["activations"] = scheme.activations
        inputs = [x, packed, scale]
        if offset is not None:
            inputs.append(offset)
        # The runtime says which steps are a prompt's and which generated: each row then takes one
        # kernel path whatever its batch (plugins/cpu; integer activations quantize generated rows).
        inputs += [""] * (4 - len(inputs)) + [self.generated_input()]
        return g.op(cpu_kernels.OP, f"{name}/MatMulBlockQuant", inputs, domain=cpu_kernels.DOMAIN,
                    bits=scheme.bits, n=w.shape[0], layout=cpu_kernels.LAYOUT, **attrs)

    def generated_input(self) -> str:
        """The graph input `generated` (int64 [1]), declared on first use."""
        if not self.has_generated:
            self.g.input(self.io.generated, I64, [1])
            self.has_generated = True
        return self.io.generated

    def quantized_embedding(self, ids: str, table: str = "model.embed_tokens") -> str:
        """A quantized engine's token embeddings [B,S,H]: the table in int8, blocks of 32 along H (the
        lm_head's scheme; a tied lm_head's very codes and scales), and only the rows looked up are
        dequantized (s * c, exactly as DequantizeLinear computes it). Our kernels' form gathers the
        packed rows (int8 codes held as uint8); MatMulNBits' form gathers its own copy of the codes
        [H, V] by column; the canonical graph, for TensorRT (whose Gather takes no int8), gathers from
        the DequantizeLinear output that a tied lm_head reads too. `table`: another table's rows
        (Gemma 4's per-layer embeddings), never the lm_head's."""
        g, s = self.g, self.spec
        scheme = self.quant.for_tables()
        # its own copy in ONNX Runtime's MatMulNBits form: a shared one keeps the lm_head from fusing; and
        # where the lm_head is int4 (--lm-head-quantization), whose codes the lookup does not read
        shared = table == "model.embed_tokens" and s.tie_word_embeddings and (self.native or not self.ort_form) \
            and scheme == self.quant.for_lm_head()
        prefix = "lm_head" if shared else table
        w = self.w.rows(f"{table}.weight")
        codes, scale, _ = self.quantized_weight(prefix, w, scheme)
        blocks, name, width = w.shape[1] // scheme.block_size, f"/{table.replace('.', '/')}", w.shape[1]
        if not self.ort_form:
            rows = g.op("Gather", f"{name}/Gather", [self.dequantized(prefix, codes, scale, scheme), ids], axis=1)
            return g.op("Transpose", f"{name}/Transpose", [rows], perm=[1, 2, 0])          # [H,B,S] -> [B,S,H]
        if self.native:  # rows [V, H] of bytes: 128..255 are the codes -128..-1
            c = g.op("Cast", f"{name}/Cast", [g.op("Gather", f"{name}/Gather", [codes, ids], axis=0)], to=F32)
            wrap = g.op("Floor", f"{name}/Wrap", [g.op("Div", f"{name}/Div", [c, g.const(128.0, np.float32)])])
            c = g.op("Sub", f"{name}/Signed", [c, g.op("Mul", f"{name}/Mul256", [wrap, g.const(256.0, np.float32)])])
            scales = g.op("Cast", f"{name}/ScaleCast", [g.op("Gather", f"{name}/ScaleGather", [scale, ids], axis=0)],
                          to=F32)                                                          # [B,S,H/32]
        else:  # codes [H, V] int8, scales [H/32, V]: gathered by column, then [B,S,...]
            c = g.op("Transpose", f"{name}/Transpose", [g.op("Gather", f"{name}/Gather", [codes, ids], axis=1)],
                     perm=[1, 2, 0])
            c = g.op("Cast", f"{name}/Cast", [c], to=F32)
            scales = g.op("Transpose", f"{name}/ScaleTranspose",
                          [g.op("Gather", f"{name}/ScaleGather", [scale, ids], axis=1)], perm=[1, 2, 0])
        c = g.op("Reshape", f"{name}/Blocks", [c, g.const([0, 0, blocks, scheme.block_size])])
        y = g.op("Mul", f"{name}/Dequantize", [c, g.op("Unsqueeze", f"{name}/ScaleUnsqueeze", [scales, g.const([-1])])])
        return g.op("Reshape", f"{name}/Reshape", [y, g.const([0, 0, width])])
