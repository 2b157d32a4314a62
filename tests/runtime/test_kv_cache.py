"""The KV cache manager and the slot scheduler on a FakeEngine: no model, no onnxruntime.

The fake writes each input token id into its KV (key buffer, layer 0) at the step's positions,
and its next token is a hash of every token visible to the row: so any slot mix-up, missed
write, wrong prefix restore or masking error changes the output."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine_helpers import MemoryPrefixes
from trtllm.runtime import manifest as mf
from trtllm.runtime.engine import StepOutputs
from trtllm.runtime.generate import RowState, chunk_end, run_rows
from trtllm.runtime.kv_cache import KVCacheManager, bytes_for, bytes_per_token
from trtllm.runtime.sampling import SamplingParams

VOCAB = 97
SHAPE = mf.ModelShape(vocab_size=VOCAB, hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4)


class FakeEngine:
    def __init__(self, capacity: int = 256):
        self.manifest = mf.Manifest(architecture="Fake", backend="onnxruntime", dtype="float32",
                                    limits=mf.Limits(4, 128, capacity), model=SHAPE, eos_token_ids=(0,),
                                    max_top_k=VOCAB)
        self.steps = []

    def step(self, inputs, kv, want_logits=False):
        keys = kv[0]  # layer 0 K: [B, 1, C, 4]; token ids live in [..., 0]
        batch, width = inputs.input_ids.shape
        self.steps.append((batch, width))
        tokens = np.empty(batch, np.int64)
        for b in range(batch):
            start = inputs.write_index[b]
            keys[b, 0, start:start + width, 0] = inputs.input_ids[b] + 1  # +1: 0 means "never written"
            last = start + inputs.last_index[b]
            visible = keys[b, 0, : last + 1, 0].astype(np.int64)
            assert np.all(visible > 0), "the row sees a position that was never written"
            tokens[b] = 1 + int((visible * np.arange(1, last + 2)).sum() % (VOCAB - 1))
        k = inputs.sampling.num_logprobs
        return StepOutputs(token_ids=tokens, top_logprobs=np.zeros((batch, k), np.float32),
                           top_logprob_ids=np.zeros((batch, k), np.int64))


def row(prompt, n=6, prefix=(), save=False):
    return RowState(prompt_ids=list(prompt), params=SamplingParams(temperature=0, max_new_tokens=n),
                    rng=np.random.default_rng(0), eos_ids=frozenset({0}), prefix_ids=tuple(prefix), save_prefix=save)


PROMPTS = [[5, 6, 7], [8] * 10, [9, 10], [11, 12, 13, 14, 15], [16], [17, 18, 19, 20]]


def alone(prompt, n=6):
    r = row(prompt, n)
    run_rows(FakeEngine(), [r], 1)
    return r.output_ids


def test_manager_books_slots():
    kv = KVCacheManager(SHAPE, num_slots=2, capacity=16)
    assert kv.nbytes == bytes_for(SHAPE, 2, 16) == 2 * 16 * bytes_per_token(SHAPE)
    a, b = kv.acquire("a", 10), kv.acquire("b", 16)
    assert (a, b) == (0, 1)
    assert kv.acquire("c", 1) is None  # full
    assert kv.acquire("d", 17) is None  # can never fit
    kv.release(a)
    assert kv.acquire("c", 3) == 0 and kv.active() == [0, 1]
    view = kv.view(0, 2)
    assert all(v.flags.c_contiguous and v.shape == (2, 1, 16, 4) for v in view)
    data = np.arange(2 * 2 * 1 * 5 * 4, dtype=np.float32).reshape(4, 1, 5, 4)
    kv.write(1, data)
    assert np.array_equal(kv.read(1, 5), data)
    kv.release(0)
    kv.move(1, 0, 5)  # the row in slot 1, its 5 positions and its booking, into free slot 0
    assert np.array_equal(kv.read(0, 5), data) and kv.active() == [0]
    with pytest.raises(AssertionError):
        kv.move(1, 0, 5)  # slot 1 is free now, slot 0 is not
    with pytest.raises(AssertionError):
        kv.release(0) or kv.release(0)


def test_layers_of_their_own_shapes_get_their_own_buffers_in_one_allocation():
    """model.kv_layers (Gemma 4): a buffer pair per KV layer in its own shape, views of one allocation; a
    slot's copy (what saved prefixes hold) cuts every row into pieces of one width and writes back the same."""
    shape = mf.ModelShape(vocab_size=VOCAB, hidden_size=8, num_layers=5, num_heads=4, num_kv_heads=2, head_dim=8,
                          kv_layers=((2, 8), (1, 16), (2, 8)))
    kv = KVCacheManager(shape, 3, 6)
    assert [b.shape for b in kv.buffers] == [(3, 2, 6, 8)] * 2 + [(3, 1, 6, 16)] * 2 + [(3, 2, 6, 8)] * 2
    assert len({b.base.ctypes.data for b in kv.buffers}) == 1 and kv.nbytes == bytes_for(shape, 3, 6)
    assert bytes_per_token(shape) == 2 * (2 * 8 + 16 + 2 * 8) * 4
    rng = np.random.default_rng(0)
    for b in kv.buffers:
        b[...] = rng.standard_normal(b.shape)
    saved = kv.read(1, 4)
    assert (saved.shape, saved.dtype) == kv.layout(4) == ((2 * (2 + 2 + 2), 1, 4, 8), np.dtype(np.float32))
    kv.write(2, saved)
    for b in kv.buffers:
        assert np.array_equal(b[2, :, :4], b[1, :, :4]) and not np.array_equal(b[2, :, 4:], b[1, :, 4:])
    # the wrong variant: the pieces written back in another order put one layer's rows in another's
    kv.write(0, saved[::-1])
    assert not all(np.array_equal(b[0, :, :4], b[1, :, :4]) for b in kv.buffers)
    # layers of one shape keep the stacked form, whatever says so
    same = mf.ModelShape(vocab_size=VOCAB, hidden_size=8, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=8,
                         kv_layers=((2, 8), (2, 8)))
    assert KVCacheManager(same, 1, 4).read(0, 3).shape == (4, 2, 3, 8) == KVCacheManager(same, 1, 4).layout(3)[0]


