#!/usr/bin/env python3
"""Our engines against the peers (../shared/peers), side by side in one run, on the same prompts.

    python scripts/bench.py                       # full: our engines (OURS) + every installed peer
    python scripts/bench.py --smoke               # tiny model, few tokens, no peers (CI)

Every system runs in its own subprocess, one after the other, grouped by precision (every other
round in reverse order), with the same thread count and the same token ids (the peers' own
prompt recipe: a chat-templated "summarize" request cut to exactly 128 and 512 tokens). Greedy, EOS ignored. Figures, as in
the peers' script: TTFT at 128 and 512 prompt tokens, decode tokens/s at batch 1 and batch 8
(8 copies of the 128-token prompt), each the median of --runs after a warm-up; peak memory is
the subprocess tree's max RSS (wait4). The whole sequence is run --rounds times (default 4); the
table shows each system's best round per figure (every round's figures are kept in the JSON). The
ratios to the best peer of the same precision (> 1 means we are better) are paired by round, each
round's ours against that round's peers, and given as the median with its range over the rounds
(see add_ratios); `agree` counts how many of the 128 greedy tokens
match transformers fp32 before the first difference, and the memory-bandwidth bound for decode is
given:
weight bytes read per token / measured copy bandwidth. Results go to --out (JSON). A llama.cpp peer
whose Python bindings crash is measured by llama.cpp's own llama-bench instead (decode at batch 1
only, after the same 128-token context; marked in the table and the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED_PEERS = ROOT.parent / "shared" / "peers"
PEERS_DIR = Path(os.environ.get("PEERS_DIR", Path.home() / "peers"))
DEMO = ROOT / "models" / "smollm2-135m-instruct"
OURS = {"fp32": ["--dtype", "float32"], "fp16": ["--dtype", "float16"], "bf16": ["--dtype", "bfloat16"],
        "int8": ["--quantization", "int8"],
        "int4": ["--quantization", "int4"],
        # int4 with integer activations (--activations): int8 is the numerics of llama.cpp's Q4_1 and
        # onnxruntime-genai's int4, int16 within 3e-5 of each block's largest value; compared with the int4 peers
        "int4-a16": ["--quantization", "int4", "--activations", "int16"],
        "int4-a8": ["--quantization", "int4", "--activations", "int8"]}
PEER_PRECISION = {"hf-fp32": "fp32", "ortgenai-fp32": "fp32", "llamacpp-f32": "fp32", "llamacpp-f16": "fp16",
                  "ortgenai-int4": "int4", "llamacpp-q4_1": "int4"}
LLAMA_GGUF = {  # under PEERS_DIR, as ../shared/peers lays it out
    "llamacpp-q4_1": "models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "llamacpp-f16": "gguf/smollm2-135m-instruct-f16.gguf",
    "llamacpp-f32": "gguf/smollm2-135m-instruct-f32.gguf"}
ORDER = ["fp32", "ortgenai-fp32", "llamacpp-f32", "hf-fp32", "int4", "int4-a16", "int4-a8", "ortgenai-int4",
         "llamacpp-q4_1", "int8", "fp16", "llamacpp-f16", "bf16"]
METRICS = [("ttft128_ms", "lower"), ("ttft512_ms", "lower"), ("dec_b1_tps", "higher"), ("dec_b8_tps", "higher")]
OWN = [("python_overhead", "lower")]  # ours only, best round too; no ratio


def build_prompts(tokenizer, lengths):
    """The peers' prompts when their script is there (identical token ids), else the same recipe."""
    if (SHARED_PEERS / "bench_peers.py").is_file():
        sys.path.insert(0, str(SHARED_PEERS))
        import bench_peers

        return bench_peers.build_prompts(tokenizer, lengths)
    text = "Edge devices run small language models close to their users, without a network. " * 60
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Summarize:\n\n" + text}],
                                        add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    return {n: ids[:n] for n in lengths}


