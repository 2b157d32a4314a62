#!/usr/bin/env python3
"""How long a generating stream stalls while a long prompt is prefilled beside it, per --prefill-chunk.

    python scripts/bench_chunked_prefill.py [--engine engines/smollm2-int4] [--chunks 0,128,256] [--repeats 2]
                                            [--items 250] [--out out/bench_chunked_prefill.json]

Two requests, batch_size 2, through `trtllm-run --stream` (one process per run, the chunk sizes
alternating within each repeat): A, a short prompt that generates 120 tokens, and B, a ~1,700-token
prompt that generates 4. Reported per chunk size: the longest gap between two of A's streamed
tokens (median over repeats), when B's first token came (after A's first), the prefill steps, and
whether the answers are the same as with the first chunk size. Writes --out.
Only the comparison within one run is meaningful on a shared machine.
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

ROOT = Path(__file__).resolve().parent.parent
TRTLLM_RUN = Path(sys.executable).parent / "trtllm-run"


def payload(items: int = 250) -> dict:
    long_text = " ".join(f"item{i} is a number" for i in range(items)) + " Summarise."
    return {"batch_size": 2, "temperature": 0, "max_generate_length": 120, "ignore_eos": True,
            "requests": [{"messages": [{"role": "user", "content": "Tell me a long story about a dragon."}]},
                         {"messages": [{"role": "user", "content": long_text}], "max_generate_length": 4}]}


def run_once(engine: str, chunk: int, work: Path, threads: int) -> dict:
    out, prof = work / "out.json", work / "profile.json"
    cmd = [str(TRTLLM_RUN), str(work / "input.json"), "--engine", engine, "--stream", "--threads", str(threads),
           "--output", str(out), "--profile", str(prof), "--prefill-chunk", str(chunk)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    a_times, b_first = [], None
    for line in proc.stdout:
        record, now = json.loads(line), time.perf_counter()
        if record["request_idx"] == 0:
            a_times.append(now)
        elif b_first is None:
            b_first = now
    err = proc.stderr.read()  # (a few summary lines: the pipe does not fill while stdout is read)
    if proc.wait() != 0:  # trtllm-run says why (an engine not built yet: --engine's default is the int4 one)
        raise SystemExit(f"{' '.join(cmd)} exited with {proc.returncode}:\n{err.strip()}")
    answers = [r["output_text"] for r in json.loads(out.read_text())["responses"]]
    return {"max_gap_s": max(b - a for a, b in zip(a_times, a_times[1:])), "b_first_after_a_s": b_first - a_times[0],
            "prefill_runs": json.loads(prof.read_text())["prefill"]["total_runs"], "answers": answers}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default=str(ROOT / "engines" / "smollm2-int4"))
    ap.add_argument("--chunks", default="0,128,256")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--items", type=int, default=250, help="B's prompt: 'itemN is a number' this many times")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_chunked_prefill.json"))
    args = ap.parse_args(argv)
    chunks = [int(c) for c in args.chunks.split(",")]
    results: dict[int, list[dict]] = {c: [] for c in chunks}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "input.json").write_text(json.dumps(payload(args.items)))
        for rep in range(args.repeats):
            for c in chunks if rep % 2 == 0 else chunks[::-1]:
                results[c].append(run_once(args.engine, c, work, args.threads))
    reference = results[chunks[0]][0]["answers"]
    rows = [{"prefill_chunk": c, "max_gap_s": statistics.median(r["max_gap_s"] for r in runs),
             "b_first_after_a_s": statistics.median(r["b_first_after_a_s"] for r in runs),
             "prefill_runs": runs[0]["prefill_runs"], "same_answers": all(r["answers"] == reference for r in runs)}
            for c, runs in results.items()]
    print("| --prefill-chunk | longest stall of A | B's first token after A's | prefill steps (A's and B's) | same answers |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['prefill_chunk']} | {r['max_gap_s']:.2f} s | {r['b_first_after_a_s']:.2f} s | "
              f"{r['prefill_runs']} | {r['same_answers']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"engine": args.engine, "rows": rows}, indent=2))
    return rows


if __name__ == "__main__":
    main()
