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

from smolvlm_check import saved_random, text_check  # (this directory: the script's own)

TYPES = ["conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv", "conv", "full_attention", "conv",
         "full_attention", "conv", "full_attention", "conv", "full_attention", "conv"]  # (LFM2-350M's)


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
    saved_random(transformers.Lfm2ForCausalLM(config).eval(), tok, out)


def main() -> int:
    return text_check(__doc__, checkpoint, "lfm2-check-")


if __name__ == "__main__":
    sys.exit(main())
