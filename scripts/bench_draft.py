"""What draft-model speculative decoding (--spec-draft-engine) buys, side by side with llama.cpp's
(llama-speculative): decode tok/s of a model with and without a draft engine on chat prompts, and
llama.cpp's speculative example with the same pair (the model's GGUF and the draft's).

    python scripts/bench_draft.py [--engine engines/smollm2-135m-instruct] [--draft engines/smollm2-int4]
        [--steps auto,4,8] [--batches 1,4] [--gen 128] [--rounds 3] [--threads 2] [--temperature T]
        [--llama-cpp ~/peers/llama.cpp/build/bin] [--gguf ~/peers/gguf/smollm2-135m-instruct-f32.gguf]
        [--draft-gguf ~/peers/models/SmolLM2-135M-Instruct.Q4_1.gguf]

The demo pair: the float32 demo engine, drafted for by its int4 build (trtllm-build --quantization
int4 --output engines/smollm2-int4), against llama.cpp's F32 GGUF drafted for by its Q4_1 GGUF:
a model and a smaller copy of it, as a 1B model and a 135M one of one family would be, at the size
this machine runs. llama-speculative is not in the peers' default build: `cmake
-DLLAMA_BUILD_EXAMPLES=ON . && ninja llama-speculative` in their llama.cpp build directory.

Each round runs every case once, every other round in reverse order; a case's figure is its decode
tok/s (ours: the generated tokens after each prompt's first over the decode steps' time, the draft's
steps included; llama.cpp's: its own "decoded" line, batch 1 only), and the ratios are paired by
round: median [min-max]. Ours checks that the draft changes no token (sampled: the same seed, the
same text); llama.cpp's acceptance is printed beside ours.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_eagle import QUESTIONS  # noqa: E402
from bench_ngram import SAMPLED, speed_and_acceptance, spread  # noqa: E402


def ours(engine, rows_for, draft, batch: list[list[int]], args, seed: int):
    from trtllm.runtime.generate import Timing, run_rows

    rows, t = rows_for(batch, seed), Timing()
    run_rows(engine, rows, timing=t, lookup=draft)
    return t.generated_tokens / t.generation_seconds, [r.output_ids for r in rows], t


def llama_speculative(args, prompt: str, seed: int) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt)
    try:
        out = subprocess.run([str(args.llama_cpp / "llama-speculative"), "-m", str(args.gguf), "-md",
                              str(args.draft_gguf), "-f", f.name, "-n", str(args.gen), "--spec-draft-n-max", "8",
                              "-t", str(args.threads), "-td", str(args.threads), "--temp", str(args.temperature),
                              "--seed", str(seed), "--ignore-eos", "-ngl", "0", "-ngld", "0",
                              *(["--top-k", str(SAMPLED["top_k"]), "--top-p", str(SAMPLED["top_p"]),
                                 "--min-p", str(SAMPLED["min_p"])] if args.temperature > 0 else [])],
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "LD_LIBRARY_PATH": str(args.llama_cpp)}).stderr
    finally:
        os.unlink(f.name)
    return speed_and_acceptance(out, "llama-speculative")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path, default=ROOT / "engines" / "smollm2-135m-instruct")
    ap.add_argument("--draft", type=Path, default=ROOT / "engines" / "smollm2-int4")
    ap.add_argument("--steps", default="auto,4,8")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: sampled (top-k 40, top-p 0.95, min-p 0.05 for both), seed = the round")
    ap.add_argument("--llama-cpp", type=Path, default=Path.home() / "peers" / "llama.cpp" / "build" / "bin")
    ap.add_argument("--gguf", type=Path, default=Path.home() / "peers" / "gguf" / "smollm2-135m-instruct-f32.gguf")
    ap.add_argument("--draft-gguf", type=Path,
                    default=Path.home() / "peers" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from trtllm.runtime import draft_model
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState
    from trtllm.runtime.sampling import SamplingParams
    from trtllm.runtime.tokenizer import Tokenizer

    engine = load_engine(args.engine, num_threads=args.threads, shared_threads=True)
    tokenizer = Tokenizer.from_engine_dir(args.engine, engine.manifest.files)
    draft_model.check(args.draft, engine.manifest, args.engine, tokenizer.vocab())
    drafter = load_engine(args.draft, num_threads=args.threads, shared_threads=True)
    template = ChatTemplate.from_engine_dir(args.engine, engine.manifest.files)
    texts = [template.format([{"role": "user", "content": q}]).text for q in QUESTIONS]
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    ban = {t: -100.0 for t in engine.manifest.eos_token_ids}  # every row its whole length, as --ignore-eos

    def rows_for(batch, seed):
        params = SamplingParams(temperature=args.temperature, max_new_tokens=args.gen, logit_bias=ban,
                                **(SAMPLED if args.temperature > 0 else {}))
        return [RowState(prompt_ids=p, params=params, rng=np.random.default_rng(seed + i),
                         eos_ids=frozenset(engine.manifest.eos_token_ids)) for i, p in enumerate(batch)]

    steps = args.steps.split(",")
    peer = (args.llama_cpp / "llama-speculative").is_file() and args.gguf.is_file() and args.draft_gguf.is_file()
    if not peer:
        print(f"llama-speculative, {args.gguf} or {args.draft_gguf} not found: ours alone", file=sys.stderr)
    report = {}
    for size in map(int, args.batches.split(",")):
        cases = ["plain"] + [f"draft {s}" for s in steps] + (["llama.cpp"] if peer and size == 1 else [])
        rates = {c: [] for c in cases}
        accept: dict[str, list] = {c: [] for c in cases}
        for r in range(args.rounds):
            for i in range(0, len(prompts), size):
                batch, ids = prompts[i:i + size], {}
                for case in cases if r % 2 == 0 else cases[::-1]:
                    if case == "llama.cpp":
                        rate, acc = llama_speculative(args, texts[i], r)
                    else:
                        step = case.removeprefix("draft ")
                        draft = None if case == "plain" else draft_model.DraftModel(
                            drafter, draft_model.DRAFTS if step == "auto" else int(step), adaptive=step == "auto")
                        rate, ids[case], t = ours(engine, rows_for, draft, batch, args, r)
                        acc = t.accepted_tokens / t.drafted_tokens if t.drafted_tokens else float("nan")
                    rates[case].append(rate)
                    accept[case].append(acc)
                if any(v != ids["plain"] for v in ids.values()):
                    print(f"error: the draft changed our tokens at batch {size}", file=sys.stderr)
                    return 1
        row = {c: round(float(np.median(v)), 1) for c, v in rates.items()}
        for c in cases[1:]:
            row[f"{c} / plain"] = spread([a / b for a, b in zip(rates[c], rates["plain"])])
            row[f"{c} acceptance"] = round(float(np.nanmean(accept[c])), 3)
        if "llama.cpp" in cases:
            best = max(cases[1:-1], key=lambda c: np.median(rates[c]))
            row[f"{best} / llama.cpp"] = spread([a / b for a, b in zip(rates[best], rates["llama.cpp"])])
        report[f"batch {size}"] = row
        print(f"batch {size}: " + json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
