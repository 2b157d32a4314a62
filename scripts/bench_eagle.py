"""What EAGLE speculation buys: decode tok/s of an EAGLE engine with speculation off and with
k drafted tokens per step, at batch 1 and 4, on chat prompts the draft head was not trained on.

    python scripts/bench_eagle.py ENGINE [--steps 0,auto,1,2,3,4,2x3] [--batches 1,4] [--rounds 3] [--threads 2]
        [--temperature T --top-p P]   # sampled (seeded) requests instead of greedy ones

A step DxK drafts a tree D deep (or auto) with K candidates per node (--spec-draft-top-k K); a plain
D is a chain (K = 1). A step ending in "-argmax" (1-argmax, 2x3-argmax) drafts the head's most likely
tokens for sampled requests too, instead of guesses at their draws (runtime/speculative.py), to
compare the two.

e.g. after
    python scripts/train_eagle.py --model models/smollm2-135m-instruct --output models/smollm2-eagle3
    trtllm-build --model models/smollm2-135m-instruct --output engines/smollm2-int4-eagle \\
        --quantization int4 --eagle models/smollm2-eagle3

Tokens are the same whatever k, greedy or seeded sampled (tests/parity/test_eagle_parity.py,
test_eagle_sampled.py); the runs check it. Every
case runs once per round in one process, every other round in reverse order; each reports its
median tok/s and its ratio to the first --steps entry (k = 0) paired by round, as the median and
[min-max] over the rounds (this machine is shared: only ratios of one spell mean anything), with
the share of drafts accepted.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trtllm.runtime.chat_template import ChatTemplate  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, Timing, run_rows  # noqa: E402
from trtllm.runtime.sampling import SamplingParams  # noqa: E402
from trtllm.runtime.speculative import Drafter  # noqa: E402
from trtllm.runtime.tokenizer import Tokenizer  # noqa: E402

QUESTIONS = [
    "Why do leaves change colour in autumn?",
    "Write a short poem about a lighthouse keeper.",
    "Explain how a bicycle gear system works.",
    "Give me three tips for learning a new language.",
    "What is the difference between weather and climate?",
    "Describe how to make a simple tomato sauce.",
    "Summarise the causes of the French Revolution in a few sentences.",
    "How does a refrigerator keep food cold?",
]


def prompts(engine_dir: Path) -> list[list[int]]:
    tok, template = Tokenizer.from_engine_dir(engine_dir), ChatTemplate.from_engine_dir(engine_dir)
    return [tok.encode(template.format([{"role": "user", "content": q}]).text, add_special_tokens=False)
            for q in QUESTIONS]


def run(engine, drafter, batch: list[list[int]], gen: int, eos, temperature: float = 0.0,
        top_p: float = 1.0) -> tuple[float, list[list[int]], Timing]:
    """(decode tok/s: tokens after each row's first over the time from the batch's first token)."""
    params = SamplingParams(temperature=temperature, top_k=0, top_p=top_p, max_new_tokens=gen)
    rows = [RowState(prompt_ids=p, params=params, rng=np.random.default_rng(i), eos_ids=eos) for i, p in enumerate(batch)]
    stamps: list[float] = []
    timing = Timing()
    run_rows(engine, rows, len(rows), timing, on_token=lambda r: stamps.append(time.perf_counter()),
             drafter=drafter)
    decoded = sum(len(r.output_ids) - 1 for r in rows)
    return decoded / (stamps[-1] - stamps[len(rows) - 1]), [r.output_ids for r in rows], timing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--steps", default="0,auto,1,2,3,4")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    engine = load_engine(args.engine, num_threads=args.threads)
    eos = frozenset(engine.manifest.eos_token_ids)
    steps = args.steps.split(",")
    drafters = {}
    for k in steps:
        step, _, width = k.removesuffix("-argmax").partition("x")
        drafters[k] = Drafter.load(args.engine, engine.manifest, step if step == "auto" else int(step), int(width or 1))
        if drafters[k] is not None:
            drafters[k].guess = not k.endswith("-argmax")
    texts = prompts(args.engine)
    for batch in (int(b) for b in args.batches.split(",")):
        groups = [texts[i: i + batch] for i in range(0, len(texts), batch)]
        rates = {k: [] for k in steps}  # tok/s per round
        stats = {k: [0, 0, {}, 0] for k in steps}
        reference = None
        for r in range(args.rounds):
            for k in (steps if r % 2 == 0 else steps[::-1]):  # every other round reversed
                tps, outputs, spent = [], [], Timing()  # this round's
                for group in groups:
                    rate, out, timing = run(engine, drafters[k], group, args.gen, eos, args.temperature, args.top_p)
                    tps.append(rate)
                    outputs += out
                    spent.accepted_tokens += timing.accepted_tokens
                    spent.drafted_tokens += timing.drafted_tokens
                    spent.branch_tokens += timing.branch_tokens
                    for j, n in timing.draft_steps.items():
                        spent.draft_steps[j] = spent.draft_steps.get(j, 0) + n
                if reference is None:
                    reference = outputs
                assert outputs == reference, f"k={k} changed the tokens"
                rates[k].append(float(np.mean(tps)))
                stats[k] = [spent.accepted_tokens, spent.drafted_tokens, spent.draft_steps, spent.branch_tokens]
        base = rates[steps[0]]
        for k in steps:
            accepted, drafted, chosen, branches = stats[k]
            share = f", {accepted / drafted:.0%} of {drafted} drafts accepted" if drafted else ""
            share += f" ({branches} on a branch)" if "x" in k else ""
            if k.startswith("auto"):
                share += ", cycles per k: " + " ".join(f"{j}:{n}" for j, n in sorted(chosen.items()))
            ratios = [a / b for a, b in zip(rates[k], base)]  # paired by round: same spell of the machine
            print(f"batch {batch}  k={k}  {np.median(rates[k]):7.1f} tok/s  {np.median(ratios):.2f}x "
                  f"[{min(ratios):.2f}-{max(ratios):.2f}]{share}", flush=True)

if __name__ == "__main__":
    main()
