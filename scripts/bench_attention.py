"""Our attention kernel (trtllm.cpu::Attention) against the canonical graph's standard ops, on a
random checkpoint of a real model's shape: one decode step at several context lengths and one
prompt step, alternating the two engines in one process.

    python scripts/bench_attention.py --shape gemma3-270m [--contexts 256,1024,3072] [--repeats 20]

Both engines are float32 and unquantized, so their MatMuls are the same (ONNX Runtime's): one is
built with `--cpu-kernels native` (our attention), the other with `--cpu-kernels onnxruntime`,
whose ONNX Runtime form keeps the standard `Attention` op where GroupQueryAttention cannot go
(sliding windows, q/k norms). Vocabularies are cut to 32,000 (the lm_head is not what is measured).
Ratios only: the machine is shared.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm.runtime import sampling  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, decode_inputs, prefill_inputs  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402

# name -> (transformers config class, its arguments): the published models' shapes, fewer layers where noted
SHAPES = {
    "gemma3-270m": ("Gemma3TextConfig", dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                             num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                             query_pre_attn_scalar=256, sliding_window=512)),
    "qwen3-0.6b-8-layers": ("Qwen3Config", dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                                                num_attention_heads=16, num_key_value_heads=8, head_dim=128)),
    "tiny-gemma3": ("Gemma3TextConfig", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=1, head_dim=32,
                                             query_pre_attn_scalar=32, sliding_window=8)),  # the smoke test's
}


def make_engines(shape: str, root: Path, capacity: int) -> tuple[Path, Path]:
    import torch
    import transformers

    from tests.tiny_models import make_tokenizer
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    cls, args = SHAPES[shape]
    tok = make_tokenizer(root)
    config = getattr(transformers, cls)(vocab_size=32000, max_position_embeddings=capacity, rms_norm_eps=1e-6,
                                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                        pad_token_id=tok.pad_token_id, **args)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    engines = []
    for kernels in ("native", "onnxruntime"):
        out = root / kernels
        build(BuildConfig(model=str(root / "model"), output=str(out), cpu_kernels=kernels, max_batch_size=1,
                          max_input_len=capacity, max_kv_cache_capacity=capacity, verify=False), log=lambda m: None)
        engines.append(out)
    return engines[0], engines[1]


def prefilled(engine, context: int):
    """A batch-1 row whose KV holds `context` prompt tokens: (row, kv, sampling batch)."""
    m = engine.manifest
    params = sampling.SamplingParams(temperature=0, max_new_tokens=10 ** 6)
    row = RowState(prompt_ids=[(7 + 13 * i) % 30000 + 300 for i in range(context)], params=params,
                   rng=np.random.default_rng(0), eos_ids=frozenset())
    batch = sampling.make_batch([params], m.model.vocab_size, m.max_top_k)
    kv = KVCacheManager(m.model, 1, context + 64)
    out = engine.step(prefill_inputs([row], m.pad_token_id, batch), kv.view(0, 1))
    row.output_ids.append(int(out.token_ids[0]))
    return row, kv, batch


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gemma3-270m")
    parser.add_argument("--contexts", default="256,1024,3072")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ours, standard = (load_engine(e) for e in make_engines(args.shape, Path(tmp), max(contexts) + 128))
        for context in contexts:
            times = {"ours": [], "standard": []}
            prompt = {"ours": [], "standard": []}
            for i in range(args.repeats):
                for name, engine in (("ours", ours), ("standard", standard))[:: 1 if i % 2 else -1]:
                    t0 = time.perf_counter()
                    row, kv, batch = prefilled(engine, context)
                    prompt[name].append(time.perf_counter() - t0)
                    for _ in range(4):  # decode steps, each timed
                        t0 = time.perf_counter()
                        out = engine.step(decode_inputs([row], engine.manifest.pad_token_id, batch), kv.view(0, 1))
                        times[name].append(time.perf_counter() - t0)
                        row.output_ids.append(int(out.token_ids[0]))
            med = {k: float(np.median(v)) for k, v in times.items()}
            pre = {k: float(np.median(v)) for k, v in prompt.items()}
            rows.append({"context": context, "decode_ms": med, "prompt_ms": pre})
            print(f"{args.shape} context {context}: decode step ours {med['ours'] * 1e3:.1f} ms, standard ops "
                  f"{med['standard'] * 1e3:.1f} ms ({med['standard'] / med['ours']:.2f}x); prompt of {context} "
                  f"ours {pre['ours'] * 1e3:.0f} ms, standard {pre['standard'] * 1e3:.0f} ms "
                  f"({pre['standard'] / pre['ours']:.2f}x)", flush=True)
        ours.close()
        standard.close()
    return rows


if __name__ == "__main__":
    main()
