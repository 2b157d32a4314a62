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

from smolvlm_check import saved_random, text_check  # (this directory: the script's own)

TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' }}"
            "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
LAYERS = ["sliding_attention"] * 4 + ["full_attention"]


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
    def scalars(model):  # (a buffer, not a parameter)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)

    torch.manual_seed(0)
    saved_random(transformers.Gemma4ForCausalLM(config).eval(), tok, out, then=scalars)


def main() -> int:
    return text_check(__doc__, checkpoint, "gemma4-check-")


if __name__ == "__main__":
    sys.exit(main())
