#!/usr/bin/env python3
"""trtllm::Sample's Triton kernel on a CUDA GPU: parity with the numpy reference, and its speed.

    python scripts/gpu_kernel_check.py out.json              # CUDA GPU (a few minutes, most of it compiling)
    python scripts/gpu_kernel_check.py out.json --interpret  # CPU only: TRITON_INTERPRET=1, small vocabulary

1. The gpu-marked comparison of tests/plugins/test_sample_triton.py (random cases over every
   feature, ids as the reference's or the exact (float64) draw for a uniform within 2e-6 of the
   row's (counted as "near", at most 2% of a check's rows; see the test's compare), logprobs 1e-5),
   then the same at the demo model's vocabulary (49152) and at
   151936, B in {1, 8}, M = 1024. The interpreted run skips the gpu-marked comparison and uses V = 2000 and 4099 instead.
2. Time per call, B in {1, 8}, all rows sampling and all rows greedy: the kernel (launch() on
   preallocated outputs and workspace; CUDA events around each call, after a warm-up; median),
   against the standard-op body on ONNX Runtime's CPU provider (a one-node model from
   plugins.sample.body, --ort-threads threads; median of wall-clock calls). Interpreted kernel
   times are the interpreter's, not a GPU's.
3. With --tune (GPU, about two minutes more): the kernel's time at both vocabularies for a few
   (BLOCK, num_warps) choices, to pick triton_kernel.BLOCK / NUM_WARPS.
Prints a table, writes everything to the JSON path, exits 1 if any comparison failed.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_TOP_K = 1024
NUM_LOGPROBS = 50                 # the op's static logprob width at MAX_TOP_K (min(50, M))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON results path")
    parser.add_argument("--interpret", action="store_true", help="run the kernel in Triton's CPU interpreter")
    parser.add_argument("--cases", type=int, default=None, help="random cases per (V, B) (default 4, interpreted 2)")
    parser.add_argument("--reps", type=int, default=None, help="timed calls (default 100, interpreted 3)")
    parser.add_argument("--ort-threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--tune", action="store_true", help="also time other BLOCK / num_warps choices (GPU)")
    args = parser.parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"      # before triton is first imported
    sys.path.insert(0, str(ROOT))                 # tests.plugins.test_sample_triton
    import torch

    if not args.interpret and not torch.cuda.is_available():
        print("no CUDA device: run with --interpret on a CPU-only machine", file=sys.stderr)
        return 2
    device = "cpu" if args.interpret else "cuda"
    if args.interpret:
        from tests.plugins.test_sample_triton import speed_up_interpreter

        speed_up_interpreter()
    vocab_sizes = (2000, 4099) if args.interpret else (49152, 151936)
    reps = args.reps or (3 if args.interpret else 100)
    checks = parity_checks(device, vocab_sizes, args.cases or (2 if args.interpret else 4), args.interpret)
    timings = [time_one(device, vocab_size, rows, greedy, reps, args.ort_threads, warmup=1 if args.interpret else 10)
               for vocab_size in vocab_sizes for rows in (1, 8) for greedy in (False, True)]
    tuning = tune(device, reps) if args.tune and not args.interpret else []
    report(checks, timings, tuning)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta(device, args), "checks": checks, "timings": timings,
                                    "tuning": tuning}, indent=1))
    print(f"wrote {args.out}")
    from tests.plugins.test_sample_triton import near_allowed

    return 1 if any(c["problems"] or len(c["near"]) > near_allowed(c["rows"]) for c in checks) else 0


def parity_checks(device: str, vocab_sizes, num_cases: int, interpret: bool) -> list[dict]:
    """The gpu-marked test's comparison, then random cases at each large V and B in {1, 8}."""
    import numpy as np
    import torch

    from tests.plugins.test_sample_triton import ARGS, GPU_CONFIGS, compare, random_case, run_cases
    from trtllm.plugins.sample import reference, triton_kernel

    checks = []
    if not interpret:                             # the interpreter would take minutes at these sizes
        start = time.perf_counter()
        near = []
        rows, problems = run_cases(triton_kernel, GPU_CONFIGS, seed=2, num_cases=12, device=device, near=near)
        checks.append({"name": "gpu test cases", "configs": GPU_CONFIGS, "rows": rows, "problems": problems,
                       "near": near, "seconds": time.perf_counter() - start})
    rng = np.random.default_rng(3)
    for vocab_size in vocab_sizes:
        for num_rows in (1, 8):
            start, num_checked, problems, near = time.perf_counter(), 0, [], []
            for i in range(num_cases):
                case, _ = random_case(rng, vocab_size, MAX_TOP_K, num_rows)
                want = reference.sample(*(case[name] for name in ARGS), MAX_TOP_K)
                got = triton_kernel.sample(*(torch.as_tensor(case[name], device=device) for name in ARGS),
                                           MAX_TOP_K)
                got = [g.cpu().numpy() for g in got]
                case_near = []
                problems += [f"case {i}: {p}" for p in compare(got, want, case, MAX_TOP_K, case_near)]
                near += [f"case {i}: {n}" for n in case_near]
                num_checked += num_rows
            problems += stream_check(device, vocab_size, num_rows)
            checks.append({"name": f"V={vocab_size} B={num_rows}", "rows": num_checked, "problems": problems,
                           "near": near, "seconds": time.perf_counter() - start})
    from tests.plugins.sample_cases import tail_case

    start, (case, want) = time.perf_counter(), tail_case()  # tokens a float32 CDF cannot reach
    got = triton_kernel.sample(*(torch.as_tensor(case[name], device=device) for name in ARGS), 64)[0].cpu().tolist()
    checks.append({"name": "least likely tokens", "rows": len(got), "near": [], "seconds": time.perf_counter() - start,
                   "problems": [] if got == want.tolist() else [f"drew {got}, want {want.tolist()}"]})
    return checks


