"""A tiny random Gemma 4 vision-language checkpoint (Gemma4ForConditionalGeneration, as gemma-4-E2B-it is
made, without its audio encoder): a 2-layer vision tower of 4 x 4 patches pooled 2 x 2 into a token (at
most 70 tokens an image, clipped linears and standardized outputs) on the tiny "gemma4" language model
(tests/tiny_models.py: KV sharing, per-layer embeddings, a window of 8), with the tiny models' BPE
tokenizer, Gemma 4's image tokens and a chat template of Gemma's shape, made in the test run with
transformers: nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models import (ARCHS, GEMMA4_LAYERS, NORMS, gemma4_scales, make_tokenizer, named_special_tokens,
                               randomized, saved)

PATCH, POOL, SOFT_TOKENS = 4, 2, 70
IMAGE_TOKENS = {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>"}
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<|image|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


def make_gemma4_vl_checkpoint(out_dir: Path, seed: int = 0, both_ways: bool = True, text: str = "gemma4") -> Path:
    """`both_ways`: text_config.use_bidirectional_attention "vision" (an image's tokens see each other both
    ways on the sliding layers), else None (causal, as the smaller models' configs have it). `text`: the
    tiny language model's ARCHS entry ("gemma4-moe": gemma-4-26B-A4B's form)."""
    import torch
    import transformers

    out_dir = Path(out_dir)
    tok = make_tokenizer(out_dir)
    tok.add_special_tokens({"additional_special_tokens": [*IMAGE_TOKENS.values(), "<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = TEMPLATE
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in IMAGE_TOKENS.items()}
    text = transformers.Gemma4TextConfig(
        vocab_size=len(tok), vocab_size_per_layer_input=len(tok), hidden_size=64, intermediate_size=128,
        num_hidden_layers=len(GEMMA4_LAYERS), layer_types=GEMMA4_LAYERS, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        use_bidirectional_attention="vision" if both_ways else None, **ARCHS[text][2])
    vision = transformers.Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16, patch_size=PATCH, pooling_kernel_size=POOL, position_embedding_size=64,
        use_clipped_linears=True, standardize=True)
    config = transformers.Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=None,
                                       boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"],
                                       image_token_id=ids["image_token"], tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.Gemma4ForConditionalGeneration(config).eval()
    randomized(model, (*NORMS, "layernorm.weight"))
    gemma4_scales(model)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith(("std_bias", "std_scale")):  # (the pooled features are x sqrt(32))
                b.copy_(torch.randn_like(b) if name.endswith("bias") else 0.2 + 0.1 * torch.rand_like(b))
            elif name.endswith(("input_max", "output_max")):  # (some clip, most are wide)
                b.fill_(3.0 if "mlp.gate_proj" in name else 1e4)
            elif name.endswith(("input_min", "output_min")):
                b.fill_(-3.0 if "mlp.gate_proj" in name else float("-inf"))
    saved(model, tok, out_dir)
    named_special_tokens(out_dir, IMAGE_TOKENS)
    (out_dir / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma4ImageProcessor", "do_convert_rgb": True, "do_normalize": False,
        "do_rescale": True, "do_resize": True, "image_mean": [0.0, 0.0, 0.0], "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": SOFT_TOKENS, "patch_size": PATCH, "pooling_kernel_size": POOL, "resample": 3,
        "rescale_factor": 1 / 255, "processor_class": "Gemma4Processor"}, indent=2))
    return out_dir
