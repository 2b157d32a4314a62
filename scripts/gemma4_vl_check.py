"""A Gemma 4 vision-language engine at gemma-4-E2B-it's image sizes, against transformers: its vision config
(transformers' Gemma4VisionConfig defaults, which are E2B's: 16 layers, 768 wide, 16 px patches pooled 3 x 3,
images resized to at most 280 tokens, 2,520 patches; random weights: no checkpoint is downloaded here) on a
Gemma 4 language model of E2B's widths (scripts/gemma4_check.py's: 10 layers, KV sharing, per-layer
embeddings), its images seen both ways on the sliding layers (use_bidirectional_attention "vision"), with the
demo model's tokenizer and Gemma 4's image tokens added. It builds the engine, answers two images in one
prompt (548 image and text tokens) with trtllm-run, and checks its greedy tokens against transformers'
Gemma4ForConditionalGeneration fed what Gemma4Processor gives it (its expansion of each image token and
mm_token_type_ids, written out: the processor itself needs torchvision), with Gemma4ImageProcessorPil's
pixels, and its first-step log-probabilities against transformers' in float64 (within 1e-3, or twice
transformers' own float32 distance from them: see main).

    python scripts/gemma4_vl_check.py [--model models/smollm2-135m-instruct] [--work DIR] [--tokens 16]

Needs the demo model converted (bash scripts/quickstart.sh, or python scripts/fetch_demo_model.py): only its
tokenizer is used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from gemma4_check import LAYERS  # (this directory: the script's own)
from smolvlm_check import answered, prepared, saved_vlm

TOKENS = {"boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>"}
TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' }}"
            "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<|image|>' }}"
            "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{{ '<end_of_turn>\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
PROCESSOR = {"image_processor_type": "Gemma4ImageProcessor", "do_normalize": False, "do_rescale": True,
             "do_resize": True, "max_soft_tokens": 280, "patch_size": 16, "pooling_kernel_size": 3, "resample": 3,
             "rescale_factor": 1 / 255}


def checkpoint(language: Path, out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(language)
    tok.add_special_tokens({"additional_special_tokens": [*TOKENS.values(), "<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = TEMPLATE
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in TOKENS.items()}
    text = transformers.Gemma4TextConfig(
        vocab_size=len(tok), hidden_size=1536, intermediate_size=6144, num_hidden_layers=10, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512, layer_types=LAYERS * 2,
        num_kv_shared_layers=5, use_double_wide_mlp=True, hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=len(tok), final_logit_softcapping=30.0, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=False, use_bidirectional_attention="vision",
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = transformers.Gemma4Config(text_config=text.to_dict(), vision_config=transformers.Gemma4VisionConfig().to_dict(),
                                       audio_config=None, boi_token_id=ids["boi_token"], eoi_token_id=ids["eoi_token"],
                                       image_token_id=ids["image_token"], tie_word_embeddings=False)
    def scalars(model):  # (a buffer, not a parameter)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)

    torch.manual_seed(0)
    saved_vlm(transformers.Gemma4ForConditionalGeneration(config).eval(), tok, out, TOKENS, PROCESSOR, then=scalars)


def main() -> int:
    args, work, ckpt, engine = prepared(__doc__, checkpoint, 1024, "gemma4-vl-check-")
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    rng = np.random.default_rng(0)
    pictures = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in ((1024, 768), (500, 900))]
    for k, picture in enumerate(pictures):
        picture.save(work / f"photo{k}.png")
    content = [{"type": "text", "text": "Compare"}, {"type": "image", "image": "photo0.png"},
               {"type": "image", "image": "photo1.png"}, {"type": "text", "text": "Which is brighter?"}]
    response, took, stages = answered(work, engine, content, args.tokens, num_logprobs=5)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    pixels = Gemma4ImageProcessorPil(**{k: v for k, v in PROCESSOR.items() if k != "image_processor_type"})(
        pictures, return_tensors="pt")
    messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
    pieces = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True).split(TOKENS["image_token"])
    text = pieces[0] + "".join(TOKENS["boi_token"] + TOKENS["image_token"] * n + TOKENS["eoi_token"] + piece
                               for n, piece in zip(pixels["num_soft_tokens_per_image"], pieces[1:]))
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    inputs = {"input_ids": ids, "pixel_values": pixels["pixel_values"], "image_position_ids": pixels["image_position_ids"],
              "mm_token_type_ids": (ids == tok.convert_tokens_to_ids(TOKENS["image_token"])).long()}
    first = {}  # the first step's log-probabilities, float32 and (the yardstick of both) float64
    for dtype in (torch.float64, torch.float32):
        model = transformers.AutoModelForImageTextToText.from_pretrained(ckpt, dtype=dtype).eval()
        with torch.no_grad():
            first[dtype] = torch.log_softmax(model(**{**inputs, "pixel_values": inputs["pixel_values"].to(dtype)})
                                             .logits[0, -1].double(), -1).numpy()
    with torch.no_grad():
        out = model.generate(**inputs, attention_mask=torch.ones_like(ids), max_new_tokens=args.tokens,
                             do_sample=False, eos_token_id=None)
    theirs = out[0, ids.shape[1]:].tolist()
    ours = response["output_ids"]
    top = [e["token_id"] for e in response["logprobs"][0]]
    error = max(abs(e["logprob"] - first[torch.float64][e["token_id"]]) for e in response["logprobs"][0])
    own = float(np.abs(first[torch.float32][top] - first[torch.float64][top]).max())
    print(f"prompt: {ids.shape[1]} tokens, {len(pictures)} images ({pixels['num_soft_tokens_per_image']} tokens); "
          f"trtllm-run {took:.1f} s (vision encoder {stages.get('vision_encoder', 0) / 1e3:.1f} s, prefill "
          f"{stages.get('llm_prefill', 0) / 1e3:.1f} s)")
    print(f"ours         {ours}\ntransformers {theirs}\ntoken-exact: {ours == theirs}; first step's top-5 "
          f"logprobs {error:.1e} from float64's (transformers' float32: {own:.1e})")
    # (float32 rounding through random layers of large weights: over this prompt's 547 positions the engine's
    # log-probabilities were 8.5e-5 from float64's on average, transformers' float32 3.0e-5; a graph wrong in
    # one place, as the image tokens' per-layer rows were before they were the pad token's, is 0.2 off)
    return 0 if ours == theirs and error <= max(1e-3, 2 * own) else 1


if __name__ == "__main__":
    sys.exit(main())
