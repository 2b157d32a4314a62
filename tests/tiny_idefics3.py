"""A tiny random Idefics3 (or SmolVLM) checkpoint: a 2-layer SigLIP encoder of 32 x 32 tiles, the pixel
shuffle and the connector's projection on a 2-layer Llama, with the tiny models' BPE tokenizer and
SmolVLM's image tokens and chat template, made in the test run with transformers: nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models import make_tokenizer, randomized, saved

TILE = 32  # 4 x 4 patches of 8, 4 image tokens a tile after the pixel shuffle (scale_factor 2)
LONGEST_EDGE = 96  # up to 3 x 3 tiles and the global one
# SmolVLM's tokenizer: these as special tokens, <row_r_col_c> for r, c up to 6
SPECIAL = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
           *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
# SmolVLM's template's shape (a system turn's content may be a string here)
TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def make_idefics3_checkpoint(out_dir: Path, seed: int = 0, model_type: str = "idefics3",
                             splitting: bool = True, legacy_template: bool = False) -> Path:
    """`legacy_template`: the chat template in the processor's chat_template.json alone, as many
    vision-language checkpoints on the hub keep it (the tokenizer then has none)."""
    import torch
    import transformers

    out_dir = Path(out_dir)
    tok = make_tokenizer(out_dir)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = TEMPLATE
    text = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-6,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, rope_theta=10000.0)
    kind = {"idefics3": "Idefics3", "smolvlm": "SmolVLM"}[model_type]
    vision = getattr(transformers, f"{kind}VisionConfig")(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=TILE,
        patch_size=8, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    config = getattr(transformers, f"{kind}Config")(
        vision_config=vision.to_dict(), text_config=text.to_dict(), scale_factor=2,
        image_token_id=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config).eval()
    randomized(model, ("norm.weight", "layer_norm1.weight", "layer_norm2.weight", "post_layernorm.weight"))
    saved(model, tok, out_dir)
    (out_dir / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": f"{kind}ImageProcessor", "do_image_splitting": splitting,
        "size": {"longest_edge": LONGEST_EDGE}, "max_image_size": {"longest_edge": TILE}, "resample": 1,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "do_pad": True, "do_resize": True}, indent=2))
    if legacy_template:
        (out_dir / "chat_template.jinja").unlink()
        (out_dir / "chat_template.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    (out_dir / "processor_config.json").write_text(json.dumps({"processor_class": f"{kind}Processor",
                                                               "image_seq_len": 4}, indent=2))
    return out_dir
