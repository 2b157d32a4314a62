"""Context reuse (trtllm-run --context-reuse, runtime/context_cache.py): a finished request's KV,
prompt and answer, is found again by a later prompt that begins with the same tokens, in the same
run or a later one, and the answers are those of a run without it."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from trtllm.runtime.context_cache import BLOCK, ContextCache
from trtllm.runtime.prefix_cache import PrefixStore

LAYOUT = (4, 2, None, 3)  # [2 * layers, kv_heads, n, head_dim] of a made-up engine


def layout(n: int):
    return (LAYOUT[0], LAYOUT[1], n, LAYOUT[3]), np.dtype(np.float32)


def kv_of(tokens) -> np.ndarray:
    """KV whose position p holds its token: what a restore copies is checkable."""
    kv = np.zeros(layout(len(tokens))[0], np.float32)
    kv[:, :, :, 0] = np.asarray(tokens, np.float32)
    return kv


def cache(tmp_path) -> ContextCache:
    return ContextCache(PrefixStore(tmp_path / "kv", "engine-a"))


def commit(c: ContextCache, tokens, adapter=None):
    tokens = tuple(tokens)
    c.commit(tokens, adapter, lambda n: kv_of(tokens)[:, :, :n])


def test_the_longest_shared_prefix_is_found_to_the_token_and_only_its_kv_is_restored(tmp_path):
    c = cache(tmp_path)
    turn = list(range(100, 150))  # a prompt and its answer: 50 tokens
    commit(c, turn)
    prompt = turn[:37] + [7, 8, 9] + turn[40:]  # the next turn's text differs after 37 tokens
    kv = c.lookup(prompt, None, len(prompt) - 2, layout)
    assert kv.shape[2] == 37 and np.array_equal(kv[0, 0, :, 0], turn[:37])
    longer = turn + [1, 2, 3, 4]
    assert c.lookup(longer, None, len(longer) - 2, layout).shape[2] == 50  # the whole entry
    assert c.lookup(longer, None, 20, layout).shape[2] == 20  # never past the limit
    assert c.lookup(turn[:10] + [0] * 30, None, 38, layout) is None  # less than a block in common
    assert c.lookup(longer, "adapter-x", 50, layout) is None  # another adapter's KV is another's
    assert (c.lookups, c.hits) == (5, 3)


def test_a_hit_no_longer_than_the_saved_system_prompt_restores_and_counts_nothing(tmp_path):
    """restore_context_kv: an entry that holds no more than the positions a saved system prompt
    already gave (`reused`) restores nothing, and the profile's hits do not count it."""
    from types import SimpleNamespace

    from trtllm.runtime.step_inputs import restore_context_kv

    c = cache(tmp_path)
    turn = list(range(300, 340))
    commit(c, turn)
    written = []
    slots = SimpleNamespace(layout=layout, write=lambda slot, kv: written.append(kv.shape[2]))
    prompt = turn + [1, 2, 3]
    assert restore_context_kv(c, slots, 0, prompt, None, reused=40) == 40 and not written
    assert (c.lookups, c.hits, c.reused_tokens) == (1, 0, 0)
    assert restore_context_kv(c, slots, 0, prompt, None, reused=16) == 40 and written == [40]
    assert (c.lookups, c.hits, c.reused_tokens) == (2, 1, 24)


def test_entries_are_found_by_a_later_process_and_forgotten_once_evicted(tmp_path):
    first = cache(tmp_path)
    commit(first, range(200, 240))
    commit(first, range(200, 230))  # held by the first entry already: not written again
    commit(first, range(5))  # shorter than a block: not worth an entry
    assert first.commits == 1 and len(list((tmp_path / "kv").glob("*.kv"))) == 1
    later = cache(tmp_path)  # another trtllm-run on the same store
    prompt = list(range(200, 240)) + [1, 2]
    assert later.lookup(prompt, None, 40, layout).shape[2] == 40
    other_engine = ContextCache(PrefixStore(tmp_path / "kv", "engine-b"))
    assert other_engine.lookup(prompt, None, 40, layout) is None
    for p in (tmp_path / "kv").glob("*.kv"):  # --kv-cache-size evicted it
        p.unlink()
    gone = cache(tmp_path)
    gone.scan()
    assert gone.index == {} and cache(tmp_path).lookup(prompt, None, 40, layout) is None
    later.store.memory.clear()  # (this process's copy too)
    assert later.lookup(prompt, None, 40, layout) is None and later.index == {}