def test_in_flight_batching_matches_alone():
    expected = [alone(p) for p in PROMPTS]
    rows = [row(p) for p in PROMPTS]
    engine = FakeEngine()
    run_rows(engine, rows, num_slots=2)  # 6 requests through 2 slots: finished slots are reused
    assert [r.output_ids for r in rows] == expected
    assert {r.slot for r in rows} == {0, 1}
    assert max(b for b, _ in engine.steps) == 2


def test_different_lengths_finish_independently():
    rows = [row(p, n) for p, n in zip(PROMPTS, [1, 9, 3, 6, 2, 4])]
    run_rows(FakeEngine(), rows, num_slots=3)
    assert [len(r.output_ids) for r in rows] == [1, 9, 3, 6, 2, 4]
    assert [r.output_ids for r in rows] == [alone(p, n) for p, n in zip(PROMPTS, [1, 9, 3, 6, 2, 4])]


def test_saved_prefix_is_restored_and_gives_the_same_tokens():
    system = [21, 22, 23, 24, 25, 26]
    prompts = [system + [30, 31], system + [32], system, [40, 41]]
    expected = [alone(p) for p in prompts]
    store = MemoryPrefixes()
    first = [row(prompts[0], prefix=system, save=True)]
    run_rows(FakeEngine(), first, 2, prefixes=store)
    assert list(store.saved) == [(tuple(system), None)] and first[0].num_reused == 0
    rows = [row(p, prefix=system if p[:6] == system else ()) for p in prompts]
    engine = FakeEngine()
    run_rows(engine, rows, num_slots=4, prefixes=store)
    assert [r.output_ids for r in rows] == expected
    # whole prefix reused, but at least two prompt tokens are computed (generate.restore_prefix)
    assert [r.num_reused for r in rows] == [6, 5, 4, 0]
    assert engine.steps[0] == (4, 2)  # one prefill computes only what was not restored


