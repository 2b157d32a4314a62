"""Guided decoding against transformers: greedy answers under a JSON schema, a regex, a GBNF grammar,
a list of choices and a structural tag are token-exact with transformers' own greedy loop masked by llguidance
(its tokenizer built from transformers' tokenizer, not from ours), alone and in one batch. The
deliberately wrong variant (a matcher that never advances: the first token's mask at every step)
must differ."""
from __future__ import annotations

import json
import re

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
    # free text in which every "e" must go on as a tag: a trigger the tiny model writes often
    "structural_tag": {"structural_tag": {"structures": [{"begin": "e=", "schema": {"enum": [1, 22]}, "end": ";"}],
                                          "triggers": ["e"]}},
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


def ours(run_cli, engine, guides: list[dict], batch_size: int = 1, *args, prompts=PROMPTS
         ) -> list[tuple[list[int], list[int], str]]:
    """(prompt ids, generated ids, finish_reason) per request, greedy; `args`: trtllm-run's."""
    requests = [{"messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                 **({"guided_decoding": g} if g else {})} for i, g in enumerate(guides)]
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": MAX_NEW, "num_logprobs": 1,
                                   "batch_size": batch_size, "requests": requests}, *args)
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
    if name == "structural_tag":  # the trigger came, and every "e" went on as a tag (the last maybe cut short)
        text = transformers.AutoTokenizer.from_pretrained(ckpt).decode(tokens, skip_special_tokens=True)
        assert "e=" in text and "e" not in re.sub(r"e(=(1|22?)?)?$", "", re.sub(r"e=(1|22);", "", text)), text


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


# --- EAGLE: greedy guided rows speculate, verified on the host under each position's mask ---------

@pytest.fixture(scope="module")
def eagle_engine(tiny_checkpoint, tmp_path_factory):
    pytest.importorskip("safetensors.numpy")
    from tests.eagle_drafts import random_draft
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    root = tmp_path_factory.mktemp("guided-eagle")
    draft = random_draft(tiny_checkpoint("llama"), root / "draft", seed=3, aux=[0, 1, 1])
    return build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(root / "engine"), eagle=str(draft),
                             max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)


def oracle(monkeypatch, want: dict, wrong_at: int | None):
    """Drafts that are the right tokens (a random head's are almost never accepted), but for the
    one at `wrong_at` in each chain or, in trees, a wrong first child under every right node; counts
    the cycles whose drafts were all accepted."""
    from trtllm.runtime import draft_tree
    from trtllm.runtime.speculative import SpecScheduler

    current, decode, ahead, grow = [None], SpecScheduler.decode, SpecScheduler.draft_ahead, draft_tree.grow
    right = lambda row, n: (want[tuple(row.prompt_ids)][len(row.output_ids):] + [0] * n)[:n]  # noqa: E731

    def draft_ahead(self, hi, rows, pos, ks, drafts, numbers):
        elapsed = ahead(self, hi, rows, pos, ks, drafts, numbers)
        for s, d in drafts.items():
            d[:] = right(rows[s], len(d))
            if wrong_at is not None and wrong_at < len(d):
                d[wrong_at] = (d[wrong_at] + 1) % 300
        return elapsed

    def grow_right(run_head, roots, batch, width, depth, size, guess=None):
        trees = grow(run_head, roots, batch, width, depth, size, guess)
        for s in trees:
            if size[s] >= 5 and depth >= 2:
                a, b = right(current[0].active[s], 2)
                trees[s] = draft_tree.DraftTree([roots[s][0], (a + 1) % 300, a, (b + 1) % 300, b],
                                                [-1, 0, 0, 2, 2], [0, 0, 1, 0, 1])
        return trees

    def tracked(self):
        current[0] = self
        return decode(self)

    monkeypatch.setattr(SpecScheduler, "decode", tracked)
    monkeypatch.setattr(SpecScheduler, "draft_ahead", draft_ahead)
    monkeypatch.setattr(draft_tree, "grow", grow_right)


