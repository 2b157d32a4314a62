"""An LFM2-MoE language model at about LFM2-8B-A1B's widths, against transformers: hidden 2,048, 6 layers of which
4 are short convolutions (kernel 3) and 2 attention (32 heads, 8 kv heads, q/k norms), the first 2 layers with
a dense MLP of 7,168 and the others 4 of 16 experts of width 1,792 a token (LFM2-8B-A1B has 32: fewer here so
that transformers in float64 fits in memory), routed by sigmoid scores with an expert bias; random weights (no
checkpoint is downloaded here) and the demo model's tokenizer with a ChatML template. It builds the engine (the
experts on trtllm.cpu::MoE), answers a 712-token prompt with trtllm-run, and checks its greedy tokens against
transformers' Lfm2MoeForCausalLM, and its first-step log-probabilities against transformers' in float64 (at
least as close as transformers' own float32).

    python scripts/lfm2_moe_check.py [--model models/smollm2-135m-instruct] [--work DIR] [--tokens 16]

Needs the demo model converted (bash scripts/quickstart.sh, or python scripts/fetch_demo_model.py): only its
tokenizer is used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from smolvlm_check import saved_random, text_check  # (this directory: the script's own)

TYPES = ["conv", "conv", "full_attention", "conv", "conv", "full_attention"]


def checkpoint(language: Path, out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(language)
    config = transformers.Lfm2MoeConfig(
        vocab_size=len(tok), hidden_size=2048, intermediate_size=7168, moe_intermediate_size=1792,
        num_hidden_layers=len(TYPES), num_attention_heads=32, num_key_value_heads=8, layer_types=TYPES,
        num_dense_layers=2, num_experts=16, num_experts_per_tok=4, use_expert_bias=True, norm_topk_prob=True,
        conv_L_cache=3, conv_bias=False, norm_eps=1e-5, max_position_embeddings=32768, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)

    def bias(model):  # (a buffer the random draw leaves at 0: large enough to move some choices)
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):
                b.normal_(0.0, 0.05)

    torch.manual_seed(0)
    saved_random(transformers.Lfm2MoeForCausalLM(config).eval(), tok, out, then=bias)


def main() -> int:
    return text_check(__doc__, checkpoint, "lfm2-moe-check-")


if __name__ == "__main__":
    sys.exit(main())
