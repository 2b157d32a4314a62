"""EAGLE-3 with a trained head: scripts/train_eagle.py on a tiny Llama, from its own greedy answers
(about half of its drafts are then accepted on those prompts; random heads are almost never right).
This exercises what random heads cannot: several tokens emitted per verification and the draft's
catch-up over them. And --spec-draft-step auto's pauses (k = 0: plain steps, the draft's pairs
kept) and resumptions (the draft catches up on the kept pairs), on a scripted k sequence so that
every case occurs: tokens equal transformers' greedy tokens, and every proposal equals the
reference head's proposal for the same text.

The wrong variant: a resumption that forgets the kept pairs but the last must propose otherwise
(its tokens stay exact: verification sees to that)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trtllm.builder.eagle_reference import Reference  # noqa: E402
from trtllm.runtime import draft_policy, speculative  # noqa: E402
from trtllm.runtime.speculative import SpecScheduler  # noqa: E402
from tests.parity.test_eagle_parity import speculate  # noqa: E402
from tests.parity.test_tiny_parity import hf_greedy, hf_model  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import train_eagle  # noqa: E402

pytestmark = pytest.mark.hf
NUM_PROMPTS, NEW_TOKENS = 16, 24
SCRIPT = [1, 0, 0, 3, 0, 2, 2, 0, 0, 0, 4, 1]  # k per cycle, repeated


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(checkpoint, draft dir, engine dir, the training prompts' ids), ~5 s."""
    from transformers import AutoTokenizer

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    root = tmp_path_factory.mktemp("eagle-trained")
    ck = make_checkpoint("llama", root / "model", num_layers=6)
    train_eagle.train(ck, root / "draft", num_prompts=NUM_PROMPTS, max_new_tokens=NEW_TOKENS, draft_vocab=64,
                      steps_ttt=3, epochs=40, lr=3e-3, batch_size=4, threads=2, log=lambda _: None)
    build(BuildConfig(model=str(ck), output=str(root / "engine"), eagle=str(root / "draft"), max_input_len=128,
                      max_kv_cache_capacity=256), log=lambda m: None)
    tok = AutoTokenizer.from_pretrained(ck)
    chats, held = train_eagle.build_prompts(NUM_PROMPTS, 0)
    prompts = [list(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True)["input_ids"])
               for c, h in zip(chats, held) if not h]
    return ck, root / "draft", root / "engine", prompts[:6]


@pytest.fixture
def scripted(monkeypatch):
    """auto's choice replaced by SCRIPT; returns the k of every cycle."""
    chosen = []

    def choose(self, batch, speculating, others):
        chosen.append(SCRIPT[len(chosen) % len(SCRIPT)])
        return chosen[-1]

    monkeypatch.setattr(draft_policy.DraftPolicy, "choose", choose)
    return chosen


def check(trained, got, seen, n=NEW_TOKENS):
    ck, draft_dir, _, prompts = trained
    model = hf_model(ck)
    assert got == [hf_greedy(model, p, n) for p in prompts]
    ref = Reference(draft_dir, model)
    for text, drafts in seen:
        assert ref.propose(text, len(drafts)) == drafts


@pytest.mark.parametrize("step", [1, 3])
def test_accepted_drafts_give_transformers_tokens(trained, step):
    _, _, engine, prompts = trained
    got, seen, timing = speculate(engine, prompts, NEW_TOKENS, num_slots=3, step=step)
    assert timing.accepted_tokens >= 0.25 * timing.drafted_tokens  # the trained head is right often
    assert any(len(drafts) == step for _, drafts in seen)
    assert timing.speculative_tokens > timing.verify_runs + 10  # cycles that emitted several tokens
    check(trained, got, seen)


@pytest.mark.parametrize("flush", [256, 3])
def test_pauses_and_resumptions(trained, scripted, monkeypatch, flush):
    """Paused cycles keep the pairs, in flight (rows are admitted while paused); with flush 3 the
    draft also catches up while still paused."""
    monkeypatch.setattr(speculative, "PAUSE_FLUSH", flush)
    _, _, engine, prompts = trained
    got, seen, timing = speculate(engine, prompts, NEW_TOKENS, num_slots=3, step="auto")
    assert set(timing.draft_steps) == {0, 1, 2, 3, 4} and timing.accepted_tokens > 0
    assert timing.verify_runs == sum(n for k, n in timing.draft_steps.items() if k)
    check(trained, got, seen)


def test_auto_with_real_choices(trained):
    _, _, engine, prompts = trained
    got, seen, timing = speculate(engine, prompts, NEW_TOKENS, num_slots=3, step="auto")
    assert sum(timing.draft_steps.values()) == timing.generation_runs
    check(trained, got, seen)


def test_forgetting_kept_pairs_is_caught(trained, scripted, monkeypatch):
    """The wrong variant: resuming from the last kept pair only leaves holes in the draft's KV."""
    original = SpecScheduler.resume

    def forgetful(self, hi, rows):
        for s, (p, tokens, hidden) in list(self.kept.items()):
            self.kept[s] = (p + len(tokens) - 1, tokens[-1:], hidden[-1:])
        return original(self, hi, rows)

    monkeypatch.setattr(SpecScheduler, "resume", forgetful)
    ck, draft_dir, engine, prompts = trained
    got, seen, _ = speculate(engine, prompts, NEW_TOKENS, num_slots=3, step="auto")
    model = hf_model(ck)
    assert got == [hf_greedy(model, p, NEW_TOKENS) for p in prompts]  # verification still keeps them exact
    ref = Reference(draft_dir, model)
    assert any(ref.propose(text, len(drafts)) != drafts for text, drafts in seen)
