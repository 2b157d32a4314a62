"""Guided decoding against transformers: greedy answers under a JSON schema, a regex, a GBNF grammar
and a list of choices are token-exact with transformers' own greedy loop masked by llguidance
(its tokenizer built from transformers' tokenizer, not from ours), alone and in one batch. The
deliberately wrong variant (a matcher that never advances: the first token's mask at every step)
must differ."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
llguidance = pytest.importorskip("llguidance")

from llguidance.hf import from_tokenizer  # noqa: E402

from trtllm.runtime import grammar, guided  # noqa: E402

pytestmark = pytest.mark.hf
MAX_NEW = 24
GUIDES = {
    "regex": {"regex": "[a-e]{2,5}(, [a-e]{2,5})*\\."},
    "choice": {"choice": ["the quick fox", "a lazy dog", "hello world", "hello"]},
    "ebnf": {"ebnf": 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'},
    "json_schema": {"json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                                     "n": {"enum": [1, 2, 3]}},
                                    "required": ["ok", "n"], "additionalProperties": False}},
}
PROMPTS = ["hello there", "the quick brown fox"]


def reference(ckpt, prompt_ids: list[int], guide: dict | None) -> list[int]:
    """transformers' greedy tokens, each step's logits masked to what llguidance allows (guide None:
    not masked)."""
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    matcher = guide and llguidance.LLMatcher(from_tokenizer(tok, n_vocab=vocab), guided.parse(guide, "g").grammar())
    ids, out = list(prompt_ids), []
    with torch.no_grad():
        for _ in range(MAX_NEW):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            if matcher:
                bits = np.frombuffer(matcher.compute_bitmask(), np.uint8)
                allowed = torch.from_numpy(np.unpackbits(bits, bitorder="little")[:vocab].astype(bool))
                logits = torch.where(allowed, logits, -torch.inf)
            token = int(logits.argmax())
            out.append(token)
            if token == tok.eos_token_id:
                break
            assert not matcher or matcher.consume_token(token), matcher.get_error()
            ids.append(token)
    return out


def ours(run_cli, engine, guides: list[dict], batch_size: int = 1) -> list[tuple[list[int], list[int], str]]:
    """(prompt ids, generated ids, finish_reason) per request, greedy."""
    requests = [{"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                 **({"guided_decoding": g} if g else {})} for i, g in enumerate(guides)]
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": MAX_NEW, "num_logprobs": 1,
                                   "batch_size": batch_size, "requests": requests})
    assert result.exit_code == 0, result.output
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(engine)
    return [(tok.encode(r["formatted_complete_request"]), [t["token_id"] for t in r["token_logprobs"]],
             r["finish_reason"]) for r in out["responses"]]


@pytest.mark.parametrize("name", list(GUIDES))
def test_greedy_guided_tokens_match_transformers(run_cli, tiny_engine, tiny_checkpoint, name):
    engine, ckpt = tiny_engine("llama"), tiny_checkpoint("llama")
    (prompt, tokens, finish), = ours(run_cli, engine, [GUIDES[name]])
    assert tokens == reference(ckpt, prompt, GUIDES[name])
    if finish == "end-of-sequence":  # a whole match: the grammar allowed EOS only there
        text = transformers.AutoTokenizer.from_pretrained(ckpt).decode(tokens[:-1])
        if name == "json_schema":
            assert set(json.loads(text)) == {"ok", "n"}
        elif name == "choice":
            assert text in GUIDES[name]["choice"]


def test_a_batch_of_guides_answers_as_each_alone(run_cli, tiny_engine, tiny_checkpoint):
    """Four guided rows and an unguided one in one batch: each row's mask is its own."""
    engine, ckpt = tiny_engine("llama"), tiny_checkpoint("llama")
    guides = [*GUIDES.values(), None]
    got = ours(run_cli, engine, guides, batch_size=4)
    for (prompt, tokens, _), guide in zip(got, guides):
        assert tokens == reference(ckpt, prompt, guide)


def test_wrong_variant_a_matcher_that_never_advances_differs(run_cli, tiny_engine, tiny_checkpoint, monkeypatch):
    engine, ckpt = tiny_engine("llama"), tiny_checkpoint("llama")
    monkeypatch.setattr(grammar.Matcher, "consume", lambda self, token_id: None)
    (prompt, tokens, _), = ours(run_cli, engine, [GUIDES["regex"]])
    assert tokens != reference(ckpt, prompt, GUIDES["regex"])
