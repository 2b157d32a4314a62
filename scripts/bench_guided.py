#!/usr/bin/env python3
"""Guided decoding against the peers: what a grammar costs each system per generated token, and who
decodes guided answers faster.

    python scripts/bench_guided.py [--systems fp32,ortgenai-fp32,llamacpp-f32,int4,ortgenai-int4,llamacpp-q4_1]
        [--rounds 3] [--runs 3] [--gen 160] [--batch 8] [--threads 2] [--llama-build DIR] [--out FILE]
    python scripts/bench_guided.py --smoke     # ours only, on a tiny model (tests)

Every system runs in its own subprocess, one after the other (every other round in reverse order),
on the same prompt ids (the demo's chat template, a request for six people as JSON). Two guides:
`gbnf`, one grammar (compact JSON: six {"name","age"} objects) given to every system as the same
text (ours: `ebnf`; llama.cpp: GBNF; onnxruntime-genai: llguidance's Lark translation of it), and
`schema`, one JSON schema given to each system's own converter (ours and onnxruntime-genai:
llguidance; llama.cpp: llama-cpp-python's json_schema_to_gbnf). Greedy, until the grammar ends
(EOS) or --gen tokens. In one process each system measures, at batch 1 and --batch (copies of the
prompt), the guided decode rate (tokens after the first / time from the first to the last) and the
unguided rate over as many tokens (EOS held back), alternately, the median of --runs after a
warm-up. llama.cpp is driven as its server samples (common_sampler): the argmax is checked against
the grammar alone and the whole vocabulary masked only when the grammar refuses it.

Printed per system: guided and unguided rates, guided / unguided (what the grammar costs it,
paired within its process), and each guide's answer; per precision, ours / the best peer for the
guided rate, paired by round, as the median [min-max] over the rounds.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (stdlib only at import: the peers' interpreter loads it too)
import bench_sampled  # noqa: E402

OURS = bench_sampled.OURS
PRECISION = bench_sampled.PRECISION
PROMPT = ("Name six famous scientists and the age at which each died, as JSON: "
          '{"people": [{"name": ..., "age": ...}, ...]}')
GBNF = r'''root ::= "{\"people\":[" person ("," person){5} "]}"
person ::= "{\"name\":\"" [A-Za-z .]{1,24} "\",\"age\":" [0-9]{1,3} "}"
'''
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["people"], "properties": {
    "people": {"type": "array", "minItems": 6, "maxItems": 6, "items": {
        "type": "object", "additionalProperties": False, "required": ["name", "age"], "properties": {
            "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 130}}}}}}
GUIDES = ("gbnf", "schema")


# --- workers (each in its own process): run(ids_list, gen, guide) -> (decode seconds, tokens, row 0's ids)

def ours(engine_dir: Path, threads: int):
    import numpy as np

    from trtllm.runtime import guided
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, Timing, run_rows
    from trtllm.runtime.grammar import Grammars
    from trtllm.runtime.sampling import SamplingParams
    from trtllm.runtime.tokenizer import Tokenizer

    engine = load_engine(engine_dir, num_threads=threads)
    tok, eos = Tokenizer.from_engine_dir(engine_dir), list(engine.manifest.eos_token_ids)
    grammars = Grammars(tok.to_json(), engine.manifest.model.vocab_size, eos, tok.vocab_size)
    guides = {"gbnf": guided.parse({"ebnf": GBNF}, "guided_decoding"),
              "schema": guided.parse({"json_schema": SCHEMA}, "guided_decoding")}

    def run(ids_list, gen, guide):
        params = SamplingParams(temperature=0, max_new_tokens=gen, min_new_tokens=0 if guide else gen)
        rows = [RowState(prompt_ids=ids, params=params, rng=np.random.default_rng(i), eos_ids=frozenset(eos),
                         guide=guide and grammars.matcher(guides[guide]), speculative=False)
                for i, ids in enumerate(ids_list)]
        stamps: list[float] = []
        run_rows(engine, rows, len(rows), Timing(), on_token=lambda r: stamps.append(time.perf_counter()))
        assert all(r.error is None for r in rows), [r.error for r in rows]
        first = stamps[len(rows) - 1]
        return stamps[-1] - first, max(len(r.output_ids) for r in rows), rows[0].output_ids
    return run


def ortgenai(path: str, threads: int):
    import numpy as np
    import onnxruntime_genai as og

    runner = bench_sampled.bench_peers().ORTRunner(path, threads)
    lark = json.loads(os.environ["BENCH_GUIDED_LARK"])

    def run(ids_list, gen, guide):
        batch, n = len(ids_list), len(ids_list[0])
        p = og.GeneratorParams(runner.model)
        p.set_search_options(do_sample=False, batch_size=batch, max_length=n + gen,
                             min_length=n if guide else n + gen)
        if guide:
            p.set_guidance(*(("lark_grammar", lark) if guide == "gbnf" else ("json_schema", json.dumps(SCHEMA))))
        g = og.Generator(runner.model, p)
        ids = np.asarray(ids_list, dtype=np.int32)
        g.append_tokens(ids if batch > 1 else ids[0])
        g.generate_next_token()
        t1 = time.perf_counter()
        while not g.is_done():
            g.generate_next_token()
        elapsed = time.perf_counter() - t1
        out = [int(t) for t in g.get_sequence(0)[n:]]
        return elapsed, len(out), out
    return run


def llamacpp(path: str, threads: int):
    import ctypes

    import numpy as np
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    runner = bench_sampled.bench_peers().LlamaCppRunner(path, threads)
    L, n_vocab = runner.L, runner.n_vocab
    grammar_text = {"gbnf": GBNF, "schema": json_schema_to_gbnf(json.dumps(SCHEMA))}
    data = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data
    assert data.itemsize == ctypes.sizeof(L.llama_token_data)
    one, full = np.zeros(1, data), np.zeros(n_vocab, data)

    def apply(sampler, candidates) -> None:
        arr = L.llama_token_data_array(candidates.ctypes.data_as(ctypes.POINTER(L.llama_token_data)),
                                       len(candidates), -1, False)
        L.llama_sampler_apply(sampler, ctypes.byref(arr))

    def pick(sampler, ctx, i) -> int:
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
        token = int(logits.argmax())
        if sampler is None:
            return token
        one["id"], one["logit"] = token, logits[token]  # the grammar on the argmax alone first
        apply(sampler, one)
        if not np.isfinite(one["logit"][0]):  # refused: mask the whole vocabulary
            full["id"], full["logit"] = np.arange(n_vocab), logits
            apply(sampler, full)
            token = int(full["id"][full["logit"].argmax()])
        L.llama_sampler_accept(sampler, token)
        return token

    def run(ids_list, gen, guide):
        batch, n = len(ids_list), len(ids_list[0])
        ctx = runner.ctxs[1 if batch == 1 else max(runner.ctxs)]
        samplers = [L.llama_sampler_init_grammar(runner.vocab, grammar_text[guide].encode(), b"root") if guide
                    else None for _ in range(batch)]
        assert all(samplers) or not guide, "llama.cpp refused the grammar"
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        runner._fill([(t, pos, s, pos == n - 1) for s, ids in enumerate(ids_list) for pos, t in enumerate(ids)])
        assert L.llama_decode(ctx, runner.batch) == 0
        last = [pick(samplers[s], ctx, s * n + n - 1) for s in range(batch)]
        out, t1 = [last[0]], time.perf_counter()
        while len(out) < gen and not (guide and L.llama_vocab_is_eog(runner.vocab, last[0])):
            runner._fill([(last[s], n + len(out) - 1, s, True) for s in range(batch)])
            assert L.llama_decode(ctx, runner.batch) == 0
            last = [pick(samplers[s], ctx, s) for s in range(batch)]
            out.append(last[0])
        elapsed = time.perf_counter() - t1
        for s in samplers:
            if s:
                L.llama_sampler_free(s)
        return elapsed, len(out), out
    return run


def prompt_ids(tokenizer_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tokenizer_dir).apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def worker(name: str, args) -> dict:
    from transformers import AutoTokenizer

    prompt, tokenizer = prompt_ids(args._tokenizer), AutoTokenizer.from_pretrained(args._tokenizer)
    if name in OURS:
        run = ours(args._engine, args.threads)
    elif name.startswith("ortgenai-"):
        run = ortgenai(bench_sampled.bench_peers().ORT[name], args.threads)
    else:
        run = llamacpp(bench_sampled.bench_peers().GGUF[name], args.threads)
    out = {"system": name}
    for guide in GUIDES:
        _, steps, ids = run([prompt], args.gen, guide)  # warm-up; the answer
        out[f"{guide}_answer"] = tokenizer.decode(ids, skip_special_tokens=True)
        out[f"{guide}_tokens"] = steps
        for batch in (1, args.batch):
            rates = {True: [], False: []}
            run([prompt] * batch, 8, None)
            for k in range(args.runs):
                for guided in ((True, False) if k % 2 == 0 else (False, True)):
                    seconds, n, _ = run([prompt] * batch, steps, guide if guided else None)
                    assert n == steps, (guide, guided, n, steps)  # (greedy: every run the same answer)
                    rates[guided].append(batch * (steps - 1) / seconds)
            out[f"{guide}_b{batch}"] = round(statistics.median(rates[True]), 1)
            out[f"{guide}_b{batch}_plain"] = round(statistics.median(rates[False]), 1)
    return out


def smoke(args) -> None:
    import tempfile

    sys.path.insert(0, str(bench.ROOT))
    from tests.tiny_models import make_checkpoint

    tmp = Path(tempfile.mkdtemp(prefix="trtllm-bench-guided-"))
    args._tokenizer = make_checkpoint("llama", tmp / "ckpt", max_positions=1024)
    OURS["fp32"] = tmp / "engine"
    bench.ensure_engine(args._tokenizer, OURS["fp32"], [],
                        ["--max-input-len", "256", "--max-kv-cache-capacity", "512", "--no-verify"])
    args.systems, args.gen, args.runs, args.batch, args.rounds = "fp32", 48, 1, 2, 1


# --- the driver --------------------------------------------------------------------------------

def report(rounds: dict[str, list[dict]], batch: int) -> list[str]:
    lines = []
    for name, runs in rounds.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            lines.append(f"{name:<15} failed: {runs[-1]['error']}")
            continue
        for guide in GUIDES:
            cells = []
            for b in (1, batch):
                g, p = (statistics.median(r[f"{guide}_b{b}{m}"] for r in ok) for m in ("", "_plain"))
                cost = [r[f"{guide}_b{b}"] / r[f"{guide}_b{b}_plain"] for r in ok]
                cells.append(f"b{b}: guided {g:6.1f}  plain {p:6.1f} tok/s  guided/plain {statistics.median(cost):.2f} "
                             f"[{min(cost):.2f}-{max(cost):.2f}]")
            lines.append(f"{name:<15} {guide:<6} " + "   ".join(cells))
            lines.append(f"{'':<15} {guide:<6} {ok[-1][f'{guide}_tokens']} tokens: {json.dumps(ok[-1][f'{guide}_answer'])}")
    for name in (n for n in rounds if n in OURS):
        for guide in GUIDES:
            for b in (1, batch):
                if ratios := bench_sampled.paired(rounds, name, f"{guide}_b{b}"):
                    lines.append(f"ours {name} {guide} guided b{b} / best {PRECISION[name]} peer: "
                                 f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench_sampled.add_arguments(ap, "fp32,ortgenai-fp32,llamacpp-f32,int4,ortgenai-int4,llamacpp-q4_1", 160,
                                "bench_guided.json", "ours only, a tiny model, 1 run")
    args = ap.parse_args()
    if args.smoke:
        smoke(args)
    if args._worker:
        print("@@RESULT@@" + json.dumps(worker(args._worker, args)), flush=True)
        return
    from llguidance.gbnf_to_lark import gbnf_to_lark  # (the peers' interpreter has none)

    lark = {"BENCH_GUIDED_LARK": json.dumps(gbnf_to_lark(GBNF))}
    rounds = bench_sampled.run_rounds(args, "bench_guided",
                                      lambda name, a: bench_sampled.measure(name, a, __file__, lark))
    bench_sampled.write(args.out, rounds, report(rounds, args.batch))


if __name__ == "__main__":
    main()