def test_samples_after_a_restored_prefix_still_share_the_rest_of_their_prompt():
    """Four samples of one prompt whose system prompt is restored: one computes the rest of the
    prompt, the others copy it (each computed it itself: twice the prefill time of no store)."""
    system, rest = [21, 22, 23, 24, 25, 26], list(range(40, 70))
    store = MemoryPrefixes()
    run_rows(FakeEngine(), [row(system + [30, 31], prefix=system, save=True)], 1, prefixes=store)
    rows = [row(system + rest, prefix=system) for _ in range(4)]
    engine = FakeEngine()
    run_rows(engine, rows, num_slots=4, prefixes=store)
    assert [r.output_ids for r in rows] == [alone(system + rest)] * 4
    assert [r.num_reused for r in rows] == [6, 34, 34, 34]  # (two tokens of each prompt computed: MIN_COMPUTED)
    assert engine.steps[:2] == [(1, 30), (3, 2)]


def test_idle_slots_do_not_disturb():
    """A long request keeps running while its neighbours' slots sit idle or are refilled."""
    rows = [row(PROMPTS[0], 20), row(PROMPTS[1], 2), row(PROMPTS[2], 2), row(PROMPTS[3], 2)]
    run_rows(FakeEngine(), rows, num_slots=3)
    assert rows[0].output_ids == alone(PROMPTS[0], 20)


def test_onnxruntime_updates_the_kv_buffer_in_place(tiny_engine):
    """The graph's TensorScatter writes straight into the KV manager's numpy buffers (bound as
    both past and present): new positions change, nothing else does, and nothing is copied."""
    pytest.importorskip("torch")
    from trtllm.runtime import sampling
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import decode_inputs, prefill_inputs

    engine = load_engine(tiny_engine("llama"))
    kv = KVCacheManager(engine.manifest.model, 2, 64)
    r = row([5, 6, 7, 8])
    batch = sampling.make_batch([r.params], engine.manifest.model.vocab_size, engine.manifest.max_top_k)
    before = [b.copy() for b in kv.buffers]
    ids = [id(b) for b in kv.buffers]
    engine.step(prefill_inputs([r], 0, batch), kv.view(1, 2))  # slot 1 only
    assert [id(b) for b in kv.buffers] == ids
    for b, old in zip(kv.buffers, before):
        assert np.abs(b[1, :, :4]).sum() > 0             # the prompt's positions were written
        assert np.array_equal(b[1, :, 4:], old[1, :, 4:])  # the rest of the slot untouched
        assert np.array_equal(b[0], old[0])                # the other slot untouched
    r.output_ids.append(9)
    engine.step(decode_inputs([r], 0, batch), kv.view(1, 2))
    assert all(np.abs(b[1, :, 4]).sum() > 0 for b in kv.buffers)


def test_onnxruntime_decode_steps_bind_nothing_new(tiny_engine, monkeypatch):
    """After the first decode step, the scheduler's feeds, sampler rows and KV views are the same
    arrays, rewritten in place, so a decode step binds nothing: only the graph runs."""
    pytest.importorskip("torch")
    import onnxruntime as ort

    from trtllm.runtime.engine import load_engine

    engine = load_engine(tiny_engine("llama"))
    binds, per_run = [0], []
    real_bind, real_run = ort.IOBinding.bind_cpu_input, engine.session.run_with_iobinding

    def bind(self, name, array):
        binds[0] += 1
        return real_bind(self, name, array)

    def run(binding, *a):
        per_run.append(binds[0])
        binds[0] = 0
        return real_run(binding, *a)

    monkeypatch.setattr(ort.IOBinding, "bind_cpu_input", bind)
    engine.session.run_with_iobinding = run
    rows = [row(PROMPTS[3], 8), row(PROMPTS[5], 8)]  # 5 and 4 tokens: one prefill step
    run_rows(engine, rows, num_slots=2)
    assert per_run[0] > 0 and per_run[1] > 0  # the prefill and the first decode step bind their feeds
    assert per_run[2:] == [0] * (len(per_run) - 2) and len(per_run) == 8
    assert rows[0].output_ids == run_alone(engine, PROMPTS[3], 8)