def test_an_evicted_entry_gives_its_blocks_back_and_does_not_stop_a_commit(tmp_path):
    """The next turn's entry took over the last turn's blocks; once it is evicted, the last turn's
    (still on disk) is found again. And an entry the index remembers but the store lost does not
    keep a shorter one from being written."""
    c = cache(tmp_path)
    turn = list(range(400, 400 + 2 * BLOCK))
    commit(c, turn)
    commit(c, turn + list(range(2 * BLOCK)))
    longer = c.store.path(c.store.key(tuple(turn + list(range(2 * BLOCK)))))
    longer.unlink()
    c.store.memory.clear()
    prompt = turn + [0, 1, 2, 3, 4]  # the next turn's entry would go furthest: it is gone, the last turn's is found
    assert c.lookup(prompt, None, len(prompt) - 2, layout).shape[2] == 2 * BLOCK
    assert c.profile()["indexed_entries"] == 1
    fresh = cache(tmp_path / "other")
    commit(fresh, turn + list(range(2 * BLOCK)))
    for p in (tmp_path / "other" / "kv").glob("*.kv"):
        p.unlink()
    fresh.store.memory.clear()
    commit(fresh, turn)  # a prefix of the lost entry: written, not skipped
    assert fresh.commits == 2 and len(list((tmp_path / "other" / "kv").glob("*.kv"))) == 1


def test_the_index_keeps_only_what_the_store_holds_however_many_commits(tmp_path):
    """--kv-cache-size evicts the oldest entries as new ones are saved; the index forgets them then
    (not at a later lookup that meets them), so it stays the store's size over a long input file."""
    entry = kv_of(range(2 * BLOCK)).nbytes + 4096  # (an entry's file: its KV and header)
    c = ContextCache(PrefixStore(tmp_path / "kv", "engine-a", max_bytes=3 * entry, memory_bytes=0))
    for i in range(40):
        commit(c, range(1000 * i, 1000 * i + 2 * BLOCK))
    files = list((tmp_path / "kv").glob("*.kv"))
    on_disk = len(files)
    assert c.commits == 40 and 1 <= on_disk <= 3 * entry // min(p.stat().st_size for p in files) < 40
    assert c.profile()["indexed_entries"] == on_disk == len(c.keys)
    assert len(c.index) == 2 * on_disk  # two blocks an entry: the evicted ones' blocks are gone
    last = list(range(39000, 39000 + 2 * BLOCK)) + [1, 2]
    assert c.lookup(last, None, 2 * BLOCK, layout).shape[2] == 2 * BLOCK


def test_the_entry_that_shares_most_is_restored_past_the_blocks_others_share(tmp_path):
    """Entries that share whole blocks are all followed past them: the one that goes furthest wins,
    whichever is longer (a longer entry that parts from the prompt sooner does not hide it)."""
    c = cache(tmp_path)
    shared = list(range(300, 300 + 2 * BLOCK))
    commit(c, [*shared, *range(5 * BLOCK)])  # the next turn's entry
    commit(c, [*shared, 7, 8, 9, 10, 11])  # shorter, and the prompt's own continuation
    assert c.commits == 2 and c.profile()["indexed_entries"] == 2
    prompt = [*shared, 7, 8, 9, 10, 11, 12, 13, 14]
    assert c.lookup(prompt, None, len(prompt) - 2, layout).shape[2] == 2 * BLOCK + 5
    prompt = [*shared, *range(3 * BLOCK)]
    assert c.lookup(prompt, None, len(prompt) - 2, layout).shape[2] == len(prompt) - 2


