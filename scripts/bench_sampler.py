#!/usr/bin/env python3
"""The sampler's cost: trtllm::Sample's ONNX body (what an engine without our kernels runs) against
trtllm.cpu::Sample (plugins/cpu/sample.cc), per call, paired by round.

    python scripts/bench_sampler.py                          # per call: B 1 and 8, V 49,152, M 1024
    python scripts/bench_sampler.py --engines OLD NEW        # and decode tok/s of two engine dirs

Each round times every setting on both (body first on even rounds, kernel first on odd ones);
the table gives each one's median over rounds and the ratio body / kernel per round as the median
[min-max]. With --engines, trtllm-run answers the same sampled requests (seeded, EOS ignored) with
each engine in turn, and the ratio of the profiles' generation tokens/s is paired by round.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # (as the other scripts)

SETTINGS = {  # name: temperature, top_k, top_p
    "greedy": (0.0, 50, 0.8),
    "defaults (t 1, top_k 50, top_p 0.8)": (1.0, 50, 0.8),
    "t 0.7, top_p 0.9": (0.7, 0, 0.9),
    "t 1, unrestricted": (1.0, 0, 1.0),
}


def sessions(vocab: int, max_top_k: int, threads: int):
    from tests.plugins.cpu_ops import session
    from tests.plugins.cpu_sample_ops import kernel_model
    from trtllm.plugins import cpu
    from trtllm.plugins.sample import body

    if cpu.library() is None:
        sys.exit(cpu.missing_hint())
    return {"body": session(body.make_model(max_top_k, vocab, argmax=True).SerializeToString(), threads),
            "kernel": session(kernel_model(max_top_k), threads)}


def feed(rows: int, vocab: int, setting, rng) -> dict:
    t, k, p = setting
    return {"logits": (rng.standard_normal((rows, vocab)) * 3).astype(np.float32),
            "logit_bias": np.zeros((rows, vocab), np.float32), "penalty_bias": np.zeros((rows, vocab), np.float32),
            "seen": np.zeros((rows, vocab), bool), "repetition_penalty": np.ones(rows, np.float32),
            "temperature": np.full(rows, t, np.float32), "min_p": np.zeros(rows, np.float32),
            "top_k": np.full(rows, k, np.int64), "top_p": np.full(rows, p, np.float32),
            "uniform": rng.random(rows, dtype=np.float32)}


def per_call(session, inputs, calls: int) -> float:
    for _ in range(3):
        session.run(None, inputs)
    t0 = time.perf_counter()
    for _ in range(calls):
        session.run(None, inputs)
    return (time.perf_counter() - t0) / calls * 1e3


def ops(args) -> list[dict]:
    run = sessions(args.vocab, args.max_top_k, args.threads)
    rng = np.random.default_rng(0)
    results = []
    for rows in (1, 8):
        for name, setting in SETTINGS.items():
            inputs = feed(rows, args.vocab, setting, rng)
            times = {"body": [], "kernel": []}
            for r in range(args.rounds):
                for which in (("body", "kernel") if r % 2 == 0 else ("kernel", "body")):
                    times[which].append(per_call(run[which], inputs, args.calls))
            ratios = [b / k for b, k in zip(times["body"], times["kernel"])]
            results.append({"rows": rows, "setting": name, "body_ms": statistics.median(times["body"]),
                            "kernel_ms": statistics.median(times["kernel"]), "ratio": statistics.median(ratios),
                            "ratio_range": [min(ratios), max(ratios)]})
            print(f"B={rows} {name}: body {results[-1]['body_ms']:.3f} ms, kernel {results[-1]['kernel_ms']:.3f} ms, "
                  f"{results[-1]['ratio']:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]", flush=True)
    return results


def decode_tps(engine: Path, input_file: Path, threads: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile.json"
        subprocess.run([sys.executable, "-m", "trtllm.runtime", "--engine", str(engine), "--threads", str(threads),
                        "--output", str(Path(tmp) / "out.json"), "--profile", str(profile), str(input_file)],
                       check=True, capture_output=True, cwd=ROOT)
        return json.loads(profile.read_text())["generation"]["tokens_per_second"]


def engines(args) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in (1, 8):
            requests = [{"messages": [{"role": "user", "content": f"Tell me a long story about dragon {i}."}],
                         "seed": i} for i in range(rows)]
            input_file = Path(tmp) / f"in{rows}.json"
            input_file.write_text(json.dumps({"batch_size": rows, "temperature": 1.0, "top_k": 50, "top_p": 0.8,
                                              "max_generate_length": args.gen, "ignore_eos": True,
                                              "requests": requests}))
            tps = {"old": [], "new": []}
            for r in range(args.rounds):
                for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    tps[which].append(decode_tps(args.engines[0 if which == "old" else 1], input_file, args.threads))
            ratios = [n / o for o, n in zip(tps["old"], tps["new"])]
            results.append({"rows": rows, "old_tps": statistics.median(tps["old"]),
                            "new_tps": statistics.median(tps["new"]), "ratio": statistics.median(ratios),
                            "ratio_range": [min(ratios), max(ratios)]})
            print(f"decode B={rows}, sampled: {results[-1]['old_tps']:.1f} -> {results[-1]['new_tps']:.1f} tok/s, "
                  f"{results[-1]['ratio']:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--max-top-k", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--engines", type=Path, nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench_sampler.json")
    args = ap.parse_args()
    report = {"ops": ops(args), "engines": engines(args) if args.engines else []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
