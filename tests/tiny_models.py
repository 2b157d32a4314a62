"""Tiny random checkpoints of every architecture the builder takes (tiny_models.ARCHS) with a real BPE tokenizer, made in the
test run with transformers: nothing is downloaded.

Weights are drawn with a large std so the logits are well separated: greedy decoding then does
not hinge on float rounding, and token-exact comparisons with transformers are meaningful.
"""
from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Edge devices run small language models on CPUs and GPUs.",
    "What is the capital of France? Paris is the capital of France.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 and symbols !?.,;:'\"()[]{}",
    "Héllo wörld, ünïcode çafé, naïve — emoji 🙂🚀 and 中文 text.",
    "system user assistant tokens templates prompts answers",
] * 20

ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    # q|k|v and gate|up stored whole
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    # Phi-4-mini's kind of RoPE: LongRoPE (the engine holds its short factors, up to 256 positions) on
    # half of each head
    "phi4-mini": ("Phi3Config", "Phi3ForCausalLM", {"rope_parameters": {
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "short_factor": [1.0, 1.3, 2.1, 3.5],
        "long_factor": [1.5, 4.0, 9.0, 16.0], "original_max_position_embeddings": 256},
        "original_max_position_embeddings": 256}),
    # a NoPE layer every other layer
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"no_rope_layer_interval": 2}),
    # a window shorter than the test prompts, a local RoPE base of its own, and every kind of layer
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 8, "query_pre_attn_scalar": 24,
                                                         "rope_local_base_freq": 100.0}),
    # soft-capping small enough to bend most scores and logits (Gemma 2's own are 50 and 30)
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"sliding_window": 8, "query_pre_attn_scalar": 24,
                                                     "attn_logit_softcapping": 1.5, "final_logit_softcapping": 8.0}),
    # Gemma 1: scaled embeddings, 1 + w norms, GELU, nothing else of Gemma 2's
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {}),
    # a window on every other layer (layer_types), shorter than the test prompts
    "ministral": ("MinistralConfig", "MinistralForCausalLM", {"sliding_window": 8}),
    # OLMo 2 with sliding layers, each kind of layer with its own RoPE base
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", {"sliding_window": 8, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}}),
    # hybrid attention: sliding layers with RoPE, full ones without
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", {"sliding_window": 8}),
    # interleaved RoPE (pairs 2i, 2i + 1)
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", {}),
    "helium": ("HeliumConfig", "HeliumForCausalLM", {"attention_bias": True}),
    # q and k heads normed after RoPE, not before; a NTK-alpha RoPE (a fixed stretch of its base)
    "hunyuan": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", {
        "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 50.0, "factor": 1.0}}),
    # gate|up stored whole, q/k/v biases, an interleaved RoPE on half of each head
    "glm": ("GlmConfig", "GlmForCausalLM", {"attention_bias": True}),
    # GLM with the attention and MLP outputs normed too
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {"attention_bias": True}),
    # an MLP without a gate: down(relu(up(x))^2)
    "arcee": ("ArceeConfig", "ArceeForCausalLM", {}),
    # ... whose activation is xIELU with each layer's own parameters; q and k heads normed
    "apertus": ("ApertusConfig", "ApertusForCausalLM", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "original_max_position_embeddings": 256,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0}}),
    # every multiplier away from 1 (and the score scale from head_dim ** -0.5 = 0.25)
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"embedding_multiplier": 4.0, "attention_multiplier": 0.1,
                                                        "residual_multiplier": 0.3, "logits_scaling": 2.5}),
    # norms on the attention and MLP outputs only, q and k normed over all their heads
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    # mixtures of experts (builder/moe.py): 4 experts, 2 a token; normalized or not; Qwen2-MoE with a
    # gated shared expert and a dense layer (mlp_only_layers); Granite MoE's shared expert and multipliers
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2,
                                                           "moe_intermediate_size": 32, "norm_topk_prob": True}),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": False,
        "shared_expert_intermediate_size": 64, "mlp_only_layers": [1]}),
    # ERNIE 4.5's: a dense first layer, experts chosen by softmax scores plus a bias, their weights' sum
    # clamped below (moe_norm_min, large here so that it acts), two shared experts
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", {
        "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32, "moe_num_shared_experts": 2,
        "moe_layer_start_index": 1, "moe_norm_min": 0.9}),
    # AFMoE (Trinity's): sliding layers with RoPE and a full one without, each attention value gated, four
    # norms a layer, a dense first layer, then experts by sigmoid scores chosen with a bias, scaled, and two
    # shared experts; muP's scaled embeddings
    "afmoe": ("AfmoeConfig", "AfmoeForCausalLM", {
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "num_shared_experts": 2,
        "num_dense_layers": 1, "route_scale": 1.5, "sliding_window": 8, "global_attn_every_n_layers": 2,
        "mup_enabled": True}),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "granitemoe-plain": ("GraniteMoeConfig", "GraniteMoeForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "embedding_multiplier": 4.0, "attention_multiplier": 0.1,
        "residual_multiplier": 0.3, "logits_scaling": 2.5}),
    "granitemoe": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 64,
        "embedding_multiplier": 4.0, "attention_multiplier": 0.1, "residual_multiplier": 0.3, "logits_scaling": 2.5}),
    # Granite 4 (granite-4.0-micro's form): every layer attention, its MLP the class's shared_mlp; and with
    # experts beside it and no RoPE (position_embedding_type unset), as the hybrid releases' attention layers
    "granite4": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
        "num_local_experts": 0, "shared_intermediate_size": 128, "position_embedding_type": "rope",
        "embedding_multiplier": 4.0, "attention_multiplier": 0.1, "residual_multiplier": 0.3, "logits_scaling": 2.5}),
    "granite4-moe": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 64,
        "embedding_multiplier": 4.0, "attention_multiplier": 0.1, "residual_multiplier": 0.3, "logits_scaling": 2.5}),
    # granite-4.0-h-micro's form: Mamba-2 layers (two groups of heads, a small chunk so that transformers'
    # scan crosses chunks) around an attention layer without RoPE; -h-tiny's: experts beside the shared MLP
    "granite4-h": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
        "num_local_experts": 0, "shared_intermediate_size": 128, "position_embedding_type": "nope",
        "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_chunk_size": 8, "embedding_multiplier": 4.0, "attention_multiplier": 0.1, "residual_multiplier": 0.3,
        "logits_scaling": 2.5}),
    "granite4-h-moe": ("GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", {
        "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 64,
        "position_embedding_type": "nope", "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 1,
        "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_chunk_size": 8, "embedding_multiplier": 4.0,
        "attention_multiplier": 0.1, "residual_multiplier": 0.3, "logits_scaling": 2.5}),
    # Bamba-9B's form: Granite 4's Mamba-2 layers around an attention layer with RoPE on half of each head
    "bamba": ("BambaConfig", "BambaForCausalLM", {
        "attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_n_groups": 2, "mamba_d_state": 16,
        "mamba_d_conv": 4, "mamba_chunk_size": 8}),
    # Gemma 4 as gemma-4-E2B is made: wider heads on the full layers, the last two layers reading the KV of
    # the last earlier layer of their kind, twice as wide MLPs there, per-layer embeddings
    "gemma4": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
        "sliding_window": 8, "global_head_dim": 32, "num_kv_shared_layers": 2, "use_double_wide_mlp": True,
        "hidden_size_per_layer_input": 32, "final_logit_softcapping": 8.0,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 10000.0}}}),
    # ... and as gemma-4-31B: the full layers' v their k projection, with a kv head of their own; no sharing
    "gemma4-kv": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
        "sliding_window": 8, "global_head_dim": 32, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
        "hidden_size_per_layer_input": 0, "final_logit_softcapping": 8.0}),
    # ... and as gemma-4-26B-A4B: a mixture of experts beside each layer's dense MLP (GELU experts, a
    # normed router with a scale per expert)
    "gemma4-moe": ("Gemma4TextConfig", "Gemma4ForCausalLM", {
        "sliding_window": 8, "global_head_dim": 32, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
        "hidden_size_per_layer_input": 0, "final_logit_softcapping": 8.0, "enable_moe_block": True,
        "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32}),
    # LFM2-MoE (LFM2-8B-A1B's form): a dense first layer, then experts routed by sigmoid scores, chosen with
    # a bias (expert_bias), normalized and scaled
    "lfm2_moe": ("Lfm2MoeConfig", "Lfm2MoeForCausalLM", {
        "conv_bias": False, "layer_types": ["conv", "full_attention", "conv", "full_attention"], "num_dense_layers": 1,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "use_expert_bias": True,
        "routed_scaling_factor": 1.5, "norm_topk_prob": True}),
    # LFM3 (LFM3-1.7B's form): convolutions, sliding layers and a full one with a proportional RoPE on half of
    # each head, sandwich norms, each attention head gated by sigmoid(g_proj(x))
    "lfm3": ("Lfm3Config", "Lfm3ForCausalLM", {
        "conv_bias": False, "sliding_window": 8, "use_sandwich_norm": True, "use_attention_gate": True,
        "layer_types": ["conv", "sliding_attention", "conv", "full_attention", "sliding_attention"],
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "rope_theta": 1000000.0,
                                               "partial_rotary_factor": 0.5}}}),
    # LFM2: convolution layers (with biases) between attention ones, as LFM2-350M mixes them
    "lfm2": ("Lfm2Config", "Lfm2ForCausalLM", {"conv_bias": True, "block_auto_adjust_ff_dim": False,
                                               "layer_types": ["conv", "conv", "full_attention", "conv"]}),
}
# Gemma 4's layer kinds: full ones with sliding ones between, the last one full
GEMMA4_LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"]


