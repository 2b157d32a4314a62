"""How DecoderWriter writes attention: the q/k/v heads' RoPE, the in-place KV write and the attention
itself as standard ops (opset 24's Attention, RotaryEmbedding and TensorScatter, or builder/legacy_ops.py's
older ones), as ONNX Runtime's GroupQueryAttention, or as our kernel (trtllm.cpu::Attention); and the
masks every layer's kind of attention reads (causal, windowed, a draft tree's), and multimodal RoPE's
per-token rotary rows (mrope).

A mixin of DecoderWriter (builder/decoder.py), whose __init__ and prologue set what these methods read:
g, spec, io, legacy, gqa, native_attention, tree, tree_mask, dtype, ftype, kv_type, the rotary tables
(cos, sin, local_cos, local_sin, rope_shape, no_rope; legacy: rope, local_rope_rows, kv_index; mrope makes
the step's own cos and sin) and, for GroupQueryAttention, gqa_lengths' seqlens_k, total_len and
query_seqlens.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from trtllm.builder import legacy_ops
from trtllm.builder.lora_sites import gate_module
from trtllm.plugins import cpu as cpu_kernels


class AttentionWriter:
    """The attention half of DecoderWriter (see the module docstring)."""

    def attention(self, i: int, x: str, position_ids: str, write_index: str, mask: dict) -> str:
        g, s, p = self.g, self.spec, f"model.layers.{i}.self_attn"
        name = f"/model/layers.{i}/attn"
        if self.gqa:
            return self.attention_gqa(i, x, position_ids)
        d, kv_heads, own = s.head_size(i), s.kv_heads(i), s.kv_source(i) == i
        if not own:  # (Gemma 4's last layers) q alone: K and V are an earlier layer's, written this step
            q = self.lora(f"{name}/q_proj", x, self.linear(f"{name}/q_proj", x, f"{p}.q_proj", s.attention_bias), i,
                          "qkv")
        else:  # (Gemma 4's attention_k_eq_v: a full layer's v is its k projection, before k's norm and RoPE)
            v_of_k = s.value_is_key and s.window(i) is None
            parts = [f"{p}.q_proj", f"{p}.k_proj"] + ([] if v_of_k else [f"{p}.v_proj"])
            q, k, *v = self.fused_linear(f"{name}/qkv_proj", x, f"{p}.qkv_proj", parts, s.attention_bias, (i, "qkv"))
            v = v[0] if v else k
            if s.full_qk_norm:
                q, k = self.full_qk_norms(name, p, q, k)
        first = s.qk_norm and not s.qk_norm_after_rope  # each head normed before its RoPE (Qwen3), or after
        q = self.heads(f"{name}/q", q, s.num_heads, f"{p}.q_norm.weight" if first else None, d)
        if own:
            k = self.heads(f"{name}/k", k, kv_heads, f"{p}.k_norm.weight" if first else None, d)
            v = self.heads(f"{name}/v", v, kv_heads, None, d, unscaled=s.v_norm)
        if s.rope(i):
            q = self.rotary(f"{name}/q_rotary", q, position_ids, s.rope(i), d)
            if own:
                k = self.rotary(f"{name}/k_rotary", k, position_ids, s.rope(i), d)
        if s.qk_norm and s.qk_norm_after_rope:  # (Hunyuan) [B,heads,S,D]: over each head's D
            q = self.rms_norm(f"{name}/q/norm", q, f"{p}.q_norm.weight")
            k = self.rms_norm(f"{name}/k/norm", k, f"{p}.k_norm.weight")
        groups = s.num_heads // kv_heads
        mask = mask[(s.window(i), groups) if self.decomposed else s.window(i)]  # this layer's: causal, or in its window
        if own:
            kv_shape, kv_type = ["batch", kv_heads, "kv_capacity", d], self.ftype
            caches = []
            for kind, new in (("key", k), ("value", v)):
                past = g.input(getattr(self.io, f"past_{kind}").format(i=s.kv_index(i)), kv_type, kv_shape)
                present = getattr(self.io, f"present_{kind}").format(i=s.kv_index(i))
                self.kv_write(f"{name}/{kind}_cache", past, new, write_index, present, kv_heads)
                g.output(present, kv_type, kv_shape)
                caches.append(present)
        else:  # the source layer's buffers as it left them this step (present_*: its new rows written)
            source = s.kv_index(s.kv_source(i))
            caches = [getattr(self.io, f"present_{kind}").format(i=source) for kind in ("key", "value")]
        if self.decomposed:
            y = legacy_ops.attention(g, f"{name}/attention", q, caches[0], caches[1], mask, s.num_heads,
                                     kv_heads, d, self.ftype, s.scale, s.attn_softcap)
        else:
            y = g.op("Attention", f"{name}/Attention", [q, caches[0], caches[1], mask],
                     scale=s.scale, softmax_precision=TensorProto.FLOAT)
        y = g.op("Transpose", f"{name}/out/Transpose", [y], perm=[0, 2, 1, 3])
        y = g.op("Reshape", f"{name}/out/Reshape", [y, g.const([0, 0, s.num_heads * d])])
        return self.out_proj(i, x, y)

    def out_proj(self, i: int, x: str, y: str) -> str:
        """o_proj of the heads' outputs y [B,S,heads*D]; with an attention gate (read from the layer's input
        x) first each head's output times sigmoid of its logit (LFM3's g_proj), or each value times its own
        (AFMoE's gate_proj)."""
        g, s, p, name = self.g, self.spec, f"model.layers.{i}.self_attn", f"/model/layers.{i}/attn"
        if s.attn_gate:
            module = gate_module(s, s.head_size(i))[0].split(".")[-1]
            gate = self.lora(f"{name}/{module}", x, self.linear(f"{name}/{module}", x, f"{p}.{module}"), i,
                             "attn_gate")
            gate = g.op("Sigmoid", f"{name}/gate/Sigmoid", [gate])
            if s.attn_gate == "element":
                y = g.op("Mul", f"{name}/gate/Mul", [y, gate])
            else:
                gate = g.op("Unsqueeze", f"{name}/gate/Unsqueeze", [gate, g.const([-1])])          # [B,S,heads,1]
                heads = g.op("Reshape", f"{name}/gate/heads", [y, g.const([0, 0, s.num_heads, s.head_size(i)])])
                y = g.op("Reshape", f"{name}/gate/Reshape", [g.op("Mul", f"{name}/gate/Mul", [heads, gate]),
                                                             g.const([0, 0, s.num_heads * s.head_size(i)])])
        return self.lora(f"{name}/o_proj", y, self.linear(f"{name}/o_proj", y, f"{p}.o_proj", s.o_proj_bias), i, "o")

    def full_qk_norms(self, name: str, p: str, q: str, k: str) -> tuple[str, str]:
        """OLMo 2's q and k norms: RMSNorm over all of q's heads at once [B,S,heads*D], and k's."""
        return (self.rms_norm(f"{name}/q_norm", q, f"{p}.q_norm.weight"),
                self.rms_norm(f"{name}/k_norm", k, f"{p}.k_norm.weight"))

    def identity_rope(self) -> tuple[str, str]:
        """cos/sin tables of the rotary tables' shape that rotate nothing (NoPE layers on our kernel)."""
        if self.no_rope is None:  # made once, shared by every NoPE layer
            shape = self.rope_shape
            self.no_rope = (self.g.weight("/model/rotary_none/cos_cache", np.ones(shape, self.dtype)),
                            self.g.weight("/model/rotary_none/sin_cache", np.zeros(shape, self.dtype)))
        return self.no_rope

    def rope_tables(self, kind: str | None) -> tuple[str, str]:
        """The cos/sin initializers of a spec.rope() kind; a NoPE layer's rotate by 0 (our kernel
        always rotates: cos 1 and sin 0, which is exact)."""
        if kind is None:
            return self.identity_rope()
        return (self.local_cos, self.local_sin) if kind == "local" else (self.cos, self.sin)

    def rotary(self, name: str, x: str, position_ids: str, kind: str = "global", head_dim: int | None = None) -> str:
        """RoPE at position_ids with the table of spec.rope()'s `kind` ("local": a sliding layer's own),
        on heads `head_dim` wide (a layer's own: spec.head_size)."""
        s = self.spec
        if self.legacy:  # (a partial rotary_dim is the model's head_dim's; a layer's own head size has its own table)
            d = head_dim or s.head_dim
            return legacy_ops.rotary(self.g, name, x, self.local_rope_rows if kind == "local" else self.rope,
                                     d, s.rotary_dim if d == s.head_dim else None)
        cos, sin = self.rope_tables(kind)
        attrs = {"rotary_embedding_dim": s.rotary_dim} if s.rotary_dim not in (None, s.head_dim) else {}
        return self.g.op("RotaryEmbedding", f"{name}/RotaryEmbedding", [x, cos, sin, position_ids], **attrs)

    def mrope(self, position_ids: str) -> str:
        """Multimodal RoPE (Qwen2-VL, Qwen3-VL): each token has a (temporal, height, width) position, and
        each rotary column turns by one of them (spec.mrope_axes). A text token's three are its slot
        plus its row's rope_delta (the slots images saved: an image of h x w tokens spans max(h, w)
        positions); rope_positions gives the three of the step's tokens at rope_index (the images', and
        text after an image in a prompt) whole. Makes the step's cos/sin rows [B*S, D/2] the layers'
        tables (all three equal: the model's one table's rows) and returns the positions 0..B*S-1 they
        are read at."""
        g, s, io, I64 = self.g, self.spec, self.io, TensorProto.INT64
        delta = g.input(io.rope_delta, I64, ["batch"])
        index = g.input(io.rope_index, I64, ["rope_tokens", 2])
        values = g.input(io.rope_positions, I64, ["rope_tokens", 3])
        text = g.op("Add", "/model/mrope/text", [position_ids, g.op("Unsqueeze", "/model/mrope/delta",
                                                                    [delta, g.const([1])])])        # [B,S]
        shape = g.op("Shape", "/model/mrope/shape", [position_ids])
        three = g.op("Expand", "/model/mrope/three", [g.op("Unsqueeze", "/model/mrope/text3", [text, g.const([2])]),
                                                      g.op("Concat", "/model/mrope/shape3", [shape, g.const([3])], axis=0)])
        pos = g.op("ScatterND", "/model/mrope/positions", [three, index, values])                   # [B,S,3]
        flat = g.op("Range", "/model/mrope/rows", [g.const(0), g.op("Size", "/model/mrope/size", [position_ids]),
                                                   g.const(1)])
        axes = s.mrope_axes()
        at = [g.op("Gather", f"/model/mrope/axis{axis}", [pos, g.const(axis)], axis=2) for axis in range(3)]  # [B,S]
        for kind in ("cos", "sin"):  # each column from its axis's rows (a choice, not arithmetic: exact)
            rows = [g.op("Gather", f"/model/mrope/{kind}/rows{axis}", [getattr(self, kind), at[axis]], axis=0)
                    for axis in range(3)]                                                         # [B,S,D/2] each
            picked = rows[0]
            for axis in (1, 2):
                picked = g.op("Where", f"/model/mrope/{kind}/pick{axis}", [g.const(axes == axis, np.bool_),
                                                                          rows[axis], picked])
            setattr(self, kind, g.op("Reshape", f"/model/mrope/{kind}/Reshape", [picked, g.const([-1, len(axes)])]))
        return g.op("Reshape", "/model/mrope/flat", [flat, shape])

    def kv_write(self, name: str, past: str, new: str, write_index: str, present: str, kv_heads: int) -> None:
        """new [B,kv_heads,S,D] into slots write_index[b].. of past; present is the same buffer."""
        if self.legacy:
            legacy_ops.kv_write(self.g, name, past, new, self.kv_index[kv_heads], present)
        else:
            self.g.op("TensorScatter", f"{name}/TensorScatter", [past, new, write_index], outputs=[present], axis=-2)

    def attention_gqa(self, i: int, x: str, position_ids: str) -> str:
        """ONNX Runtime only: com.microsoft GroupQueryAttention does RoPE, the in-place KV write and
        attention over the valid length in one kernel (see docs/notes/ort_lowering.md for the recipe); or
        our kernel (plugins/cpu/attention.cc), which also takes Gemma 4's layers (native_attention)."""
        g, s, p = self.g, self.spec, f"model.layers.{i}.self_attn"
        name = f"/model/layers.{i}/attn"
        if self.native_attention:
            return self.attention_native(i, x, position_ids)
        parts = [f"{p}.q_proj", f"{p}.k_proj", f"{p}.v_proj"]
        if s.full_qk_norm:  # q and k normed whole before the fused kernel takes q|k|v
            q, k, v = self.fused_linear(f"{name}/qkv_proj", x, f"{p}.qkv_proj", parts, s.attention_bias, (i, "qkv"))
            qkv = g.op("Concat", f"{name}/qkv_normed", [*self.full_qk_norms(name, p, q, k), v], axis=-1)
        else:
            qkv = self.fused_proj(f"{name}/qkv_proj", x, f"{p}.qkv_proj", parts, s.attention_bias, (i, "qkv"))
        past, present = self.kv_io(i)
        ins = [qkv, "", "", *past, self.seqlens_k, self.total_len, self.cos, self.sin, position_ids,
               "", "", "", "", "", "", self.query_seqlens]
        y = g.op("GroupQueryAttention", f"{name}/GroupQueryAttention", ins,
                 outputs=[f"{name}/GroupQueryAttention/output_0", *present], domain="com.microsoft",
                 num_heads=s.num_heads, kv_num_heads=s.num_kv_heads, do_rotary=1, rotary_interleaved=0,
                 scale=s.scale)[0]
        return self.out_proj(i, x, y)

    def kv_io(self, i: int) -> tuple[list[str], list[str]]:
        """Layer i's KV graph inputs and outputs (past_key/value.i, present_key/value.i), declared: its
        own shape [batch, kv heads, capacity, head size (+ 4: an int8 cache's scale)]."""
        g, s = self.g, self.spec
        kv_shape = ["batch", s.kv_heads(i), "kv_capacity", s.head_size(i) + self.kv_width - s.head_dim]
        index = s.kv_index(i)  # (past_key.{index}: the layers that keep KV, counted)
        past = [g.input(getattr(self.io, f"past_{k}").format(i=index), self.kv_type, kv_shape) for k in ("key", "value")]
        present = [getattr(self.io, f"present_{k}").format(i=index) for k in ("key", "value")]
        for name_out in present:
            g.output(name_out, self.kv_type, kv_shape)
        return past, present

    def attention_native(self, i: int, x: str, position_ids: str) -> str:
        """Our kernel: q|k|v (RoPE, q/k norms, the in-place KV write and attention in one node). Gemma 4:
        its layers' own head sizes and kv heads, v normed in the kernel, a full layer's v its k projection
        (attention_k_eq_v: k's columns again, after the LoRA delta), and a layer reading another's KV
        giving q alone and reading that layer's present buffers (shared_kv: written this step already)."""
        g, s, p = self.g, self.spec, f"model.layers.{i}.self_attn"
        name, own = f"/model/layers.{i}/attn", s.kv_source(i) == i
        v_of_k = own and s.value_is_key and s.window(i) is None
        parts = [f"{p}.q_proj"] + ([f"{p}.k_proj"] if own else []) + ([f"{p}.v_proj"] if own and not v_of_k else [])
        if s.full_qk_norm:  # q and k normed whole before the fused kernel takes q|k|v
            q, k, v = self.fused_linear(f"{name}/qkv_proj", x, f"{p}.qkv_proj", parts, s.attention_bias, (i, "qkv"))
            qkv = g.op("Concat", f"{name}/qkv_normed", [*self.full_qk_norms(name, p, q, k), v], axis=-1)
        elif len(parts) == 1:
            qkv = self.lora(f"{name}/q_proj", x, self.linear(f"{name}/q_proj", x, parts[0], s.attention_bias), i, "qkv")
        else:
            qkv = self.fused_proj(f"{name}/qkv_proj", x, f"{p}.qkv_proj", parts, s.attention_bias, (i, "qkv"))
        if v_of_k:
            width = s.kv_heads(i) * s.head_size(i)
            k = g.op("Slice", f"{name}/v_of_k", [qkv, g.const([-width]), g.const([np.iinfo(np.int64).max]),
                                                 g.const([-1])])
            qkv = g.op("Concat", f"{name}/qkv", [qkv, k], axis=-1)
        if own:
            past, present = self.kv_io(i)
        else:  # (the source layer's buffers as its node left them this step)
            source = s.kv_index(s.kv_source(i))
            past, present = [getattr(self.io, f"present_{k}").format(i=source) for k in ("key", "value")], []
        window = s.window(i)
        cos, sin = self.rope_tables(s.rope(i))
        # (past Gemma 4's first KV-sharing layer, the rows kept: shared_rows' write and last indices)
        write_index, last_index = self.step_indices or (self.io.write_index, self.io.last_index)
        ins = [qkv, *past, write_index, last_index, position_ids, cos, sin]
        attrs = {"window": window} if window else {}
        if s.attn_softcap is not None:
            attrs["softcap"] = s.attn_softcap
        if s.qk_norm:  # each q and k head normed before its rotary (or after), inside the kernel
            ins += [self.norm_scale(f"{p}.q_norm.weight"), self.norm_scale(f"{p}.k_norm.weight") if own else ""]
            if s.qk_norm_after_rope:
                attrs["norm_after_rotary"] = 1
        if s.qk_norm or s.v_norm:
            attrs["epsilon"] = s.rms_norm_eps
        if s.v_norm:
            attrs["v_norm"] = 1
        if not own:
            attrs["shared_kv"] = 1
        # (Gemma 4 sees an image both ways on its sliding layers alone)
        ahead = self.ahead if not (s.image_ahead_windows_only and window is None) else None
        if self.tree or ahead:  # inputs 10 and 11 (those before left empty where absent)
            ins += ["", ""] * (not s.qk_norm) + [self.tree_mask if self.tree else ""]
        if ahead:
            ins.append(ahead)
        out = g.op(cpu_kernels.ATTENTION, f"{name}/Attention", ins, outputs=[f"{name}/Attention/output_0", *present],
                   domain=cpu_kernels.DOMAIN, num_heads=s.num_heads, kv_num_heads=s.kv_heads(i), scale=s.scale, **attrs)
        y = out if isinstance(out, str) else out[0]
        return self.out_proj(i, x, y)

    def gqa_lengths(self, write_index: str, last_index: str) -> None:
        """GroupQueryAttention's per-row lengths: Q = last_index + 1 new tokens, P + Q - 1 =
        write_index + last_index, and the buffer capacity as the total."""
        g, i32 = self.g, TensorProto.INT32
        q = g.op("Add", "/model/gqa/q_len", [last_index, g.const(1)])
        self.query_seqlens = g.op("Cast", "/model/gqa/query_seqlens", [q], to=i32)
        k = g.op("Add", "/model/gqa/k_len", [write_index, last_index])
        self.seqlens_k = g.op("Cast", "/model/gqa/seqlens_k", [k], to=i32)
        cap = g.op("Gather", "/model/gqa/capacity", [g.op("Shape", "/model/gqa/kv_shape", [self.io.past_key.format(i=0)]),
                                                      g.const(2)], axis=0)
        self.total_len = g.op("Cast", "/model/gqa/total", [cap], to=i32)

    def masks(self, input_ids: str, write_index: str, last_index: str | None = None,
              prefix: str = "/model/mask") -> dict[int | None, str]:
        """bool [B,1,S,C] per window the layers use (None: full attention): slot j is visible to query s
        of row b iff j <= write_index[b] + s (and, in a window W, j > write_index[b] + s - W); with
        image_ahead (Gemma 3), j <= write_index[b] + s + its look-ahead (the window still from its slot).
        S is input_ids' second dimension; `last_index` (default the step's) and `prefix` are another row
        set's (Gemma 4's kept rows: per_layer.shared_rows)."""
        g = self.g
        zero, one = g.const(0), g.const(1)
        seq = g.op("Gather", f"{prefix}/seq_len", [g.op("Shape", f"{prefix}/ids_shape", [input_ids]), one], axis=0)
        past0 = self.io.past_key.format(i=0)
        cap = g.op("Gather", f"{prefix}/capacity", [g.op("Shape", f"{prefix}/kv_shape", [past0]), g.const(2)], axis=0)
        q_off = g.op("Range", f"{prefix}/q_range", [zero, seq, one])                      # [S]
        kv_slot = g.op("Range", f"{prefix}/kv_range", [zero, cap, one])                   # [C]
        wi = g.op("Unsqueeze", f"{prefix}/wi", [write_index, g.const([1])])               # [B,1]
        q_slot = g.op("Add", f"{prefix}/q_slot", [wi, q_off])                             # [B,S]
        q_slot = g.op("Unsqueeze", f"{prefix}/q_slot4", [q_slot, g.const([1, 3])])        # [B,1,S,1]
        seen_to = q_slot if self.ahead is None else self.seen_to(q_slot, write_index, last_index, prefix)
        causal = g.op("LessOrEqual", f"{prefix}/causal", [kv_slot, seen_to])              # [B,1,S,C]
        # Gemma 4: its full-attention layers see images causally (image_ahead is its sliding layers')
        own = self.ahead is not None and self.spec.image_ahead_windows_only
        full = g.op("LessOrEqual", f"{prefix}/causal_full", [kv_slot, q_slot]) if own else None
        if self.tree:
            visible = self.tree_visible(write_index, seq, kv_slot)
            causal = g.op("And", f"{prefix}/tree", [causal, visible])
            full = g.op("And", f"{prefix}/tree_full", [full, visible]) if own else None
            # a token's window counts from its position: a tree's tokens share positions, not slots
            q_slot = g.op("Unsqueeze", f"{prefix}/q_pos4", [self.io.position_ids, g.const([1, 3])])
        out = {}
        for window in sorted({self.spec.window(i) for i in range(self.spec.num_layers)}, key=lambda w: w or 0):
            if window is None:
                out[None] = full or causal
            else:
                lo = g.op("Sub", f"{prefix}/window_lo", [q_slot, g.const(window)])
                out[window] = g.op("And", f"{prefix}/window",
                                   [causal, g.op("Greater", f"{prefix}/in_window", [kv_slot, lo])])
        return out

    def seen_to(self, q_slot: str, write_index: str, last_index: str | None = None, prefix: str = "/model/mask") -> str:
        """[B,1,S,1]: the last slot each token sees with its look-ahead (Gemma 3's image tokens: the rest of
        their image), never past its row's last new slot (write_index + last_index), as our kernel checks."""
        g = self.g
        ahead = g.op("Add", f"{prefix}/ahead", [q_slot, g.op("Unsqueeze", f"{prefix}/ahead4",
                                                              [self.ahead, g.const([1, 3])])])
        last = g.op("Add", f"{prefix}/last_slot", [write_index, last_index or self.io.last_index])
        last = g.op("Max", f"{prefix}/own_or_last", [q_slot, g.op("Unsqueeze", f"{prefix}/last4",
                                                                    [last, g.const([1, 2, 3])])])
        return g.op("Min", f"{prefix}/seen_to", [ahead, last])

    def tree_visible(self, write_index: str, seq: str, kv_slot: str) -> str:
        """bool [B,1,S,C]: tree_mask [B,S,T] covers the step's last T slots (from write_index + S - T):
        slot j there is visible to token s iff tree_mask[b, s, j - start]; slots before it all are
        (the causal mask still applies). T = 0: a plain step."""
        g = self.g
        shape = g.op("Shape", "/model/tree/shape", [self.tree_mask])
        t = g.op("Gather", "/model/tree/T", [shape, g.const(2)], axis=0)
        start = g.op("Sub", "/model/tree/start", [g.op("Add", "/model/tree/end", [write_index, seq]), t])   # [B]
        r = g.op("Sub", "/model/tree/r", [kv_slot, g.op("Unsqueeze", "/model/tree/start2", [start, g.const([1])])])
        past = g.op("Less", "/model/tree/past", [r, g.const(0)])                                          # [B,C]
        idx = g.op("Min", "/model/tree/idx", [g.op("Max", "/model/tree/r0", [r, g.const(0)]), t])        # [B,C]
        # column T: False, for the slots after the region (the causal mask hides them anyway)
        rows = g.op("Slice", "/model/tree/rows", [shape, g.const([0]), g.const([2])])
        off_shape = g.op("Concat", "/model/tree/off_shape", [rows, g.const([1])], axis=0)
        off = g.op("Expand", "/model/tree/off", [g.const([[[False]]], np.bool_), off_shape])
        padded = g.op("Concat", "/model/tree/padded", [self.tree_mask, off], axis=2)                     # [B,S,T+1]
        cap = g.op("Shape", "/model/tree/cap", [kv_slot])
        idx = g.op("Expand", "/model/tree/idx3", [g.op("Unsqueeze", "/model/tree/idx1", [idx, g.const([1])]),
                                                   g.op("Concat", "/model/tree/idx_shape", [rows, cap], axis=0)])
        seen = g.op("GatherElements", "/model/tree/seen", [padded, idx], axis=2)                          # [B,S,C]
        seen = g.op("Or", "/model/tree/visible", [g.op("Unsqueeze", "/model/tree/past3", [past, g.const([1])]), seen])
        return g.op("Unsqueeze", "/model/tree/visible4", [seen, g.const([1])])                            # [B,1,S,C]
