"""--spec-draft-engine (draft-model speculative decoding, runtime/draft_model.py): answers token-exact
with plain decoding whatever the draft (the model itself, another model of its vocabulary), for greedy
rows beside sampled, penalized, logprobs and min_new_tokens ones, in flight with chunked prompts,
beyond the draft's batch size and KV capacity; the refusals of a draft that cannot draft; the CLI and
its profile. The wrong variant, guesses taken unchecked, must change the answers."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.runtime.test_ngram import LOOPING, answers, unchecked
from trtllm.runtime import draft_model, ngram
from trtllm.runtime.engine import load_engine
from trtllm.runtime.generate import RowState, Timing, run_rows
from trtllm.runtime.kv_cache import KVCacheManager
from trtllm.runtime.sampling import SamplingParams

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return load_engine(tiny_engine("llama"))


@pytest.fixture(scope="module")
def other(tiny_engine):
    """Another random model of the same tokenizer: its guesses mostly fail."""
    return load_engine(tiny_engine("qwen2"))


def draft(engine, k=4, **options):
    return draft_model.DraftModel(engine, k, adaptive=False, p_min=options.pop("p_min", 0.0), **options)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_the_model_as_its_own_draft_s_guesses_all_hold(engine, k):
    """The model drafting for itself guesses its own greedy tokens (its catch-up and decode steps
    compute what plain decoding does), so every guess holds and the answer is plain decoding's."""
    want, _ = answers(engine, LOOPING)
    got, timing = answers(engine, LOOPING, draft(engine, k))
    assert got == want
    assert timing.drafted_tokens > 0 and timing.accepted_tokens == timing.drafted_tokens
    assert timing.draft_runs > 0 and timing.draft_kv_bytes > 0
    assert timing.generation_runs <= -(-39 // (k + 1)) + 1  # (k + 1 tokens a step, from the prefill's on)


def test_another_model_s_guesses_are_checked(engine, other):
    want, _ = answers(engine, LOOPING)
    got, timing = answers(engine, LOOPING, draft(other, 4))
    assert got == want and timing.drafted_tokens > timing.accepted_tokens


def test_other_rows_in_the_same_steps_are_as_without_it(engine):
    kinds = ["sampled", "penalized", "greedy", "logprobs", "min_new", "cold", "cold_biased", "sampled_logprobs"]
    prompts = (LOOPING + [[9, 8, 7, 9, 8, 7, 9], list(range(60, 90))] * 2)[:len(kinds)]
    eos = [int(np.bincount(sum(prompts, [])).argmax())]
    want, _ = answers(engine, prompts, kinds=kinds, eos=eos, n=48)
    got, timing = answers(engine, prompts, draft(engine, 4), kinds=kinds, eos=eos, n=48)
    assert got == want and 0 < timing.accepted_tokens
    # a sampled row guesses its draw with its own next number: the model drafting for itself at a low
    # temperature guesses (nearly) every draw
    cold = ["cold"] * 4
    want, _ = answers(engine, LOOPING, kinds=cold, n=48)
    got, timing = answers(engine, LOOPING, draft(engine, 4), kinds=cold, n=48)
    assert got == want and timing.accepted_tokens > 0.9 * timing.drafted_tokens


def test_in_flight_with_chunked_prompts_and_limits(engine, other):
    """Two slots for five rows (admissions, compaction: the draft follows each row, not its slot), a
    long prompt chunked while others speculate, rows that end at max_new_tokens exactly."""
    prompts = LOOPING + [list(range(10, 200))]
    for n in (5, 40):
        want, _ = answers(engine, prompts, num_slots=2, prefill_chunk=16, n=n)
        for d in (engine, other):
            got, timing = answers(engine, prompts, draft(d, 6), num_slots=2, prefill_chunk=16, n=n)
            assert got == want and all(len(ids) == n for ids, _, _ in got)
            assert timing.accepted_tokens > 0 or d is other


def test_a_common_system_prompt_is_computed_once_by_the_draft(engine, monkeypatch):
    """Rows that begin alike (a 200-token system prompt), two slots for five of them: the first two
    start together, one computing it and the other copying it after; each later one takes over a
    freed slot's KV, so the draft computes it once, where with nothing kept (the wrong variant) it
    computes it for every row. Answers unchanged either way."""
    system = list(range(100, 300))
    prompts = [system + [5 + i, 17, 42 + i] for i in range(5)]
    want, _ = answers(engine, prompts, num_slots=2, n=24)
    fed, step = [], draft_model.DraftSlots.step
    monkeypatch.setattr(draft_model.DraftSlots, "step",
                        lambda self, feed: fed.append(sum(map(len, feed.values()))) or step(self, feed))
    got, timing = answers(engine, prompts, draft(engine, 4), num_slots=2, n=24)
    kept = sum(fed)
    # the model drafting for itself guesses right only on the KV it would compute: the copied one too
    assert got == want and timing.accepted_tokens == timing.drafted_tokens > 0
    fed.clear()
    monkeypatch.setattr(draft_model, "shared", lambda a, b: 0)
    got, _ = answers(engine, prompts, draft(engine, 4), num_slots=2, n=24)
    assert got == want and sum(fed) >= kept + 4 * len(system)  # (every row but the first's system prompt)
    # a new row whose free slot held another text copies the slot that holds its beginning: the
    # first row's slot is unrelated, and the third and fourth rows start together after the first two
    monkeypatch.undo()
    copies, copy = [], KVCacheManager.copy_slot
    monkeypatch.setattr(KVCacheManager, "copy_slot", lambda self, *a: copies.append(a) or copy(self, *a))
    prompts = [list(range(5, 60))] + prompts[:3]
    want, _ = answers(engine, prompts, num_slots=2, n=24)
    plain, copies[:] = copies[:], []  # (the model's own rows share their prompts too)
    got, timing = answers(engine, prompts, draft(engine, 4), num_slots=2, n=24)
    whole = [n >= len(system) for _, _, n in plain], [n >= len(system) for _, _, n in copies]
    assert got == want and sum(whole[1]) > sum(whole[0]) and timing.accepted_tokens == timing.drafted_tokens


def test_a_long_prompt_is_caught_up_on_in_chunks(engine, monkeypatch):
    monkeypatch.setattr(draft_model, "CHUNK", 16)
    prompts = [list(range(10, 200)), LOOPING[2]]
    want, _ = answers(engine, prompts)
    got, timing = answers(engine, prompts, draft(engine, 4))
    assert got == want and timing.accepted_tokens == timing.drafted_tokens > 0


@dataclasses.dataclass
class Smaller:
    """An engine whose manifest says a smaller batch or KV capacity than it has (what a draft built
    with smaller limits says)."""
    engine: object
    max_batch_size: int = 0
    max_kv_cache_capacity: int = 0

    def __post_init__(self):
        m = self.engine.manifest
        limits = dataclasses.replace(m.limits, max_batch_size=self.max_batch_size or m.limits.max_batch_size,
                                     max_kv_cache_capacity=self.max_kv_cache_capacity
                                     or m.limits.max_kv_cache_capacity)
        self.manifest, self.engine_dir = dataclasses.replace(m, limits=limits), self.engine.engine_dir

    def step(self, inputs, kv, want_logits=False):
        return self.engine.step(inputs, kv, want_logits)


def test_rows_past_the_draft_s_batch_or_capacity_decode_plainly(engine):
    want, _ = answers(engine, LOOPING, n=60)
    got, timing = answers(engine, LOOPING, draft(Smaller(engine, max_batch_size=1), 4), n=60)
    assert got == want and timing.accepted_tokens > 0
    # a KV capacity of 50: the rows draft until their text reaches it, then decode plainly
    got, timing = answers(engine, LOOPING, draft(Smaller(engine, max_kv_cache_capacity=50), 4), n=60)
    assert got == want and timing.accepted_tokens > 0 and timing.draft_kv_bytes > 0


def test_a_row_too_long_for_the_draft_leaves_its_slot_to_others(engine):
    """A draft of one slot and 128 positions: the first row outgrows it at once and must not keep
    the slot from the second, whose answer loops (guesses that hold)."""
    prompts = [[(i * 37) % 390 + 5 for i in range(124)], LOOPING[2]]
    want, _ = answers(engine, prompts, n=60)
    got, timing = answers(engine, prompts, draft(Smaller(engine, max_batch_size=1, max_kv_cache_capacity=128), 4),
                          n=60)
    assert got == want and timing.accepted_tokens > 20


@pytest.fixture(scope="module")
def built(tiny_checkpoint, tmp_path_factory):
    """Drafts of other kinds, built once: on ONNX Runtime's own attention (GroupQueryAttention, which
    refuses a step that writes past its KV buffer, where our kernel drops such writes), and the
    tiny model with its embedding padded past the tokenizer (as Qwen2.5's are)."""
    from tests.tiny_models import make_checkpoint
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    made = {}
    padded = make_checkpoint("llama", tmp_path_factory.mktemp("padded-ckpt"), padded_vocab=100)
    for name, model, options in (("gqa", tiny_checkpoint("llama"), dict(cpu_kernels="onnxruntime")),
                                 ("padded", padded, {})):
        out = tmp_path_factory.mktemp(name) / "engine"
        build(BuildConfig(model=str(model), output=str(out), max_batch_size=4, max_input_len=256,
                          max_kv_cache_capacity=512, **options), log=lambda m: None)
        made[name] = load_engine(out)
    return made


def test_a_long_catch_up_beside_a_row_near_the_draft_s_limit(built):
    """A 250-token prompt admitted while another row nears the draft's 512 positions: the catch-up's
    chunks are kept narrow enough that no slot of the step writes past the buffer."""
    gqa = built["gqa"]
    spec = [(list(range(10, 250)), 260), ([5, 17, 42, 99, 7], 30), ([(i * 7) % 390 + 3 for i in range(250)], 10)]

    def rows():
        return [RowState(prompt_ids=p, params=SamplingParams(max_new_tokens=n, temperature=0.0),
                         rng=np.random.default_rng(i), eos_ids=frozenset()) for i, (p, n) in enumerate(spec)]

    plain, spec_rows, timing = rows(), rows(), Timing()
    run_rows(gqa, plain, 2)
    run_rows(gqa, spec_rows, 2, timing, lookup=draft(gqa, 4))
    assert [r.output_ids for r in spec_rows] == [r.output_ids for r in plain] and timing.accepted_tokens > 0


def test_ids_one_model_has_and_the_other_not(engine, built):
    """A draft with a wider embedding never guesses an id past the model's; a model that produces a
    padded id (a logit_bias chose it) is not drafted for by a draft without that id."""
    padded = built["padded"]
    for model, other, bias in ((engine, padded, {}), (padded, engine, {450: 100.0})):
        def rows():
            return [RowState(prompt_ids=list(range(30, 60)), params=SamplingParams(max_new_tokens=30, temperature=0.0,
                                                                                   logit_bias=bias),
                             rng=np.random.default_rng(0), eos_ids=frozenset())]

        plain, spec_rows = rows(), rows()
        run_rows(model, plain, 1)
        run_rows(model, spec_rows, 1, Timing(), lookup=draft(other, 4))
        assert spec_rows[0].output_ids == plain[0].output_ids
    assert 450 in plain[0].output_ids  # (the padded id was produced)


def test_an_unsure_draft_guesses_nothing(engine):
    want, _ = answers(engine, LOOPING)
    got, timing = answers(engine, LOOPING, draft(engine, 4, p_min=1.01))
    assert got == want and timing.drafted_tokens == 0 and timing.verify_runs == 0


def test_adaptive_drafting_is_exact_too(engine, other):
    want, _ = answers(engine, LOOPING, n=60)
    for d in (engine, other):
        got, timing = answers(engine, LOOPING, draft_model.DraftModel(d, 4, p_min=0.0), n=60)
        assert got == want and timing.generation_runs > 0


def test_wrong_variant_taking_guesses_unchecked_changes_answers(engine, other, monkeypatch):
    want, _ = answers(engine, LOOPING)
    monkeypatch.setattr(ngram.NgramScheduler, "verify", unchecked)
    got, _ = answers(engine, LOOPING, draft(other, 4))
    assert got != want


def test_a_draft_of_another_vocabulary_is_refused(engine):
    vocab, m, where = {"a": 0, "b": 1, "c": 2}, engine.manifest, engine.engine_dir
    draft_model.check_pair(m, where, m, where, vocab, dict(vocab))
    with pytest.raises(draft_model.DraftError, match=r"'b' is id 2 there, 1 here.*share the model's vocabulary"):
        draft_model.check_pair(m, where, m, where, {"a": 0, "b": 2, "c": 1}, vocab)
    n = m.model.vocab_size
    small = dataclasses.replace(m, model=dataclasses.replace(m.model, vocab_size=n - 10))
    every = {str(i): i for i in range(n)}
    with pytest.raises(draft_model.DraftError, match=f"embedding has {n - 10} ids, fewer than the model's {n}"):
        draft_model.check_pair(small, where, m, where, every, every)
    with pytest.raises(draft_model.DraftError, match="EAGLE draft head: build the draft engine without --eagle"):
        draft_model.check_pair(dataclasses.replace(m, eagle={"draft_step": 1}), where, m, where, vocab, vocab)
    with pytest.raises(draft_model.DraftError, match="is a tensorrt engine: a draft engine is an ONNX Runtime one"):
        draft_model.check_pair(dataclasses.replace(m, backend="tensorrt"), where, m, where, vocab, vocab)


def trtllm_run(engine, requests, tmp_path, *extra) -> tuple[subprocess.CompletedProcess, dict | None]:
    """trtllm-run in a process of its own: with a draft engine its sessions share one pool of workers,
    which every later session of the process would have to share too (backends/onnxruntime.py)."""
    inp, out = tmp_path / "in.json", tmp_path / "out.json"
    inp.write_text(json.dumps(requests))
    out.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "trtllm.runtime", str(inp), "--engine", str(engine), "--output",
                           str(out), *map(str, extra)], capture_output=True, text=True, timeout=300)
    return done, json.loads(out.read_text()) if out.exists() else None