def test_a_bad_header_costs_reuse_not_the_run(tmp_path):
    """A file whose header reads as JSON but not as an entry (a token id past int64, one that is no
    integer, no prefix_ids) is passed over by the index: the lookups go on."""
    c = cache(tmp_path)
    commit(c, range(500, 500 + 2 * BLOCK))
    path = next((tmp_path / "kv").glob("*.kv"))
    data = path.read_bytes()
    for bad in (b"100000000000000000000", b'"5"', b"-1"):
        (tmp_path / "kv" / ("0" * 63 + "1.kv")).write_bytes(data.replace(b"[500,", b"[" + bad + b",", 1))
        later = cache(tmp_path)
        assert later.lookup([*range(500, 500 + 2 * BLOCK), 1, 2], None, 2 * BLOCK, layout).shape[2] == 2 * BLOCK


# --- through trtllm-run on a tiny engine ---------------------------------------------------------

SYSTEM = {"role": "system", "content": "You answer questions about the text the user gives, briefly."}
DOC = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do."


def turn_two(first_answer: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": DOC}, {"role": "assistant", "content": first_answer},
            {"role": "user", "content": "And then?"}]


def profile_of(path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("kind", ["float32", "float16", "int4", "kv-int8", "gemma4", "lfm2"])
def test_the_next_turn_reuses_the_last_ones_kv_and_answers_the_same(run_cli, tmp_path, tiny_checkpoint, kind):
    """Bit for bit on float32 engines. Elsewhere the answer's KV, computed in decode steps, differs
    in the last bits from a prefill's (float16 arithmetic; int4's kernels specialise by row count),
    so `including_generated_tokens` (the default) gives logprobs equal to rounding only and
    `prefill_state_only` is the exact policy. gemma4: a float32 engine whose layers keep KV of two
    shapes, and some none (model.kv_layers); lfm2: convolution layers, whose state is kept by position
    as KV (builder/short_conv.py)."""
    pytest.importorskip("torch")
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.tokenizer import Tokenizer

    engine = tmp_path / "engine"
    options = {"int4": {"quantization": "int4"}, "kv-int8": {"kv_cache_dtype": "int8"}, "gemma4": {}, "lfm2": {}}.get(
        kind, {"dtype": kind})
    build(BuildConfig(model=str(tiny_checkpoint(kind if kind in ("gemma4", "lfm2") else "llama")), output=str(engine), max_batch_size=2, max_input_len=256,
                      max_kv_cache_capacity=512, verify=False, **options), log=lambda m: None)
    tokenizer = Tokenizer.from_engine_dir(engine)
    base = {"temperature": 0, "max_generate_length": 24, "num_logprobs": 2}
    first_turn = {**base, "requests": [{"messages": [SYSTEM, {"role": "user", "content": DOC}]}]}
    _, out = run_cli(engine, first_turn)
    first = out["responses"][0]
    second = {**base, "requests": [{"messages": turn_two(first["output_text"])}]}
    _, fresh = run_cli(engine, second, "--kv-cache-dir", str(tmp_path / "none"))
    fresh = fresh["responses"][0]
    for policy in ("including_generated_tokens", "prefill_state_only"):
        store, profile = tmp_path / policy, tmp_path / f"{policy}.json"
        reuse = ("--context-reuse", "--kv-cache-dir", str(store), "--profile", str(profile))
        result, _ = run_cli(engine, {**first_turn, "context_cache_commit_policy": policy}, *reuse)
        assert profile_of(profile)["context_cache"]["committed_entries"] == 1
        result, reused = run_cli(engine, second, *reuse)
        assert result.exit_code == 0, result.output
        prefill, answer = profile_of(profile)["prefill"], reused["responses"][0]
        # what the first turn's KV holds (its prompt, and but for its last token its answer) that the
        # new prompt begins with: a random model's answer need not tokenize again as it was made
        held = tokenizer.encode(first["formatted_complete_request"])
        if policy == "including_generated_tokens":
            held += first["output_ids"][:-1]
        now = tokenizer.encode(answer["formatted_complete_request"])
        shared = next(i for i, (x, y) in enumerate(zip([*held, -1], now)) if x != y)
        assert shared >= first["prompt_tokens"] and prefill["reused_tokens"] == min(shared, len(now) - 2)
        # (positions of the answer, computed in decode steps, restored: the random llama's answer tokenizes
        # again so far; the gemma4 one's does not)
        if policy == "including_generated_tokens" and kind not in ("gemma4", "lfm2"):
            assert shared >= first["prompt_tokens"] + 2
        assert prefill["reused_tokens"] + prefill["computed_tokens"] == len(now)
        assert answer["output_ids"] == fresh["output_ids"]
        if kind in ("float32", "gemma4", "lfm2") or policy == "prefill_state_only":
            assert answer["logprobs"] == fresh["logprobs"]  # bit for bit
        else:
            got, want = ([e["logprob"] for step in r["logprobs"] for e in step] for r in (answer, fresh))
            np.testing.assert_allclose(got, want, atol=2e-2)


def test_policies_choose_what_is_kept_and_looked_up(run_cli, tmp_path, tiny_engine):
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    profile = tmp_path / "profile.json"
    ask = [SYSTEM, {"role": "user", "content": DOC}]
    base = {"temperature": 0, "max_generate_length": 24, "batch_size": 1}
    reuse = ("--context-reuse", "--kv-cache-dir", str(tmp_path / "store"), "--profile", str(profile))
    # one run: the second request is admitted after the first has finished, and reuses its prompt
    result, out = run_cli(engine, {**base, "context_cache_commit_policy": "prefill_state_only", "requests": [
        {"messages": ask}, {"messages": ask + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]},
        {"messages": ask, "context_cache_lookup_policy": "bypass"}]}, *reuse)
    assert result.exit_code == 0, result.output
    first, second, third = out["responses"]
    p = profile_of(profile)
    # the first request's prompt, all of it (prefill_state_only: not its answer), and not by the third
    assert p["context_cache"]["hits"] == 1 and p["context_cache"]["reused_tokens"] == first["prompt_tokens"]
    assert p["prefill"]["reused_tokens"] == first["prompt_tokens"]
    assert third["output_ids"] == first["output_ids"]
    result, _ = run_cli(engine, {**base, "context_cache_lookup_policy": "bypass", "requests": [{"messages": ask}]})
    assert "warning: the context_cache_* policies apply with --context-reuse only" in result.output


