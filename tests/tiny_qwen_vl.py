"""A tiny random Qwen2.5-VL (or Qwen2-VL, or Qwen3-VL) checkpoint: a windowed (Qwen2-VL, Qwen3-VL: plain)
ViT with a 2x2 patch merger (Qwen3-VL: and a learned position grid, and deepstack mergers) on a Qwen2
(Qwen3) model with M-RoPE (Qwen3-VL: interleaved), the tiny models' BPE tokenizer with Qwen's vision
tokens, a chat template that writes one image placeholder per image and Qwen2VLImageProcessor's config;
made in the test run with transformers: nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models import make_tokenizer, randomized, saved

VISION_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
                 "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>"}
# Qwen2.5-VL's own template's shape: an image item is <|vision_start|><|image_pad|><|vision_end|> (the
# processor repeats <|image_pad|> once per merged patch)
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
PATCH, MERGE = 14, 2
QWEN3_PATCH = 16  # (Qwen3-VL's own: 16 px patches, mean and std 0.5)
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
KINDS = {"qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
         "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
         "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
         "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration")}
# the tower's norms (kept near 1, not scaled): Qwen3-VL's mergers' is `norm`, Qwen2.5-VL's `ln_q`
TOWER_NORMS = ("norm1.weight", "norm2.weight", "ln_q.weight", ".norm.weight")


def vision_config(kind: str) -> dict:
    """Depth 4, 2 heads of 16; Qwen2.5-VL's windows are 56 px = 2x2 merged patches, full attention in
    layers 1 and 3. Qwen3-VL: depth 3, a 4 x 4 learned position grid, deepstack mergers on layers 0 and 1."""
    common = {"depth": 4, "num_heads": 2, "patch_size": PATCH, "temporal_patch_size": 2,
              "spatial_merge_size": MERGE, "in_channels": 3}
    if kind.startswith("qwen3_vl"):
        return {**common, "depth": 3, "patch_size": QWEN3_PATCH, "hidden_size": 32, "intermediate_size": 64,
                "hidden_act": "gelu_pytorch_tanh", "out_hidden_size": 64, "num_position_embeddings": 16,
                "deepstack_visual_indexes": [0, 1]}
    if kind == "qwen2_5_vl":
        return {**common, "hidden_size": 32, "intermediate_size": 64, "hidden_act": "silu", "window_size": 56,
                "fullatt_block_indexes": [1, 3], "out_hidden_size": 64}
    return {**common, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2, "hidden_act": "quick_gelu"}


def make_qwen_vl_checkpoint(out_dir: Path, seed: int = 0, kind: str = "qwen2_5_vl") -> Path:
    import torch
    import transformers

    out_dir = Path(out_dir)
    config_name, model_name = KINDS[kind]
    tok = make_tokenizer(out_dir)
    tok.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS.values())})
    tok.chat_template = TEMPLATE
    ids = {key: tok.convert_tokens_to_ids(text) for key, text in VISION_TOKENS.items()}
    text = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
            # M-RoPE: (temporal, height, width) sections of the head's 8 frequencies
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
    if kind.startswith("qwen3_vl"):  # (Qwen3-VL's own shape: interleaved, t h w t h w t h; t gets the rest)
        text["rope_parameters"] = {**text["rope_parameters"], "mrope_section": [3, 3, 2], "mrope_interleaved": True}
        text["num_hidden_layers"] = 3  # (DeepStack's rows go to the first 2: a plain layer after them)
    if kind == "qwen3_vl_moe":  # (4 experts of 32, 2 a token, on every layer)
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
                    mlp_only_layers=[])
    config = getattr(transformers, config_name)(text_config=text, vision_config=vision_config(kind),
                                                tie_word_embeddings=True, **ids)
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(config).eval()
    randomized(model, ("norm.weight", *TOWER_NORMS))
    with torch.no_grad():  # (randomized scales by the last dim, 14 here: the patch embedding's fan-in is 1176)
        proj = model.model.visual.patch_embed.proj.weight
        proj.copy_(torch.randn_like(proj) / proj[0].numel() ** 0.5 * 2.0)
        # the tower's weights halved: at full size its embeddings reach 11, and transformers' own float32
        # then differs from float64 by 9e-5 there, more than the logprob tolerance the parity tests allow
        for name, p in model.model.visual.named_parameters():
            if not name.endswith((*TOWER_NORMS, "ln_q.bias")):
                p.mul_(0.5)
    saved(model, tok, out_dir)
    if kind.startswith("qwen3_vl"):  # (its size as Qwen3-VL's own config gives it: shortest_edge / longest_edge pixels)
        pixels, mean, std = {"size": {"shortest_edge": 64 * 64, "longest_edge": 32 * 32 * 64}}, [0.5] * 3, [0.5] * 3
    else:
        pixels, mean, std = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64}, CLIP_MEAN, CLIP_STD
    (out_dir / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": {"qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen2_vl": "Qwen2VLProcessor",
                            "qwen3_vl": "Qwen3VLProcessor", "qwen3_vl_moe": "Qwen3VLProcessor"}[kind],
        **pixels, "patch_size": config.vision_config.patch_size, "temporal_patch_size": 2,
        "merge_size": MERGE, "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": mean, "image_std": std, "do_convert_rgb": True}, indent=2))
    return out_dir
