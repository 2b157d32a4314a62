"""What prompt lookup decoding (--spec-ngram) buys, side by side with llama.cpp's (llama-lookup):
greedy (or, with --temperature, sampled) decode tok/s on texts whose continuation repeats what they
hold, ours with and without lookup and llama.cpp's lookup example on the same text (its F32 GGUF, the
same draft length and sampling parameters).

    python scripts/bench_ngram.py [--engine engines/smollm2-135m-instruct] [--k 6] [--gen 128]
        [--rounds 4] [--threads 2] [--llama-cpp ~/peers/llama.cpp/build/bin]
        [--gguf ~/peers/gguf/smollm2-135m-instruct-f32.gguf] [--temperature 0.7] [--repetition-penalty 1.1]
    python scripts/bench_ngram.py --chat   # ours alone: chat answers, where few guesses hold, batch 1 and 8

--chat measures what lookup costs where it has little to find: scripts/bench_eagle.py's eight chat
questions, one at a time and all eight in one batch, ours with and without lookup, paired by round.

llama-lookup is not in the peers' default build: `cmake -DLLAMA_BUILD_EXAMPLES=ON . && ninja
llama-lookup` in their llama.cpp build directory (seconds: the libraries are built). Each round runs
every case once (every other round in reverse order); a case's figure is its decode tok/s (ours:
the generated tokens after the first over the decode steps' time; llama.cpp's: its own "decoded"
line), and the ratios are paired by round: median [min-max]. Ours checks that lookup changes no
token (sampled: each round's seed gives the same text with and without it); llama.cpp's answer is
its own (it does not hold EOS back, and its F32 kernels round differently), so its acceptance is
printed beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXTS = {
    "repeated paragraph": "The following paragraph is repeated three times.\n\nEdge devices run small language models "
                          "on CPUs and GPUs. They answer questions, summarize documents and write code without a "
                          "network connection.\n\nEdge devices run small language models on CPUs and GPUs. They answer "
                          "questions, summarize documents and write code without a network connection.\n\nEdge",
    "code": "import numpy as np\n\n\ndef test_add():\n    a = np.array([1, 2, 3])\n    b = np.array([4, 5, 6])\n"
            "    assert np.array_equal(a + b, np.array([5, 7, 9]))\n\n\ndef test_sub():\n    a = np.array([1, 2, 3])\n"
            "    b = np.array([4, 5, 6])\n    assert np.array_equal(a - b, np.array([-3, -3, -3]))\n\n\ndef test_mul():",
}
# (each ends inside a line: llama.cpp drops a prompt file's last newline, and the prompts must be the same)
SAMPLED = {"top_k": 40, "top_p": 0.95, "min_p": 0.05}  # --temperature > 0, both: llama.cpp defaults


def ours(engine, tokenizer, text: str, gen: int, k: int, temperature: float = 0.0,
         seed: int = 0, repetition_penalty: float = 1.0) -> tuple[float, list[int], float]:
    from trtllm.runtime.generate import RowState, Timing, run_rows
    from trtllm.runtime.ngram import Lookup
    from trtllm.runtime.sampling import SamplingParams

    # EOS banned, as llama.cpp's --ignore-eos does (ours would generate it and go on: another text)
    ban = {t: -100.0 for t in engine.manifest.eos_token_ids}
    params = SamplingParams(temperature=temperature, max_new_tokens=gen, logit_bias=ban,
                            repetition_penalty=repetition_penalty, **(SAMPLED if temperature > 0 else {}))
    row = RowState(prompt_ids=tokenizer.encode(text), params=params, rng=np.random.default_rng(seed),
                   eos_ids=frozenset(engine.manifest.eos_token_ids))
    t = Timing()
    run_rows(engine, [row], timing=t, lookup=Lookup(k) if k else None)
    return t.generated_tokens / t.generation_seconds, row.output_ids, t.accepted_tokens / max(t.drafted_tokens, 1)


def llama_lookup(binary: Path, gguf: Path, text: str, gen: int, k: int, threads: int, temperature: float = 0.0,
                 seed: int = 0, repetition_penalty: float = 1.0) -> tuple[float, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(text)
    try:
        out = subprocess.run([str(binary / "llama-lookup"), "-m", str(gguf), "-f", f.name, "-n", str(gen),
                              "--spec-draft-n-max", str(k), "-t", str(threads), "--temp", str(temperature),
                              "--ignore-eos", "--seed", str(seed), "--repeat-penalty", str(repetition_penalty),
                              *(["--top-k", str(SAMPLED["top_k"]), "--top-p", str(SAMPLED["top_p"]),
                                 "--min-p", str(SAMPLED["min_p"])] if temperature > 0 else [])],
                             capture_output=True, text=True, timeout=600,
                             env={**os.environ, "LD_LIBRARY_PATH": str(binary)}).stderr
    finally:
        os.unlink(f.name)
    return speed_and_acceptance(out, "llama-lookup")


def speed_and_acceptance(out: str, example: str) -> tuple[float, float]:
    """A llama.cpp speculative example's decode tok/s and accepted share, from what it printed."""
    speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+) t/s", out)
    accept = re.search(r"accept\s+=\s+([\d.]+)%", out)
    if not speed:
        raise RuntimeError(f"{example} printed no speed:\n{out[-2000:]}")
    return float(speed.group(1)), float(accept.group(1)) / 100 if accept else float("nan")