def weight_bytes(engine_dir: Path) -> int:
    """Bytes of the initializers every decode step reads in full: the matmul weights (float or
    quantized codes + scales + offsets), in the form ONNX Runtime runs (llm.ort.onnx) when there is
    one. The embedding table is read one row per token, unless it doubles as a (tied, unquantized)
    lm_head."""
    import onnx
    from onnx import helper

    path = engine_dir / "llm.ort.onnx"
    model = onnx.load(path if path.is_file() else engine_dir / "llm.onnx", load_external_data=False)
    sizes = {t.name: helper.tensor_dtype_to_np_dtype(t.data_type).itemsize * int(_prod(t.dims)) for t in model.graph.initializer}
    sizes.update({t.name: (int(_prod(t.dims)) + 1) // 2 for t in model.graph.initializer if t.data_type == 22})  # int4
    # On ONNX Runtime's own kernels, a float16 form runs its MatMuls on Casts of the weights to
    # float32; they are counted as float16, as the canonical graph has them (ONNX Runtime may fold
    # those Casts at load). Ours (MatMulHalf) read the float16 weights themselves.
    cast_of = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Cast"}
    read = set()
    for node in model.graph.node:
        if node.op_type in ("MatMul", "Gemm", "DequantizeLinear", "MatMulNBits", "MatMulBlockQuant", "MatMulHalf"):
            names = [cast_of.get(name, name) for name in node.input]
            read.update(name for name in names if name in sizes and not name.startswith("/const"))
    return sum(sizes[n] for n in read)


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def copy_bandwidth() -> float:
    """Bytes per second (read + written) of one large numpy copy, best of 5: the memory speed."""
    import numpy as np

    a = np.ones(64 << 20, np.float32)
    b = np.empty_like(a)
    best = min(_timed(lambda: np.copyto(b, a)) for _ in range(5))
    return 2 * a.nbytes / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# --- our worker (runs in its own process) ------------------------------------------------------

def our_run(engine, prompts: list[list[int]], gen: int, params=None):
    """(time to first token, time from first to last token, ids of row 0), the peers' protocol;
    `params`: the rows' SamplingParams (default: greedy, EOS held back for `gen` tokens); row i
    draws from default_rng(i)."""
    import numpy as np

    from trtllm.runtime.generate import RowState, Timing, run_rows
    from trtllm.runtime.sampling import SamplingParams

    # EOS held back for all `gen` tokens, as the transformers and onnxruntime-genai peers do
    # (min_new_tokens / min_length): the demo model's argmax at token 55 of the 128-token prompt is
    # EOS, so merely not stopping there (llama.cpp's way) compares another continuation from there on
    params = params or SamplingParams(temperature=0, max_new_tokens=gen, min_new_tokens=gen)
    eos = frozenset(engine.manifest.eos_token_ids)
    rows = [RowState(prompt_ids=p, params=params, rng=np.random.default_rng(i), eos_ids=eos)
            for i, p in enumerate(prompts)]
    stamps: list[float] = []
    t0 = time.perf_counter()
    run_rows(engine, rows, len(rows), Timing(), on_token=lambda r: stamps.append(time.perf_counter()))
    for i, r in enumerate(rows):  # (a row cut short by the KV capacity, or failed, would inflate the rate)
        if len(r.output_ids) != gen or r.finish_reason == "error":
            raise RuntimeError(f"row {i} generated {len(r.output_ids)} of {gen} tokens ({r.finish_reason}"
                               f"{': ' + r.error if r.error else ''}): the engine's KV capacity may be too small")
    first = stamps[len(rows) - 1]  # every row's first token comes from the one prefill step
    return first - t0, stamps[-1] - first, rows[0].output_ids


def worker(name: str, engine_dir: Path, tokenizer_dir: Path, args) -> dict:
    from transformers import AutoTokenizer

    from trtllm.runtime.engine import load_engine

    prompts = build_prompts(AutoTokenizer.from_pretrained(tokenizer_dir), [128, 512])
    t = time.perf_counter()
    engine = load_engine(engine_dir, num_threads=args.threads)
    res = {"peer": f"trtllm-{name}", "load_s": round(time.perf_counter() - t, 2),
           "huge_pages": engine.huge_pages.to_json()}
    gen, ort_time = args.gen, [0.0]
    run = engine.session.run_with_iobinding

    def timed_run(*a):  # ORT's share of the decode time, to measure our Python overhead
        s = time.perf_counter()
        run(*a)
        ort_time[0] += time.perf_counter() - s

    engine.session.run_with_iobinding = timed_run

    def median_of(fn):
        fn()
        return [fn() for _ in range(args.runs)]

    start, ort_time[0] = time.perf_counter(), 0.0
    runs = median_of(lambda: our_run(engine, [prompts[128]], gen))
    res["python_overhead"] = round(1 - ort_time[0] / (time.perf_counter() - start), 4)
    res["ttft128_ms"] = round(1000 * statistics.median(v[0] for v in runs), 1)
    res["dec_b1_tps"] = round(statistics.median((gen - 1) / v[1] for v in runs), 1)
    res["tokens_128"] = runs[0][2]
    runs = median_of(lambda: our_run(engine, [prompts[512]], 1))
    res["ttft512_ms"] = round(1000 * statistics.median(v[0] for v in runs), 1)
    runs = median_of(lambda: our_run(engine, [prompts[128]] * args.batch, gen))
    res["dec_b8_tps"] = round(statistics.median(args.batch * (gen - 1) / v[1] for v in runs), 1)
    res["weight_bytes_per_token"] = weight_bytes(engine_dir)
    res["engine"] = {**engine_identity(engine.manifest), "build_id": engine.manifest.build_id}  # (what was measured)
    return res


# --- the driver ----------------------------------------------------------------------------------

def run_measured(cmd: list[str], timeout: int, env=None) -> tuple[str, int, float]:
    """Run cmd; returns (stdout, exit code, peak RSS in MiB of the process tree, from wait4)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, env=env)
        deadline = time.time() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.time() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        return out.read(), proc.returncode, usage.ru_maxrss / 1024


def result_line(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("@@RESULT@@")]
    return json.loads(lines[-1][len("@@RESULT@@"):]) if lines else None


def measure_ours(name: str, engine_dir: Path, tokenizer_dir: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--_worker", name, "--_engine", str(engine_dir), "--_tokenizer",
           str(tokenizer_dir), "--threads", str(args.threads), "--gen", str(args.gen), "--runs", str(args.runs),
           "--batch", str(args.batch)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    stdout, code, rss = run_measured(cmd, args.timeout, env)
    res = result_line(stdout) or {"peer": f"trtllm-{name}", "error": f"exit code {code}"}
    res.update(precision=name.split("-")[0], peak_rss_mb=round(rss, 1))  # int4-a8: an int4 engine
    return res


def measure_peer(peer: str, args) -> dict:
    python = PEERS_DIR / "venv" / "bin" / "python"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        cmd = [str(python), str(SHARED_PEERS / "bench_peers.py"), "--peers", peer, "--threads", str(args.threads),
               "--gen", str(args.gen), "--runs", str(args.runs), "--batch", str(args.batch), "--out", str(out),
               "--timeout", str(args.timeout)]  # (its own default, 300 s, killed a slow round and dropped it)
        env = {**os.environ, "PEERS_DIR": str(PEERS_DIR)}
        if args.llama_build:  # llama-cpp-python loads libllama from here instead of its lib/ link
            env["LLAMA_CPP_LIB_PATH"] = str(args.llama_build / "bin")
        _, code, rss = run_measured(cmd, args.timeout * 2, env)
        results = json.loads(out.read_text())["results"] if out.is_file() else []
    res = results[0] if results else {"peer": peer, "error": f"exit code {code}"}
    if f"dec_b{args.batch}_tps" in res:  # the peers' script names it by the batch
        res["dec_b8_tps"] = res.pop(f"dec_b{args.batch}_tps")
    res.update(precision=PEER_PRECISION[peer], peak_rss_mb=round(rss, 1))
    if "error" in res and peer in LLAMA_GGUF:
        res = llama_bench_decode(peer, res, args)
    return res


def llama_bench_decode(peer: str, failed: dict, args) -> dict:
    """When llama.cpp's Python bindings crash (Q4_1 here: its batched prompt kernels die with SIGILL
    or SIGSEGV on this CPU), its own llama-bench still measures decode: `tg` tokens after a context
    of `-d` 128 tokens, as our protocol (decode after the 128-token prompt), the context fed one
    token per micro-batch (`-ub 1`, which avoids the crashing kernels; it is not timed). Only dec_b1
    comes out, marked with its protocol; decode from an empty context (llama-bench's default, faster:
    no attention over the prompt) is kept beside it for reference."""
    binary = (args.llama_build or PEERS_DIR / "llama.cpp" / "build") / "bin" / "llama-bench"
    gguf = PEERS_DIR / LLAMA_GGUF[peer]
    if not (binary.is_file() and gguf.is_file()):
        return failed
    depth = 128
    cmd = [str(binary), "-m", str(gguf), "-t", str(args.threads), "-p", "0", "-n", str(args.gen),
           "-d", f"{depth},0", "-ub", "1", "-r", str(args.runs), "-o", "json"]
    stdout, code, rss = run_measured(cmd, args.timeout)
    try:
        tps = {int(e.get("n_depth", 0)): e["avg_ts"] for e in json.loads(stdout)}
        at_depth = tps[depth]
    except (ValueError, LookupError, TypeError, AttributeError):
        return failed
    return {"peer": peer, "precision": failed["precision"], "dec_b1_tps": round(at_depth, 1),
            "dec_b1_tps_empty_context": round(tps[0], 1) if 0 in tps else None, "peak_rss_mb": round(rss, 1),
            "protocol": f"llama-bench tg{args.gen} after {depth} tokens", "bindings_error": failed["error"]}


def installed_peers() -> list[str]:
    if not ((PEERS_DIR / "venv" / "bin" / "python").is_file() and (SHARED_PEERS / "bench_peers.py").is_file()):
        return []
    return list(PEER_PRECISION)


def ensure_engine(model: Path, engine_dir: Path, options: list[str], extra: list[str]) -> None:
    """Build the engine unless one of these options is there (an engine of an older format, or one
    built with other options, is rebuilt: it would be measured under this engine's name)."""
    from trtllm.runtime import manifest as mf

    try:
        if engine_identity(mf.load(engine_dir)) == wanted_identity(options):
            return
    except mf.ManifestError:
        pass
    trtllm_build = Path(sys.executable).parent / "trtllm-build"
    subprocess.run([str(trtllm_build), "--model", str(model), "--output", str(engine_dir), *options, *extra],
                   check=True)


def engine_identity(m) -> dict:
    """What an engine measured under one of OURS' names must be: its number format."""
    return {"dtype": m.dtype, "quantization": m.quantization, "kv": m.model.kv_dtype,
            "activations": m.quantization_scheme.get("activations", "float32") if m.quantization_scheme else "float32"}


def wanted_identity(options: list[str]) -> dict:
    given = dict(zip(options[::2], options[1::2]))
    dtype = given.get("--dtype", "float32")
    quantization = given.get("--quantization", "none")
    kv = given.get("--kv-cache-dtype", "auto")
    return {"dtype": dtype, "quantization": quantization, "kv": dtype if kv == "auto" else kv,
            "activations": given.get("--activations", "float32") if quantization != "none" else "float32"}


def best_of(rounds: list[dict]) -> dict:
    """One system's rounds -> its best value of each figure (the lowest time, the highest rate)."""
    ok = [r for r in rounds if "error" not in r]
    if not ok:
        return rounds[-1]
    out = dict(ok[0])
    for metric, better in METRICS + OWN:
        vals = [r[metric] for r in ok if r.get(metric)]
        if vals:
            out[metric] = min(vals) if better == "lower" else max(vals)
    out["peak_rss_mb"] = max(r.get("peak_rss_mb", 0) for r in ok)
    out["rounds"] = [{m: r.get(m) for m, _ in METRICS} | {m: r[m] for m, _ in OWN if m in r} |
                     ({"error": r["error"]} if "error" in r else {}) for r in rounds]
    return out


def add_agreement(results: list[dict]) -> None:
    """agree_hf: how many of the 128 greedy tokens match transformers fp32 before the first difference."""
    hf = next((r.get("tokens_128") for r in results if r["peer"] == "hf-fp32"), None)
    for r in results:
        if hf and r.get("tokens_128"):
            same = 0
            for a, b in zip(r["tokens_128"], hf):
                if a != b:
                    break
                same += 1
            r["agree_hf"] = same


def ratio(ours: float, peer_values: list[float], better: str) -> float:
    """ours against the best peer value (inverted for times: > 1 is better)."""
    best = min(peer_values) if better == "lower" else max(peer_values)
    return best / ours if better == "lower" else ours / best


def add_ratios(results: list[dict], rounds: dict[str, list[dict]]) -> None:
    """Paired ratios: in each round, ours / the best peer of the same precision in that same round
    (systems of a round run minutes apart; the best of each system's rounds may come from different
    rounds, which on a noisy machine compares a quiet spell with a busy one). ratio_<metric> is their
    median, ratio_<metric>_range their min and max, paired_<metric> each round's: ours is ahead only
    where the whole range is above 1."""
    for r in results:
        if not r["peer"].startswith("trtllm-"):
            continue
        peers = [p["peer"] for p in results if not p["peer"].startswith("trtllm-") and p["precision"] == r["precision"]]
        mine = rounds[r["peer"].removeprefix("trtllm-")]
        # a round where a peer of this precision failed pairs ours with the slower peers left: out
        failed = [k for k in range(len(mine)) if any(k < len(rounds[p]) and "error" in rounds[p][k] for p in peers)]
        if failed:
            r["rounds_left_out"] = failed
        for metric, better in METRICS:
            paired = []
            for k, own in enumerate(mine):
                if k in failed:
                    continue
                vals = [rounds[p][k][metric] for p in peers if k < len(rounds[p]) and rounds[p][k].get(metric)]
                if vals and own.get(metric):
                    paired.append(round(ratio(own[metric], vals, better), 2))
            if paired:
                r[f"paired_{metric}"] = paired
                r[f"ratio_{metric}"] = round(statistics.median(paired), 2)
                r[f"ratio_{metric}_range"] = [min(paired), max(paired)]


def print_table(results: list[dict], bandwidth: float) -> None:
    head = (f"{'system':<16}{'prec':>5}{'ttft128':>9}{'ttft512':>9}{'dec b1':>8}{'dec b8':>8}{'peak MB':>9}"
            f"{'agree':>7}  ratios vs best peer, paired by round: median [min-max] (ttft128/ttft512/b1/b8)")
    print(head)
    print("-" * len(head))
    for r in results:
        if "error" in r:
            print(f"{r['peer']:<16}{r['precision']:>5}  failed: {r['error']}")
            continue
        ratios = " / ".join(f"{r[f'ratio_{m}']:.2f} [{r[f'ratio_{m}_range'][0]:.2f}-{r[f'ratio_{m}_range'][1]:.2f}]"
                            if f"ratio_{m}" in r else "-" for m, _ in METRICS)
        cell = lambda m, width, fmt: f"{r[m]:>{width}{fmt}}" if r.get(m) is not None else f"{'-':>{width}}"
        print(f"{r['peer']:<16}{r['precision']:>5}{cell('ttft128_ms', 9, '.0f')}{cell('ttft512_ms', 9, '.0f')}"
              f"{cell('dec_b1_tps', 8, '.1f')}{cell('dec_b8_tps', 8, '.1f')}{r['peak_rss_mb']:>9.0f}"
              f"{r.get('agree_hf', '-'):>7}  "
              f"{ratios if r['peer'].startswith('trtllm-') else r.get('protocol', '')}")
    print(f"\nmemory copy bandwidth {bandwidth / 1e9:.1f} GB/s; decode bound at batch 1 = bandwidth / weight bytes:")
    for r in results:
        if r.get("weight_bytes_per_token"):
            bound = bandwidth / r["weight_bytes_per_token"]
            print(f"  {r['peer']:<16} {r['weight_bytes_per_token'] / 1e6:7.1f} MB/token -> at most {bound:6.1f} tok/s; "
                  f"measured {r['dec_b1_tps']:.1f} ({r['dec_b1_tps'] / bound:.0%} of the bound), "
                  f"Python overhead {r['python_overhead']:.1%} of decode time")


def smoke_setup(tmp: Path) -> tuple[Path, dict[str, Path]]:
    sys.path.insert(0, str(ROOT))
    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("llama", tmp / "ckpt", max_positions=1024)
    engines = {}
    for name, options in OURS.items():
        engines[name] = tmp / f"engine-{name}"
        ensure_engine(ckpt, engines[name], options, ["--max-input-len", "512", "--max-kv-cache-capacity", "1024",
                                                       "--no-verify"])
    return ckpt, engines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny model, 4 tokens, 1 run, no peers")
    ap.add_argument("--ours", default=",".join(OURS))
    ap.add_argument("--peers", default=None, help="comma list (default: all installed; 'none' for none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4,
                    help="passes over every system (every other one in reverse order); ratios are paired by round")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("--llama-build", type=Path, default=None,
                    help="a llama.cpp build directory to use instead of the peers' (its bin/ holds libllama and "
                         "llama-bench), e.g. one built without AMX where the CPU reports AMX the VM does not enable")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench.json")
    ap.add_argument("--_worker"), ap.add_argument("--_engine", type=Path), ap.add_argument("--_tokenizer", type=Path)
    args = ap.parse_args()
    if args._worker:
        print("@@RESULT@@" + json.dumps(worker(args._worker, args._engine, args._tokenizer, args)))
        return
    ours = args.ours.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="trtllm-bench-"))
    if args.smoke:
        args.gen, args.runs, args.batch, args.rounds = 4, 1, 2, 1
        tokenizer_dir, engines = smoke_setup(tmp)
        peers = [] if args.peers in (None, "none") else args.peers.split(",")
    else:
        tokenizer_dir = DEMO
        engines = {n: ROOT / "engines" / ("smollm2-135m-instruct" if n == "fp32" else f"smollm2-{n}") for n in ours}
        for n in ours:
            ensure_engine(DEMO, engines[n], OURS[n], [])
        peers = installed_peers() if args.peers is None else [] if args.peers == "none" else args.peers.split(",")
    names = [n for n in ORDER if n in ours or n in peers]
    rounds: dict[str, list[dict]] = {n: [] for n in names}
    for k in range(args.rounds):
        # every other round in reverse: no system always runs just after (or before) the same one
        for name in names if k % 2 == 0 else names[::-1]:
            print(f"[bench] round {k + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
            rounds[name].append(measure_ours(name, engines[name], tokenizer_dir, args) if name in ours
                                else measure_peer(name, args))
    results = [best_of(rounds[n]) for n in names]
    add_ratios(results, rounds)
    add_agreement(results)
    bandwidth = copy_bandwidth()
    meta = {"threads": args.threads, "gen": args.gen, "batch": args.batch, "runs": args.runs,
            "rounds": args.rounds, "smoke": args.smoke,
            "llama_build": str(args.llama_build or PEERS_DIR / "llama.cpp" / "build"),
            "copy_bandwidth_bytes_per_s": bandwidth, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print_table(results, bandwidth)
    print(f"\nwrote {args.out}")
    if any("error" in r for r in results if r["peer"].startswith("trtllm-")):
        sys.exit(1)


if __name__ == "__main__":
    main()
