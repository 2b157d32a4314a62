"""A Gemma 4 language model of gemma-4-E2B's widths, against transformers: hidden 1,536, 8 heads and one kv
head, heads of 256 on the sliding layers (window 512) and 512 on the full ones (a quarter of each turned by
its proportional RoPE), MLPs of 6,144 (12,288 on the layers that read another's KV), per-layer embeddings
of 256, logits soft-capped at 30; on 10 layers (E2B has 35): [4 sliding, 1 full] twice, the second five
reading the KV of layers 3 and 4. Random weights (no checkpoint is downloaded here) and the demo model's
tokenizer with a Gemma turn template. It builds the engine, answers a prompt longer than the window with
trtllm-run, and checks its greedy tokens against transformers' Gemma4ForCausalLM, and its first-step
log-probabilities against transformers' in float64 (at least as close as transformers' own float32).

    python scripts/gemma4_check.py [--model models/smollm2-135m-instruct] [--work DIR] [--tokens 16]

Needs the demo model converted (bash scripts/quickstart.sh, or python scripts/fetch_demo_model.py): only its
tokenizer is used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from smolvlm_check import answered, prepared  # (this directory: the script's own)

TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' }}"
            "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
LAYERS = ["sliding_attention"] * 4 + ["full_attention"]
TEXT = ("Edge devices run small language models on their own processors, and every layer of such a model "
        "reads what the layers before it wrote. ") * 26  # (about 690 tokens: past the 512-token window)


def checkpoint(language: Path, out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(language)
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = TEMPLATE
    config = transformers.Gemma4TextConfig(
        vocab_size=len(tok), hidden_size=1536, intermediate_size=6144, num_hidden_layers=10, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512, layer_types=LAYERS * 2,
        num_kv_shared_layers=5, use_double_wide_mlp=True, hidden_size_per_layer_input=256,
        vocab_size_per_layer_input=len(tok), final_logit_softcapping=30.0, rms_norm_eps=1e-6,
        max_position_embeddings=32768, tie_word_embeddings=False,  # (tied, a random head repeats the last token)
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(config).eval()
    with torch.no_grad():  # weights large enough that the answer depends on the prompt (the init's are tiny)
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 2.0 / p.shape[-1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
    model.generation_config = transformers.GenerationConfig(bos_token_id=tok.bos_token_id, do_sample=False)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def main() -> int:
    args, work, ckpt, engine = prepared(__doc__, checkpoint, 1024, "gemma4-check-")
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
    # (float32 over 691 positions of logits up to 30 is 1e-4 from float64: the engine must be as close)
    return 0 if ours == theirs and error <= max(1e-4, 2 * own) else 1


if __name__ == "__main__":
    sys.exit(main())
