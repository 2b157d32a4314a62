"""What LoRA costs: decode tok/s and time to first token of an engine without LoRA inputs against the
same model built with them, without an adapter, with one shared by the batch, and with two mixed.

    python scripts/bench_lora.py PLAIN_ENGINE LORA_ENGINE [--rounds 3] [--threads 2] [--llama-cpp F32|F16]

e.g. after
    trtllm-build --model models/smollm2-135m-instruct --output engines/smollm2-int4 --quantization int4
    trtllm-build --model models/smollm2-135m-instruct --output engines/smollm2-int4-lora --quantization int4 \\
        --max-lora-rank 16

Random adapters (rank 16 on every projection, rank 8 on q and v) are written to a temporary
directory. Every case runs once per round, the cases alternating, in one process; each reports its
best round and its ratio to the plain engine's (this machine is shared: only ratios mean anything).

--llama-cpp F32|F16 (after ../shared/peers/setup.sh): llama.cpp runs the same rank-16 adapter,
converted with its convert_lora_to_gguf.py, on that GGUF of the same model, with and without it,
on the same token ids (bench_peers.py's runner, in the peers' environment, in a subprocess); then
compare a float32 (or float16) engine of ours: only matching precisions compare. Its Q4_1 kernels
crash on this CPU's prompts (README), so there is no int4 pair.
"""
from __future__ import annotations

import argparse
import os
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.bench import LLAMA_GGUF, PEERS_DIR, SHARED_PEERS, build_prompts  # noqa: E402
from trtllm.runtime import lora  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, Timing, run_rows  # noqa: E402
from trtllm.runtime.sampling import SamplingParams  # noqa: E402

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def random_adapter(path: Path, m, rank: int, seed: int, modules=ALL, std: float = 0.02,
                   alpha: float | None = None) -> Path:
    """A PEFT adapter directory for a LoRA engine's model: rank `rank` on `modules` of every layer,
    weights drawn from N(0, std), lora_alpha `alpha` (default: the rank, a scale of 1)."""
    from safetensors.numpy import save_file

    rng, tensors = np.random.default_rng(seed), {}
    for i, name, n_in, n_out, experts in lora.projections(m):
        if name.split(".")[-1] in modules and not experts:  # (the dense projections' only)
            prefix = f"base_model.model.model.layers.{i}.{name}"
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, std, (rank, n_in)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, std, (n_out, rank)).astype(np.float32)
    path.mkdir(parents=True)
    save_file(tensors, str(path / lora.WEIGHTS_NAME))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha or rank, "target_modules": list(modules),
              "task_type": "CAUSAL_LM"}
    (path / lora.CONFIG_NAME).write_text(json.dumps(config))
    return path


# Run in the peers' environment: llama.cpp on the token ids, without and with the adapter.
LLAMA_DRIVER = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from bench_peers import LlamaCppRunner
import llama_cpp as L
gguf, adapter, ids, gen, rounds, threads = sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), *map(int, sys.argv[5:8])
out = {}
for name in ("without", "with"):
    runner = LlamaCppRunner(gguf, threads)
    if name == "with":
        lora = L.llama_adapter_lora_init(runner.model, adapter.encode())
        assert lora, adapter
        for ctx in runner.ctxs.values():
            L.llama_set_adapter_lora(ctx, lora, 1.0)
    for batch in (1, 8):
        best = (0.0, float("inf"))
        for _ in range(rounds):
            ttft, decode, _ = runner.run([ids] * batch, gen)
            best = (max(best[0], batch * (gen - 1) / decode), min(best[1], ttft))
        out[f"{name} {batch}"] = best
print(json.dumps(out))
"""


def llama_cpp(precision: str, adapter_dir: Path, model_dir: Path, ids: list[int], args) -> dict:
    """{"without 1": (tok/s, first token s), "with 1": ..., "without 8", "with 8"} from llama.cpp."""
    python = PEERS_DIR / "venv" / "bin" / "python"
    converter = next((PEERS_DIR / "src").glob("llama_cpp_python-*/vendor/llama.cpp/convert_lora_to_gguf.py"))
    gguf_adapter = adapter_dir.with_suffix(".gguf")
    subprocess.run([str(python), str(converter), "--base", str(model_dir), "--outtype", "f32", "--outfile",
                    str(gguf_adapter), str(adapter_dir)], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(converter.parent / "gguf-py")})
    proc = subprocess.run([str(python), "-c", LLAMA_DRIVER, str(SHARED_PEERS), str(PEERS_DIR / LLAMA_GGUF[f"llamacpp-{precision.lower()}"]),
                           str(gguf_adapter), json.dumps(ids), str(args.gen), str(args.rounds), str(args.threads)],
                          check=True, capture_output=True, text=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    parser.add_argument("--llama-cpp", choices=("F32", "F16"), help="also llama.cpp on this GGUF (needs the peers)")
    parser.add_argument("--model", type=Path, default=Path("models/smollm2-135m-instruct"),
                        help="the HF checkpoint (for llama.cpp's adapter converter)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    plain, with_lora = load_engine(args.plain, num_threads=args.threads), load_engine(args.lora, num_threads=args.threads)
    prompt = build_prompts(AutoTokenizer.from_pretrained(args.plain), [128])[128]
    ours: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        m = with_lora.manifest
        all16, other16, qv8 = (lora.load_adapter(path.name, path, m) for path in (
            random_adapter(Path(tmp) / "all16", m, 16, 0), random_adapter(Path(tmp) / "other16", m, 16, 1),
            random_adapter(Path(tmp) / "qv8", m, 8, 2, ("q_proj", "v_proj"))))
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
            ours[batch] = best
        if args.llama_cpp:
            peer = llama_cpp(args.llama_cpp, Path(tmp) / "all16", args.model, prompt, args)
            for batch in (1, 8):
                without, with_adapter = peer[f"without {batch}"], peer[f"with {batch}"]
                mine = ours[batch]["rank 16 on all"]
                print(f"batch {batch}  llama.cpp {args.llama_cpp}: {without[0]:7.1f} tok/s without the adapter, "
                      f"{with_adapter[0]:7.1f} with it ({with_adapter[0] / without[0]:.2f}x); first token "
                      f"{1e3 * with_adapter[1]:.0f} ms with it. Ours with it: {mine[0] / with_adapter[0]:.2f}x its "
                      f"decode, {with_adapter[1] / mine[1]:.2f}x its first token", flush=True)


if __name__ == "__main__":
    main()
