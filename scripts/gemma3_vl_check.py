"""A Gemma 3 vision-language engine at gemma-3-4b-it's image sizes, against transformers: its vision config
(SigLIP-so400m: 27 layers, 1,152 wide, 896 x 896 images of 4,096 patches pooled to 256 tokens; random
weights: no checkpoint is downloaded here) on a Gemma 3 language model of gemma-3-270m's shape (18 layers,
640 wide, head size 256, one kv head, sliding layers of 512 between full ones; random weights) with the
demo model's tokenizer and Gemma 3's image tokens added. It builds the engine, answers two images in one
prompt (534 image and text tokens; each image's 256 tokens seen both ways) with trtllm-run, and checks its
greedy tokens and first-step log-probabilities against transformers' Gemma3ForConditionalGeneration fed
what Gemma3Processor gives it.

    python scripts/gemma3_vl_check.py [--model models/smollm2-135m-instruct] [--work DIR] [--tokens 16]

Needs the demo model converted (bash scripts/quickstart.sh, or python scripts/fetch_demo_model.py): only its
tokenizer is used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from smolvlm_check import answered, prepared, saved_vlm  # (this directory: the script's own)

TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' }}"
            "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
            "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{{ '<end_of_turn>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
PROCESSOR = {"image_processor_type": "Gemma3ImageProcessor", "do_normalize": True, "do_rescale": True,
             "do_resize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "image_seq_length": 256,
             "resample": 2, "rescale_factor": 1 / 255, "size": {"height": 896, "width": 896}}


def checkpoint(language: Path, out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(language)
    tok.add_special_tokens({"additional_special_tokens": [*TOKENS.values(), "<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = TEMPLATE
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in TOKENS.items()}
    text = transformers.Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    vision = transformers.SiglipVisionConfig(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                                             num_attention_heads=16, image_size=896, patch_size=14,
                                             hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=False)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=256, boi_token_index=ids["boi_token"],
                                       eoi_token_index=ids["eoi_token"], image_token_index=ids["image_token"],
                                       tie_word_embeddings=False)  # (tied, a random head repeats the last token)
    torch.manual_seed(0)
    saved_vlm(transformers.Gemma3ForConditionalGeneration(config).eval(), tok, out, TOKENS, PROCESSOR)


def main() -> int:
    args, work, ckpt, engine = prepared(__doc__, checkpoint, 1024, "gemma3-vl-check-")
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((1024, 768), (500, 900))]
    for k, picture in enumerate(pictures):
        picture.save(work / f"photo{k}.png")
    content = [{"type": "text", "text": "Compare"}, {"type": "image", "image": "photo0.png"},
               {"type": "image", "image": "photo1.png"}, {"type": "text", "text": "Which is brighter?"}]
    response, took, stages = answered(work, engine, content, args.tokens, num_logprobs=5)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    processor = transformers.Gemma3Processor(Gemma3ImageProcessorPil(**{k: v for k, v in PROCESSOR.items()
                                                                        if k != "image_processor_type"}),
                                             tok, image_seq_length=256)
    messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    feats = processor(text=text, images=pictures, return_tensors="pt", add_special_tokens=False)
    model = transformers.AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()
    inputs = {k: feats[k] for k in ("input_ids", "pixel_values", "token_type_ids")}
    with torch.no_grad():
        first = torch.log_softmax(model(**inputs).logits[0, -1], -1).numpy()
        out = model.generate(**inputs, attention_mask=torch.ones_like(feats["input_ids"]), max_new_tokens=args.tokens,
                             do_sample=False, eos_token_id=None)
    theirs = out[0, feats["input_ids"].shape[1]:].tolist()
    ours = response["output_ids"]
    error = max(abs(e["logprob"] - float(first[e["token_id"]])) for e in response["logprobs"][0])
    print(f"prompt: {feats['input_ids'].shape[1]} tokens, {len(pictures)} images; trtllm-run {took:.1f} s "
          f"(vision encoder {stages.get('vision_encoder', 0) / 1e3:.1f} s, prefill {stages.get('llm_prefill', 0) / 1e3:.1f} s)")
    print(f"ours         {ours}\ntransformers {theirs}\ntoken-exact: {ours == theirs}; first step's top-5 "
          f"logprobs within {error:.1e}")
    return 0 if ours == theirs and error < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
