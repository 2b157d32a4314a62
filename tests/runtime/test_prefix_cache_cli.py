"""Saved system-prompt KV end to end on a tiny engine: trtllm-run --kv-cache-dir (the on-disk store
alone: test_prefix_cache.py)."""
from __future__ import annotations

import json

import pytest

SYSTEM = "You are a careful assistant. " * 3


def requests(save_first=True, extra=()):
    reqs = [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]}
            for q in ["Paris?", "The quick brown fox", "Numbers 0 1 2"]]
    if save_first:
        reqs[0]["save_system_prompt_kv_cache"] = True
    return reqs + [{"messages": [{"role": "user", "content": "no system prompt"}]}, *extra]


def run(run_cli, engine, reqs, cache_dir, tmp_path, batch_size=2):
    prof = tmp_path / "prof.json"
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 12, "batch_size": batch_size,
                                   "requests": reqs}, "--kv-cache-dir", str(cache_dir), "--profile", str(prof))
    assert result.exit_code == 0, result.output
    return [r["output_text"] for r in out["responses"]], json.loads(prof.read_text())["prefill"]


@pytest.mark.hf
# (gemma4: KV of two shapes, and layers with none; lfm2: convolutions' state kept by position as KV)
@pytest.mark.parametrize("arch", ["llama", "gemma4", "lfm2"])
def test_reuse_is_token_exact_within_and_across_runs(run_cli, tiny_engine, tmp_path, arch):
    pytest.importorskip("torch")
    engine = tiny_engine(arch)
    baseline, prof = run(run_cli, engine, requests(save_first=False), tmp_path / "none", tmp_path, batch_size=1)
    assert prof["reused_tokens"] == 0 and not (tmp_path / "none").exists()  # (batch 1: none shared in a wave)
    cache = tmp_path / "cache"
    # batch_size 1: request 0 saves, requests 1 and 2 (same system prompt) reuse it in the same run
    first, prof1 = run(run_cli, engine, requests(), cache, tmp_path, batch_size=1)
    assert first == baseline
    assert prof1["reused_tokens"] > 0 and len(list(cache.glob("*.kv"))) == 1
    # a later process: all three reuse it; mixed with a request without a system prompt
    second, prof2 = run(run_cli, engine, requests(), cache, tmp_path, batch_size=4)
    assert second == baseline
    assert prof2["reused_tokens"] == 3 * prof1["reused_tokens"] // 2
    assert prof2["computed_tokens"] < prof["computed_tokens"]
    # Edge-LLM's per-run and per-token figures count the reused tokens too; computed_tokens_per_second does not
    assert prof2["average_tokens_per_run"] * prof2["total_runs"] == pytest.approx(
        prof2["reused_tokens"] + prof2["computed_tokens"])
    assert prof2["tokens_per_second"] > prof2["computed_tokens_per_second"] > 0


@pytest.mark.hf
def test_another_cpu_or_runtime_recomputes(run_cli, tiny_engine, tmp_path, monkeypatch):
    """Saved KV is keyed by what computes it too: a copied engine directory (or a shared cache) on a
    CPU with other instruction sets, whose kernels round differently, does not reuse it."""
    pytest.importorskip("torch")
    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine, cache = tiny_engine("llama"), tmp_path / "cache"
    run(run_cli, engine, requests(), cache, tmp_path)
    _, same = run(run_cli, engine, requests(), cache, tmp_path)
    assert same["reused_tokens"] > 0
    monkeypatch.setattr(ort_backend, "cpu_signature", lambda: "cpu another-one")
    _, other = run(run_cli, engine, requests(save_first=False), cache, tmp_path, batch_size=1)
    assert other["reused_tokens"] == 0


@pytest.mark.hf
def test_corrupt_entry_is_recomputed(run_cli, tiny_engine, tmp_path):
    pytest.importorskip("torch")
    engine, cache = tiny_engine("llama"), tmp_path / "cache"
    baseline, _ = run(run_cli, engine, requests(), cache, tmp_path)
    (entry,) = cache.glob("*.kv")
    entry.write_bytes(entry.read_bytes()[:-100])
    again, prof = run(run_cli, engine, requests(), cache, tmp_path, batch_size=1)
    assert again == baseline
    assert prof["reused_tokens"] > 0  # recomputed by request 0, saved again, reused by 1 and 2


