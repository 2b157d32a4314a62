"""An Idefics3 engine at SmolVLM-256M-Instruct's sizes, against transformers: SmolVLM-256M's vision
config (a SigLIP of 12 layers, 768 wide, 512 x 512 tiles of 64 tokens; random weights: no checkpoint is
downloaded here) on the demo model's language model (SmolLM2-135M-Instruct, which is SmolVLM-256M's),
with SmolVLM's image tokens added to its tokenizer. It builds the engine, answers a 1024 x 768 image
(13 tiles, 874 prompt tokens) with trtllm-run, and checks its greedy tokens against transformers'
Idefics3ForConditionalGeneration fed what Idefics3Processor gives it.

    python scripts/smolvlm_check.py [--model models/smollm2-135m-instruct] [--work DIR] [--tokens 16]

Needs the demo model converted (bash scripts/quickstart.sh, or python scripts/fetch_demo_model.py).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ("<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}{% if message['content'][0]['type'] "
            "== 'image' %}{{':'}}{% else %}{{': '}}{% endif %}{% for line in message['content'] %}{% if line['type'] == "
            "'text' %}{{line['text']}}{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
            "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
SPECIAL = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>",
           *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
PROCESSOR = {"image_processor_type": "Idefics3ImageProcessor", "do_image_splitting": True,
             "size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}, "resample": 1,
             "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3,
             "image_std": [0.5] * 3, "do_convert_rgb": True, "do_pad": True, "do_resize": True}


def checkpoint(language: Path, out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(language)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    tok.chat_template = TEMPLATE
    lm = transformers.AutoModelForCausalLM.from_pretrained(language, dtype=torch.float32)
    vision = transformers.Idefics3VisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                               num_attention_heads=12, image_size=512, patch_size=16,
                                               hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    config = transformers.Idefics3Config(vision_config=vision.to_dict(),
                                         text_config={**lm.config.to_dict(), "vocab_size": len(tok)}, scale_factor=4,
                                         image_token_id=tok.convert_tokens_to_ids("<image>"), tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Idefics3ForConditionalGeneration(config).eval()
    state = lm.model.state_dict()
    table = state["embed_tokens.weight"]  # (the added tokens' rows drawn like the others)
    state["embed_tokens.weight"] = torch.cat([table, torch.randn(len(tok) - len(table), table.shape[1]) * table.std()])
    model.model.text_model.load_state_dict(state, strict=True)
    model.tie_weights()
    model.generation_config = lm.generation_config
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    (out / "processor_config.json").write_text(json.dumps({"processor_class": "Idefics3Processor", "image_seq_len": 64}))


def prepared(doc: str, make_checkpoint, max_len: int, prefix: str) -> tuple:
    """A check's command line (--model, --work, --tokens), its checkpoint (`make_checkpoint(language
    model dir, out dir)`) and its engine (`max_len` prompt and KV positions, 2 rows), built with
    trtllm-build: (args, work dir, checkpoint dir, engine dir)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2-135m-instruct")
    parser.add_argument("--work", type=Path, default=None, help="where the checkpoint and engine go (default: a temp dir)")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    ckpt, engine = work / "checkpoint", work / "engine"
    make_checkpoint(args.model, ckpt)
    subprocess.run([sys.executable, "-m", "trtllm.builder", "--model", str(ckpt), "--output", str(engine),
                    "--max-input-len", str(max_len), "--max-kv-cache-capacity", str(max_len), "--max-batch-size", "2"],
                   check=True)
    return args, work, ckpt, engine


def answered(work: Path, engine: Path, content: list, tokens: int, **top) -> tuple[dict, float, dict]:
    """trtllm-run's greedy answer to one user turn of `content` (paths from `work`): (its response, the
    seconds the run took, the profile's stage times in ms)."""
    (work / "input.json").write_text(json.dumps({"temperature": 0.0, "max_generate_length": tokens,
                                                 "ignore_eos": True, **top, "requests": [{"messages": [
                                                     {"role": "user", "content": content}]}]}))
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trtllm.runtime", str(work / "input.json"), "--engine", str(engine),
                    "--output", str(work / "output.json"), "--profile", str(work / "profile.json")], check=True)
    took = time.perf_counter() - began
    stages = {s["stage_id"]: s["total_gpu_time_ms"] for s in json.loads((work / "profile.json").read_text())["stages"]}
    return json.loads((work / "output.json").read_text())["responses"][0], took, stages


# a prompt past a 512-token window (about 690 tokens of the demo tokenizer), for text_check
LONG_TEXT = ("Edge devices run small language models on their own processors, and every layer of such a model "
             "reads what the layers before it wrote. ") * 26 + "What do the layers read?"


def saved_random(model, tok, out: Path, then=None, keep: str | None = None) -> None:
    """A random text model with weights large enough that its answer depends on the prompt (the init's are
    tiny), `then(model)` after them (buffers of its own), greedy, saved to `out` with its tokenizer; `keep`:
    parameters whose names hold it keep their init (a vision tower's: many layers of large weights would
    amplify float32 rounding as much as the answer's signal)."""
    import torch
    import transformers

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and (keep is None or keep not in name):
                p.normal_(0.0, 2.0 / p.shape[-1] ** 0.5)
        if then is not None:
            then(model)
    model.generation_config = transformers.GenerationConfig(bos_token_id=tok.bos_token_id, do_sample=False)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def saved_vlm(model, tok, out: Path, tokens: dict, processor: dict, then=None) -> None:
    """saved_random of a vision-language model (its vision tower's init kept), with its image tokens named
    in tokenizer_config.json's extra_special_tokens and `processor` as preprocessor_config.json."""
    saved_random(model, tok, out, then=then, keep="vision_tower")
    config_path = out / "tokenizer_config.json"
    tok_config = json.loads(config_path.read_text())
    tok_config["extra_special_tokens"] = tokens
    config_path.write_text(json.dumps(tok_config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(processor))


def text_check(doc: str, make_checkpoint, prefix: str, text: str = LONG_TEXT) -> int:
    """A text model's check (scripts/gemma4_check.py, lfm2_check.py): `make_checkpoint`'s model built,
    `text` answered greedily with trtllm-run, its tokens against transformers' and its first step's top-5
    log-probabilities against transformers' in float64, which they must be at least about as close to as
    transformers' own float32 is (2x, or 1e-4). 0 when both hold."""
    args, work, ckpt, engine = prepared(doc, make_checkpoint, 1024, prefix)
    import numpy as np
    import torch
    import transformers

    from trtllm.runtime import manifest as mf
    from trtllm.runtime.kv_cache import bytes_per_token

    response, took, stages = answered(work, engine, text, args.tokens, num_logprobs=5)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    first = {}  # the first step's log-probabilities, float32 and (the yardstick of both) float64
    for dtype in (torch.float64, torch.float32):
        # (eager experts: transformers' grouped_mm takes no float64)
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype, experts_implementation="eager").eval()
        with torch.no_grad():
            first[dtype] = torch.log_softmax(model(ids).logits[0, -1].double(), -1).numpy()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.tokens, do_sample=False,
                             eos_token_id=None)
    theirs, ours = out[0, ids.shape[1]:].tolist(), response["output_ids"]
    top = [e["token_id"] for e in response["logprobs"][0]]
    error = max(abs(e["logprob"] - first[torch.float64][e["token_id"]]) for e in response["logprobs"][0])
    own = float(np.abs(first[torch.float32][top] - first[torch.float64][top]).max())
    shape = mf.load(engine).model
    print(f"prompt: {ids.shape[1]} tokens (ours {response['prompt_tokens']}); trtllm-run {took:.1f} s (prefill "
          f"{stages.get('llm_prefill', 0) / 1e3:.1f} s); KV {bytes_per_token(shape)} bytes a token for "
          f"{shape.num_kv_layers} of {shape.num_layers} layers {list(shape.kv_layers or [])}")
    print(f"ours         {ours}\ntransformers {theirs}\ntoken-exact: {ours == theirs}; first step's top-5 "
          f"logprobs {error:.1e} from float64's (transformers' float32: {own:.1e})")
    return 0 if ours == theirs and error <= max(1e-4, 2 * own) else 1


def main() -> int:
    args, work, ckpt, engine = prepared(__doc__, checkpoint, 2048, "smolvlm-check-")
    import numpy as np
    import torch
    import transformers
    from PIL import Image
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (768, 1024, 3), dtype=np.uint8))
    image.save(work / "photo.png")
    content = [{"type": "image", "image": "photo.png"}, {"type": "text", "text": "Describe this picture."}]
    response, took, stages = answered(work, engine, content, args.tokens)
    ours = response["output_ids"]
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    processor = transformers.Idefics3Processor(Idefics3ImageProcessorPil(**{k: v for k, v in PROCESSOR.items()
                                                                           if k != "image_processor_type"}),
                                               tok, image_seq_len=64)
    text = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"}, content[1]]}], tokenize=False,
                                   add_generation_prompt=True)
    feats = processor(text=text, images=[image], return_tensors="pt", add_special_tokens=False)
    model = transformers.AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(**feats, max_new_tokens=args.tokens, do_sample=False, eos_token_id=None)
    theirs = out[0, feats["input_ids"].shape[1]:].tolist()
    print(f"prompt: {feats['input_ids'].shape[1]} tokens, {feats['pixel_values'].shape[1]} tiles; trtllm-run {took:.1f} s "
          f"(vision encoder {stages.get('vision_encoder', 0) / 1e3:.1f} s, prefill {stages.get('llm_prefill', 0) / 1e3:.1f} s)")
    print(f"ours         {ours}\ntransformers {theirs}\ntoken-exact: {ours == theirs}")
    return 0 if ours == theirs else 1


if __name__ == "__main__":
    sys.exit(main())