def run_alone(engine, prompt, n):
    r = row(prompt, n)
    run_rows(engine, [r], num_slots=1)
    return r.output_ids


class BrokenRowEngine(FakeEngine):
    """Answers past the vocabulary for any row that has seen token 42 (what a sampler does with
    non-finite logits)."""

    def step(self, inputs, kv, want_logits=False):
        out = super().step(inputs, kv, want_logits)
        for b in range(len(out.token_ids)):
            last = inputs.write_index[b] + inputs.last_index[b]
            if (kv[0][b, 0, : last + 1, 0] == 42 + 1).any():
                out.token_ids[b] = VOCAB
        return out


def test_a_broken_draw_fails_its_row_alone():
    rows = [row(p) for p in PROMPTS[:2]] + [row([40, 41, 42])] + [row(p) for p in PROMPTS[2:]]
    streamed = []
    run_rows(BrokenRowEngine(), rows, num_slots=3, on_token=lambda r: streamed.append(r.finish_reason))
    bad = rows[2]
    assert bad.finish_reason == "error" and bad.output_ids == []
    assert "logits were not finite" in bad.error
    assert "error" in streamed
    for r, prompt in zip(rows[:2] + rows[3:], PROMPTS):
        assert r.error is None and r.output_ids == alone(prompt)


@pytest.mark.parametrize("prompt_len, expected", [(5, 12), (15, 2), (16, 1)])
def test_generation_fills_the_kv_capacity(prompt_len, expected):
    """A capacity-16 engine holds prompt + output but the last token (never fed back): a 5-token
    prompt gets 12 tokens, and one that fills the capacity still gets its first token."""
    r = row(range(1, prompt_len + 1), n=100)
    engine = FakeEngine(capacity=16)
    run_rows(engine, [r], 1)
    assert r.finish_reason == "max-length" and len(r.output_ids) == expected and r.slot == 0


def test_prompts_of_very_different_lengths_are_not_padded_to_the_longest():
    """A 60-token prompt admitted with three 3-token ones: padding all to 60 would compute 240
    positions for 69 real ones. They are split into steps that waste at most 25%, and each row's
    tokens are what it gets alone."""
    prompts = [[5, 6, 7], list(range(1, 61)), [9, 10, 11], [12, 13, 14]]
    expected = [alone(p) for p in prompts]
    rows, engine = [row(p) for p in prompts], FakeEngine()
    run_rows(engine, rows, 4)
    assert [r.output_ids for r in rows] == expected
    prefills = [s for s in engine.steps if s[1] > 1]
    assert sorted(prefills) == [(1, 3), (1, 60), (2, 3)]


def test_rows_admitted_together_share_their_common_prompt():
    """A request's n samples (one prompt) and requests with one system prompt, admitted in one
    wave: the first computes, the others copy its KV and compute only the rest (at least two
    tokens), with the tokens each gets alone; a follower asking to save has the leader save."""
    system = [21, 22, 23, 24, 25, 26]
    same = system + [30, 31, 32]
    prompts = [same, same, same, system + [40, 41, 42], [50, 51, 52]]
    expected = [alone(p) for p in prompts]
    store = MemoryPrefixes()
    rows = [row(p, prefix=system if p[:6] == system else (), save=k == 3) for k, p in enumerate(prompts)]
    engine = FakeEngine()
    run_rows(engine, rows, 5, prefixes=store)
    assert [r.output_ids for r in rows] == expected
    assert [r.num_reused for r in rows] == [0, 7, 7, 6, 0]
    # leaders [0] (9 tokens) and [4] (3); then the followers' rests: [1, 2] (2 each) and [3] (3)
    assert [s for s in engine.steps if s[1] > 1] == [(1, 9), (1, 3), (2, 2), (1, 3)]
    assert list(store.saved) == [(tuple(system), None)]


