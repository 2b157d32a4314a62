#!/usr/bin/env python3
"""Granite 4.0's hybrid form (Mamba-2 layers) against llama.cpp, side by side in one run (after
../shared/peers/setup.sh).

    python scripts/bench_mamba.py [--rounds 3] [--threads 2] [--work DIR] [--llama-libs DIR]

No granite-4.0-h checkpoint can be downloaded here, so the model is a synthetic one written with
transformers (random weights, the demo model's tokenizer) of the shape third-party ports give
granite-4.0-h-350m (its config.json was not at hand to check): 32 layers, hidden 768, attention (12
heads, 4 KV heads, no RoPE) on layers 10, 13, 17 and 27, Mamba-2 on the others (48 heads of 32, state
128, one group, kernel 4), MLP 2,048, about 300M parameters with the demo model's vocabulary; no
experts, and none a token (llama.cpp asserts the one at most the other). Timings do not depend on the
weights' values. llama.cpp gets the same checkpoint through its own converter (F32 and BF16) and Q4_1
from its llama-quantize; we build float32, bfloat16 and int4 engines. The protocol is
scripts/bench_moe.py's (its measure and pairing).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402
import bench_moe  # noqa: E402

from trtllm.plugins import cpu as cpu_kernels  # noqa: E402

OURS = {"fp32": [], "bf16": ["--dtype", "bfloat16"], "int4": ["--quantization", "int4"]}
ORDER = ["fp32", "llamacpp-f32", "bf16", "llamacpp-bf16", "int4", "llamacpp-q4_1"]
ATTENTION_LAYERS = (10, 13, 17, 27)


def make_checkpoint(out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(bench.DEMO)
    config = transformers.GraniteMoeHybridConfig(
        vocab_size=len(tok), hidden_size=768, num_hidden_layers=32, num_attention_heads=12, num_key_value_heads=4,
        intermediate_size=2048, shared_intermediate_size=2048, num_local_experts=0, num_experts_per_tok=0,
        position_embedding_type="nope",
        layer_types=["attention" if i in ATTENTION_LAYERS else "mamba" for i in range(32)],
        mamba_n_heads=48, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4, mamba_expand=2,
        max_position_embeddings=2048, tie_word_embeddings=True, embedding_multiplier=12.0,
        attention_multiplier=0.015625, residual_multiplier=0.246, logits_scaling=3.0,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    # the hub's spelling of the layer types, which llama.cpp's converter reads (transformers 5 writes
    # its own, linear_attention and full_attention, and reads either)
    path = out / "config.json"
    saved = json.loads(path.read_text())
    saved["layer_types"] = ["attention" if i in ATTENTION_LAYERS else "mamba" for i in range(32)]
    path.write_text(json.dumps(saved, indent=2))


if __name__ == "__main__":
    bench_moe.main(__doc__, __file__, "mamba", OURS, ORDER, {cpu_kernels.MAMBA_LOWERING}, make_checkpoint,
                   "synthetic granite-4.0-h-350m shape (scripts/bench_mamba.py)")
