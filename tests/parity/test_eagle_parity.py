"""EAGLE-3 speculative decoding against transformers, on tiny random checkpoints with random heads:

- the base graph's eagle_hidden and the draft graph equal transformers' modules (tests/eagle_drafts.py),
  within 1e-4;
- greedy tokens with speculation are exactly transformers' greedy tokens, in a batch and in flight;
- every proposal the runtime verifies is the reference's proposal for the same text (the draft's
  cached, rewritten KV and the hidden-state alignment are right);
- the wrong variant, drafts emitted without verification, must miss.

Random heads are rarely right; test_eagle_trained.py covers accepted drafts and auto's pauses.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.runtime import sampling  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, Timing, prefill_inputs, run_rows  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402
from trtllm.runtime.speculative import Drafter, SpecScheduler  # noqa: E402

from trtllm.builder.eagle_reference import Reference  # noqa: E402
from tests.engine_helpers import MemoryPrefixes  # noqa: E402
from tests.eagle_drafts import random_draft  # noqa: E402
from tests.parity.test_tiny_parity import hf_greedy, hf_model  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

pytestmark = pytest.mark.hf
ARCHS = ["llama", "mistral", "ministral", "qwen2", "qwen3", "phi3", "phi4-mini", "smollm3", "gemma", "gemma2", "gemma3",
         "gemma4", "lfm2", "granite", "olmo2", "olmo3", "exaone4", "ernie4_5", "helium", "hunyuan", "glm", "glm4",
         "granite4", "lfm3", "arcee", "apertus", "qwen3_moe", "qwen2_moe", "granite4-moe", "ernie4_5_moe", "afmoe"]  # (mixtures of experts: the head reads the
# residual stream, whatever the MLP)
PROMPTS = [[5, 17, 42, 99, 7], list(range(30, 52)), [3, 200, 11]]
ATOL = 1e-4


@pytest.fixture(scope="module")
def eagle_setup(tmp_path_factory):
    """arch -> (checkpoint, draft dir, engine dir), built once per arch."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    made = {}

    def get(arch: str, kernels: str = "auto", draft_vocab: int | None = None, graph: str = "modern"):
        key = (arch, kernels, draft_vocab, graph)
        if key not in made:
            root = tmp_path_factory.mktemp(f"eagle-{arch}-{kernels}-{graph}")
            ck = make_checkpoint(arch, root / "model", num_layers=6)
            draft = random_draft(ck, root / "draft", seed=1, draft_vocab=draft_vocab)
            build(BuildConfig(model=str(ck), output=str(root / "engine"), eagle=str(draft), cpu_kernels=kernels,
                              graph=graph, max_input_len=128, max_kv_cache_capacity=256), log=lambda m: None)
            made[key] = (ck, draft, root / "engine")
        return made[key]

    return get


def greedy_rows(prompts, n):
    """`n`: new tokens for every prompt, or one number per prompt."""
    lengths = n if isinstance(n, list) else [n] * len(prompts)
    return [RowState(prompt_ids=p, params=sampling.SamplingParams(temperature=0.0, max_new_tokens=k),
                     rng=np.random.default_rng(0), eos_ids=frozenset()) for p, k in zip(prompts, lengths)]


def speculate(engine_dir, prompts, n, num_slots=None, step=4, prefixes=None, prefix_len=0, prefill_chunk=0,
              top_k=1, verify_size="auto"):
    """Greedy tokens with speculation, and every verification: (text before it, its drafts).
    With `prefixes`, each prompt's first prefix_len tokens are a saved system prompt. `top_k` > 1:
    draft trees (--spec-draft-top-k, --spec-verify-size)."""
    engine = load_engine(engine_dir)
    drafter = Drafter.load(engine_dir, engine.manifest, step, top_k, verify_size)
    seen, original = [], SpecScheduler.verify

    def record(self, slot, row, greedy_ids, drafts, *rest):
        seen.append((row.prompt_ids + row.output_ids, list(drafts)))
        return original(self, slot, row, greedy_ids, drafts, *rest)

    rows, timing = greedy_rows(prompts, n), Timing()
    for r in rows:
        r.prefix_ids, r.save_prefix = tuple(r.prompt_ids[:prefix_len]), prefix_len > 0
    SpecScheduler.verify = record
    try:
        run_rows(engine, rows, num_slots, timing, prefixes=prefixes, drafter=drafter, prefill_chunk=prefill_chunk)
    finally:
        SpecScheduler.verify = original
    speculate.rows = rows  # (for tests that look at where rows ran)
    return [r.output_ids for r in rows], seen, timing