def make_tokenizer(out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None)
    fast.chat_template = CHATML
    return fast


def make_checkpoint(arch: str, out_dir: Path, seed: int = 0, num_layers: int = 2, tie: bool = True,
                    max_positions: int = 512, padded_vocab: int = 0) -> Path:
    """Write a tiny random `arch` checkpoint (config, safetensors, tokenizer) to out_dir.
    `padded_vocab`: that many embedding rows past the tokenizer's (as Qwen2.5, Phi-3 and Gemma pad)."""
    import torch
    import transformers

    cfg_name, _, extra = ARCHS[arch]
    if arch in ("gemma2", "gemma3", "ministral", "olmo3", "exaone4"):  # sliding layers with a full one every other layer
        extra = {**extra, "layer_types": ["full_attention" if i % 2 else "sliding_attention"
                                          for i in range(num_layers)]}
    if arch.startswith("gemma4"):  # (untied: tied, the tiny model repeats the last token whatever it is given)
        num_layers, tie = len(GEMMA4_LAYERS), False
        extra = {**extra, "layer_types": GEMMA4_LAYERS}
    if arch == "afmoe":  # (untied, as Gemma 4: tied, its outputs normed, the tiny model repeats one token)
        tie = False
    if arch.startswith("granite4-h") or arch == "bamba":  # (a Mamba layer on each side of the attention)
        num_layers = 3
        extra = {**extra, "layer_types": ["mamba", "attention", "mamba"]} if arch != "bamba" else extra
    elif arch.startswith("granite4"):
        extra = {**extra, "layer_types": ["attention"] * num_layers}
    if arch.startswith(("lfm2", "lfm3")):
        num_layers = len(extra["layer_types"])
        extra = {**extra, "norm_eps": 1e-6}
    out_dir = Path(out_dir)
    tok = make_tokenizer(out_dir)
    if arch.startswith("gemma4"):
        extra = {**extra, "vocab_size_per_layer_input": len(tok) + padded_vocab}
    config = getattr(transformers, cfg_name)(
        vocab_size=len(tok) + padded_vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions,
        rms_norm_eps=1e-6, tie_word_embeddings=tie, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, rope_theta=10000.0, **extra)
    if arch == "qwen3":
        config.attention_bias = False
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomized(model, NORMS)
    gemma4_scales(model)
    with torch.no_grad():  # (LFM2-MoE's, a buffer: large enough to move which experts are chosen)
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(0.3 * torch.randn_like(b))
    saved(model, tok, out_dir)
    return out_dir


