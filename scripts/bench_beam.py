"""Beam search speed side by side with the peers that have it: transformers' generate(num_beams) and
onnxruntime-genai's beam search, on the demo model in float32 (llama.cpp has no beam search).

    python scripts/bench_beam.py [--engine engines/smollm2-135m-instruct] [--beams 4] [--gen 64]
        [--rounds 4] [--threads 2] [--peers ~/peers] [--out docs/bench/beam-run1.json]

Each round runs every system once, each in a process of its own (ours in this environment, the
peers in the peers' venv: bash ../shared/peers/setup.sh), every other round in reverse order. A
process loads its model, runs one short search to warm up, then times one whole beam search of
--gen tokens from the same chat prompt's ids, EOS held back until the last token (min_new_tokens =
--gen, so every system runs every step with every beam). A system's figure is beam tokens per
second (beams x tokens / the search's seconds); the ratios, ours over each peer, are paired by
round: median [min-max]. It also says whether each peer's best beam is ours, token for token.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "Explain in a few sentences how a CPU cache speeds up a program."


def worker(kind: str, model: str, ids: list[int], beams: int, gen: int, threads: int, eos: list[int]) -> dict:
    """One system's timed search (run in its own process): {"seconds", "best"}."""
    if kind == "ours":
        from trtllm.runtime import beam
        from trtllm.runtime.engine import load_engine

        engine = load_engine(model, num_threads=threads)

        def search(n):
            return list(beam.run(engine, ids, beam.BeamParams(beams, n, frozenset(eos), min_new_tokens=n))[0].tokens)
    elif kind == "transformers":
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

        def search(n):
            x = torch.tensor([ids])
            with torch.inference_mode():
                out = hf.generate(x, attention_mask=torch.ones_like(x), num_beams=beams, do_sample=False,
                                  max_new_tokens=n, min_new_tokens=n, eos_token_id=eos, pad_token_id=eos[0])
            return out[0, len(ids):].tolist()
    else:
        import numpy as np
        import onnxruntime_genai as og

        cfg = og.Config(model)
        cfg.clear_providers()
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
        og_model = og.Model(cfg)

        def search(n):
            p = og.GeneratorParams(og_model)
            p.set_search_options(do_sample=False, num_beams=beams, max_length=len(ids) + n, min_length=len(ids) + n)
            g = og.Generator(og_model, p)
            g.append_tokens(np.asarray(ids, np.int32))
            while not g.is_done():
                g.generate_next_token()
            return [int(t) for t in g.get_sequence(0)[len(ids):]]
    search(4)  # warm-up
    t0 = time.perf_counter()
    best = search(gen)
    return {"seconds": time.perf_counter() - t0, "best": best}


def spread(values) -> str:
    import numpy as np

    return f"{np.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", type=Path, default=ROOT / "engines" / "smollm2-135m-instruct")
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peers", type=Path, default=Path.home() / "peers")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ids", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--eos", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.model, json.loads(args.ids), args.beams, args.gen, args.threads,
                                json.loads(args.eos))))
        return 0
    from trtllm.runtime import manifest as mf
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.tokenizer import Tokenizer

    m = mf.load(args.engine)
    template = ChatTemplate.from_engine_dir(args.engine, m.files)
    text = template.format([{"role": "user", "content": QUESTION}], add_generation_prompt=True).text \
        if template is not None else QUESTION  # (a base model's engine has no template)
    ids = Tokenizer.from_engine_dir(args.engine, m.files).encode(text, add_special_tokens=template is None)
    python = args.peers / "venv" / "bin" / "python"
    systems = {"ours": (sys.executable, str(args.engine)),
               "transformers": (str(python), str(args.peers / "models" / "smollm2-135m-instruct")),
               "onnxruntime-genai": (str(python), str(args.peers / "ortgenai" / "fp32"))}
    if not python.is_file():
        print(f"{python} not found: ours alone (bash ../shared/peers/setup.sh installs the peers)", file=sys.stderr)
        systems = {"ours": systems["ours"]}
    results = {name: [] for name in systems}
    for r in range(args.rounds):
        for name in list(systems) if r % 2 == 0 else list(systems)[::-1]:
            exe, model = systems[name]
            done = subprocess.run([exe, __file__, "--worker", name, "--model", model, "--ids", json.dumps(ids),
                                   "--eos", json.dumps(list(m.eos_token_ids)), "--beams", str(args.beams),
                                   "--gen", str(args.gen), "--threads", str(args.threads)],
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode:
                raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r} {name}: {results[name][-1]['seconds']:.2f} s", file=sys.stderr)
    rate = {name: [args.beams * args.gen / x["seconds"] for x in runs] for name, runs in results.items()}
    report = {"beams": args.beams, "gen": args.gen, "threads": args.threads, "prompt_tokens": len(ids),
              "beam_tokens_per_second": {name: v for name, v in rate.items()}}  # (in round order)
    for name in systems:
        if name != "ours":
            report[f"ours over {name}"] = spread([a / b for a, b in zip(rate["ours"], rate[name])])
            report[f"{name}'s best beam is ours"] = all(x["best"] == y["best"]
                                                         for x, y in zip(results["ours"], results[name]))
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