def test_trtllm_run_spec_draft_engine(tiny_engine, tmp_path):
    target, other_dir = tiny_engine("llama"), tiny_engine("qwen2")
    requests = {"temperature": 0, "max_generate_length": 32, "requests": [
        {"messages": [{"role": "user", "content": "the cat the cat the cat the cat"}]},
        {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7, "seed": 3}]}
    done, plain = trtllm_run(target, requests, tmp_path)
    assert done.returncode == 0, done.stderr
    for d, step in ((target, "3"), (other_dir, "auto")):
        profile = tmp_path / "p.json"
        done, out = trtllm_run(target, requests, tmp_path, "--spec-draft-engine", d, "--spec-draft-step", step,
                               "--profile", profile)
        assert done.returncode == 0 and "warning" not in done.stdout + done.stderr, done.stdout + done.stderr
        assert [r["output_ids"] for r in out["responses"]] == [r["output_ids"] for r in plain["responses"]]
        written = json.loads(profile.read_text())
        spec = written["draft_model_generation"]
        assert spec["draft_step"] == (3 if step == "3" else "auto")
        assert spec["drafted_tokens"] >= spec["accepted_tokens"] and written["kv_cache"]["draft_allocated_bytes"] > 0
        if step == "3":  # (the tiny model's own guesses are sure enough: P_MIN)
            assert spec["verify_steps"] > 0 and spec["draft_runs"] > 0 and spec["accepted_tokens"] > 0


