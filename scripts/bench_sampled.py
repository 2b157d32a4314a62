#!/usr/bin/env python3
"""Sampled decoding against the peers: what each system's sampler costs, and who decodes faster
when requests sample (the input format's defaults do: temperature 1.0, top_k 50, top_p 0.8).

    python scripts/bench_sampled.py [--systems int4,ortgenai-int4,llamacpp-q4_1,fp32,ortgenai-fp32,llamacpp-f32]
        [--rounds 3] [--runs 3] [--gen 128] [--batch 8] [--threads 2] [--llama-build DIR] [--out FILE]
    python scripts/bench_sampled.py --smoke     # ours only, on a tiny int4 model (tests)

Every system runs in its own subprocess, one after the other (every other round in reverse order),
on the same token ids as scripts/bench.py (the peers' 128-token prompt). In one process each
measures decode tokens/s at batch 1 and at --batch (copies of the prompt), greedy and sampled
alternately, the median of --runs after a warm-up; EOS never stops a row (ours: ignore_eos;
llama.cpp: it is fed on; onnxruntime-genai: min_length). Sampled means temperature 1.0, top-k 50,
top-p 0.8 in each system's own sampler: ours in the graph (trtllm.cpu::Sample), onnxruntime-genai's
search options (do_sample), llama.cpp's sampler chain (top_k, top_p, temp, dist: at temperature 1 its
order is ours). Printed per system: both rates and sampled / greedy (what sampling costs it, paired
within its process); per precision, ours / the best peer for sampled decode, paired by round, as the
median [min-max] over the rounds. Needs ../shared/peers/setup.sh's peers and our engines
(engines/smollm2-int4, engines/smollm2-135m-instruct: `trtllm-build`, see docs/performance.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (stdlib only at import: the peers' interpreter loads it too)

OURS = {"int4": bench.ROOT / "engines" / "smollm2-int4", "fp32": bench.ROOT / "engines" / "smollm2-135m-instruct"}
PRECISION = {"int4": "int4", "ortgenai-int4": "int4", "llamacpp-q4_1": "int4",
             "fp32": "fp32", "ortgenai-fp32": "fp32", "llamacpp-f32": "fp32"}
TOP_K, TOP_P, TEMPERATURE = 50, 0.8, 1.0


# --- workers (each in its own process) ---------------------------------------------------------

def ours(engine_dir: Path, threads: int):
    """run(ids_list, gen, sample) -> decode seconds, for our engine (scripts/bench.py's loop)."""
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.sampling import SamplingParams

    engine = load_engine(engine_dir, num_threads=threads)

    def run(ids_list, gen, sample):
        params = SamplingParams(temperature=TEMPERATURE if sample else 0, top_k=TOP_K, top_p=TOP_P,
                                max_new_tokens=gen, ignore_eos=True)
        return bench.our_run(engine, ids_list, gen, params)[1]
    return run


def ortgenai(path: str, threads: int):
    import numpy as np
    import onnxruntime_genai as og

    runner = bench_peers().ORTRunner(path, threads)

    def run(ids_list, gen, sample):
        batch, n = len(ids_list), len(ids_list[0])
        p = og.GeneratorParams(runner.model)
        options = dict(batch_size=batch, max_length=n + gen, min_length=n + gen)
        options.update(do_sample=True, top_k=TOP_K, top_p=TOP_P, temperature=TEMPERATURE, random_seed=0) if sample \
            else options.update(do_sample=False)
        p.set_search_options(**options)
        g = og.Generator(runner.model, p)
        ids = np.asarray(ids_list, dtype=np.int32)
        g.append_tokens(ids if batch > 1 else ids[0])
        g.generate_next_token()
        t1, steps = time.perf_counter(), 1
        while steps < gen and not g.is_done():
            g.generate_next_token()
            steps += 1
        assert steps == gen, steps
        return time.perf_counter() - t1
    return run


def llamacpp(path: str, threads: int):
    runner = bench_peers().LlamaCppRunner(path, threads)
    L = runner.L

    def chain(seed: int):
        c = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        for s in (L.llama_sampler_init_top_k(TOP_K), L.llama_sampler_init_top_p(TOP_P, 1),
                  L.llama_sampler_init_temp(TEMPERATURE), L.llama_sampler_init_dist(seed)):
            L.llama_sampler_chain_add(c, s)
        return c

    def run(ids_list, gen, sample):
        batch, n = len(ids_list), len(ids_list[0])
        ctx = runner.ctxs[1 if batch == 1 else max(runner.ctxs)]
        samplers = [chain(s) for s in range(batch)] if sample else []
        pick = (lambda s, i: L.llama_sampler_sample(samplers[s], ctx, i)) if sample else \
            (lambda s, i: runner._argmax(ctx, i))
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        runner._fill([(t, pos, s, pos == n - 1) for s, ids in enumerate(ids_list) for pos, t in enumerate(ids)])
        assert L.llama_decode(ctx, runner.batch) == 0
        last = [pick(s, s * n + n - 1) for s in range(batch)]
        t1 = time.perf_counter()
        for step in range(1, gen):
            runner._fill([(last[s], n + step - 1, s, True) for s in range(batch)])
            assert L.llama_decode(ctx, runner.batch) == 0
            last = [pick(s, s) for s in range(batch)]
        elapsed = time.perf_counter() - t1
        for c in samplers:
            L.llama_sampler_free(c)
        return elapsed
    return run


def bench_peers():
    sys.path.insert(0, str(bench.SHARED_PEERS))
    import bench_peers as module

    return module


def worker(name: str, args) -> dict:
    from transformers import AutoTokenizer

    prompt = bench.build_prompts(AutoTokenizer.from_pretrained(args._tokenizer), [128])[128]
    if name in OURS:
        run = ours(args._engine, args.threads)
    elif name.startswith("ortgenai-"):
        run = ortgenai(bench_peers().ORT[name], args.threads)
    else:
        run = llamacpp(bench_peers().GGUF[name], args.threads)
    out = {"system": name}
    for batch in (1, args.batch):
        rates = {False: [], True: []}
        for sample in (False, True):  # warm-up
            run([prompt] * batch, 8, sample)
        for k in range(args.runs):
            for sample in ((False, True) if k % 2 == 0 else (True, False)):
                rates[sample].append(batch * (args.gen - 1) / run([prompt] * batch, args.gen, sample))
        out[f"greedy_b{batch}"] = round(statistics.median(rates[False]), 1)
        out[f"sampled_b{batch}"] = round(statistics.median(rates[True]), 1)
    return out


def smoke(args) -> None:
    import tempfile

    sys.path.insert(0, str(bench.ROOT))
    from tests.tiny_models import make_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="trtllm-bench-sampled-"))
    args._tokenizer = make_checkpoint("llama", tmp / "ckpt", max_positions=1024)
    OURS["int4"] = tmp / "engine-int4"
    bench.ensure_engine(args._tokenizer, OURS["int4"], ["--quantization", "int4"],
                        ["--max-input-len", "512", "--max-kv-cache-capacity", "1024", "--no-verify"])
    args.systems, args.gen, args.runs, args.batch, args.rounds = "int4", 4, 1, 2, 1