def stream_check(device: str, vocab_size: int, num_rows: int) -> list[str]:
    """launch() on a raw stream handle (the tensorrt.plugin path) gives sample()'s outputs."""
    if device != "cuda":
        return []
    import torch

    from trtllm.plugins.sample import triton_kernel

    inputs, _ = timing_inputs(device, vocab_size, num_rows, greedy=False)
    want = list(triton_kernel.sample(*inputs, MAX_TOP_K))
    stream = torch.cuda.Stream()
    outputs = [torch.empty_like(w) for w in want]
    triton_kernel.launch(*inputs, MAX_TOP_K, outputs, stream=stream.cuda_stream)
    stream.synchronize()
    same = all(torch.equal(o, w) for o, w in zip(outputs, want))
    return [] if same else [f"launch(stream=...) differs from sample() at V={vocab_size} B={num_rows}"]


def timing_inputs(device: str, vocab_size: int, num_rows: int, greedy: bool):
    """Decode-like rows: t 0.8 (or 0), top-k 50, top-p 0.95, min-p 0.05, penalties on 2% of the vocabulary."""
    import numpy as np
    import torch

    rng = np.random.default_rng(vocab_size + num_rows)
    shape = (num_rows, vocab_size)
    seen = rng.random(shape) < 0.02
    full = lambda value, dtype: np.full(num_rows, value, dtype)  # noqa: E731
    values = {"logits": (rng.normal(size=shape) * 3).astype(np.float32), "logit_bias": np.zeros(shape, np.float32),
              "penalty_bias": np.where(seen, -0.5, 0.0).astype(np.float32), "seen": seen,
              "repetition_penalty": full(1.1, np.float32), "temperature": full(0.0 if greedy else 0.8, np.float32),
              "min_p": full(0.05, np.float32), "top_k": full(50, np.int64), "top_p": full(0.95, np.float32),
              "uniform": rng.random(num_rows, dtype=np.float32)}
    from trtllm.plugins.sample import schema

    return [torch.as_tensor(values[name], device=device) for name in schema.INPUT_NAMES], values