def test_wrong_variant_a_restore_one_token_too_long_changes_the_answer(run_cli, tmp_path, tiny_engine, monkeypatch):
    """The equality above has teeth: KV restored one position past what the prompts share (the old
    turn's token where the new prompt has another) changes the logprobs."""
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    base = {"temperature": 0, "max_generate_length": 8, "num_logprobs": 2, "batch_size": 1}
    ask = [SYSTEM, {"role": "user", "content": DOC}]
    other = [SYSTEM, {"role": "user", "content": DOC.replace("tired", "tried")}]
    payload = {**base, "requests": [{"messages": ask}, {"messages": other}]}
    _, fresh = run_cli(engine, payload, "--kv-cache-dir", str(tmp_path / "a"))
    real = ContextCache.lookup

    def too_long(self, prompt, adapter, limit, layout):
        kv = real(self, prompt, adapter, limit, layout)
        if kv is None:
            return None
        tokens = next(t for held in self.index.values() for t, _ in held)
        return self.store.load(tokens, adapter, layout(len(tokens)))[:, :, :kv.shape[2] + 1]
    monkeypatch.setattr(ContextCache, "lookup", too_long)
    _, wrong = run_cli(engine, payload, "--context-reuse", "--kv-cache-dir", str(tmp_path / "b"))
    assert fresh["responses"][0]["logprobs"] == wrong["responses"][0]["logprobs"]
    assert fresh["responses"][1]["logprobs"] != wrong["responses"][1]["logprobs"]