# --- the driver --------------------------------------------------------------------------------

def add_arguments(ap: argparse.ArgumentParser, systems: str, gen: int, out: str, smoke: str) -> None:
    """The options this script and scripts/bench_guided.py share (theirs: the defaults)."""
    ap.add_argument("--systems", default=systems)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gen", type=int, default=gen)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--llama-build", type=Path, default=None, help="as scripts/bench.py's (a build without AMX)")
    ap.add_argument("--out", type=Path, default=bench.ROOT / "out" / out)
    ap.add_argument("--smoke", action="store_true", help=smoke)
    ap.add_argument("--_worker"), ap.add_argument("--_engine", type=Path)
    ap.add_argument("--_tokenizer", type=Path, default=bench.DEMO)


def measure(name: str, args, script: str = __file__, env: dict | None = None) -> dict:
    """One system's worker (`script --_worker name`) in its own process: its result line."""
    peer = name not in OURS
    python = bench.PEERS_DIR / "venv" / "bin" / "python" if peer else Path(sys.executable)
    cmd = [str(python), script, "--_worker", name, "--runs", str(args.runs), "--gen", str(args.gen),
           "--batch", str(args.batch), "--threads", str(args.threads), "--_tokenizer", str(args._tokenizer),
           "--_engine", str(OURS.get(name, ""))]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PEERS_DIR": str(bench.PEERS_DIR), **(env or {})}
    if peer and args.llama_build:
        env["LLAMA_CPP_LIB_PATH"] = str(args.llama_build / "bin")
    stdout, code, _ = bench.run_measured(cmd, args.timeout, env)
    return bench.result_line(stdout) or {"system": name, "error": f"exit code {code}"}


