"""DecoderSpec: everything about a decoder-only model that changes its graph (builder/decoder.py writes
it), and which forms of attention and MatMul a spec can run on: ONNX Runtime's GroupQueryAttention, our
attention kernel, our 16-bit MatMuls."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtllm.builder.mamba import Mamba
from trtllm.builder.moe import MoE
from trtllm.builder.quantize import QuantScheme

@dataclass(frozen=True)
class DecoderSpec:
    """Everything about a decoder-only model that changes its graph."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    attention_bias: bool = False      # q/k/v projections carry a bias (Qwen2; Llama/Qwen3 attention_bias)
    o_proj_bias: bool = False         # so does o_proj (Llama/Qwen3 attention_bias; not Qwen2)
    qk_norm: bool = False             # RMSNorm on q and k per head before RoPE (Qwen3)
    qk_norm_after_rope: bool = False  # ... after RoPE instead (Hunyuan)
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] | None = None  # the layers the window applies to; None: all (Gemma 3 mixes)
    local_rope: bool = False          # sliding layers have their own RoPE table (Gemma 3's local base frequency)
    embed_scale: float = 1.0          # token embeddings are multiplied by this (Gemma: sqrt(hidden_size))
    norm_offset: float = 0.0          # every RMSNorm scales by offset + weight (Gemma: 1 + w)
    sandwich_norms: bool = False      # Gemma: the attention and MLP outputs are normed before their residual add
    hidden_act: str = "silu"          # the MLP's activation: silu, gelu_tanh (Gemma) or relu2 (relu(x)^2: Arcee)
    gated_mlp: bool = True            # False: down(act(up(x))), no gate_proj (Arcee's)
    query_scale: float | None = None  # attention's score scale; None: head_dim ** -0.5
    nope_layers: tuple[int, ...] = ()  # layers whose q and k get no RoPE (SmolLM3's NoPE layers)
    rotary_dim: int | None = None     # RoPE on the first rotary_dim of each head only (partial_rotary_factor)
    fused_projections: bool = False   # the checkpoint stores q|k|v and gate|up whole (Phi-3): LoRA's module names
    fused_gate_up: bool = False       # ... gate|up alone (GLM)
    residual_scale: float = 1.0       # the attention and MLP outputs times this before their residual add (Granite)
    full_qk_norm: bool = False        # RMSNorm on q and k over all their heads at once, before RoPE (OLMo 2)
    pre_norms: bool = True            # False: a layer's attention and MLP take the residual stream as it is,
                                      # and norm their outputs instead (OLMo 2, with sandwich_norms)
    logits_scale: float = 1.0         # the logits divided by this (Granite's logits_scaling)
    attn_softcap: float | None = None  # scores -> c tanh(scores / c) before the mask and softmax (Gemma 2)
    final_softcap: float | None = None  # logits -> c tanh(logits / c) (Gemma 2's final_logit_softcapping)
    interleaved_rope: bool = False    # the checkpoint's RoPE turns pairs (2i, 2i + 1) (ERNIE 4.5, Helium, GLM): q
                                      # and k rows are reordered (architectures.weights_of), the graph's is rotate-half
    moe: MoE | None = None            # mixture-of-experts MLPs (builder/moe.py) on all but moe.dense_layers
    image_embeds: bool = False        # a vision-language model's: image tokens take embeddings the vision graph
                                      # made (image_embeds at image_index), not the table's (builder/vision.py)
    mrope_section: tuple[int, ...] | None = None  # Qwen2-VL's multimodal RoPE: the rotary columns (head_dim / 2
                                      # in all) that turn with a token's temporal, height and width position
    mrope_interleaved: bool = False   # ... taken in turn (Qwen3-VL: t, h, w, t, h, w, ...), not in three runs
    image_bidirectional: bool = False  # Gemma 3: in the prompt an image's tokens see each other both ways
                                      # (image_ahead: how many slots past its own each also sees)
    image_ahead_windows_only: bool = False  # Gemma 4: ... on the sliding layers only (full ones causal)
    placeholder_ids: tuple[int, ...] = ()  # Gemma 4: tokens read as placeholder_pad_id by the token tables (the
    placeholder_pad_id: int = 0       # image, video and audio tokens: Gemma4Model.forward's llm_input_ids), so
                                      # the image tokens' per-layer rows are the pad's, as is a generated one's
    deepstack_layers: int = 0         # Qwen3-VL: the image tokens' rows after each of the first K layers get
                                      # the vision graph's k-th extra embeddings added (image_embeds' columns
                                      # H(k+1)..H(k+2): it is [N, H * (1 + K)])
    global_head_dim: int | None = None  # full-attention layers' own head size (Gemma 4: 512, its sliding ones 256)
    global_kv_heads: int | None = None  # ... and their own kv heads
    kv_shared_layers: int = 0         # the last N layers keep no KV: each reads the KV of the last layer of its
                                      # kind (sliding or full) before them (Gemma 4's num_kv_shared_layers)
    v_norm: bool = False              # each v head RMS-normed, without a scale (Gemma 4)
    value_is_key: bool = False        # full-attention layers' v is their k projection (Gemma 4's attention_k_eq_v)
    per_layer_input: int = 0          # Gemma 4's per-layer embeddings (PLE), this wide a layer: a gated
                                      # projection of them joins each layer's output (hidden_size_per_layer_input)
    layer_scalars: bool = False       # each layer's output times its own layer_scalar (Gemma 4)
    wide_mlp_layers: tuple[int, ...] = ()  # layers whose MLP is twice intermediate_size wide (Gemma 4's
                                      # KV-sharing layers with use_double_wide_mlp)
    conv_layers: tuple[int, ...] = ()  # LFM2's short-convolution layers (in place of attention: builder/short_conv.py)
    conv_kernel: int = 3              # ... their kernel (conv_L_cache): each token mixes its row's last this many
    conv_bias: bool = False           # ... and their projections' and convolution's biases
    attn_gate: str = ""               # the attention output times a sigmoid gate of x before o_proj: "head" one
                                      # logit a head (LFM3's g_proj), "element" one a value (AFMoE's gate_proj)
    mamba_layers: tuple[int, ...] = ()  # Mamba-2 layers (in place of attention: builder/mamba.py), keeping no KV
    mamba: Mamba | None = None        # ... their shape
    module_names: tuple[tuple[str, str], ...] = ()  # (ours, the checkpoint's) where a module's name differs
                                      # (LFM2's self_attn.out_proj, feed_forward.w1): LoRA's names are the checkpoint's

    def mrope_axes(self) -> np.ndarray:
        """Multimodal RoPE: which position (0 temporal, 1 height, 2 width) turns each rotary column, as
        transformers' recomposition_frequencies takes them."""
        t, h, w = self.mrope_section
        if not self.mrope_interleaved:
            return np.repeat([0, 1, 2], [t, h, w])
        axes = np.zeros(t + h + w, np.int64)
        axes[1:3 * h:3], axes[2:3 * w:3] = 1, 2
        return axes

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window, or None for full attention."""
        if self.sliding_layers is None or layer in self.sliding_layers:
            return self.sliding_window
        return None

    def rope(self, layer: int) -> str | None:
        """The RoPE table layer `layer` uses: "local" (a sliding layer's own, local_rope), "global",
        or None (a NoPE layer)."""
        if layer in self.nope_layers:
            return None
        return "local" if self.local_rope and self.window(layer) is not None else "global"

    def head_size(self, layer: int) -> int:
        """Layer `layer`'s head size: global_head_dim on a full-attention layer where set, else head_dim;
        a convolution layer's KV row (half its hidden_size: builder/short_conv.py)."""
        if layer in self.conv_layers:
            return self.hidden_size // 2
        return self.global_head_dim if self.global_head_dim and self.window(layer) is None else self.head_dim

    def kv_heads(self, layer: int) -> int:
        if layer in self.conv_layers:  # (one row a position: half its values as keys, half as values)
            return 1
        return self.global_kv_heads if self.global_kv_heads and self.window(layer) is None else self.num_kv_heads

    def kv_index(self, layer: int) -> int:
        """Layer `layer`'s KV buffers' index (past_key.{index}): its own, or among the layers that keep KV
        where Mamba layers keep none."""
        return layer - sum(1 for m in self.mamba_layers if m < layer)

    def state_shapes(self) -> tuple[tuple[int, ...], ...] | None:
        """Each recurrent state buffer's shape after the batch (manifest model.state_shapes), or None."""
        return self.mamba.state_shapes() * len(self.mamba_layers) if self.mamba_layers else None

    def kv_source(self, layer: int) -> int:
        """The layer whose KV layer `layer` attends over: its own, or in the last kv_shared_layers the
        last one of its kind (sliding or full) before them."""
        first = self.num_layers - self.kv_shared_layers
        if layer < first:
            return layer
        return max(j for j in range(first) if self.window(j) == self.window(layer))

    def mlp_width(self, layer: int) -> int:
        return self.intermediate_size * (2 if layer in self.wide_mlp_layers else 1)

    def kv_layers(self) -> tuple[tuple[int, int], ...] | None:
        """(kv_heads, head size) of each layer that keeps KV (manifest model.kv_layers), or None where
        every layer keeps its own of one shape."""
        if not (self.kv_shared_layers or self.global_head_dim or self.global_kv_heads or self.conv_layers
                or self.mamba_layers):
            return None
        return tuple((self.kv_heads(i), self.head_size(i)) for i in range(self.num_layers - self.kv_shared_layers)
                     if i not in self.mamba_layers)

    @property
    def scale(self) -> float:
        return float(self.head_dim) ** -0.5 if self.query_scale is None else float(self.query_scale)


def gqa_supported(spec: DecoderSpec, dtype: str) -> bool:
    """Where ONNX Runtime's GroupQueryAttention is proven equal to the canonical attention (tests):
    its CPU kernel needs head_dim % 16 == 0, and a partial rotary table a multiple of 8 wide; sliding
    windows, q/k norms (Qwen3, Gemma, OLMo 2), NoPE layers (SmolLM3: it rotates every layer), a scale
    of the model's own, soft-capped scores (Gemma 2), images seen both ways (Gemma 3) and float16 are not
    lowered to it."""
    partial_ok = spec.rotary_dim is None or (spec.rotary_dim // 2) % 8 == 0
    # (multimodal RoPE's per-token tables are shorter than the KV, which GroupQueryAttention refuses)
    return (spec.head_dim % 16 == 0 and partial_ok and not spec.sliding_window and not spec.qk_norm
            and spec.kv_layers() is None and not spec.v_norm
            and spec.mrope_section is None and not spec.image_bidirectional
            and not spec.full_qk_norm and not spec.nope_layers and spec.query_scale is None
            and spec.attn_softcap is None and dtype == "float32")


def attention_supported(spec: DecoderSpec, dtype: str) -> bool:
    """Where our trtllm.cpu::Attention (plugins/cpu/attention.cc) is proven equal to the canonical
    attention (tests): everything GroupQueryAttention takes, and sliding windows (on every layer or
    some), q/k norms, the sliding layers' own RoPE table, the model's own scale, soft-capped scores
    (Gemma 2), and Gemma 4's layers (their own head sizes, v norms, KV read from another layer). Its
    AVX-512 and AVX2 paths take head sizes 16..128 in steps of 16, 256 and 512; the others run its
    portable loop."""
    return all(spec.head_size(i) % 16 == 0 for i in range(spec.num_layers)) and dtype == "float32"


def half_supported(spec: DecoderSpec, dtype: str, quant: QuantScheme | None) -> bool:
    """Where a float16 or bfloat16 engine's ONNX Runtime form runs on trtllm.cpu::MatMulHalf and
    Attention (float32 activations, weights and cache in the engine's dtype), given our kernels:
    16-bit and unquantized, attention as attention_supported, and every projection's input width a
    multiple of 32 (a shared expert's down_proj too; the experts are moe.kernel_takes' to ask for)."""
    return (dtype in ("float16", "bfloat16") and quant is None and attention_supported(spec, "float32")
            and all(w % 32 == 0 for w in projection_widths(spec).values()))


def projection_widths(spec: DecoderSpec) -> dict[str, int]:
    """The input widths of the projections on MatMul kernels (16-bit: MatMulHalf; quantized: block
    quantization), by the config's names for them. The experts are not among them: our MoE kernel
    takes them where moe.kernel_takes says (else ONNX Runtime's MoE node, any width); quantized,
    their width is model_limits.check_blocks' to ask for."""
    widths = {"hidden_size": spec.hidden_size, "num_attention_heads x head_dim": spec.num_heads * spec.head_dim}
    if spec.global_head_dim:
        widths["num_attention_heads x global_head_dim"] = spec.num_heads * spec.global_head_dim
    if spec.per_layer_input:
        widths["hidden_size_per_layer_input"] = spec.per_layer_input
    if spec.moe is None or spec.moe.dense_layers or spec.moe.beside_dense:
        widths["intermediate_size"] = spec.intermediate_size
    if spec.wide_mlp_layers:
        widths["twice intermediate_size (use_double_wide_mlp)"] = 2 * spec.intermediate_size
    if spec.moe is not None and spec.moe.shared_size:
        widths["shared expert's intermediate size"] = spec.moe.shared_size
    if spec.mamba_layers:
        widths["mamba_expand x hidden_size"] = spec.mamba.inner
    return widths
