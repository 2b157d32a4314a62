"""The canonical decoder graph (DESIGN.md §4), written op by op from a checkpoint's weights.

One step of the graph, for every architecture in the registry:

    input_ids [B,S] -> Gather(embed) -> h [B,S,H]                   (Gemma: times sqrt(H))
    per layer i:
        x = RMSNormalization(h)
        q,k,v = Split(MatMul(x, W_qkv) (+ bias)) -> [B,heads,S,D]   (Qwen3, Gemma: RMSNorm per head)
        q,k   = RotaryEmbedding(q|k, position_ids)                  (Gemma: sliding layers' own table;
                                                                     SmolLM3: none on its NoPE layers;
                                                                     Phi-4-mini: on part of each head)
        K_i   = TensorScatter(past_key.i, k, write_index)   # in place: present_key.i aliases past_key.i
        V_i   = TensorScatter(past_value.i, v, write_index)
        h    += o_proj(Attention(q, K_i, V_i, mask))        # mask: slot j visible to query s of row b
        h    += down(silu(gate) * up), gate|up = Split(MatMul(x', W_gate_up))   # mask: j <= write_index[b] + s
        (a sliding layer's mask also needs j > write_index[b] + s - window; Gemma norms the attention
        and MLP outputs before each +=, its MLP is GELU's tanh form, and its norms scale by 1 + w)
        LoRA engines (lora_rank > 0) add (x @ lora_a) @ lora_b, graph inputs per projection, to the
        output of each of qkv, o, gate|up and down (`lora_sites`) before it is split or activated.
    logits [B,V] = lm_head(norm(h[b, last_index[b]]))
    token_ids, top_logprobs = trtllm::Sample(logits, logit_bias, penalties, temperature, min_p, top_k, top_p, uniform)

KV slots are positions: a row's token at position p lives in slot p, so right-padding a batch of
prompts of different lengths is harmless (the pad's slots are masked, then overwritten).

Two profiles (DESIGN.md §4): graph="modern" is the above at opset 24 (TensorRT >= 10.15);
graph="legacy" is opset 20 for TensorRT 10.3 (JetPack 6), the four newer ops written as older
ones (builder/legacy_ops.py), with the same I/O, KV layout and results.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto
from onnx import helper as onnx_helper

from trtllm.builder import legacy_ops
from trtllm.builder.attention import AttentionWriter
from trtllm.builder.config import GRAPHS
from trtllm.builder.graph import DTYPES, STORAGE, GraphWriter
from trtllm.builder.head import HeadWriter
from trtllm.builder.lora_sites import lora_sites, site_for
from trtllm.builder.mamba import MambaWriter
from trtllm.builder.mlp import MLPWriter
from trtllm.builder.decoder_spec import DecoderSpec, attention_supported, gqa_supported, half_supported
from trtllm.builder.moe import MoEWriter
from trtllm.builder.moe import kernel_takes as moe_kernel_takes
from trtllm.builder.per_layer import PerLayerWriter
from trtllm.builder.short_conv import ConvWriter
from trtllm.builder.quantize import QuantScheme, in_slices
from trtllm.builder.weights import WeightWriter
from trtllm.plugins import cpu as cpu_kernels
from trtllm.plugins.sample import body as sample_body
from trtllm.plugins.sample import schema as sample_schema
from trtllm.runtime.manifest import GraphIO

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


class DecoderWriter(AttentionWriter, MLPWriter, HeadWriter, WeightWriter, MoEWriter, PerLayerWriter, ConvWriter,
                    MambaWriter):
    """Writes one decoder graph; `graph` picks the profile ("modern" opset 24, "legacy" opset 20,
    which refuses `quant` and `ort_attention`). Its attention (builder/attention.py), MLPs (builder/mlp.py),
    head and sampler (builder/head.py), weights (builder/weights.py), mixture-of-experts MLPs
    (builder/moe.py), Gemma 4's per-layer embeddings (builder/per_layer.py), LFM2's convolutions
    (builder/short_conv.py) and Mamba-2 layers (builder/mamba.py) are written by its mixins."""

    def __init__(self, spec: DecoderSpec, weights: dict[str, np.ndarray], rope_cos: np.ndarray,
                 rope_sin: np.ndarray, max_top_k: int, io: GraphIO = GraphIO(), quant: QuantScheme | None = None,
                 dtype: str = "float32", ort_attention: bool = False, graph: str = "modern",
                 native_kernels: bool = False, lora_rank: int = 0,
                 eagle: tuple[tuple[int, ...], np.ndarray] | None = None,
                 local_rope: tuple[np.ndarray, np.ndarray] | None = None, ort_form: bool = False,
                 tree: bool = False, verify_logits: bool = False, kv_int8: bool = False, grids: dict | None = None,
                 handoff: dict | None = None, hand_on: dict | None = None, dense_experts: bool = False,
                 lora_experts: bool = False):
        if graph not in GRAPHS:
            raise ValueError(f"graph must be one of {GRAPHS}, got {graph!r}")
        self.legacy = graph == "legacy"
        if self.legacy:
            legacy_ops.refuse(quant, ort_attention)
        self.spec, self.w, self.io, self.quant = spec, weights, io, quant
        # ONNX Runtime form only: plugins/cpu's kernels for the quantized projections
        # (trtllm.cpu::MatMulBlockQuant) and, where GroupQueryAttention would go, trtllm.cpu::Attention.
        # A float16 or bfloat16 engine's form there (`half`) keeps its weights and cache in that type
        # but computes in float32 (trtllm.cpu::MatMulHalf): ONNX Runtime has no fast float16 kernels
        # on CPUs, and no bfloat16 ones at all.
        # A quantized float16 engine's form there computes in float32 too, its KV cache float16.
        self.native = native_kernels and quant is not None and quant.block_size == 32 and dtype != "bfloat16"
        self.half = native_kernels and ort_attention and half_supported(spec, dtype, quant)
        # attention as one fused node: ours (trtllm.cpu::Attention) on our kernels, else ONNX Runtime's
        supported = attention_supported if native_kernels else gqa_supported
        self.gqa = ort_attention and supported(spec, "float32" if self.half or self.native else dtype)
        self.native_attention = native_kernels and self.gqa
        # attention as standard MatMul and Softmax (builder/legacy_ops.py) where it is not one node: in
        # the legacy graph, and for soft-capped scores (Gemma 2), which TensorRT's Attention lacks
        self.decomposed = not self.gqa and (self.legacy or spec.attn_softcap is not None)
        # float16 or bfloat16 (elsewhere): weights, activations and the KV cache in that type; norms
        # accumulate in float32 (stash_type), attention's softmax too, and the logits are cast to float32.
        self.storage = STORAGE[dtype]  # the weights' and the cache's type
        self.dtype = np.dtype("float32") if self.half or self.native else self.storage
        self.ftype, self.kv_type = DTYPES[self.dtype], DTYPES[self.storage]
        # --kv-cache-dtype int8: each slot row is head_dim int8 values and their float32 scale's 4 bytes,
        # which only our attention kernel reads and writes
        self.kv_width = spec.head_dim + 4 if kv_int8 else spec.head_dim
        if kv_int8:
            if not self.native_attention:
                raise ValueError("an int8 KV cache needs our attention kernel (native_kernels, ort_attention)")
            self.kv_type = TensorProto.INT8
        # LoRA inputs: float16 engines take float16; bfloat16 ones float32 (numpy, which the runtime
        # feeds them from, has no bfloat16), cast to the graph's type where it differs
        self.lora_type = TensorProto.FLOAT16 if dtype == "float16" else F32
        self.g = GraphWriter("trtllm_decoder")
        self.cos = self.g.weight("/model/rotary/cos_cache", rope_cos.astype(self.dtype))
        self.sin = self.g.weight("/model/rotary/sin_cache", rope_sin.astype(self.dtype))
        self.rope_shape, self.no_rope = rope_cos.shape, None
        if spec.local_rope != (local_rope is not None):
            raise ValueError(f"spec.local_rope is {spec.local_rope}: local_rope tables must be given exactly then")
        if local_rope is not None:  # the sliding layers' own table (spec.local_rope)
            self.local_cos = self.g.weight("/model/rotary_local/cos_cache", local_rope[0].astype(self.dtype))
            self.local_sin = self.g.weight("/model/rotary_local/sin_cache", local_rope[1].astype(self.dtype))
        self.max_top_k = max_top_k
        self.lora_rank = lora_rank  # > 0: LoRA inputs on every site (lora_sites)
        self.native_lora = native_kernels and lora_rank > 0  # as trtllm.cpu::LoraAdd nodes
        self.native_sample = native_kernels  # trtllm::Sample as trtllm.cpu::Sample (its body costs 2 ms a row)
        self.native_moe = native_kernels and moe_kernel_takes(spec, quant)  # trtllm.cpu::MoE (builder/moe.py)
        self.native_mamba = native_kernels and bool(spec.mamba_layers)  # trtllm.cpu::MambaScan (builder/mamba.py)
        # quantized experts as the other projections (our kernel's form, and llm.onnx's to match), not
        # QMoE's zero points (moe_quant.py): the build decides it for both of its writers
        self.dense_experts = dense_experts
        self.sites = lora_sites(spec, lora_experts)  # (lora_experts: the routed experts' sites too)
        self.eagle = eagle  # (the draft's three layers, its fc [H, 3H]): EAGLE-3 outputs (builder/eagle.py)
        # The logits of the positions verify_index names as an output too (ONNX Runtime): EAGLE rows
        # that ask for logprobs take theirs from it (it is written where the sampler's input is), and
        # any engine's prompt_logprobs are read from it (a prompt's positions, chunk by chunk)
        self.verify_logits_out = verify_logits
        # EAGLE graphs (the model's and the head's) for draft trees: a `tree_mask` input says which of
        # the step's last slots each token sees. The build decides it for both together (export.py);
        # not where attention is ONNX Runtime's GroupQueryAttention, which takes no such mask.
        self.tree = tree
        self._verify_index = None  # (HeadWriter.verify_index_input)
        self.step_indices = None  # (write_index, last_index) of the rows kept past shared_rows, where it slices
        self.ahead = None  # Gemma 3's image_ahead as [B,S] (prologue), where spec.image_bidirectional
        if tree and self.gqa and not self.native_attention:
            raise ValueError("draft trees need a tree mask, which ONNX Runtime's GroupQueryAttention does not take")
        self.half_embedding = False  # the token embedding table in float16, computing in float32 (EAGLE heads)
        self.ort_form = ort_form or ort_attention or native_kernels  # ONNX Runtime's form, not llm.onnx
        self.quantized = {}  # prefix -> its quantized weights' names (dequantized or packed), made once
        self.has_generated = False  # plugins/cpu MatMuls: the `generated` input is declared (generated_input)
        # a GPTQ/AWQ checkpoint's grids (builder/prequantized.py), and the projections whose grid int4
        # or int8 kept (quantize_weight)
        self.grids, self.kept = grids or {}, []
        # quantize_weight's results, shared by the build's two writers (llm.onnx, then its ONNX Runtime
        # form), so that each weight is quantized once: the first leaves them in `hand_on`, the second
        # takes (and frees) them from `handoff`
        self.handoff, self.hand_on = {} if handoff is None else handoff, hand_on

    def linear(self, name: str, x: str, prefix: str, bias: bool = False) -> str:
        """x @ W.T (+ b)."""
        y = self.matmul(name, x, prefix, self.w[f"{prefix}.weight"])
        if bias:
            y = self.g.op("Add", f"{name}/Add", [y, self.fw(f"{prefix}.bias", self.w[f"{prefix}.bias"])])
        return y

    def fused_proj(self, name: str, x: str, prefix: str, parts: list[str], bias: bool = False,
                   lora: tuple[int, str] | None = None) -> str:
        """Projections of the same input as one MatMul (q|k|v, gate|up): one weight read and one
        kernel instead of several; `lora` = (layer, site) adds that site's LoRA delta."""
        w = np.concatenate([self.w[f"{p}.weight"] for p in parts], axis=0)   # [sum(out), in]
        y = self.matmul(name, x, prefix, w, parts=parts)
        if bias:
            b = np.concatenate([self.w[f"{p}.bias"] for p in parts])
            y = self.g.op("Add", f"{name}/Add", [y, self.fw(f"{prefix}.bias", b)])
        return y if lora is None else self.lora(name, x, y, *lora)

    def lora_pair(self, layer: int, site_io: dict, module: str, width: int, where: str) -> tuple[str, str]:
        """A module's graph inputs lora_a [1|B, in, r] and lora_b [1|B, r, width] ([1|B, E, in, r] and
        [1|B, E, r, width] on the experts: one adapter each), in the graph's type: given in lora_type
        (the manifest's LoRA dtype) whatever the activations, cast where they differ."""
        g, rank = self.g, f"lora_rank.{layer}.{module}"
        lead = ["lora_batch", site_io["experts"]] if "experts" in site_io else ["lora_batch"]
        a = g.input(self.io.lora_a.format(i=layer, module=module), self.lora_type, [*lead, site_io["in"], rank])
        b = g.input(self.io.lora_b.format(i=layer, module=module), self.lora_type, [*lead, rank, width])
        if self.lora_type != self.ftype:
            a = g.op("Cast", f"{where}/Cast_a", [a], to=self.ftype)
            b = g.op("Cast", f"{where}/Cast_b", [b], to=self.ftype)
        return a, b

    def lora(self, name: str, x: str, y: str, layer: int, site: str, gated: bool = False) -> str:
        """y + Concat over the site's modules of (x @ lora_a) @ lora_b: [B,S,in] @ [1|B, in, r] @
        [1|B, r, out]. A leading 1 shares one adapter across the batch, B gives each row its own;
        r = 0 adds zeros (no adapter on that module). `gated`: then act(gate) * up of the sum (gated).
        On our kernels, one trtllm.cpu::LoraAdd node does it all (plugins/cpu/lora.cc; SiLU only)."""
        if not self.lora_rank:
            return y
        g, site_io, deltas, pairs = self.g, self.sites[site_for(self.sites, layer, site)], [], []
        for module, lo, hi in site_io["modules"]:
            where = f"{name}/lora/{module.split('.')[-1]}"
            a, b = self.lora_pair(layer, site_io, module, hi - lo, where)
            pairs += [a, b]
            if not self.native_lora:
                deltas.append(g.op("MatMul", f"{where}/MatMul_b", [g.op("MatMul", f"{where}/MatMul_a", [x, a]), b]))
        if self.native_lora:
            columns = [c for _, lo, hi in site_io["modules"] for c in (lo, hi)]
            fused = gated and self.spec.hidden_act == "silu"  # the kernel's activation is SiLU
            op = cpu_kernels.LORA_SWIGLU if fused else cpu_kernels.LORA
            y = g.op(op, f"{name}/lora/{op}", [y, x, *pairs], domain=cpu_kernels.DOMAIN, columns=columns)
            if fused or not gated:
                return y
        else:
            d = deltas[0] if len(deltas) == 1 else g.op("Concat", f"{name}/lora/Concat", deltas, axis=-1)
            y = g.op("Add", f"{name}/lora/Add", [y, d])
        if not gated:
            return y
        half = site_io["modules"][-1][2] // 2  # gate|up: the two halves of the site's columns
        return self.gated(name, *g.op("Split", f"{name}/Split", [y, g.const([half, half])], num_outputs=2, axis=-1))

    def fused_linear(self, name: str, x: str, prefix: str, parts: list[str], bias: bool = False,
                     lora: tuple[int, str] | None = None) -> list[str]:
        """fused_proj, then Split into the parts."""
        y = self.fused_proj(name, x, prefix, parts, bias, lora)
        sizes = self.g.const([self.w[f"{p}.weight"].shape[0] for p in parts])
        return self.g.op("Split", f"{name}/Split", [y, sizes], num_outputs=len(parts), axis=-1)

    def norm_scale(self, weight_name: str | None, width: int = 0) -> str:
        """An RMSNorm's scale: its weight, or with spec.norm_offset (Gemma) 1 + w in float32, from w
        as the engine stores it: transformers computes a 16-bit Gemma's norms so (1 + w rounded to
        bfloat16 would be 1/256 off), and rms_norm normalizes in float32 for it. No weight: ones
        `width` wide (a norm without a scale: Gemma 4's on v)."""
        if weight_name is None:  # (rms_norm computes such a norm in float32)
            return self.g.const(np.ones(width), np.float32)
        w = self.w[weight_name]
        if not self.spec.norm_offset:
            return self.fw(weight_name, w)
        if self.half or self.dtype == self.storage:  # stored in the engine's dtype (a quantized form: float32)
            w = w.astype(self.storage)
        return self.g.weight(weight_name, w.astype(np.float32) + np.float32(self.spec.norm_offset))

    def rms_norm(self, name: str, x: str, weight_name: str | None, width: int = 0) -> str:
        g, scale = self.g, self.norm_scale(weight_name, width)
        # a 16-bit Gemma's norms (and any without a weight): in float32, cast back after
        wide = (self.spec.norm_offset or weight_name is None) and self.ftype != F32
        if wide:
            x = g.op("Cast", f"{name}/Cast", [x], to=F32)
        if self.legacy:
            y = legacy_ops.rms_norm(g, name, x, scale, self.spec.rms_norm_eps, F32 if wide else self.ftype)
        else:
            y = g.op("RMSNormalization", f"{name}/RMSNormalization", [x, scale], axis=-1,
                     epsilon=self.spec.rms_norm_eps, stash_type=1)
        return g.op("Cast", f"{name}/CastBack", [y], to=self.ftype) if wide else y

    def residual_scaled(self, name: str, y: str) -> str:
        """An attention or MLP output as it joins the residual stream: times residual_scale (Granite's
        residual_multiplier, in the graph's type as transformers multiplies; a LoRA delta is in y too)."""
        if self.spec.residual_scale == 1.0:
            return y
        return self.g.op("Mul", f"{name}/residual_scale", [y, self.g.const(self.spec.residual_scale, self.dtype)])

    def layer_input(self, name: str, h: str, branch: tuple[str, str] | None, weight_name: str) -> tuple[str, str]:
        """h += branch; (what the attention or MLP takes, the new h): h normed (residual_norm), or
        without pre_norms (OLMo 2) h itself."""
        if self.spec.pre_norms:
            return self.residual_norm(name, h, branch, weight_name)
        h = h if branch is None else self.g.op("Add", branch[0], [h, branch[1]])
        return h, h

    def residual_norm(self, name: str, h: str, branch: tuple[str, str] | None, weight_name: str) -> tuple[str, str]:
        """h += branch, then RMSNorm: (normed, new h). The ONNX Runtime lowering does both in one
        com.microsoft SkipSimplifiedLayerNormalization, which ONNX Runtime does not fuse by itself."""
        if branch is None:
            return self.rms_norm(name, h, weight_name), h
        if not self.gqa:
            h = self.g.op("Add", branch[0], [h, branch[1]])
            return self.rms_norm(name, h, weight_name), h
        scale = self.norm_scale(weight_name)
        normed, _, _, h = self.g.op("SkipSimplifiedLayerNormalization", f"{name}/SkipSimplifiedLayerNormalization",
                                    [h, branch[1], scale], outputs=[f"{name}/output_0", "", "", f"{branch[0]}/output_0"],
                                    domain="com.microsoft", epsilon=self.spec.rms_norm_eps)
        return normed, h

    def heads(self, name: str, x: str, num_heads: int, norm: str | None, head_dim: int | None = None,
              unscaled: bool = False) -> str:
        """[B,S,heads*D] -> [B,heads,S,D], with an optional per-head RMSNorm (Qwen3 q/k norm; `unscaled`:
        one without a weight, Gemma 4's on v)."""
        g, d = self.g, head_dim or self.spec.head_dim
        x = g.op("Reshape", f"{name}/Reshape", [x, g.const([0, 0, num_heads, d])])
        if norm:
            x = self.rms_norm(f"{name}/norm", x, norm)
        elif unscaled:
            x = self.rms_norm(f"{name}/norm", x, None, width=d)
        return g.op("Transpose", f"{name}/Transpose", [x], perm=[0, 2, 1, 3])

    def prologue(self) -> tuple[str, str, str, str, str, str | None]:
        """The step inputs every graph takes, the token embeddings and the attention mask:
        (input_ids, position_ids, write_index, last_index, embeddings, mask)."""
        g, s, io = self.g, self.spec, self.io
        input_ids = g.input(io.input_ids, I64, ["batch", "seq"])
        position_ids = g.input(io.position_ids, I64, ["batch", "seq"])
        if s.mrope_section:  # every layer turns by the step's own rows (mrope), at positions 0..B*S-1
            position_ids = self.mrope(position_ids)
        write_index = g.input(io.write_index, I64, ["batch"])
        last_index = g.input(io.last_index, I64, ["batch"])
        if self.tree:
            self.tree_mask = g.input(io.tree_mask, TensorProto.BOOL, ["batch", "seq", "tree"])
        table_ids = self.placeholders(input_ids) if s.placeholder_ids else input_ids
        if self.half or self.half_embedding:  # one 16-bit table for the lookup and a tied lm_head
            table = self.storage if self.half else np.dtype(np.float16)  # a quantized EAGLE head's: float16
            embed = g.weight("model.embed_tokens.weight", in_slices(self.w.rows("model.embed_tokens.weight"), table))
            h = g.op("Gather", "/model/embed_tokens/Gather", [embed, table_ids], axis=0)
            if table != self.dtype:
                h = g.op("Cast", "/model/embed_tokens/Cast", [h], to=self.ftype)
        elif self.quant is not None:
            h = self.quantized_embedding(table_ids)
        else:
            embed = self.fw("model.embed_tokens.weight", self.w.rows("model.embed_tokens.weight"))
            h = g.op("Gather", "/model/embed_tokens/Gather", [embed, table_ids], axis=0)
        if s.embed_scale != 1.0:  # in the table's type, as transformers multiplies
            h = g.op("Mul", "/model/embed_tokens/Scale", [h, g.const(s.embed_scale, self.dtype)])
        if s.image_embeds:  # written over the image tokens' rows, as transformers' masked_scatter does
            width = s.hidden_size * (1 + s.deepstack_layers)
            embeds = g.input(io.image_embeds, TensorProto.FLOAT, ["image_tokens", width])
            if self.ftype != TensorProto.FLOAT:
                embeds = g.op("Cast", "/model/image_embeds/Cast", [embeds], to=self.ftype)
            self.image_index = g.input(io.image_index, I64, ["image_tokens", 2])
            parts = [embeds] if not s.deepstack_layers else g.op(
                "Split", "/model/image_embeds/Split", [embeds, g.const([s.hidden_size] * (1 + s.deepstack_layers))],
                num_outputs=1 + s.deepstack_layers, axis=-1)
            self.deepstack = parts[1:]  # (each added after its layer: write)
            h = g.op("ScatterND", "/model/image_embeds/ScatterND", [h, self.image_index, parts[0]])
        if s.per_layer_input:
            self.per_layer = self.per_layer_inputs(table_ids, h)
        if s.image_bidirectional:  # [B,S]: 0 but for the image tokens, which see the rest of their image
            given = g.input(io.image_ahead, I64, ["image_tokens"])
            shape = g.op("Shape", "/model/image_ahead/shape", [input_ids])
            zeros = g.op("ConstantOfShape", "/model/image_ahead/zeros", [shape],
                         value=onnx_helper.make_tensor("value", I64, [1], [0]))
            self.ahead = g.op("ScatterND", "/model/image_ahead/ScatterND", [zeros, self.image_index, given])
        if self.gqa:
            mask = None
            if not self.native_attention:
                self.gqa_lengths(write_index, last_index)
        else:
            mask = self.step_masks(input_ids, write_index)
        if self.legacy:  # what every layer shares, built once: the cos/sin rows, KV addresses
            self.legacy_rope_rows(position_ids)
            self.kv_index = {n: legacy_ops.scatter_indices(g, input_ids, write_index, n, "" if n == s.num_kv_heads
                                                           else f"_{n}")
                             for n in {s.kv_heads(i) for i in range(s.num_layers - s.kv_shared_layers)}}
        return input_ids, position_ids, write_index, last_index, h, mask

    def legacy_rope_rows(self, position_ids: str, prefix: str = "/model") -> None:
        """The legacy graph's cos/sin rows at position_ids (and the sliding layers' own), which its layers
        share: the step's, or (another `prefix`) the rows shared_rows keeps."""
        self.rope = legacy_ops.rope_tables(self.g, position_ids, self.cos, self.sin, f"{prefix}/rotary")
        if self.spec.local_rope:
            self.local_rope_rows = legacy_ops.rope_tables(self.g, position_ids, self.local_cos, self.local_sin,
                                                          f"{prefix}/rotary_local")

    def step_masks(self, input_ids: str, write_index: str, last_index: str | None = None,
                   prefix: str = "/model/mask") -> dict:
        """The standard ops' attention masks (AttentionWriter.masks: input_ids' rows, or another row set's
        with `last_index` and a name `prefix` of its own); decomposed attention's as additive biases per
        window and query group size (Gemma 4's full layers have kv heads of their own)."""
        g, s = self.g, self.spec
        mask = self.masks(input_ids, write_index, last_index, prefix)
        if not self.decomposed:
            return mask
        groups = s.num_heads // s.num_kv_heads  # (the model's own: its biases keep their plain names)
        kinds = sorted({(s.window(i), s.num_heads // s.kv_heads(i)) for i in range(s.num_layers)
                        if i not in s.conv_layers and i not in s.mamba_layers}, key=lambda k: (k[0] or 0, k[1]))
        return {(w, n): legacy_ops.attention_bias(
            g, mask[w], n, f"{prefix}/{'bias' if w is None else 'window_bias'}" + f"_{n}" * (n != groups))
            for w, n in kinds}

    def placeholders(self, input_ids: str) -> str:
        """input_ids with each of spec.placeholder_ids as placeholder_pad_id: what the token tables read."""
        g, s, name = self.g, self.spec, "/model/placeholders"
        hit = None
        for k, t in enumerate(s.placeholder_ids):
            eq = g.op("Equal", f"{name}/Equal{k}", [input_ids, g.const(t)])
            hit = eq if hit is None else g.op("Or", f"{name}/Or{k}", [hit, eq])
        return g.op("Where", f"{name}/Where", [hit, g.const(s.placeholder_pad_id), input_ids])

    def experts_beside(self, i: int, y: str, h: str) -> str:
        """Gemma 4's MoE layer: the dense MLP's y normed, plus the experts of h (the residual stream
        the MLP's input was normed from) normed, the router reading h normed without a scale."""
        p, name = f"model.layers.{i}", f"/model/layers.{i}"
        y = self.rms_norm(f"{name}/post_feedforward_layernorm_1", y, f"{p}.post_feedforward_layernorm_1.weight")
        x = self.rms_norm(f"{name}/pre_feedforward_layernorm_2", h, f"{p}.pre_feedforward_layernorm_2.weight")
        experts = self.moe(i, x, router_x=self.rms_norm(f"{name}/router/norm", h, None, width=self.spec.hidden_size))
        experts = self.rms_norm(f"{name}/post_feedforward_layernorm_2", experts,
                                f"{p}.post_feedforward_layernorm_2.weight")
        return self.g.op("Add", f"{name}/experts_beside/Add", [y, experts])

    def deepstack_add(self, i: int, h: str) -> str:
        """h's image token rows += the vision graph's i-th extra rows (Gather, Add, Scatter: TensorRT's
        ScatterND takes no reduction)."""
        g, name = self.g, f"/model/layers.{i}/deepstack"
        rows = g.op("GatherND", f"{name}/GatherND", [h, self.image_index])
        extra = self.deepstack[i]
        return g.op("ScatterND", f"{name}/ScatterND", [h, self.image_index, g.op("Add", f"{name}/Add", [rows, extra])])

    def finish(self) -> "onnx.ModelProto":  # noqa: F821
        extra = {sample_body.DOMAIN: sample_schema.DOMAIN_VERSION, **({"com.microsoft": 1} if self.gqa else {}),
                 **({cpu_kernels.DOMAIN: 1} if self.native or self.native_attention or self.half or self.native_lora
                    or self.native_sample else {})}
        model = self.g.model("trtllm-edge", extra_opsets=extra)
        if self.legacy:
            next(o for o in model.opset_import if o.domain == "").version = legacy_ops.OPSET
            model.ir_version = legacy_ops.IR_VERSION
        return model

    def write(self) -> "onnx.ModelProto":  # noqa: F821
        g, s = self.g, self.spec
        input_ids, position_ids, write_index, last_index, h, mask = self.prologue()
        if s.mamba_layers:  # a parked row's last_index is -1 (its Mamba states kept): 0 for everything else
            state_last, last_index = last_index, g.op("Max", "/model/last_index/Max", [last_index, g.const(0)])
            self.step_indices = (write_index, last_index)
        aux = {}  # EAGLE: the residual stream at the input of the draft head's three layers
        branch = None  # (residual Add name, the attention or MLP output still to be added into h)
        for i in range(s.num_layers):
            if i == s.num_layers - s.kv_shared_layers and self.slices_shared():  # (Gemma 4: h is whole here)
                h, position_ids, last_index = self.shared_rows(h, position_ids, write_index, last_index)
                if not self.native_attention:  # (the standard ops' masks and legacy RoPE rows, of the kept rows)
                    mask = self.step_masks(h, *self.step_indices, prefix="/model/shared_rows/mask")
                    if self.legacy:
                        self.legacy_rope_rows(position_ids, "/model/shared_rows")
            x, h = self.layer_input(f"/model/layers.{i}/input_layernorm", h, branch,
                                    f"model.layers.{i}.input_layernorm.weight")
            aux[i] = h
            if i in s.mamba_layers:
                y = self.mamba_mixer(i, x, write_index, state_last)
            elif i in s.conv_layers:
                y = self.short_conv(i, x, write_index)
            else:
                y = self.attention(i, x, position_ids, write_index, mask)
            if s.sandwich_norms:  # Gemma: the output is normed first, and the MLP's own norm is "pre_feedforward"
                y = self.rms_norm(f"/model/layers.{i}/post_attention_layernorm", y,
                                  f"model.layers.{i}.post_attention_layernorm.weight")
            y = self.residual_scaled(f"/model/layers.{i}/attn", y)
            pre_mlp = "pre_feedforward_layernorm" if s.sandwich_norms else "post_attention_layernorm"
            x, h = self.layer_input(f"/model/layers.{i}/{pre_mlp}", h, (f"/model/layers.{i}/attn/residual", y),
                                    f"model.layers.{i}.{pre_mlp}.weight")
            y = self.mlp(i, x)
            if s.moe is not None and s.moe.beside_dense:
                y = self.experts_beside(i, y, h)
            if s.sandwich_norms:
                y = self.rms_norm(f"/model/layers.{i}/post_feedforward_layernorm", y,
                                  f"model.layers.{i}.post_feedforward_layernorm.weight")
            branch = (f"/model/layers.{i}/mlp/residual", self.residual_scaled(f"/model/layers.{i}/mlp", y))
            if s.per_layer_input or s.layer_scalars:  # (Gemma 4) more after the MLP's residual add
                h, branch = self.per_layer_block(i, g.op("Add", branch[0], [h, branch[1]])), None
            if i < s.deepstack_layers:  # (Qwen3-VL) the layer's output, then the image tokens' extra rows added
                h = h if branch is None else g.op("Add", branch[0], [h, branch[1]])
                h, branch = self.deepstack_add(i, h), None
        if branch is not None:  # (None: the last layer took its image rows already)
            h = g.op("Add", branch[0], [h, branch[1]])
        if self.eagle is not None:
            self.eagle_hidden([aux[i] for i in self.eagle[0]])
        logits = self.lm_head(h, last_index)
        self.sampler(logits)
        return self.finish()
