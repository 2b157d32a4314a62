"""What an int4 lm_head (trtllm-build --lm-head-quantization int4) buys: one checkpoint built twice with
--quantization int4 (an int8 lm_head, and an int4 one), each engine measured by scripts/bench.py's
measure_ours (TTFT at 128 and 512 tokens, decode at batch 1 and 8) in its own process, every other round in
reverse order; the int4 lm_head's figures over the int8 one's, paired by round. --shape gemma3-270m makes a
random checkpoint of gemma-3-270m's shape (262,144 x 640 tied table, 18 layers) to build from, the kind of
model whose decode is mostly its lm_head.

    python scripts/bench_lm_head.py [--model HF_DIR | --shape gemma3-270m] [--activations float32|int16]
        [--rounds 4] [--threads 2] [--out out/bench_lm_head.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts import bench  # noqa: E402


def gemma3_270m_shape(out: Path) -> Path:
    """A random Gemma 3 checkpoint of gemma-3-270m's shape, with the demo model's tokenizer (the bench
    feeds token ids; the tokenizer is for the build alone)."""
    import shutil

    import torch
    import transformers

    config = transformers.Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, sliding_window=512,
        tie_word_embeddings=True, query_pre_attn_scalar=256, rope_theta=1000000.0)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (bench.DEMO / name).is_file():
            shutil.copy(bench.DEMO / name, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=bench.DEMO)
    ap.add_argument("--shape", choices=["gemma3-270m"], default=None, help="build from a random checkpoint of it")
    ap.add_argument("--activations", choices=["float32", "int16"], default="float32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench_lm_head.json")
    args = ap.parse_args()
    measure = argparse.Namespace(threads=args.threads, gen=128, batch=8, runs=3, timeout=600)
    tmp = Path(tempfile.mkdtemp(prefix="trtllm-lm-head-"))
    model = gemma3_270m_shape(tmp / "ckpt") if args.shape else args.model
    build = Path(sys.executable).parent / "trtllm-build"
    engines = {}
    for head in ("int8", "int4"):
        engines[head] = tmp / f"engine-{head}"
        subprocess.run([str(build), "--model", str(model), "--output", str(engines[head]), "--quantization", "int4",
                        "--activations", args.activations, "--lm-head-quantization", head, "--no-verify"], check=True)
    rounds = {head: [] for head in engines}
    for k in range(args.rounds):
        for head in engines if k % 2 == 0 else list(engines)[::-1]:
            rounds[head].append(bench.measure_ours(f"int4-{head}", engines[head], bench.DEMO, measure))
            print(f"[round {k + 1}] lm_head {head}: " + ", ".join(f"{m} {rounds[head][-1].get(m)}"
                                                                  for m, _ in bench.METRICS), file=sys.stderr)
    ratios = {}
    for metric, better in bench.METRICS:
        pairs = zip(rounds["int4"], rounds["int8"])
        ratios[metric] = [round(b[metric] / a[metric] if better == "lower" else a[metric] / b[metric], 3)
                          for a, b in pairs]
        print(f"{metric}: int4 lm_head over int8, by round: {ratios[metric]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": str(args.shape or args.model), "activations": args.activations,
                                    "rounds": rounds, "ratios": ratios}, indent=2) + "\n")


if __name__ == "__main__":
    main()