@pytest.mark.parametrize("top_k, wrong_at", [(1, None), (1, 1), (2, None)])
def test_guided_rows_speculate_and_keep_transformers_tokens(run_cli, tiny_engine, tiny_checkpoint, eagle_engine,
                                                            monkeypatch, tmp_path, top_k, wrong_at):
    """Chains (all right, or the second draft wrong) and trees (a wrong sibling before each right
    node): every guide's tokens are transformers' masked greedy ones, next to an unguided row, and
    drafts were accepted. Verification runs each position under the mask after the tokens before it."""
    guides, prompts = [*GUIDES.values(), None], [f"{p} {i}" for i, p in enumerate(PROMPTS * 3)]  # (one each)
    plain = ours(run_cli, tiny_engine("llama"), guides, 4, prompts=prompts)
    want = {tuple(p): t for p, t, _ in plain}
    from trtllm.runtime.speculative import SpecScheduler

    oracle(monkeypatch, want, wrong_at)
    walks, walk = [], SpecScheduler.walk
    monkeypatch.setattr(SpecScheduler, "walk", lambda *a: walks.append(walk(*a)) or walks[-1])
    got = ours(run_cli, eagle_engine, guides, 4, "--spec-draft-step", "3", "--spec-draft-top-k", str(top_k),
               prompts=prompts)
    assert got == plain
    ckpt = tiny_checkpoint("llama")
    for (prompt, tokens, _), guide in zip(got, guides):
        assert tokens == reference(ckpt, prompt, guide)
    accepted = [len(path) for path, _ in walks]  # per guided row and cycle
    assert sum(accepted) >= len(walks) // 2 and max(accepted) == (1 if wrong_at == 1 else 3 if top_k == 1 else 2), accepted


def test_wrong_variant_guided_verification_under_the_first_mask_differs(run_cli, tiny_engine, tiny_checkpoint,
                                                                        eagle_engine, monkeypatch):
    """Right drafts verified by the graph's sampler alone (each position under the cycle's first
    mask) must not give the masked greedy tokens."""
    from trtllm.runtime.speculative import SpecScheduler

    plain = ours(run_cli, tiny_engine("llama"), [GUIDES["regex"]])
    oracle(monkeypatch, {tuple(p): t for p, t, _ in plain}, None)
    monkeypatch.setattr(SpecScheduler, "walked_token", lambda self, slot, node, out, uniform=None: int(out.verify_ids[slot, node]))
    result, out = run_cli(eagle_engine, {"temperature": 0, "max_generate_length": MAX_NEW, "num_logprobs": 1, "requests": [
        {"messages": [{"role": "user", "content": PROMPTS[0]}], "guided_decoding": GUIDES["regex"]}]},
        "--spec-draft-step", "3")
    (r,) = out["responses"]
    assert r["finish_reason"] == "error" or [t["token_id"] for t in r["token_logprobs"]] != plain[0][1], r


def test_a_guided_rows_overflow_at_a_drafted_position_fails_it_alone(run_cli, tiny_engine, eagle_engine,
                                                                    monkeypatch):
    """NaN logits at a drafted position the host walks to: that row fails as in a plain step (not
    with the grammar's word for the NaN's token); its neighbour is answered."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    guides, prompts = [GUIDES["regex"], None], ["first prompt", "second prompt"]
    plain = ours(run_cli, tiny_engine("llama"), guides, 2, prompts=prompts)
    oracle(monkeypatch, {tuple(p): t for p, t, _ in plain}, None)
    step, calls = ort_backend.OnnxRuntimeEngine.step, []

    def damaged(self, inputs, kv, want_logits=False):
        out = step(self, inputs, kv, want_logits)
        calls.append(inputs.verify_index is not None and inputs.verify_index.shape[1] > 1)
        if calls.count(True) == 1 and calls[-1]:  # (the first verification: the answer is short)
            out.verify_logits[0, 1, 7] = np.nan
        return out

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", damaged)
    result, out = run_cli(eagle_engine, {"temperature": 0, "max_generate_length": MAX_NEW, "batch_size": 2, "requests": [
        {"messages": [{"role": "user", "content": prompts[0]}], "guided_decoding": guides[0]},  # (no logprobs:
        {"messages": [{"role": "user", "content": prompts[1]}], "num_logprobs": 1}]},  # they would see the NaN)
        "--spec-draft-step", "3")
    assert result.exit_code == 1, result.output
    bad, good = out["responses"]
    assert bad["finish_reason"] == "error" and "logits were not finite" in bad["error"], bad
    assert ([t["token_id"] for t in good["token_logprobs"]], good["finish_reason"]) == plain[1][1:]