def test_trtllm_run_refuses_a_draft_it_cannot_use(tiny_engine, run_cli, tmp_path):
    target, other_dir = tiny_engine("llama"), tiny_engine("qwen2")
    requests = {"max_generate_length": 4, "requests": [{"messages": [{"role": "user", "content": "Hi"}]}]}
    result, _ = run_cli(target, requests, "--spec-draft-engine", str(other_dir), "--spec-ngram", "3")
    assert result.exit_code == 2 and "give one" in result.output
    result, _ = run_cli(target, requests, "--spec-draft-engine", str(tmp_path / "none"))
    assert result.exit_code == 2 and "--spec-draft-engine: " in result.output and "none" in result.output
    # --spec-draft-step 0: no drafting, and the model not on a pool shared with a draft
    profile = tmp_path / "p.json"
    result, out = run_cli(target, requests, "--spec-draft-engine", str(other_dir), "--spec-draft-step", "0",
                          "--profile", str(profile))
    assert result.exit_code == 0 and out["responses"][0]["finish_reason"] in ("max-length", "end-of-sequence")
    assert "draft_model_generation" not in json.loads(profile.read_text())
    from trtllm.runtime.backends import onnxruntime as ort_backend
    assert not ort_backend.SHARED_THREADS  # (refused before the model loaded, on a shared pool)