def spread(values) -> str:
    return f"{np.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path, default=ROOT / "engines" / "smollm2-135m-instruct")
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-cpp", type=Path, default=Path.home() / "peers" / "llama.cpp" / "build" / "bin")
    ap.add_argument("--gguf", type=Path, default=Path.home() / "peers" / "gguf" / "smollm2-135m-instruct-f32.gguf")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: sampled (top-k 40, top-p 0.95, min-p 0.05 for both), seed = the round")
    ap.add_argument("--repetition-penalty", type=float, default=1.0,
                    help="ours over the prompt and answer (transformers'); llama.cpp's --repeat-penalty over its "
                         "last 64 tokens, so the two texts differ")
    args = ap.parse_args(argv)
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.tokenizer import Tokenizer

    engine = load_engine(args.engine, num_threads=args.threads)
    tokenizer = Tokenizer.from_engine_dir(args.engine, engine.manifest.files)
    if args.chat:
        return chat(engine, tokenizer, args)
    peer = (args.llama_cpp / "llama-lookup").is_file() and args.gguf.is_file()
    if not peer:
        print(f"llama-lookup or {args.gguf} not found: ours alone", file=sys.stderr)
    cases = ["ours", "ours+lookup"] + (["llama.cpp+lookup"] * peer)
    results = {name: {c: [] for c in cases} for name in TEXTS}
    accept = {name: {} for name in TEXTS}
    for r in range(args.rounds):
        for name, text in TEXTS.items():
            for case in cases if r % 2 == 0 else cases[::-1]:
                if case == "llama.cpp+lookup":
                    speed, accept[name][case] = llama_lookup(args.llama_cpp, args.gguf, text, args.gen, args.k,
                                                             args.threads, args.temperature, r, args.repetition_penalty)
                else:
                    speed, ids, rate = ours(engine, tokenizer, text, args.gen, args.k if case != "ours" else 0,
                                            args.temperature, r, args.repetition_penalty)
                    accept[name].setdefault("ids", {}).setdefault(case, []).append(ids)
                    if case == "ours+lookup":
                        accept[name][case] = rate
                results[name][case].append(speed)
    report = {}
    for name in TEXTS:
        same = accept[name]["ids"]["ours"] == accept[name]["ids"]["ours+lookup"]
        res = results[name]
        row = {c: float(np.median(v)) for c, v in res.items()}
        row["lookup over plain (ours)"] = spread([a / b for a, b in zip(res["ours+lookup"], res["ours"])])
        if peer:
            row["ours+lookup over llama.cpp+lookup"] = spread([a / b for a, b in zip(res["ours+lookup"],
                                                                                       res["llama.cpp+lookup"])])
        row["acceptance"] = {c: round(v, 3) for c, v in accept[name].items() if c != "ids"}
        row["tokens unchanged by lookup"] = same
        report[name] = row
        print(f"{name}: " + json.dumps(row))
        if not same:
            print(f"error: lookup changed our tokens on {name!r}", file=sys.stderr)
            return 1
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


def chat(engine, tok, args) -> int:
    from bench_eagle import QUESTIONS
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.generate import RowState, Timing, run_rows
    from trtllm.runtime.ngram import Lookup
    from trtllm.runtime.sampling import SamplingParams

    template = ChatTemplate.from_engine_dir(args.engine, engine.manifest.files)
    prompts = [tok.encode(template.format([{"role": "user", "content": q}]).text, add_special_tokens=False)
               for q in QUESTIONS]

    def rate(batch, lookup):
        rows = [RowState(prompt_ids=p, params=SamplingParams(temperature=0.0, max_new_tokens=args.gen),
                         rng=np.random.default_rng(0), eos_ids=frozenset(engine.manifest.eos_token_ids)) for p in batch]
        t = Timing()
        run_rows(engine, rows, timing=t, lookup=lookup)
        return t.generated_tokens / t.generation_seconds, [r.output_ids for r in rows]

    for size in (1, 8):
        ratios = []
        for r in range(args.rounds):
            for i in range(0, len(prompts), size):
                order = (None, Lookup(args.k)) if r % 2 == 0 else (Lookup(args.k), None)
                (a, ids_a), (b, ids_b) = (rate(prompts[i:i + size], look) for look in order)
                if ids_a != ids_b:
                    print(f"error: lookup changed our tokens at batch {size}", file=sys.stderr)
                    return 1
                ratios.append(b / a if order[0] is None else a / b)
        print(f"chat, batch {size}: lookup over plain {spread(ratios)} ({len(ratios)} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