def test_the_last_long_row_moves_down_and_decodes_alone():
    """Four slots; the long request is admitted last (slot 3). Once the short ones finish and
    nothing waits, it moves to slot 0 (its KV and sampler rows copied) and each step computes one
    row, not four; its tokens are those it gets alone, and its batch_idx stays the slot it got."""
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13], [17, 18, 19, 20]]
    lengths = [2, 3, 2, 12]
    expected = [alone(p, n) for p, n in zip(prompts, lengths)]
    rows, engine = [row(p, n) for p, n in zip(prompts, lengths)], FakeEngine()
    run_rows(engine, rows, 4)
    assert [r.output_ids for r in rows] == expected
    assert rows[3].batch_idx == 3 and rows[3].slot == 0
    decode_widths = [b for b, w in engine.steps if w == 1]
    assert decode_widths[-1] == 1 and decode_widths.count(1) >= 8


def test_a_request_without_a_system_prompt_saves_nothing():
    """save_system_prompt_kv_cache on a prompt with no system prefix (alone, or as a follower of
    the same prompt): no empty entry, which could never be loaded."""
    store = MemoryPrefixes()
    run_rows(FakeEngine(), [row([5, 6, 7, 8]), row([5, 6, 7, 8], save=True)], 2, prefixes=store)
    run_rows(FakeEngine(), [row([9, 10, 11], save=True)], 1, prefixes=store)
    assert store.saved == {}


def test_chunk_end_never_leaves_a_lone_last_token():
    r = row(range(1, 41))
    assert chunk_end(r, 0) == 40 and chunk_end(r, 16) == 16
    r.computed = 16
    assert chunk_end(r, 16) == 32
    r.computed = 23  # 17 left: a chunk of 16 would leave one token for a one-token (decode) step
    assert chunk_end(r, 16) == 40
    r.computed = 22  # 18 left: 16, then the last 2
    assert chunk_end(r, 16) == 38


def chunked_run(prefill_chunk=16):
    """Two slots: B (slot 0) stops after 2 tokens, A (slot 1) generates long, and C (a 60-token
    prompt) takes slot 0 while A is generating: in A's decode steps, C's slot is parked."""
    prompts, lengths = [[9, 10], [5, 6, 7], list(range(20, 80))], [2, 20, 5]
    rows, engine = [row(p, n) for p, n in zip(prompts, lengths)], FakeEngine()
    run_rows(engine, rows, 2, prefill_chunk=prefill_chunk)
    return rows, engine, [alone(p, n) for p, n in zip(prompts, lengths)]


def test_a_long_prompt_admitted_mid_run_is_prefilled_in_chunks_between_decode_steps():
    rows, engine, expected = chunked_run()
    assert [r.output_ids for r in rows] == expected
    first = engine.steps.index((1, 16))  # C's first chunk
    # chunks of 16, 16, 16 and the last 12, each followed by a decode step for A (C parked in slot 0)
    assert engine.steps[first:first + 8] == [(1, 16), (2, 1), (1, 16), (2, 1), (1, 16), (2, 1), (1, 12), (2, 1)]
    whole, engine, _ = chunked_run(prefill_chunk=0)
    assert (1, 60) in engine.steps and [r.output_ids for r in whole] == expected


def test_a_prompt_admitted_alone_is_prefilled_whole():
    """No other row generating: nothing to keep streaming, so the prompt is one step."""
    r, engine = row(list(range(20, 80))), FakeEngine()
    run_rows(engine, [r], 1, prefill_chunk=16)
    assert engine.steps[0] == (1, 60) and r.output_ids == alone(list(range(20, 80)))