def test_shared_prompts_and_moved_rows_keep_the_tokens_and_proposals(eagle_setup):
    """Speculating rows admitted together that share a prompt (identical prompts, or a system
    prefix followed by different tokens) copy the leader's model and draft KV; the last long row
    moves down into a free slot with its draft KV and proposal. Tokens are transformers', every
    verification's drafts the reference's."""
    ck, draft_dir, engine_dir = eagle_setup("llama")
    model = hf_model(ck)
    system = list(range(30, 52))
    prompts = [system + [5, 6], system + [5, 6], system + [7, 200, 9], [3, 200, 11], system + [8, 8, 1]]
    lengths = [6, 8, 10, 5, 40]
    got, seen, timing = speculate(engine_dir, prompts, lengths, prefix_len=len(system))
    assert got == [hf_greedy(model, p, k) for p, k in zip(prompts, lengths)]
    ref = Reference(draft_dir, model)
    assert len(seen) >= 10 and all(ref.propose(text, len(d)) == d for text, d in seen)
    assert timing.reused_tokens >= 3 * (len(system) - 1)  # three followers copied
    assert speculate.rows[4].batch_idx == 4 and speculate.rows[4].slot == 0  # it moved down


def test_a_leader_done_at_its_first_token_still_gives_its_followers_the_draft_kv(eagle_setup):
    """The leader stops at its first token (max_generate_length 1): the draft still runs over its
    prompt, whose KV its speculating follower copies; the follower's drafts are the reference's."""
    ck, draft_dir, engine_dir = eagle_setup("llama")
    prompt = list(range(30, 52))
    got, seen, timing = speculate(engine_dir, [prompt, prompt], [1, 8], num_slots=2, step=1)
    model = hf_model(ck)
    assert got == [hf_greedy(model, prompt, 1), hf_greedy(model, prompt, 8)] and timing.reused_tokens > 0
    ref = Reference(draft_dir, model)
    assert len(seen) >= 3 and all(ref.propose(text, len(d)) == d for text, d in seen)


def test_a_parked_prompts_draft_kv_is_not_touched_by_verify_steps(eagle_setup, monkeypatch):
    """While a chunked prompt waits for its next chunk, the verify steps' draft runs (drafting
    ahead, catching up) leave its draft KV as its chunks wrote it."""
    ck, draft_dir, engine_dir = eagle_setup("llama")
    real, checked = SpecScheduler.decode, []

    def decode(self):
        parked = {s: (r.computed, self.dkv.read(s, r.computed)) for s, r in self.active.items()
                  if r.prefilling and self.follows(r) and not r.num_reused}
        real(self)
        for s, (n, before) in parked.items():
            checked.append(np.array_equal(self.dkv.read(s, n), before))

    monkeypatch.setattr(SpecScheduler, "decode", decode)
    prompts, lengths = [[9, 4, 11], [3, 200, 11, 5], [(7 * i) % 300 + 3 for i in range(70)]], [1, 40, 12]
    speculate(engine_dir, prompts, lengths, num_slots=2, step=4, prefill_chunk=16)
    assert len(checked) >= 4 and all(checked)


@pytest.mark.parametrize("step", [4, "auto"])
def test_a_chunked_prompt_keeps_the_tokens_and_proposals(eagle_setup, step):
    """Two slots: the third request (a 70-token prompt) is admitted while the second speculates,
    and is prefilled in chunks of 16 between its verify steps (parked in them; the draft runs
    over each chunk's pairs). Tokens are transformers', every verification's drafts the
    reference's, also with auto's paused steps."""
    ck, draft_dir, engine_dir = eagle_setup("llama")
    model = hf_model(ck)
    prompts, lengths = [[9, 4, 11], [3, 200, 11, 5], [(7 * i) % 300 + 3 for i in range(70)]], [1, 40, 12]
    got, seen, timing = speculate(engine_dir, prompts, lengths, num_slots=2, step=step, prefill_chunk=16)
    assert got == [hf_greedy(model, p, k) for p, k in zip(prompts, lengths)]
    ref = Reference(draft_dir, model)
    # (auto chooses k from measured times: how often it drafts varies from run to run)
    assert len(seen) >= (5 if step == 4 else 1) and all(ref.propose(text, len(d)) == d for text, d in seen)
    assert timing.prefill_runs == 1 + 5  # the first two together, then the long one's 16, 16, 16, 16, 6


