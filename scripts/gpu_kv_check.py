#!/usr/bin/env python3
"""The TensorRT backend's device KV cache on a real CUDA device (no TensorRT needed).

    python scripts/gpu_kv_check.py out.json            # a CUDA GPU with cuda-python
    python scripts/gpu_kv_check.py out.json --fake     # here: tests/fakes/cuda (the test does this)

runtime/backends/tensorrt.py's DeviceKVCache and backends/cuda.py's calls (cudaMalloc,
cudaMemsetAsync, cudaMemcpyAsync, cudaMemcpy2DAsync from pageable numpy memory, streams,
device properties) against the host KVCacheManager, op for op on the same random data: writes of
part of a slot, reads, a failed row's clear, a slot's move, a draft tree's position moves and
beam search's copies where slots trade places. Every read must equal the host cache's bit for bit,
for each KV type (float32, float16, bfloat16's bits, int8 rows with their float32 scales). Prints a
line per KV type, writes them to the JSON path, exits 1 on any difference.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="JSON results path")
    parser.add_argument("--fake", action="store_true", help="tests/fakes/cuda instead of cuda-python")
    parser.add_argument("--ops", type=int, default=400, help="random operations per KV type")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # (tests.fakes)
    if args.fake:
        from tests import fakes

        with fakes.installed():
            device, results = run_all(args.ops)
    else:
        device, results = run_all(args.ops)
    for r in results:
        print(f"{r['kv_dtype']:<9} {r['ops']} ops  {r['reads']} reads  "
              f"{'ok' if not r['problems'] else str(len(r['problems'])) + ' PROBLEMS'}")
        for p in r["problems"][:10]:
            print(f"    {p}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": device, "fake": args.fake, "results": results}, indent=1))
    print(f"wrote {args.out}")
    return 1 if any(r["problems"] for r in results) else 0


def run_all(num_ops: int) -> tuple[dict, list[dict]]:
    """The device's name and capability, and run_ops' result per KV type."""
    from trtllm.runtime.backends import cuda

    device = cuda.device_info()
    stream = cuda.Stream()
    try:
        return device, [run_ops(kv_dtype, stream, num_ops, seed)
                        for seed, kv_dtype in enumerate(("float32", "float16", "bfloat16", "int8"))]
    finally:
        stream.close()


def run_ops(kv_dtype: str, stream, num_ops: int, seed: int) -> dict:
    """Random operations on a device cache and a host one; every read compared bit for bit."""
    from trtllm.runtime.backends.tensorrt import DeviceKVCache
    from trtllm.runtime.kv_cache import KVCacheManager
    from trtllm.runtime.manifest import ModelShape

    # 2 layers, 2 KV heads of 64: a slot's bytes are a multiple of 256 (TensorRT's alignment)
    model = ModelShape(vocab_size=100, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                       kv_dtype=kv_dtype)
    slots, capacity = 6, 64
    device, host = DeviceKVCache(model, slots, capacity, stream), KVCacheManager(model, slots, capacity)
    rng = np.random.default_rng(seed)
    problems, reads = [], 0

    def random_kv(length):
        shape, dtype = host.layout(length)
        return rng.integers(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), np.uint8).view(dtype)

    def same(what, slot, length):
        got, want = device.read(slot, length), host.read(slot, length)
        if got.tobytes() != want.tobytes():
            problems.append(f"{what}: slot {slot} positions 0..{length - 1} differ")

    for slot in range(slots):
        kv = random_kv(capacity)
        device.write(slot, kv)
        host.write(slot, kv)
    for i in range(num_ops):
        op = rng.choice(["write", "read", "clear", "move", "move_position", "copy_positions"])
        if op == "write":
            slot, kv = int(rng.integers(slots)), random_kv(int(rng.integers(1, capacity + 1)))
            device.write(slot, kv)
            host.write(slot, kv)
        elif op == "clear":
            start = int(rng.integers(slots))
            stop = int(rng.integers(start + 1, slots + 1))
            device.clear(start, stop)
            host.clear(start, stop)
        elif op == "move":  # (move takes an owned slot to a free one: the owners set for it, books aside)
            src, dst = (int(s) for s in rng.choice(slots, 2, replace=False))
            length = int(rng.integers(1, capacity + 1))
            for cache in (device, host):
                cache.owners = [None] * slots
                cache.owners[src] = "row"
                cache.move(src, dst, length)
        elif op == "move_position":
            slot, src, dst = int(rng.integers(slots)), int(rng.integers(capacity)), int(rng.integers(capacity))
            device.move_position(slot, src, dst)
            host.move_position(slot, src, dst)
        elif op == "copy_positions":  # (beam search: destinations may be sources, a source given twice)
            n = int(rng.integers(1, slots + 1))
            dst = rng.choice(slots, n, replace=False)
            src = rng.integers(0, slots, n)
            start = int(rng.integers(capacity))
            stop = int(rng.integers(start + 1, capacity + 1))
            device.copy_positions(dst, src, start, stop)
            host.copy_positions(dst, src, start, stop)
        if op == "read" or i % 25 == 0:
            slot = int(rng.integers(slots))
            same(f"after op {i} ({op})", slot, int(rng.integers(1, capacity + 1)))
            reads += 1
    for slot in range(slots):
        same("at the end", slot, capacity)
        reads += 1
    return {"kv_dtype": kv_dtype, "ops": num_ops, "reads": reads, "problems": problems}


if __name__ == "__main__":
    sys.exit(main())