def time_one(device: str, vocab_size: int, num_rows: int, greedy: bool, reps: int, ort_threads: int,
             warmup: int) -> dict:
    """Median ms per call of the kernel and of the ONNX body on ONNX Runtime, same inputs."""
    import numpy as np
    import torch

    from trtllm.plugins.sample import triton_kernel

    inputs, values = timing_inputs(device, vocab_size, num_rows, greedy)
    outputs = (torch.empty(num_rows, dtype=torch.int64, device=device),
               torch.empty(num_rows, NUM_LOGPROBS, device=device),
               torch.empty(num_rows, NUM_LOGPROBS, dtype=torch.int64, device=device))
    workspace = torch.empty(num_rows * (2 * vocab_size + 4096), device=device)

    def call():
        triton_kernel.launch(*inputs, MAX_TOP_K, outputs, workspace=workspace)

    kernel_ms = _median_ms(call, reps, warmup, cuda=device == "cuda")
    session, feeds = _ort_session(values, vocab_size, ort_threads)
    ort_ms = _median_ms(lambda: session.run(None, feeds), max(reps // 2, 3), 3, cuda=False)
    got = [o.cpu().numpy() for o in outputs]
    want = session.run(None, feeds)
    return {"V": vocab_size, "B": num_rows, "rows": "greedy" if greedy else "sampling", "kernel_ms": kernel_ms,
            "ort_cpu_ms": ort_ms, "ort_threads": ort_threads,
            "same_tokens_as_ort": bool(np.array_equal(got[0], want[0]))}


def tune(device: str, reps: int) -> list[dict]:
    """Kernel ms at both vocabularies, sampling rows, for other (BLOCK, num_warps); the defaults are restored."""
    import torch

    from trtllm.plugins.sample import triton_kernel

    default = triton_kernel.BLOCK, triton_kernel.NUM_WARPS
    results = []
    try:
        for (block, warps), vocab_size in itertools.product(
                ((1024, 8), (2048, 8), (4096, 8), (4096, 16), (8192, 8), (8192, 16)), (49152, 151936)):
            triton_kernel.BLOCK, triton_kernel.NUM_WARPS = block, warps
            for num_rows in (1, 8):
                inputs, _ = timing_inputs(device, vocab_size, num_rows, greedy=False)
                outputs = (torch.empty(num_rows, dtype=torch.int64, device=device),
                           torch.empty(num_rows, NUM_LOGPROBS, device=device),
                           torch.empty(num_rows, NUM_LOGPROBS, dtype=torch.int64, device=device))
                ms = _median_ms(lambda: triton_kernel.launch(*inputs, MAX_TOP_K, outputs), reps, 10, cuda=True)
                results.append({"V": vocab_size, "BLOCK": block, "num_warps": warps, "B": num_rows, "kernel_ms": ms})
    finally:
        triton_kernel.BLOCK, triton_kernel.NUM_WARPS = default
    return results


def _median_ms(fn, reps: int, warmup: int, cuda: bool) -> float:
    for _ in range(warmup):                       # the first call also compiles
        fn()
    times = []
    if cuda:
        import torch

        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _ort_session(values: dict, vocab_size: int, threads: int):
    import onnxruntime as ort

    from trtllm.plugins.sample import body

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(body.make_model(MAX_TOP_K, vocab_size).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = dict(values)
    return session, feeds


def report(checks: list[dict], timings: list[dict], tuning: list[dict]) -> None:
    for c in checks:
        status = "ok" if not c["problems"] else f"{len(c['problems'])} PROBLEMS"
        print(f"parity {c['name']:<16} {c['rows']:5d} rows  {status}  {len(c['near'])} near a boundary  "
              f"({c['seconds']:.1f} s)")
        for p in c["problems"][:10] + c["near"][:10]:
            print(f"    {p}")
    print(f"\n{'V':>7} {'B':>2} {'rows':<9} {'kernel ms':>10} {'ORT CPU ms':>11} {'ratio':>7}  same tokens")
    for t in timings:
        print(f"{t['V']:7d} {t['B']:2d} {t['rows']:<9} {t['kernel_ms']:10.3f} {t['ort_cpu_ms']:11.3f} "
              f"{t['ort_cpu_ms'] / t['kernel_ms']:7.3g}  {t['same_tokens_as_ort']}")
    for t in tuning:
        print(f"tune V={t['V']:<6d} BLOCK={t['BLOCK']:<5d} num_warps={t['num_warps']:<3d} B={t['B']}  "
              f"{t['kernel_ms']:.3f} ms")


def meta(device: str, args) -> dict:
    import onnxruntime
    import torch
    import triton

    return {"device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "interpret": args.interpret, "torch": torch.__version__, "triton": triton.__version__,
            "onnxruntime": onnxruntime.__version__, "max_top_k": MAX_TOP_K, "num_logprobs": NUM_LOGPROBS,
            "ort_threads": args.ort_threads, "cpu_count": os.cpu_count()}


if __name__ == "__main__":
    sys.exit(main())