def test_wrong_variant_a_parked_slot_writing_at_position_0_fails(monkeypatch):
    """The parked row's pad must go where its next chunk writes: at position 0 it overwrites the
    prompt's first token, and the chunked row's tokens change."""
    from trtllm.runtime import generate

    real = generate.decode_inputs

    def at_zero(rows, pad_id, batch, reuse=None, recurrent=False):
        feeds = real(rows, pad_id, batch, reuse, recurrent)
        for b, r in enumerate(rows):
            if r is not None and not r.output_ids:
                feeds.position_ids[b, 0] = feeds.write_index[b] = 0
        return feeds

    monkeypatch.setattr(generate, "decode_inputs", at_zero)
    rows, _, expected = chunked_run()
    assert rows[2].output_ids != expected[2]


def test_followers_of_a_chunked_leader_copy_its_kv_after_its_last_chunk():
    """C and D (one 40-token prompt) are admitted while A generates: C is prefilled in chunks, D
    waits, parked, and copies C's KV once all of it is there."""
    prompts, lengths = [[5, 6, 7], [9, 10], [11, 12], list(range(20, 60)), list(range(20, 60))], [20, 2, 2, 4, 4]
    rows, engine = [row(p, n) for p, n in zip(prompts, lengths)], FakeEngine()
    run_rows(engine, rows, 3, prefill_chunk=16)
    assert [r.output_ids for r in rows] == [alone(p, n) for p, n in zip(prompts, lengths)]
    assert rows[4].num_reused == 38 and rows[3].num_reused == 0
    assert (1, 16) in engine.steps and (1, 2) in engine.steps  # C's chunks, then D's last 2 tokens


def test_followers_of_a_leader_that_fails_mid_prompt_compute_their_own(monkeypatch):
    """C leads D (one 40-token prompt, chunked) and fails after its first chunk (its logits
    overflowed): D computes its prompt itself and answers as alone; it waited on C's slot, which it
    read after C was gone (a KeyError that failed every row still running)."""
    from trtllm.runtime import generate

    prompts, lengths = [[5, 6, 7], list(range(20, 60)), list(range(20, 60))], [12, 4, 4]
    rows = [row(p, n) for p, n in zip(prompts, lengths)]
    real = generate.Scheduler.prefill

    def failing(self, start, stop):
        real(self, start, stop)
        if rows[1].slot in range(start, stop) and rows[1].computed and not rows[1].finish_reason:
            rows[1].fail("the logits overflowed")

    monkeypatch.setattr(generate.Scheduler, "prefill", failing)
    run_rows(FakeEngine(), rows, 3, prefill_chunk=16)
    assert rows[1].finish_reason == "error" and rows[2].num_reused == 0
    assert [rows[0].output_ids, rows[2].output_ids] == [alone(prompts[0], 12), alone(prompts[2], 4)]


class CapacityEngine(FakeEngine):
    """Records the KV capacity each step sees."""

    def step(self, inputs, kv, want_logits=False):
        self.capacities = getattr(self, "capacities", []) + [kv[0].shape[2]]
        return super().step(inputs, kv, want_logits)


def test_the_kv_buffers_grow_as_generation_needs_them(monkeypatch):
    """A request allowed 1,000 new tokens: its slot starts at its prompt + 256 positions (320) and
    doubles as it generates (640, then the 1,024 it can need at most), its KV copied over, with
    the tokens of a run allocated at 1,024 from the start. One that stops early (a stop token)
    never holds more than the 320."""
    from trtllm.runtime.generate import Scheduler, Timing

    long = row([5, 6, 7], 1000)
    engine, timing = CapacityEngine(capacity=2048), Timing()
    run_rows(engine, [long], 1, timing)
    assert sorted(set(engine.capacities)) == [320, 640, 1024]
    assert timing.kv_cache_bytes == bytes_for(SHAPE, 1, 1024)
    early = row([5, 6, 7], 1000)
    early.params = SamplingParams(temperature=0, max_new_tokens=1000, stop_token_ids=(long.output_ids[20],))
    timing = Timing()
    run_rows(CapacityEngine(capacity=2048), [early], 1, timing)
    assert early.finish_reason == "stop-words" and timing.kv_cache_bytes == bytes_for(SHAPE, 1, 320)
    fixed, engine = row([5, 6, 7], 1000), CapacityEngine(capacity=2048)
    monkeypatch.setattr(Scheduler, "grow_kv", False)
    run_rows(engine, [fixed], 1)
    assert set(engine.capacities) == {1024} and fixed.output_ids == long.output_ids