def report(rounds: dict[str, list[dict]], batch: int) -> list[str]:
    lines = []
    for name, runs in rounds.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            lines.append(f"{name:<15} failed: {runs[-1]['error']}")
            continue
        cells = []
        for b in (1, batch):
            g, s = (statistics.median(r[f"{m}_b{b}"] for r in ok) for m in ("greedy", "sampled"))
            cost = [r[f"sampled_b{b}"] / r[f"greedy_b{b}"] for r in ok]
            cells.append(f"b{b}: greedy {g:6.1f}  sampled {s:6.1f} tok/s  sampled/greedy {statistics.median(cost):.2f} "
                         f"[{min(cost):.2f}-{max(cost):.2f}]")
        lines.append(f"{name:<15} " + "   ".join(cells))
    for name in (n for n in rounds if n in OURS):
        for b in (1, batch):
            if ratios := paired(rounds, name, f"sampled_b{b}"):
                lines.append(f"ours {name} sampled b{b} / best {PRECISION[name]} peer: {statistics.median(ratios):.2f} "
                             f"[{min(ratios):.2f}-{max(ratios):.2f}]")
    return lines


def paired(rounds: dict[str, list[dict]], name: str, key: str) -> list[float]:
    """Ours (`name`) over the best peer of its precision, round by round, where both measured `key`."""
    peers = [p for p in rounds if p not in OURS and PRECISION[p] == PRECISION[name]]
    out = []
    for k, own in enumerate(rounds[name]):
        vals = [rounds[p][k][key] for p in peers if "error" not in rounds[p][k]]
        if vals and "error" not in own:
            out.append(own[key] / max(vals))
    return out


def run_rounds(args, tag: str, measure_one=measure) -> dict[str, list[dict]]:
    """Every system once per round, one after the other, every other round in reverse order."""
    names = args.systems.split(",")
    rounds: dict[str, list[dict]] = {n: [] for n in names}
    for k in range(args.rounds):
        for name in names if k % 2 == 0 else names[::-1]:
            print(f"[{tag}] round {k + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
            rounds[name].append(measure_one(name, args))
    return rounds


def write(out: Path, rounds: dict[str, list[dict]], lines: list[str]) -> None:
    print("\n".join(lines))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "rounds": rounds, "report": lines}, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap, "int4,ortgenai-int4,llamacpp-q4_1,fp32,ortgenai-fp32,llamacpp-f32", 128, "bench_sampled.json",
                  "ours only, a tiny int4 model, 4 tokens, 1 run")
    args = ap.parse_args()
    if args.smoke:
        smoke(args)
    if args._worker:
        print("@@RESULT@@" + json.dumps(worker(args._worker, args)), flush=True)
        return
    rounds = run_rounds(args, "bench_sampled")
    write(args.out, rounds, report(rounds, args.batch))


if __name__ == "__main__":
    main()