@pytest.mark.hf
def test_two_engines_share_a_cache_dir(run_cli, tiny_engine, tmp_path):
    pytest.importorskip("torch")
    cache = tmp_path / "cache"
    a, _ = run(run_cli, tiny_engine("llama"), requests(), cache, tmp_path)
    b_alone, _ = run(run_cli, tiny_engine("qwen2"), requests(save_first=False), tmp_path / "none", tmp_path)
    b, _ = run(run_cli, tiny_engine("qwen2"), requests(), cache, tmp_path)
    assert b == b_alone  # the llama engine's entry (same prefix ids) was not used by qwen2
    assert len(list(cache.glob("*.kv"))) == 2  # one entry per engine
    a2, _ = run(run_cli, tiny_engine("llama"), requests(), cache, tmp_path)
    b2, _ = run(run_cli, tiny_engine("qwen2"), requests(), cache, tmp_path)
    assert (a2, b2) == (a, b)


@pytest.mark.hf
def test_unwritable_cache_dir_fails_no_request(run_cli, tiny_engine, tmp_path):
    """A --kv-cache-dir that cannot be written: every request answers as without a cache, and
    requests of this run still reuse the prefix from memory."""
    pytest.importorskip("torch")
    engine = tiny_engine("llama")
    baseline, _ = run(run_cli, engine, requests(save_first=False), tmp_path / "none", tmp_path)
    (tmp_path / "afile").write_text("x")
    got, prof = run(run_cli, engine, requests(), tmp_path / "afile" / "cache", tmp_path, batch_size=1)
    assert got == baseline
    assert prof["reused_tokens"] > 0
    result, _ = run_cli(engine, {"max_generate_length": 2, "requests": requests()},
                        "--kv-cache-dir", str(tmp_path / "afile" / "cache"))
    # one plain line, not Python's "file.py:293: PrefixCacheWarning: ..." and the source line
    assert "warning: saved KV cannot be written to" in result.output
    assert "PrefixCacheWarning" not in result.output and ".py:" not in result.output


@pytest.mark.hf
def test_a_prompt_that_is_its_system_prompt_is_saved(run_cli, tiny_engine, tmp_path):
    pytest.importorskip("torch")
    engine, cache = tiny_engine("llama"), tmp_path / "cache"
    only_system = {"messages": [{"role": "system", "content": SYSTEM}], "save_system_prompt_kv_cache": True}
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "add_generation_prompt": False,
                                   "requests": [only_system]}, "--kv-cache-dir", str(cache))
    assert result.exit_code == 0, result.output
    r = out["responses"][0]
    assert r["formatted_complete_request"] == r["formatted_system_prompt"]
    assert len(list(cache.glob("*.kv"))) == 1
    baseline, _ = run(run_cli, engine, requests(save_first=False), tmp_path / "none", tmp_path)
    again, prof = run(run_cli, engine, requests(save_first=False), cache, tmp_path)
    assert again == baseline and prof["reused_tokens"] > 0


def test_a_request_whose_prompt_saves_nothing_says_so(run_cli, tiny_engine, tmp_path):
    """save_system_prompt_kv_cache where nothing can be saved (no chat template, a truncated prompt)
    is a warning naming the request's field and why; the answers are as ever and no entry is
    written (it was silent). Where the prompt has a system prompt, no warning."""
    engine, cache = tiny_engine("llama"), tmp_path / "cache"
    system = {"role": "system", "content": SYSTEM}
    ask = [system, {"role": "user", "content": "Paris?"}]
    result, _ = run_cli(engine, {"max_generate_length": 2, "temperature": 0, "requests": [
        {"messages": ask, "save_system_prompt_kv_cache": True, "truncate_prompt_tokens": 4}]},
        "--kv-cache-dir", str(cache))
    assert result.exit_code == 0, result.output
    assert ("warning: `requests[0].save_system_prompt_kv_cache`: nothing is saved: truncate_prompt_tokens cut "
            "the prompt's start") in result.output
    result, _ = run_cli(engine, {"max_generate_length": 2, "apply_chat_template": False, "requests": [
        {"messages": ask, "save_system_prompt_kv_cache": True}]}, "--kv-cache-dir", str(cache))
    assert ("warning: `requests[0].save_system_prompt_kv_cache`: nothing is saved: without the chat template a prompt has no "
            "system prompt to save") in result.output
    assert not list(cache.glob("*.kv"))
    result, _ = run_cli(engine, {"max_generate_length": 2, "requests": [
        {"messages": ask, "save_system_prompt_kv_cache": True}]}, "--kv-cache-dir", str(cache))
    assert "nothing is saved" not in result.output and len(list(cache.glob("*.kv"))) == 1