class XTokenizer:
    """Every id is an "x" (what TextStream's decoder needs)."""

    special_ids = frozenset()

    def decode(self, ids, skip_special_tokens=True):
        return "x" * len(ids)


def test_a_row_that_cannot_stop_early_gets_its_whole_length_at_once():
    """ignore_eos and no stop id, stop string or grammar: it generates every token it is allowed,
    so its slot starts at that (growing copied the buffers mid-run and faulted the new pages in:
    a 0.5 s step at batch 8, 512 tokens); a row that heeds EOS beside it still starts small."""
    from trtllm.runtime.text import TextStream

    fixed = row([5, 6, 7], 1000)
    fixed.params = SamplingParams(temperature=0, max_new_tokens=1000, ignore_eos=True)
    fixed.__post_init__()  # (what it holds back, from its params)
    engine = CapacityEngine(capacity=2048)
    run_rows(engine, [fixed], 1)
    assert set(engine.capacities) == {1024} and len(fixed.output_ids) == 1000
    stopping = row([5, 6, 7], 1000)
    stopping.params = fixed.params
    stopping.__post_init__()
    stopping.text = TextStream(XTokenizer(), ("never",))  # a stop string may end it: it starts small
    engine = CapacityEngine(capacity=2048)
    run_rows(engine, [stopping], 1)
    assert min(engine.capacities) == 320 and stopping.output_ids == fixed.output_ids


def test_growing_with_rows_in_every_state_keeps_their_tokens(monkeypatch):
    """Growth while other slots hold a parked chunked prompt, a finished row's free slot and a
    moved row: every row's tokens are the ones it gets alone."""
    from trtllm.runtime import generate

    monkeypatch.setattr(generate, "GENERATION_HEADROOM", 0)  # start at the longest prompt: grow early
    prompts, lengths = [[9, 10], [5, 6, 7], list(range(20, 80)), [11, 12, 13]], [2, 150, 5, 40]
    rows, engine = [row(p, n) for p, n in zip(prompts, lengths)], CapacityEngine(capacity=512)
    run_rows(engine, rows, 3, prefill_chunk=16)
    assert [r.output_ids for r in rows] == [alone(p, n) for p, n in zip(prompts, lengths)]
    assert sorted(set(engine.capacities)) == [64, 128, 192]


def test_a_follower_sharing_a_system_prompt_copies_after_the_leaders_first_chunk():
    """C (60 tokens) and D share a 6-token system prompt and are admitted while A generates: D
    copies the 6 positions once C's first chunk holds them, not after C's last chunk."""
    system = [21, 22, 23, 24, 25, 26]
    prompts = [[9, 10], [5, 6, 7], [11, 12], system + list(range(30, 84)), system + [90, 91, 92]]
    lengths = [1, 30, 1, 3, 3]
    rows = [row(p, n, prefix=system if p[:6] == system else ()) for p, n in zip(prompts, lengths)]
    engine = FakeEngine()
    run_rows(engine, rows, 3, prefill_chunk=16)
    assert [r.output_ids for r in rows] == [alone(p, n) for p, n in zip(prompts, lengths)]
    assert rows[4].num_reused == 6
    first = engine.steps.index((1, 16))  # C's first chunk; D's rest (3 tokens) comes right after it
    assert engine.steps[first + 1] == (1, 3)
    chunk = [s for s in engine.steps if s[0] == 1 and s[1] > 3]
    assert sum(w for _, w in chunk) == 60
