#!/usr/bin/env python3
"""A mixture of experts against llama.cpp, side by side in one run (after ../shared/peers/setup.sh).

    python scripts/bench_moe.py [--rounds 3] [--threads 2] [--work DIR]

No MoE checkpoint can be downloaded here, so the model is a synthetic Qwen3-MoE written with
transformers (random weights, the demo model's tokenizer): 8 layers, hidden 1024, 32 experts of
width 512, 8 a token (478M parameters, 140M active a token). Timings do not depend on the weights'
values: every token runs 8 experts whatever they are. llama.cpp gets the same checkpoint through
its own converter (F32 and BF16), and Q4_1 from its llama-quantize; we build float32, bfloat16 and
int4 engines.

Protocol: scripts/bench.py's for ours (its worker: TTFT at 128 and 512 prompt tokens, decode at
batch 1 after the 128-token prompt and at batch 8, greedy, EOS ignored); llama.cpp's own tools for
it: llama-bench's prompt processing (pp128, pp512: TTFT = n / rate) and decode after a 128-token
context (tg with -d 128), llama-batched-bench for batch 8 (8 sequences of 128 prompt tokens, their
generation rate). llama.cpp's tools load the libraries of its build without AMX
(`--llama-libs`, docs/performance.md's Fairness: this VM does not enable AMX tile state, and the
AMX build's Q4_1 prompt kernels crash). Every system once a round, every other round in reverse order; ratios are paired
by round (> 1: ours is better), as scripts/bench.py gives them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (scripts/bench.py: our worker, paired ratios)

from trtllm.plugins import cpu as cpu_kernels  # noqa: E402
from trtllm.runtime import manifest as mf  # noqa: E402

ROOT, PEERS_DIR = bench.ROOT, bench.PEERS_DIR
OUR_MOE = {cpu_kernels.MOE_LOWERING, cpu_kernels.MOE_QUANT_LOWERING}
OURS = {"fp32": [], "bf16": ["--dtype", "bfloat16"], "int4": ["--quantization", "int4"]}
# llama.cpp's files, by the name the peer is measured under: (file name after the model's stem, precision)
LLAMA = {"llamacpp-f32": ("f32.gguf", "fp32"), "llamacpp-bf16": ("bf16.gguf", "bf16"),
         "llamacpp-q4_1": ("q4_1.gguf", "int4")}
ORDER = ["fp32", "llamacpp-f32", "bf16", "llamacpp-bf16", "int4", "llamacpp-q4_1"]


def make_checkpoint(out: Path) -> None:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(bench.DEMO)
    config = transformers.Qwen3MoeConfig(
        vocab_size=len(tok), hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=8, head_dim=64, num_experts=32, num_experts_per_tok=8,
        norm_topk_prob=True, max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def prepare(work: Path, llama_bin: Path, script: str = __file__, stem: str = "moe", ours: dict = OURS,
            kernels: set = OUR_MOE) -> dict[str, Path]:
    """The checkpoint (`script --_checkpoint DIR` makes it), llama.cpp's GGUF files (`stem`-f32.gguf ...)
    and our engines (`ours`: name -> trtllm-build options; rebuilt where built before the `kernels`
    lowerings were), each made once."""
    ckpt = work / "ckpt"
    if not (ckpt / "config.json").is_file():
        # in a child process: a child's peak RSS (wait4) starts from this process's at fork, so the
        # checkpoint's gigabytes held here would count in every system's figure
        subprocess.run([sys.executable, script, "--_checkpoint", str(ckpt)], check=True)
    convert = next((PEERS_DIR / "src").glob("llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    for outtype in ("f32", "bf16"):
        gguf = work / f"{stem}-{outtype}.gguf"
        if not gguf.is_file():
            subprocess.run([str(PEERS_DIR / "venv" / "bin" / "python"), str(convert), str(ckpt), "--outtype", outtype,
                            "--outfile", str(gguf)], check=True, capture_output=True)
    if not (work / f"{stem}-q4_1.gguf").is_file():
        subprocess.run([str(llama_bin / "llama-quantize"), str(work / f"{stem}-f32.gguf"),
                        str(work / f"{stem}-q4_1.gguf"), "Q4_1", "2"], check=True, capture_output=True)
    engines = {}
    for name, options in ours.items():
        engines[name] = work / f"engine-{name}"
        # random weights: int4 misses the build's agreement floor, which measures nothing here
        extra = ["--max-input-len", "512", "--max-kv-cache-capacity", "1024", "--no-verify"]
        bench.ensure_engine(ckpt, engines[name], options, extra)
        if cpu_kernels.library() is not None and not set(mf.load(engines[name]).lowerings) & kernels:
            # built before our kernel, with the same options (ensure_engine compares options only)
            shutil.rmtree(engines[name])
            bench.ensure_engine(ckpt, engines[name], options, extra)
    return {"ckpt": ckpt, **engines}


def measure_llama(peer: str, work: Path, llama_bin: Path, args, stem: str = "moe") -> dict:
    gguf, precision = LLAMA[peer]
    gguf = f"{stem}-{gguf}"
    res = {"peer": peer, "precision": precision}
    env = {**os.environ, "LD_LIBRARY_PATH": str(args.llama_libs)}
    cmd = [str(llama_bin / "llama-bench"), "-m", str(work / gguf), "-t", str(args.threads), "-r", str(args.runs),
           "-o", "json"]
    prompt, _, rss = bench.run_measured(cmd + ["-p", "128,512", "-n", "0"], args.timeout, env)
    decode, _, rss2 = bench.run_measured(cmd + ["-p", "0", "-n", str(args.gen), "-d", "128"], args.timeout, env)
    batched, _, rss3 = bench.run_measured([str(llama_bin / "llama-batched-bench"), "-m", str(work / gguf), "-t",
                                           str(args.threads), "-c", "2048", "-npp", "128", "-ntg", str(args.gen),
                                           "-npl", "8", "--output-format", "jsonl"], args.timeout, env)
    try:
        rates = {e["n_prompt"]: e["avg_ts"] for e in json.loads(prompt)}
        res["ttft128_ms"] = round(128_000 / rates[128], 1)
        res["ttft512_ms"] = round(512_000 / rates[512], 1)
        res["dec_b1_tps"] = round(json.loads(decode)[0]["avg_ts"], 1)
        rows = [json.loads(line) for line in batched.splitlines() if line.startswith("{")]
        res["dec_b8_tps"] = round(next(r["speed_tg"] for r in rows if r.get("pl") == 8), 1)
    except (ValueError, LookupError, TypeError, StopIteration) as e:
        res["error"] = f"llama.cpp's output not read: {type(e).__name__}: {e}"
    res["peak_rss_mb"] = round(max(rss, rss2, rss3), 1)
    return res


def main(doc: str = __doc__, script: str = __file__, stem: str = "moe", ours: dict = OURS, order: list = ORDER,
         kernels: set = OUR_MOE, checkpoint=make_checkpoint, model: str = "synthetic Qwen3-MoE (scripts/bench_moe.py)"):
    """The bench (scripts/bench_mamba.py runs it for its own model: its checkpoint, engines and names)."""
    if sys.argv[1:2] == ["--_checkpoint"]:  # prepare()'s child
        return checkpoint(Path(sys.argv[2]))
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--work", type=Path, default=ROOT / "out" / f"bench-{stem}")
    ap.add_argument("--llama-build", type=Path, default=PEERS_DIR / "llama.cpp" / "build",
                    help="where llama-bench, llama-batched-bench and llama-quantize are (bin/)")
    ap.add_argument("--llama-libs", type=Path, default=PEERS_DIR / "llama.cpp" / "build-noamx" / "bin",
                    help="the libraries they load: the build without AMX (see the docstring)")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / f"bench-{stem}.json")
    ap.add_argument("--systems", default=",".join(order), help=f"which of {','.join(order)} (default: all)")
    args = ap.parse_args()
    order = [name for name in order if name in args.systems.split(",")]
    args.batch = 8
    llama_bin = args.llama_build / "bin"
    args.work.mkdir(parents=True, exist_ok=True)
    paths = prepare(args.work, llama_bin, script, stem, ours, kernels)
    rounds: dict[str, list[dict]] = {name: [] for name in order}
    for k in range(args.rounds):
        for name in order if k % 2 == 0 else order[::-1]:
            if name in ours:
                res = bench.measure_ours(name, paths[name], paths["ckpt"], args)
            else:
                res = measure_llama(name, args.work, llama_bin, args, stem)
            rounds[name].append(res)
            print(f"round {k + 1}: {name}: " + ", ".join(f"{m} {res.get(m)}" for m, _ in bench.METRICS), flush=True)
    results = [{**bench.best_of(rounds[name]), "peer": rounds[name][0]["peer"]} for name in order]
    bench.add_ratios(results, rounds)
    for r in results:
        print(f"{r['peer']:<16}{r['precision']:>5}  " + "  ".join(f"{m} {r.get(m)}" for m, _ in bench.METRICS) +
              ("  ratios " + " / ".join(f"{r.get(f'ratio_{m}')} {r.get(f'ratio_{m}_range')}" for m, _ in bench.METRICS)
               if r["peer"].startswith("trtllm-") else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"model": model, "threads": args.threads,
                                    "gen": args.gen, "rounds": args.rounds, "llama_libs": str(args.llama_libs),
                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
