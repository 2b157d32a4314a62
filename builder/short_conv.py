"""LFM2's short-convolution layers, as DecoderWriter writes them in place of attention (Lfm2ShortConv):

    B, C, x = Split(in_proj(h))              [B,S,H] each
    Bx      = B * x
    y       = C * (depthwise causal conv of Bx over the row's last L tokens, + bias)
    out     = out_proj(y)

The convolution's state is kept as KV is, by position: each token's Bx row is written into its layer's
buffers at its slot (the first half of the row as its "keys", the second as its "values": one kv head
H / 2 wide, manifest model.kv_layers), and each new token reads the rows of slots slot - L + 1 .. slot back
(zeros before the first). So everything the runtime does with KV by position keeps the state right too:
chunked prefill, saved system prompts and context reuse, beam copies, rows moved between slots, a
speculative step's rejected positions (written over later, never read before). It costs H values a
token per layer, where a rolling state would keep L - 1 tokens' worth; a draft tree, whose tokens do not
sit after their parents, is not taken (EAGLE heads draft chains for such models).

A mixin of DecoderWriter (builder/decoder.py), whose __init__ sets what this reads: g, spec, io, w, dtype,
ftype, kv_type, kv_io and kv_write (AttentionWriter), linear, lora (its sites conv_in and conv_out: lora_sites.py).
"""
from __future__ import annotations

import numpy as np


class ConvWriter:
    """The short-convolution part of DecoderWriter (see the module docstring)."""

    def short_conv(self, i: int, x: str, write_index: str) -> str:
        g, s, p, name = self.g, self.spec, f"model.layers.{i}.conv", f"/model/layers.{i}/conv"
        h, taps = s.hidden_size, s.conv_kernel
        bcx = self.lora(f"{name}/in_proj", x, self.linear(f"{name}/in_proj", x, f"{p}.in_proj", s.conv_bias), i,
                        "conv_in")
        b, c, xx = g.op("Split", f"{name}/Split", [bcx, g.const([h, h, h])], num_outputs=3, axis=-1)
        bx = g.op("Mul", f"{name}/Bx", [b, xx])                                                  # [B,S,H]
        if self.kv_type != self.ftype:
            bx = g.op("Cast", f"{name}/Bx/Cast", [bx], to=self.kv_type)
        halves = g.op("Split", f"{name}/Halves", [bx, g.const([h // 2, h // 2])], num_outputs=2, axis=-1)
        caches, present = self.kv_io(i)  # [B,1,C,H/2] each (spec.kv_heads and head_size of a convolution layer)
        for kind, half, past, out in zip(("key", "value"), halves, caches, present):
            new = g.op("Unsqueeze", f"{name}/{kind}/Unsqueeze", [half, g.const([1])])           # [B,1,S,H/2]
            self.kv_write(f"{name}/{kind}_cache", past, new, write_index, out, 1)
        caches = present
        # each token's taps: slots slot - L + 1 .. slot of its row, as [B, S * L] (a slot before 0: zeros)
        shape = g.op("Shape", f"{name}/shape", [x])
        seq = g.op("Gather", f"{name}/seq", [shape, g.const(1)], axis=0)
        slot = g.op("Add", f"{name}/slot", [g.op("Unsqueeze", f"{name}/wi", [write_index, g.const([1])]),
                                            g.op("Range", f"{name}/s", [g.const(0), seq, g.const(1)])])  # [B,S]
        at = g.op("Add", f"{name}/taps", [g.op("Unsqueeze", f"{name}/slot3", [slot, g.const([2])]),
                                          g.const(np.arange(1 - taps, 1).reshape(1, 1, taps))])        # [B,S,L]
        valid = g.op("Cast", f"{name}/valid", [g.op("GreaterOrEqual", f"{name}/seen", [at, g.const(0)])],
                     to=self.ftype)
        index = g.op("Reshape", f"{name}/index", [g.op("Max", f"{name}/from0", [at, g.const(0)]), g.const([0, -1, 1])])
        rows = [g.op("GatherND", f"{name}/{kind}/GatherND",
                     [g.op("Squeeze", f"{name}/{kind}/Squeeze", [cache, g.const([1])]), index], batch_dims=1)
                for kind, cache in zip(("key", "value"), caches)]                                 # [B,S*L,H/2]
        rows = g.op("Concat", f"{name}/rows", rows, axis=-1)
        if self.kv_type != self.ftype:
            rows = g.op("Cast", f"{name}/rows/Cast", [rows], to=self.ftype)
        rows = g.op("Reshape", f"{name}/rows/Reshape", [rows, g.op("Concat", f"{name}/rows/shape",
                                                                   [g.op("Slice", f"{name}/bs", [shape, g.const([0]),
                                                                                                  g.const([2])]),
                                                                    g.const([taps, h])], axis=0)])  # [B,S,L,H]
        rows = g.op("Mul", f"{name}/rows/valid", [rows, g.op("Unsqueeze", f"{name}/valid4", [valid, g.const([3])])])
        kernel = self.fw(f"{p}.conv.weight", self.w[f"{p}.conv.weight"][:, 0, :].T)             # [L,H]
        y = g.op("ReduceSum", f"{name}/conv", [g.op("Mul", f"{name}/taps/Mul", [rows, kernel]), g.const([2])],
                 keepdims=0)                                                                     # [B,S,H]
        if s.conv_bias:
            y = g.op("Add", f"{name}/conv/bias", [y, self.fw(f"{p}.conv.bias", self.w[f"{p}.conv.bias"])])
        y = g.op("Mul", f"{name}/Cy", [c, y])
        return self.lora(f"{name}/out_proj", y, self.linear(f"{name}/out_proj", y, f"{p}.o_proj", s.conv_bias), i,
                         "conv_out")
