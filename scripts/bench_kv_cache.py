"""What an int8 KV cache (trtllm-build --kv-cache-dtype int8) buys at long contexts: decode tok/s
after a prompt of N tokens, an engine with its float KV cache against the same engine built with an
int8 one, each (engine, context) in its own process, every other round in reverse order; ratios
paired by round, median [min-max]. With --llama-cpp, llama.cpp's llama-bench at the same depth with
its f16 and q8_0 KV caches (its F32 GGUF by default), as the peer's own figure for the same trade.

    python scripts/bench_kv_cache.py --engine ENGINE --engine-int8 ENGINE_KV8 [--contexts 256,2048]
        [--gen 64] [--rounds 3] [--threads 2] [--llama-cpp ~/peers/llama.cpp/build/bin]
        [--gguf ~/peers/gguf/smollm2-135m-instruct-f32.gguf] [--out out/bench_kv_cache.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def decode_rate(engine_dir: str, context: int, gen: int, threads: int) -> dict:
    """One engine, one context: a prompt of `context` tokens, then `gen` greedy tokens (EOS held back)."""
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, Timing, run_rows
    from trtllm.runtime.kv_cache import bytes_per_token
    from trtllm.runtime.sampling import SamplingParams

    engine = load_engine(engine_dir, num_threads=threads)
    m = engine.manifest
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(10, m.model.vocab_size - 10, context)]
    params = SamplingParams(temperature=0.0, max_new_tokens=gen, logit_bias={t: -100.0 for t in m.eos_token_ids})
    row = RowState(prompt_ids=prompt, params=params, rng=rng, eos_ids=frozenset(m.eos_token_ids))
    t = Timing()
    run_rows(engine, [row], timing=t)
    return {"tok_s": t.generated_tokens / t.generation_seconds, "kv_bytes_per_token": bytes_per_token(m.model),
            "kv_dtype": m.model.kv_dtype}


def llama_bench(binary: Path, gguf: Path, depth: int, gen: int, threads: int, kv: str) -> float:
    out = subprocess.run([str(binary / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", str(gen), "-d", str(depth),
                          "-t", str(threads), "-ctk", kv, "-ctv", kv, "-r", "1", "-o", "json"],
                         capture_output=True, text=True, timeout=900, env={**os.environ, "LD_LIBRARY_PATH": str(binary)})
    if out.returncode:
        raise RuntimeError(f"llama-bench failed: {out.stderr[-400:]}")
    return float(json.loads(out.stdout)[0]["avg_ts"])


def in_process(args, engine: str, context: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", engine, str(context), str(args.gen), str(args.threads)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode:
        raise RuntimeError(f"{engine} at {context}: {out.stderr[-600:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", help="the engine with its float KV cache")
    p.add_argument("--engine-int8", help="the same model built with --kv-cache-dtype int8")
    p.add_argument("--contexts", default="256,2048")
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-cpp", type=Path, help="llama.cpp's bin directory (llama-bench)")
    p.add_argument("--gguf", type=Path, default=Path.home() / "peers/gguf/smollm2-135m-instruct-f32.gguf")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "bench_kv_cache.json")
    p.add_argument("--one", nargs=4, metavar=("ENGINE", "CONTEXT", "GEN", "THREADS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(decode_rate(args.one[0], int(args.one[1]), int(args.one[2]), int(args.one[3]))))
        return {}
    contexts = [int(c) for c in args.contexts.split(",")]
    cases = [(name, c) for c in contexts for name in ("float", "int8")]
    cases += [(f"llama.cpp {kv}", c) for c in contexts for kv in ("f16", "q8_0")] if args.llama_cpp else []
    rounds = []
    for r in range(args.rounds):
        figures = {}
        for name, c in (cases if r % 2 == 0 else cases[::-1]):
            if name.startswith("llama.cpp"):
                figures[f"{name} @{c}"] = {"tok_s": llama_bench(args.llama_cpp, args.gguf, c, args.gen, args.threads,
                                                                  name.split()[1])}
            else:
                figures[f"{name} @{c}"] = in_process(args, args.engine if name == "float" else args.engine_int8, c)
            print(f"round {r} {name} @{c}: {figures[f'{name} @{c}']['tok_s']:.1f} tok/s", file=sys.stderr)
        rounds.append(figures)

    def paired(a: str, b: str) -> list[float]:
        return [f[a]["tok_s"] / f[b]["tok_s"] for f in rounds]

    summary = {}
    for c in contexts:
        pairs = {"int8 over float": (f"int8 @{c}", f"float @{c}")}
        if args.llama_cpp:
            pairs.update({"llama.cpp q8_0 over f16": (f"llama.cpp q8_0 @{c}", f"llama.cpp f16 @{c}"),
                          "ours int8 over llama.cpp q8_0": (f"int8 @{c}", f"llama.cpp q8_0 @{c}")})
        for what, (a, b) in pairs.items():
            ratios = paired(a, b)
            summary[f"{what} @{c}"] = {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios)}
            print(f"{what} @{c}: {np.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
    result = {"args": {k: str(v) for k, v in vars(args).items() if k != "one"}, "rounds": rounds, "paired": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
