"""A Gemma 4 mixture of experts at about gemma-4-26B-A4B's widths, against transformers: hidden 2,816, 16 heads
(8 kv heads of 256 on the sliding layers, 2 of 512 on the full one, whose v is its k projection), a dense MLP
of 2,112 on every layer and beside it 8 of 16 experts of width 704 (26B-A4B has 128: fewer here so that
transformers in float64 fits in memory), GELU's tanh form, a normed router with a scale per expert,
logits soft-capped at 30; on 6 layers (5 sliding with a window of 512, then 1 full). Random weights (no
checkpoint is downloaded here) and the demo model's tokenizer with a Gemma turn template. It builds the engine
(the experts on trtllm.cpu::MoE), answers a prompt longer than the window with trtllm-run, and checks its greedy
tokens against transformers' Gemma4ForCausalLM, and its first-step log-probabilities against transformers'
in float64 (at least as close as transformers' own float32).

    python scripts/gemma4_moe_check.py [--model models/smollm2-135m-instruct] [--work DIR] [--tokens 16]

Needs the demo model converted (bash scripts/quickstart.sh, or python scripts/fetch_demo_model.py): only its
tokenizer is used.
"""
from __future__ import annotations

import sys
from pathlib import Path

from gemma4_check import TEMPLATE  # (this directory: the script's own)
from smolvlm_check import saved_random, text_check

LAYERS = ["sliding_attention"] * 5 + ["full_attention"]


def checkpoint(language: Path, out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(language)
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = TEMPLATE
    config = transformers.Gemma4TextConfig(
        vocab_size=len(tok), hidden_size=2816, intermediate_size=2112, num_hidden_layers=len(LAYERS),
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
        attention_k_eq_v=True, sliding_window=512, layer_types=LAYERS, hidden_size_per_layer_input=0,
        enable_moe_block=True, num_experts=16, top_k_experts=8, moe_intermediate_size=704,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
        tie_word_embeddings=False,  # (tied, a random head repeats the last token)
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)

    def scales(model):  # (buffers and vectors the random draw leaves at 1)
        for name, t in [*model.named_buffers(), *model.named_parameters()]:
            if name.endswith(("layer_scalar", "per_expert_scale")):
                t.uniform_(0.5, 1.5)

    torch.manual_seed(0)
    saved_random(transformers.Gemma4ForCausalLM(config).eval(), tok, out, then=scales)


def main() -> int:
    return text_check(__doc__, checkpoint, "gemma4-moe-check-")


if __name__ == "__main__":
    sys.exit(main())
