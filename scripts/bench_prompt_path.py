"""What exact prompts cost: a prompt step of P tokens on the prefill path (what the runtime runs, so
that a prompt's rows are computed the same in any batch and after a restored prefix) against the
decode path (what calls of <= 16 rows took before), alternating in one process on one engine.

    python scripts/bench_prompt_path.py ENGINE [--tokens 1,4,16] [--repeats 30]

Only engines on plugins/cpu's MatMul kernels (quantized, float16 or bfloat16 on ONNX Runtime) have
the two paths; ratios only (the machine is shared).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm.runtime import sampling  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, prefill_inputs  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402


def measure(engine, num_tokens: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one prompt step of `num_tokens` tokens: (prefill path, decode path)."""
    m = engine.manifest
    params = sampling.SamplingParams(temperature=0)
    row = RowState(prompt_ids=[(100 + i) % m.model.vocab_size for i in range(num_tokens)], params=params,
                   rng=np.random.default_rng(0), eos_ids=frozenset())
    kv = KVCacheManager(m.model, 1, min(256, m.limits.max_kv_cache_capacity))
    inputs = prefill_inputs([row], m.pad_token_id, sampling.make_batch([params], m.model.vocab_size, m.max_top_k))
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeats):
        for prompt in (True, False):  # False: labelled generated, which takes the decode path
            t0 = time.perf_counter()
            engine.step(dataclasses.replace(inputs, prompt=prompt), kv.view(0, 1))
            times[prompt].append(time.perf_counter() - t0)
    return float(np.median(times[True])), float(np.median(times[False]))


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--tokens", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    engine = load_engine(args.engine)
    rows = []
    try:
        for n in (int(t) for t in args.tokens.split(",")):
            prefill, decode = measure(engine, n, args.repeats)
            rows.append({"tokens": n, "prefill_path_ms": prefill * 1e3, "decode_path_ms": decode * 1e3})
            print(f"{n:3d} tokens: prefill path {prefill * 1e3:6.1f} ms, decode path {decode * 1e3:6.1f} ms, "
                  f"{prefill / decode:.2f}x")
    finally:
        engine.close()
    return rows


if __name__ == "__main__":
    main()
