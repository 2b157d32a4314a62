"""A tiny random Gemma 3 vision-language checkpoint (Gemma3ForConditionalGeneration): a 2-layer SigLIP of
32 x 32 images (8 x 8 patches of 4, pooled to 16 image tokens) and the projector on a 2-layer Gemma 3
text model (a sliding layer of a window shorter than an image's tokens, then a full one), with the tiny
models' BPE tokenizer, Gemma 3's image tokens and a chat template of Gemma's shape, made in the test run
with transformers: nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models import make_tokenizer, named_special_tokens, randomized, saved

IMAGE_SIZE, TOKENS = 32, 16
IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


# (pan-and-scan, off unless asked for, would crop none of the test images at its default 256 px: 16 here)
def make_gemma3_checkpoint(out_dir: Path, seed: int = 0, window: int = 12) -> Path:
    import torch
    import transformers

    out_dir = Path(out_dir)
    tok = make_tokenizer(out_dir)
    tok.add_special_tokens({"additional_special_tokens": [*IMAGE_TOKENS.values(), "<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = TEMPLATE
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in IMAGE_TOKENS.items()}
    text = transformers.Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-6,
        sliding_window=window, query_pre_attn_scalar=24, layer_types=["sliding_attention", "full_attention"],
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=IMAGE_SIZE,
        patch_size=4, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=False)
    config = transformers.Gemma3Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=TOKENS,
        boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"], image_token_index=ids["image_token"],
        tie_word_embeddings=False)  # (tied, its random lm_head would answer each token with itself)
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    randomized(model, ("layer_norm1.weight", "layer_norm2.weight", "post_layernorm.weight"))
    with torch.no_grad():  # Gemma's 1 + w norms: w near 0
        for name, p in model.named_parameters():
            if name.endswith(("layernorm.weight", "norm.weight")) and "vision_tower" not in name:
                p.copy_(0.1 * torch.randn_like(p))
    saved(model, tok, out_dir)
    named_special_tokens(out_dir, IMAGE_TOKENS)
    (out_dir / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "do_convert_rgb": None, "do_normalize": True,
        "do_pan_and_scan": None, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "image_seq_length": TOKENS, "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": 16, "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 1 / 255,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}}, indent=2))
    (out_dir / "processor_config.json").write_text(json.dumps({"processor_class": "Gemma3Processor",
                                                               "image_seq_length": TOKENS}, indent=2))
    return out_dir