# the weights randomized near 1 (`randomized`): norms, Gemma 4's MoE layers' extra ones and its router's
# input scale
NORMS = ("norm.weight", "layernorm_1.weight", "layernorm_2.weight", "router.scale")


def gemma4_scales(model) -> None:
    """Gemma 4's per-layer output scales (buffers, not parameters) in [0.5, 1.5), and its experts'
    per_expert_scale likewise (each expert's own weight, away from 1)."""
    import torch

    with torch.no_grad():
        for name, t in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith(("layer_scalar", "per_expert_scale")):
                t.copy_(0.5 + torch.rand_like(t))


def randomized(model, norms: tuple[str, ...] = ("norm.weight",)) -> None:
    """Every weight drawn anew (the module docstring's large std); a norm's (its name ends with one
    of `norms`) near 1."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(norms):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (0.5 if "bias" in name else 1.0) / p.shape[-1] ** 0.5 * 2.0)


def saved(model, tok, out_dir: Path) -> None:
    """The model, with greedy generation and the tokenizer's special ids, and the tokenizer into out_dir."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id, do_sample=False)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


def named_special_tokens(out_dir: Path, tokens: dict) -> None:
    """The saved tokenizer's extra_special_tokens (tokenizer_config.json): `tokens` {attribute: token},
    which transformers' tokenizer then has as attributes (a vision-language processor's image tokens)."""
    import json

    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["extra_special_tokens"] = tokens
    path.write_text(json.dumps(config, indent=2))


def make_gemma4_multimodal(out_dir: Path, seed: int = 0) -> Path:
    """gemma-4-E2B's release form (Gemma4ForConditionalGeneration, model_type gemma4) with an audio encoder
    alone: the tiny "gemma4" language model under model.language_model, beside a tiny audio tower the build
    leaves out (tests/tiny_gemma4.py has the vision one, which it builds)."""
    import torch
    import transformers

    text_dir = make_checkpoint("gemma4", Path(out_dir) / "text", seed=seed)
    text = transformers.AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    audio = transformers.Gemma4AudioConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           subsampling_conv_channels=[8, 4], output_proj_dims=32)
    vocab = text.config.vocab_size  # (the placeholder tokens within the tiny vocabulary: a prompt can hold them)
    config = transformers.Gemma4Config(text_config=text.config, vision_config=None, audio_config=audio,
                                       tie_word_embeddings=False, image_token_id=vocab - 1, audio_token_id=vocab - 2,
                                       video_token_id=vocab - 3)
    torch.manual_seed(seed)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    with torch.no_grad():  # the language model's weights are the text checkpoint's
        model.model.language_model.load_state_dict(text.model.state_dict())
        model.lm_head.weight.copy_(text.lm_head.weight)
    tok = transformers.AutoTokenizer.from_pretrained(text_dir)
    saved(model, tok, Path(out_dir))
    return Path(out_dir)
