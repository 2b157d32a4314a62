"""An LFM2 language model of LFM2-350M's shape, against transformers: hidden 1,024, 16 layers of which 10 are
short convolutions (kernel 3) and 6 attention (16 heads, 8 kv heads, q/k norms), an MLP of 4,608
(block_auto_adjust_ff_dim), tied embeddings; random weights (no checkpoint is downloaded here) and the
demo model's tokenizer with a ChatML template. It builds the engine, answers a 690-token prompt with
trtllm-run (its convolutions' state kept by position as KV), and checks its greedy tokens against
transformers' Lfm2ForCausalLM, and its first-step log-probabilities against transformers' in float64 (at
least as close as transformers' own float32).

    python scripts/lfm2_check.py [--model models/smollm2-135m-instruct] [--work DIR] [--tokens 16]

Needs the demo model converted (bash scripts/quickstart.sh, or python scripts/fetch_demo_model.py): only its
tokenizer is used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from smolvlm_check import answered, prepared  # (this directory: the script's own)

TYPES = ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
         "full_attention", "conv", "full_attention", "conv", "full_attention", "conv"]  # (LFM2-350M's)
TEXT = ("Edge devices run small language models on their own processors, and every layer of such a model "
        "reads what the layers before it wrote. ") * 26  # (about 690 tokens)


def checkpoint(language: Path, out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(language)
    config = transformers.Lfm2Config(
        vocab_size=len(tok), hidden_size=1024, intermediate_size=6656, block_auto_adjust_ff_dim=True,
        block_ffn_dim_multiplier=1.0, block_multiple_of=256, num_hidden_layers=16, num_attention_heads=16,
        num_key_value_heads=8, layer_types=TYPES, conv_L_cache=3, conv_bias=False, norm_eps=1e-5,
        max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = transformers.Lfm2ForCausalLM(config).eval()
    with torch.no_grad():  # weights large enough that the answer depends on the prompt (the init's are tiny)
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 2.0 / p.shape[-1] ** 0.5)
    model.generation_config = transformers.GenerationConfig(bos_token_id=tok.bos_token_id, do_sample=False)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def main() -> int:
    args, work, ckpt, engine = prepared(__doc__, checkpoint, 1024, "lfm2-check-")
    import numpy as np
    import torch
    import transformers

    from trtllm.runtime import manifest as mf
    from trtllm.runtime.kv_cache import bytes_per_token

    response, took, stages = answered(work, engine, TEXT + "What do the layers read?", args.tokens, num_logprobs=5)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    ids = tok.apply_chat_template([{"role": "user", "content": TEXT + "What do the layers read?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    first = {}  # the first step's log-probabilities, float32 and (the yardstick of both) float64
    for dtype in (torch.float64, torch.float32):
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).eval()
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
          f"{shape.num_kv_layers} of {shape.num_layers} layers {list(shape.kv_layers)}")
    print(f"ours         {ours}\ntransformers {theirs}\ntoken-exact: {ours == theirs}; first step's top-5 "
          f"logprobs {error:.1e} from float64's (transformers' float32: {own:.1e})")
    return 0 if ours == theirs and error <= max(1e-4, 2 * own) else 1


if __name__ == "__main__":
    sys.exit(main())
