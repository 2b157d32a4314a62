"""What the EAGLE CLI tests share (test_eagle_cli.py, test_eagle_forms.py): the tiny engine with a
random draft head, the requests, and answers compared within float rounding."""
from __future__ import annotations

import json

from tests.eagle_drafts import random_draft
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build

LIMITS = dict(max_batch_size=4, max_input_len=96, max_kv_cache_capacity=192)


def build_engine(tiny_checkpoint, tmp_path_factory):
    """(engine dir, draft head dir): the tiny llama with a random head on its layers 0, 1, 1."""
    root, ckpt = tmp_path_factory.mktemp("eagle-cli"), tiny_checkpoint("llama")
    draft = random_draft(ckpt, root / "draft", seed=3, aux=[0, 1, 1])  # the tiny model has 2 layers
    return build(BuildConfig(model=str(ckpt), output=str(root / "engine"), eagle=str(draft), **LIMITS),
                 log=lambda m: None), draft


def chat(text, **extra):
    return {"messages": [{"role": "user", "content": text}], **extra}


REQUESTS = [chat("Edge devices run small language models"),
            chat("What is the capital of France?", temperature=0.8, top_k=20, seed=7),
            chat("The quick brown fox", num_logprobs=3),
            chat("Numbers 0 1 2 3", stop=["4"], disable_spec_decode=True),
            chat("system user assistant tokens"),
            chat("Héllo wörld")]


class Near(float):
    """A logprob that equals another within float rounding: a verification's lm_head multiplies more
    rows than a plain step's, and its other positions' logprobs are computed in numpy, not the sampler."""

    def __eq__(self, other):
        return other is not None and abs(float(self) - float(other)) <= 1e-5

    __hash__ = float.__hash__


def near(logprobs):
    return logprobs and [[{**e, "logprob": e["logprob"] if e["logprob"] is None else Near(e["logprob"])} for e in step]
                         for step in logprobs]


def answers(run_cli, engine, tmp_path, *extra, batch_size=4, requests=REQUESTS):
    profile = tmp_path / "profile.json"
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 24, "batch_size": batch_size,
                                   "requests": requests}, "--profile", str(profile), *extra)
    assert result.exit_code == 0, result.output
    return [(r["output_text"], r["finish_reason"], near(r.get("logprobs"))) for r in out["responses"]], \
        json.loads(profile.read_text())


def same(got, want):
    """Texts and finish reasons equal; log-probabilities within float32 rounding of another graph."""
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for g, w in zip(got, want):
        if w[2] is not None:
            assert [[t["token_id"] for t in s] for s in g[2]] == [[t["token_id"] for t in s] for s in w[2]]
            assert max(abs(a["logprob"] - b["logprob"]) for s, r in zip(g[2], w[2]) for a, b in zip(s, r)) < 1e-4
    return True