def test_an_eagle_engine_restores_the_heads_kv_with_the_models(run_cli, tmp_path, tiny_checkpoint, monkeypatch):
    """A speculating request keeps its draft-head KV beside the model's (its answer's too: the head
    catches up with its last tokens as it finishes); the next turn restores both, the head's one
    position less, so it answers as without reuse and the head proposes the uncached drafts."""
    pytest.importorskip("torch")
    from tests.eagle_drafts import random_draft
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.speculative import SpecScheduler

    ckpt = tiny_checkpoint("llama")
    draft = random_draft(ckpt, tmp_path / "draft", seed=3, aux=[0, 1, 1])
    engine = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), eagle=str(draft), max_batch_size=2,
                               max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    base = {"temperature": 0, "max_generate_length": 24}
    profile = tmp_path / "profile.json"
    spec = ("--spec-draft-step", "3", "--profile", str(profile))
    reuse = ("--context-reuse", "--kv-cache-dir", str(tmp_path / "store"), *spec)
    _, out = run_cli(engine, {**base, "requests": [{"messages": [SYSTEM, {"role": "user", "content": DOC}]}]}, *reuse)
    first = out["responses"][0]
    second = {**base, "requests": [{"messages": turn_two(first["output_text"])}]}
    proposals = []  # every verification's drafts: the head's proposals
    real = SpecScheduler.verify
    monkeypatch.setattr(SpecScheduler, "verify", lambda self, slot, row, ids, drafts, *rest:
                        proposals.append(tuple(drafts)) or real(self, slot, row, ids, drafts, *rest))
    _, fresh = run_cli(engine, second, "--kv-cache-dir", str(tmp_path / "none"), *spec)
    want, proposals[:] = list(proposals), []
    result, reused = run_cli(engine, second, *reuse)
    assert result.exit_code == 0, result.output
    assert reused["responses"][0]["output_ids"] == fresh["responses"][0]["output_ids"]
    assert proposals == want and any(want)
    # as far as the new prompt follows the first turn's prompt and answer, less the last position
    from trtllm.runtime.tokenizer import Tokenizer

    tok = Tokenizer.from_engine_dir(engine)
    held = tok.encode(first["formatted_complete_request"]) + first["output_ids"][:-1]
    now = tok.encode(reused["responses"][0]["formatted_complete_request"])
    shared = min(next(i for i, (x, y) in enumerate(zip([*held, -1], now)) if x != y), len(now) - 2)
    assert shared > first["prompt_tokens"] + 1  # into the answer
    assert profile_of(profile)["prefill"]["reused_tokens"] == shared - 1


@pytest.mark.parametrize("beams", [1, 2])
def test_a_request_that_restored_context_still_saves_its_system_prompt(run_cli, tmp_path, tiny_engine, beams):
    """save_system_prompt_kv_cache on a request whose prompt --context-reuse restored: its slot holds
    the system prompt's KV all the same, so it is saved, and a later run without --context-reuse
    restores it (a review found the flag dropped there: only rows that restored nothing saved)."""
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    profile, store = tmp_path / "profile.json", str(tmp_path / "store")
    base = {"temperature": 0, "max_generate_length": 8}
    ask = [SYSTEM, {"role": "user", "content": DOC}]
    reuse = ("--context-reuse", "--kv-cache-dir", store, "--profile", str(profile))
    run_cli(engine, {**base, "requests": [{"messages": ask}]}, *reuse)
    result, _ = run_cli(engine, {**base, "requests": [{"messages": ask + [
        {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}], "save_system_prompt_kv_cache": True,
        "num_beams": beams}]}, *reuse)
    assert result.exit_code == 0 and profile_of(profile)["context_cache"]["hits"] == 1
    _, out = run_cli(engine, {**base, "requests": [{"messages": [SYSTEM, {"role": "user", "content": "z"}]}]},
                     "--kv-cache-dir", store, "--profile", str(profile))
    assert profile_of(profile)["prefill"]["reused_tokens"] > 0 and out["responses"][0]["finish_reason"] != "error"


def test_an_entry_with_image_keys_is_found_by_a_later_process(tmp_path):
    """A prompt's image tokens are keyed by negative ids of their own (runtime/media.py): an entry
    holding them is read back by a later process's scan as any other."""
    image = -1 - 2**59
    tokens = [1, 2, 3, *[image] * 20, 4, 5]
    commit(cache(tmp_path), tokens)
    later = cache(tmp_path)
    assert later.lookup(tokens + [6, 7], None, len(tokens), layout).shape[2] == len(tokens)
    other = [1, 2, 3, *[image - 1] * 20, 4, 5]  # (another image: only the 3 tokens before it are shared)
    assert later.lookup(other, None, len(other), layout) is None