def test_wrong_variant_a_follower_without_the_leaders_draft_kv_fails(eagle_setup, monkeypatch):
    """Copying only the model's KV leaves the follower's draft KV empty: its drafts change."""
    ck, draft_dir, engine_dir = eagle_setup("llama")
    monkeypatch.setattr(SpecScheduler, "copy_prompt", lambda self, leader, slot, n:
                        self.kv.write(slot, self.kv.read(leader, n)))
    system = list(range(30, 52))
    _, seen, _ = speculate(engine_dir, [system + [5, 6], system + [5, 6]], 8)
    ref = Reference(draft_dir, hf_model(ck))
    assert any(ref.propose(text, len(d)) != d for text, d in seen)


def float32_error(ref, ck, prompt, want) -> float:
    """ATOL, or three times transformers' own float32 error in eagle_hidden (against float64) where that
    is larger: Gemma 1's values reach 270 (its scaled embeddings), and its float32 error 1.2e-3. Ours
    is float32 rounding in another order, amplified alike: 8e-4 on the portable attention, 2.4e-3 on
    the AVX2 one (an AMD EPYC VM), though each is within 1e-6 of float64 in tests/plugins. (A mixture
    of experts in float64 runs transformers' eager expert loop: its grouped_mm takes no float64.)"""
    model = hf_model(ck)
    if model._can_set_experts_implementation():
        model.set_experts_implementation("eager")
    with torch.no_grad():
        hs = model.double()(torch.tensor([prompt]), output_hidden_states=True).hidden_states
        exact = torch.cat([hs[i][0] for i in ref.aux], -1) @ ref.fc.double().T
    return max(ATOL, 3 * float((want.double() - exact).abs().max()))


