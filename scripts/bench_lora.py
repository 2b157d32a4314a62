"""What LoRA costs: decode tok/s and time to first token of an engine without LoRA inputs against the
same model built with them, without an adapter, with one shared by the batch, and with two mixed.

    python scripts/bench_lora.py PLAIN_ENGINE LORA_ENGINE [--rounds 3] [--threads 2]

e.g. after
    trtllm-build --model models/smollm2-135m-instruct --output engines/smollm2-int4 --quantization int4
    trtllm-build --model models/smollm2-135m-instruct --output engines/smollm2-int4-lora --quantization int4 \\
        --max-lora-rank 16

Random adapters (rank 16 on every projection, rank 8 on q and v) are written to a temporary
directory. Every case runs once per round, the cases alternating, in one process; each reports its
best round and its ratio to the plain engine's (this machine is shared: only ratios mean anything).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench import build_prompts  # noqa: E402
from trtllm.runtime import lora  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, Timing, run_rows  # noqa: E402
from trtllm.runtime.sampling import SamplingParams  # noqa: E402

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def random_adapter(path: Path, m, rank: int, modules, seed: int) -> lora.Adapter:
    from safetensors.numpy import save_file

    rng, tensors = np.random.default_rng(seed), {}
    for site in m.lora["sites"].values():
        for name, lo, hi in site["modules"]:
            if name.split(".")[-1] in modules:
                for i in range(m.model.num_layers):
                    prefix = f"base_model.model.model.layers.{i}.{name}"
                    tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, 0.02, (rank, site["in"])).astype(np.float32)
                    tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, 0.02, (hi - lo, rank)).astype(np.float32)
    path.mkdir(parents=True)
    save_file(tensors, str(path / lora.WEIGHTS_NAME))
    (path / lora.CONFIG_NAME).write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": rank}))
    return lora.load_adapter(path.name, path, m)


def run(engine, prompt: list[int], adapters: list, gen: int) -> tuple[float, float]:
    """(decode tok/s over the batch, time to first token in seconds)."""
    params = SamplingParams(temperature=0, max_new_tokens=gen, ignore_eos=True)
    rows = [RowState(prompt_ids=prompt, params=params, rng=np.random.default_rng(0), eos_ids=frozenset(), adapter=a)
            for a in adapters]
    stamps: list[float] = []
    start = time.perf_counter()
    run_rows(engine, rows, len(rows), Timing(), on_token=lambda r: stamps.append(time.perf_counter()))
    first = stamps[len(rows) - 1]
    return len(rows) * (gen - 1) / (stamps[-1] - first), first - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plain", type=Path)
    parser.add_argument("lora", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gen", type=int, default=64)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    plain, with_lora = load_engine(args.plain, num_threads=args.threads), load_engine(args.lora, num_threads=args.threads)
    prompt = build_prompts(AutoTokenizer.from_pretrained(args.plain), [128])[128]
    with tempfile.TemporaryDirectory() as tmp:
        m = with_lora.manifest
        all16 = random_adapter(Path(tmp) / "all16", m, 16, ALL, 0)
        other16 = random_adapter(Path(tmp) / "other16", m, 16, ALL, 1)
        qv8 = random_adapter(Path(tmp) / "qv8", m, 8, ("q_proj", "v_proj"), 2)
        for batch in (1, 8):
            cases = {"no LoRA inputs": (plain, [None] * batch), "LoRA inputs, no adapter": (with_lora, [None] * batch),
                     "rank 8 on q, v": (with_lora, [qv8] * batch), "rank 16 on all": (with_lora, [all16] * batch)}
            if batch > 1:
                cases["two rank-16 adapters mixed"] = (with_lora, [all16, other16] * (batch // 2))
            best = {name: (0.0, float("inf")) for name in cases}
            for _ in range(args.rounds):
                for name, (engine, adapters) in cases.items():
                    tps, ttft = run(engine, prompt, adapters, args.gen)
                    best[name] = (max(best[name][0], tps), min(best[name][1], ttft))
            base = best["no LoRA inputs"]
            for name, (tps, ttft) in best.items():
                print(f"batch {batch}  {name:28s} {tps:7.1f} tok/s ({tps / base[0]:.2f}x)  "
                      f"first token {1e3 * ttft:6.0f} ms ({ttft / base[1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