@pytest.mark.parametrize("arch", ARCHS)
def test_eagle_hidden_and_draft_match_reference(arch, eagle_setup):
    ck, draft_dir, engine_dir = eagle_setup(arch)
    ref = Reference(draft_dir, hf_model(ck))
    engine = load_engine(engine_dir)
    prompt = PROMPTS[1]
    params = sampling.SamplingParams(temperature=0.0)
    batch = sampling.make_batch([params], engine.manifest.model.vocab_size, engine.manifest.max_top_k)
    row = RowState(prompt_ids=prompt, params=params, rng=np.random.default_rng(0), eos_ids=frozenset())
    out = engine.step(prefill_inputs([row], engine.manifest.pad_token_id, batch),
                      KVCacheManager(engine.manifest.model, 1, 64).view(0, 1))
    want = ref.target_hidden(prompt)
    np.testing.assert_allclose(out.hidden[0], want.numpy(), atol=float32_error(ref, ck, prompt, want), rtol=1e-5)
    # The draft over the prompt's pairs (hidden q, token q+1), then one step on its own hidden.
    drafter = Drafter.load(engine_dir, engine.manifest)
    kv = KVCacheManager(drafter.engine.manifest.model, 1, 64)
    ids, hidden = prompt[1:], want[:-1]
    n = len(ids)
    got_id, got_h = drafter.engine.draft(np.array([ids]), hidden.numpy()[None], np.arange(n)[None],
                                         np.array([0]), np.array([n - 1]), kv.view(0, 1))
    ref_ids, ref_h = ref.forward(ids, hidden)
    assert int(got_id[0]) == ref_ids[-1]
    np.testing.assert_allclose(got_h[0], ref_h[-1].numpy(), atol=ATOL, rtol=1e-5)
    got_id2, got_h2 = drafter.engine.draft(got_id[None].astype(np.int64), got_h[None], np.array([[n]]),
                                           np.array([n]), np.array([0]), kv.view(0, 1))
    ref_ids2, ref_h2 = ref.forward(ids + ref_ids[-1:], torch.cat([hidden, ref_h[-1:]]))
    assert int(got_id2[0]) == ref_ids2[-1]
    np.testing.assert_allclose(got_h2[0], ref_h2[-1].numpy(), atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_speculative_greedy_equals_transformers(arch, eagle_setup):
    ck, draft_dir, engine_dir = eagle_setup(arch)
    model = hf_model(ck)
    expected = [hf_greedy(model, p, 24) for p in PROMPTS]
    got, seen, timing = speculate(engine_dir, PROMPTS, 24)
    assert got == expected
    assert timing.verify_runs > 0 and timing.drafted_tokens > 0
    got, _, _ = speculate(engine_dir, PROMPTS, 24, num_slots=2)  # in flight: a slot changes hands
    assert got == expected


def test_growing_kv_keeps_the_tokens_and_proposals(eagle_setup, monkeypatch):
    """The base's and the draft's KV start at the longest prompt (64 positions here) and grow
    together while rows speculate: the greedy tokens are transformers' and those of buffers
    allocated whole, each verification's drafts the reference's."""
    from trtllm.runtime import generate

    grown = []
    real_grow = SpecScheduler.grow
    monkeypatch.setattr(SpecScheduler, "grow", lambda self, c: grown.append(c) or real_grow(self, c))
    monkeypatch.setattr(generate, "GENERATION_HEADROOM", 0)
    monkeypatch.setattr(generate, "runs_to_length", lambda row: False)  # (as rows that may stop early)
    ck, draft_dir, engine_dir = eagle_setup("llama")
    model = hf_model(ck)
    got, seen, timing = speculate(engine_dir, PROMPTS[:2], 90)
    assert grown and got == [hf_greedy(model, p, 90) for p in PROMPTS[:2]]
    ref = Reference(draft_dir, model)
    assert len(seen) >= 10 and all(ref.propose(text, len(d)) == d for text, d in seen[::5])
    monkeypatch.setattr(generate.Scheduler, "grow_kv", False)
    whole, whole_seen, fixed = speculate(engine_dir, PROMPTS[:2], 90)
    assert whole == got and whole_seen == seen
    assert (fixed.kv_cache_bytes, fixed.draft_kv_bytes) == (timing.kv_cache_bytes, timing.draft_kv_bytes)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_proposals_match_reference(arch, eagle_setup):
    """Each verification's drafts are what the reference proposes for the same text."""
    ck, draft_dir, engine_dir = eagle_setup(arch)
    ref = Reference(draft_dir, hf_model(ck))
    _, seen, _ = speculate(engine_dir, PROMPTS[:2], 12)
    assert len(seen) >= 6
    for text, drafts in seen:
        assert ref.propose(text, len(drafts)) == drafts


def test_restored_system_prompt_keeps_the_proposals(eagle_setup):
    """A saved prefix restores the draft's KV too: the proposals after it are the reference's."""
    ck, draft_dir, engine_dir = eagle_setup("llama")
    ref, store = Reference(draft_dir, hf_model(ck)), MemoryPrefixes()
    system = list(range(60, 75))
    prompts = [system + [5, 17, 42], system + [99, 7, 3, 8]]
    first, _, _ = speculate(engine_dir, prompts[:1], 10, prefixes=store, prefix_len=len(system))
    assert len(store.saved) == 2  # the base's KV and the draft's
    got, seen, timing = speculate(engine_dir, prompts, 10, prefixes=store, prefix_len=len(system))
    assert timing.reused_tokens == 2 * (len(system) - 1)
    assert got == [hf_greedy(hf_model(ck), p, 10) for p in prompts] and got[0] == first[0]
    # both restored prompts were verified with drafts (a restore that stopped drafting would pass
    # the loop below vacuously)
    drafted = [text for text, drafts in seen if drafts]
    assert timing.drafted_tokens > 0 and len(drafted) >= 4
    assert all(any(text[:len(p)] == p for text in drafted) for p in prompts)
    for text, drafts in seen:
        assert ref.propose(text, len(drafts)) == drafts


def test_reduced_draft_vocabulary(eagle_setup):
    """A draft vocabulary smaller than the target's: d2t maps proposals back to target ids."""
    ck, draft_dir, engine_dir = eagle_setup("llama", draft_vocab=150)
    ref = Reference(draft_dir, hf_model(ck))
    got, seen, _ = speculate(engine_dir, PROMPTS, 16)
    assert got == [hf_greedy(hf_model(ck), p, 16) for p in PROMPTS]
    assert len(seen) >= 6 and all(d >= 3 and (d - 3) % 2 == 0 for _, drafts in seen for d in drafts)
    for text, drafts in seen[:6]:
        assert ref.propose(text, len(drafts)) == drafts


def test_onnxruntime_kernels(eagle_setup):
    """The same engine on ONNX Runtime's own kernels (GroupQueryAttention) gives the same tokens."""
    ck, _, engine_dir = eagle_setup("llama", kernels="onnxruntime")
    got, _, _ = speculate(engine_dir, PROMPTS, 16, step=3)
    assert got == [hf_greedy(hf_model(ck), p, 16) for p in PROMPTS]


def test_unverified_drafts_are_caught(eagle_setup):
    """The wrong variant: emitting the drafts without checking them must not match transformers."""
    ck, _, engine_dir = eagle_setup("llama")
    original = SpecScheduler.verify

    def trusting(self, slot, row, greedy_ids, drafts, *rest):  # d1 .. dk, then the base's token after dk
        return original(self, slot, row, [*drafts, greedy_ids[len(drafts)]], drafts, *rest)

    SpecScheduler.verify = trusting
    try:
        got, _, _ = speculate(engine_dir, PROMPTS, 24)
    finally:
        SpecScheduler.verify = original
    assert got != [hf_greedy(hf_model(ck), p, 24) for p in PROMPTS]
