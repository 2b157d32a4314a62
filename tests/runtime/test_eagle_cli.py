"""EAGLE through trtllm-build and trtllm-run: the answers with speculation are the answers without
it (greedy, sampled, logprobs, stop strings, disable_spec_decode, in flight, saved system-prompt KV),
and the profile reports it (bad draft heads: test_eagle_build.py; other engine forms:
test_eagle_forms.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import pytest

from tests.runtime.eagle_cli import LIMITS, REQUESTS, answers, chat
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build
from trtllm.runtime import manifest as mf

pytest.importorskip("safetensors.numpy")
pytestmark = pytest.mark.hf


@pytest.mark.parametrize("batch_size", [4, 2])
def test_speculation_changes_no_answer(eagle_engine, run_cli, tmp_path, batch_size):
    engine, _ = eagle_engine
    plain, plain_profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", batch_size=batch_size)
    assert "eagle_generation" not in plain_profile
    for step in ("1", "4"):
        got, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", step, batch_size=batch_size)
        assert got == plain
        spec = profile["eagle_generation"]
        assert spec["draft_step"] == int(step) and spec["verify_steps"] > 0
        assert spec["drafted_tokens"] > 0 and 0 <= spec["accepted_tokens"] <= spec["drafted_tokens"]
        # each step is counted under what it drafted: at most the step, fewer near a row's end, and
        # "0" for a plain one (no row left to speculate, or nothing to draft)
        drafted = {int(k): n for k, n in spec["draft_steps"].items()}
        assert max(drafted) == int(step) and spec["verify_steps"] == sum(n for k, n in drafted.items() if k)
        assert sum(drafted.values()) == profile["generation"]["total_runs"]
        # Edge-LLM's figures as its runtime counts them: a sequence's rounds (each at least its own
        # token, and its prefill token besides), per speculating sample (one disables speculation)
        assert spec["average_acceptance_rate"] == spec["total_generated_tokens"] / spec["total_iterations"] > 1
        assert spec["verify_steps"] <= spec["total_iterations"] <= spec["verify_steps"] * batch_size
        assert 0 < spec["total_runs"] <= len(REQUESTS) - 1
        assert spec["average_tokens_per_run"] == spec["total_generated_tokens"] / spec["total_runs"]
        assert spec["draft_acceptance_rate"] == spec["accepted_tokens"] / spec["drafted_tokens"]
        assert spec["overall_tokens_per_second_excluding_base_prefill"] > 0
    got, profile = answers(run_cli, engine, tmp_path, batch_size=batch_size)  # auto, the default
    assert got == plain
    spec = profile["eagle_generation"]
    assert spec["draft_step"] == "auto" and set(spec["draft_steps"]) <= {"0", "1", "2", "3", "4"}
    assert sum(spec["draft_steps"].values()) == profile["generation"]["total_runs"]
    assert spec["verify_steps"] == sum(n for k, n in spec["draft_steps"].items() if k != "0")


@pytest.mark.parametrize("step", ["2", "auto"])
def test_no_speculating_row_takes_plain_steps(eagle_engine, run_cli, tmp_path, monkeypatch, step):
    """Sampled rows with penalties where the host cannot draw as the engine's sampler does (its
    sampler not our kernel's: verification draws every position under the cycle's first penalties)
    and disable_spec_decode never speculate: every decode step is a plain one."""
    from trtllm.runtime import sampling

    monkeypatch.setattr(sampling, "host_draws", lambda manifest: False)
    engine, _ = eagle_engine
    requests = [REQUESTS[3], chat("Tell me", temperature=0.8, seed=3, repetition_penalty=1.2),
                chat("More", temperature=0.5, seed=1, presence_penalty=-0.5)]
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=requests)
    got, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", step, requests=requests)
    spec = profile["eagle_generation"]
    assert got == plain and spec["verify_steps"] == 0 and spec["drafted_tokens"] == 0
    assert spec["draft_steps"] == {"0": profile["generation"]["total_runs"]}


def test_sampled_rows_speculate(eagle_engine, run_cli, tmp_path):
    """Sampled requests (temperature, top-k, top-p, min-p, logit_bias, seeded) speculate, and give
    the answers they give without speculation: verification draws each drafted position's token
    with the random number plain decoding would draw it with."""
    engine, _ = eagle_engine
    requests = [REQUESTS[1], chat("Edge devices", temperature=1.2, top_p=0.9, min_p=0.05, seed=11),
                chat("Numbers", temperature=0.5, top_k=5, logit_bias={"7": 2.0}, seed=5)]
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=requests)
    for extra in (("--spec-draft-step", "3"), ("--spec-draft-step", "3", "--spec-draft-top-k", "2")):
        got, profile = answers(run_cli, engine, tmp_path, *extra, requests=requests)
        assert got == plain and profile["eagle_generation"]["drafted_tokens"] > 0


def test_greedy_proposals_take_the_heads_argmax(eagle_engine, run_cli, tmp_path, monkeypatch):
    """Edge-LLM's spec_proposal_sampling: "greedy" drafts a sampled request's tokens as the head's
    argmax instead of guessing at its draws; the answers are the same either way."""
    from trtllm.runtime.speculative import SpecScheduler

    engine, _ = eagle_engine
    guessed = []
    real = SpecScheduler.guess
    monkeypatch.setattr(SpecScheduler, "guess", staticmethod(lambda *a: guessed.append(1) or real(*a)))
    sampled = [chat("Edge devices", temperature=1.2, top_p=0.9, seed=11)]
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=sampled)
    for policy, guesses in (("auto", True), ("probabilistic", True), ("greedy", False)):
        guessed[:] = []
        got, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "3",
                               requests=[{**sampled[0], "spec_proposal_sampling": policy}])
        assert got == plain and profile["eagle_generation"]["drafted_tokens"] > 0
        assert bool(guessed) == guesses, policy


def test_min_new_tokens_and_greedy_penalties_speculate(eagle_engine, run_cli, tmp_path):
    """Requests with min_new_tokens (EOS and stop_token_ids held back) speculate, greedy and sampled,
    and ones with penalties (raising ones too) or a grammar, greedy and sampled, and give the answers
    they give without speculation: a cycle stops at the ban's end, and a penalized or guided row's
    positions are walked under the penalties and mask after the tokens before them."""
    engine, _ = eagle_engine
    requests = [chat("Edge devices", min_new_tokens=20, ignore_eos=False),
                chat("Numbers", temperature=0.9, top_p=0.9, seed=4, min_new_tokens=12, stop_token_ids=[5, 9]),
                chat("More", min_new_tokens=24, repetition_penalty=1.3, frequency_penalty=0.5),
                chat("Less", repetition_penalty=0.8, presence_penalty=-0.5),
                chat("Words", repetition_penalty=1.2, guided_decoding={"regex": "[a-z ]{5,60}"}),
                chat("Tell me", temperature=0.8, seed=3, repetition_penalty=1.2, frequency_penalty=0.3),
                chat("Spell", temperature=0.5, seed=5, guided_decoding={"regex": "[a-z ]{5,60}"})]
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=requests)
    for extra in (("--spec-draft-step", "3"), ("--spec-draft-step", "2", "--spec-draft-top-k", "2")):
        got, profile = answers(run_cli, engine, tmp_path, *extra, requests=requests)
        assert got == plain and profile["eagle_generation"]["drafted_tokens"] > 0


def test_steps_are_counted_under_what_they_drafted(eagle_engine, run_cli, tmp_path):
    """Two greedy requests of 5 tokens with --spec-draft-step 2: the last steps draft fewer (a row
    at its last token drafts none), and are counted so; a step that drafts nothing is a plain one."""
    engine, _ = eagle_engine
    requests = [chat("Edge devices run small language models", max_generate_length=5),
                chat("The quick brown fox", max_generate_length=5)]
    got, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "2", requests=requests)
    spec, drafted = profile["eagle_generation"], {int(k): n for k, n in profile["eagle_generation"]["draft_steps"].items()}
    assert drafted.get(0, 0) >= 1 and set(drafted) <= {0, 1, 2}
    assert spec["verify_steps"] == sum(n for k, n in drafted.items() if k)
    assert spec["drafted_tokens"] <= sum(k * n for k, n in drafted.items()) * len(requests)
    # Edge-LLM's stages: each engine call timed, under the stage it was
    stages = {s["stage_id"]: s for s in profile["stages"]}
    assert stages["spec_decode_base_verification"]["total_runs"] == spec["verify_steps"]
    assert stages["llm_prefill"]["total_runs"] == profile["prefill"]["total_runs"]
    assert sum(stages[k]["total_runs"] for k in ("llm_generation", "spec_decode_base_verification")) == \
        profile["generation"]["total_runs"]
    assert sum(stages[k]["total_runs"] for k in stages if k.startswith("spec_decode_draft")) == spec["draft_runs"]
    for s in stages.values():
        stats = s["gpu_time_stats"]
        assert stats["count"] == s["total_runs"] and isinstance(stats["count"], int) and stats["min_ms"] <= stats["median_ms"] <= stats["p95_ms"]
        assert stats["p95_ms"] <= stats["p99_ms"] <= stats["max_ms"]
        assert abs(s["average_time_per_run_ms"] * s["total_runs"] - s["total_gpu_time_ms"]) < 1e-6
    plain, plain_profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=requests)
    assert got == plain
    assert {s["stage_id"] for s in plain_profile["stages"]} == {"llm_prefill", "llm_generation"}


def test_non_finite_logits_in_a_verification_fail_that_row(eagle_engine, run_cli, tmp_path, monkeypatch):
    """The root position's logits overflow (NaN there, so the last position's top logprob too): that
    row fails alone, its neighbour answers as without speculation."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine, _ = eagle_engine
    requests = [chat("Edge devices run small language models"), chat("The quick brown fox")]
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=requests)
    step, calls = ort_backend.OnnxRuntimeEngine.step, []

    def overflow_row_0_in_a_verification(self, inputs, kv, want_logits=False):
        out = step(self, inputs, kv, want_logits)
        calls.append(inputs.verify_index is not None)
        if calls.count(True) == 2 and calls[-1]:
            out.top_logprobs[0, 0] = np.nan
            out.verify_logits[0, 0, 5] = np.nan
        return out

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", overflow_row_0_in_a_verification)
    profile = tmp_path / "p.json"
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 24, "batch_size": 2,
                                   "requests": requests}, "--spec-draft-step", "2", "--profile", str(profile))
    assert result.exit_code == 1 and json.loads(profile.read_text())["eagle_generation"]["verify_steps"] > 1
    bad, good = out["responses"]
    assert bad["finish_reason"] == "error" and "logits were not finite" in bad["error"]
    assert (good["output_text"], good["finish_reason"]) == plain[1][:2]


@pytest.mark.parametrize("damage", ["past the vocabulary", "NaN logits"])
def test_a_bad_drafted_position_fails_its_row_alone_with_logprobs(eagle_engine, run_cli, tmp_path, monkeypatch,
                                                                  damage):
    """A drafted position whose logits overflowed (the sampler's token then past the vocabulary, or
    the logits NaN) in a row that asks for logprobs: that row fails, its neighbour is answered."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    engine, _ = eagle_engine
    requests = [chat("Edge devices run small language models", num_logprobs=3), chat("The quick brown fox")]
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=requests)
    step, calls = ort_backend.OnnxRuntimeEngine.step, []

    def damaged(self, inputs, kv, want_logits=False):
        out = step(self, inputs, kv, want_logits)
        calls.append(inputs.verify_index is not None and inputs.verify_index.shape[1] > 0)
        if calls.count(True) == 2 and calls[-1]:
            if damage == "NaN logits":
                out.verify_logits[0, 0, 5] = np.nan
            else:
                out.verify_ids[0, 0] = self.manifest.model.vocab_size
        return out

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", damaged)
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 24, "batch_size": 2,
                                   "requests": requests}, "--spec-draft-step", "2")
    assert result.exit_code == 1, result.output
    bad, good = out["responses"]
    assert bad["finish_reason"] == "error" and "logits were not finite" in bad["error"]
    assert (good["output_text"], good["finish_reason"]) == plain[1][:2]


@pytest.mark.parametrize("batch_size", [4, 2])
def test_draft_trees_change_no_answer(eagle_engine, run_cli, tmp_path, batch_size):
    """--spec-draft-top-k 3: each step verifies a tree of the head's candidates (3 per node, as deep
    as the draft step) instead of a chain; the answers are those without speculation."""
    engine, _ = eagle_engine
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", batch_size=batch_size)
    for extra in (["--spec-draft-step", "1"], ["--spec-draft-step", "3"], ["--spec-draft-step", "3",
                  "--spec-verify-size", "5"], []):
        got, profile = answers(run_cli, engine, tmp_path, *extra, "--spec-draft-top-k", "3", batch_size=batch_size)
        spec = profile["eagle_generation"]
        assert got == plain and spec["draft_top_k"] == 3 and 0 <= spec["branch_tokens"] <= spec["accepted_tokens"]
        drafted = {int(k): n for k, n in spec["draft_steps"].items()}  # steps by the trees' depth
        assert spec["verify_steps"] == sum(n for k, n in drafted.items() if k) > 0
        if extra[1:2] == ["3"]:  # a depth-3 tree verifies top-k x depth nodes, or --spec-verify-size - 1
            most = 4 if extra[2:] else 9
            assert max(drafted) == 3 and spec["drafted_tokens"] <= most * 4 * spec["verify_steps"]
    _, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "2", requests=REQUESTS[:1])
    assert profile["eagle_generation"]["draft_top_k"] == 1  # auto on ONNX Runtime: a chain


@pytest.mark.parametrize("args,message", [
    (["--spec-draft-top-k", "0"], "auto or an integer >= 1"), (["--spec-draft-top-k", "x"], "auto or an integer >= 1"),
    (["--spec-draft-top-k", "11"], "its 10 best proposals at most"),
    (["--spec-verify-size", "1"], "auto or an integer >= 2"),
    (["--spec-verify-size", "4"], "a chain (--spec-draft-top-k 1) verifies its drafts alone")])
def test_bad_tree_options_are_usage_errors(eagle_engine, run_cli, args, message):
    engine, _ = eagle_engine
    result, _ = run_cli(engine, {"requests": REQUESTS[:1]}, *args)
    assert result.exit_code == 2 and args[0] in result.output and message in result.output


def test_a_chain_only_engine_refuses_a_tree(eagle_engine, tiny_checkpoint, run_cli, tmp_path):
    """ONNX Runtime's own attention (--cpu-kernels onnxruntime) takes no tree mask: the engine
    drafts chains, says so when asked for a tree, and answers as before with the default."""
    engine, draft = eagle_engine
    chain = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "chain"), eagle=str(draft),
                              cpu_kernels="onnxruntime", **LIMITS), log=lambda m: None)
    m = mf.load(chain)
    assert m.eagle["tree"] is False and m.eagle["draft_top_k"] == 1
    result, _ = run_cli(chain, {"requests": REQUESTS[:1]}, "--spec-draft-top-k", "2")
    assert result.exit_code == 2 and "drafts chains only" in result.output
    _, profile = answers(run_cli, chain, tmp_path, "--spec-draft-step", "2", requests=REQUESTS[:2])
    assert profile["eagle_generation"]["draft_top_k"] == 1


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_bad_draft_step_is_a_usage_error(eagle_engine, run_cli, value):
    engine, _ = eagle_engine
    result, _ = run_cli(engine, {"requests": REQUESTS[:1]}, "--spec-draft-step", value)
    assert result.exit_code == 2 and "--spec-draft-step" in result.output and "auto or an integer" in result.output


def test_default_step_and_manifest(eagle_engine, run_cli, tmp_path):
    engine, draft = eagle_engine
    m = mf.load(engine)
    assert m.eagle["aux_layers"] == [0, 1, 1] and m.eagle["draft_step"] == 1  # where auto starts on a CPU
    assert (engine / m.eagle["onnx"]).is_file() and (engine / m.eagle["compiled"]).is_file()
    _, profile = answers(run_cli, engine, tmp_path, requests=REQUESTS[:1])
    assert profile["eagle_generation"]["draft_step"] == "auto"
    kv = profile["kv_cache"]  # the head's KV: one layer of the model's shape here
    assert 0 < kv["draft_allocated_bytes"] < kv["allocated_bytes"] and "present_copy_bytes" not in kv


def test_saved_system_prompt_reuse(eagle_engine, run_cli, tmp_path):
    """A system prompt saved without speculating has no head KV: a speculating request that saves
    computes the whole prompt again and saves the head's KV beside it; later ones restore both. The
    text is the same throughout."""
    engine, _ = eagle_engine
    system = {"role": "system", "content": "You are a careful assistant who answers briefly."}
    reqs = [{"messages": [system, {"role": "user", "content": t}], "save_system_prompt_kv_cache": True}
            for t in ("Edge devices", "The quick brown fox")]
    cache = ["--kv-cache-dir", str(tmp_path / "kv")]
    plain, plain_profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", *cache, requests=reqs)
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 1  # the model's KV only
    first, profile = answers(run_cli, engine, tmp_path, *cache, requests=reqs, batch_size=4)
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 2
    # nothing restored from the store (no head KV there yet): the first computes its prompt, and the
    # second, admitted with it, copies its KV, one position less than without speculation
    assert profile["prefill"]["reused_tokens"] == plain_profile["prefill"]["reused_tokens"] - 1 > 0
    again, profile = answers(run_cli, engine, tmp_path, *cache, requests=reqs)
    assert profile["prefill"]["reused_tokens"] > 0
    assert first == plain and again == plain


def test_restored_prompt_without_head_kv_proposes_as_uncached(eagle_engine, run_cli, tmp_path, monkeypatch):
    from trtllm.runtime.speculative import SpecScheduler

    """Speculating requests that do not save, on a prompt whose model KV was saved without the
    head's: they compute it whole (the draft needs its hidden states) and save the head's KV, so
    their proposals, and every later run's, are those of an uncached run."""
    engine, _ = eagle_engine
    system = {"role": "system", "content": "You are a careful assistant who answers briefly."}
    reqs = [{"messages": [system, {"role": "user", "content": t}]} for t in ("Edge devices", "The quick brown fox")]
    cache = ["--kv-cache-dir", str(tmp_path / "kv")]
    saving = [{**r, "save_system_prompt_kv_cache": True} for r in reqs]
    answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", *cache, requests=saving)
    assert len(list((tmp_path / "kv").glob("*.kv"))) == 1  # the model's KV only
    proposals = []  # every verification's drafts, row by row: the head's proposals
    real = SpecScheduler.verify
    monkeypatch.setattr(SpecScheduler, "verify", lambda self, slot, row, ids, drafts, *rest:
                        proposals.append((row.prompt_ids[-1], tuple(drafts))) or real(self, slot, row, ids, drafts, *rest))
    uncached, uncached_profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "2", "--kv-cache-dir",
                                         str(tmp_path / "none"), requests=reqs)
    want, proposals[:] = sorted(proposals), []
    assert any(drafts for _, drafts in want)
    shared = uncached_profile["prefill"]["reused_tokens"]  # the second copies the first's prompt, in any run
    for restored in (False, True):
        got, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "2", *cache, requests=reqs)
        assert got == uncached and sorted(proposals) == want
        assert (profile["prefill"]["reused_tokens"] > shared) == restored
        assert len(list((tmp_path / "kv").glob("*.kv"))) == 2
        proposals[:] = []


def test_verify_report(eagle_engine):
    engine, _ = eagle_engine
    report = json.loads((engine / "verify.json").read_text())["eagle"]
    assert report["proposals_agree"] and report["hidden_max_abs_error"] < 1e-3 * max(1, report["hidden_max_abs"])


def test_bench_eagle_script_pairs_rounds(eagle_engine, tmp_path):
    """scripts/bench_eagle.py runs on an EAGLE engine and prints, per setting, a paired ratio to
    k=0 with its range over the rounds (k=0 against itself: exactly 1)."""
    import subprocess
    import sys

    engine, _ = eagle_engine
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_eagle.py"
    out = subprocess.run([sys.executable, str(script), str(engine), "--steps", "0,1,1x3", "--batches", "2",
                          "--rounds", "2", "--threads", "1", "--gen", "6"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    lines = out.splitlines()
    assert len(lines) == 3 and "k=0" in lines[0] and "1.00x [1.00-1.00]" in lines[0]
    assert "k=1 " in lines[1] and "drafts accepted" in lines[1] and "branch" not in lines[1], out
    assert "k=1x3" in lines[2] and "on a branch" in lines[2], out


def test_logprob_rows_take_plain_steps_without_the_verified_logits(eagle_engine, run_cli, tmp_path):
    """An engine whose graph gives no verify_logits (built before them, or a TensorRT plan:
    eagle.logprobs false) runs rows with logprobs in plain steps; with them, those rows speculate."""
    import shutil

    engine, _ = eagle_engine
    requests = [REQUESTS[2]]
    _, profile = answers(run_cli, engine, tmp_path, "--spec-draft-step", "2", requests=requests)
    assert profile["eagle_generation"]["verify_steps"] > 0
    older = tmp_path / "older"
    shutil.copytree(engine, older)
    raw = json.loads((older / mf.MANIFEST_NAME).read_text())
    raw["eagle"]["logprobs"] = False
    raw["prompt_logits"] = raw["verify_sampler"] = False  # (a build before them: its verify steps bind no logits)
    (older / mf.MANIFEST_NAME).write_text(json.dumps(raw))
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=requests)
    got, profile = answers(run_cli, older, tmp_path, "--spec-draft-step", "2", requests=requests)
    assert got == plain and profile["eagle_generation"]["verify_steps"] == 0
    # and its greedy rows speculate, binding no logits (an empty buffer once failed every such step)
    greedy = [REQUESTS[0], REQUESTS[4]]
    plain, _ = answers(run_cli, engine, tmp_path, "--spec-draft-step", "0", requests=greedy)
    got, profile = answers(run_cli, older, tmp_path, "--spec-draft-step", "2", requests=greedy)
    assert got == plain and profile["eagle_generation"]["verify_steps"] > 0


def test_an_eagle_graph_under_a_manifest_without_eagle_is_refused(eagle_engine, tmp_path):
    import shutil

    from trtllm.runtime import manifest as mf
    from trtllm.runtime.engine import load_engine

    engine = tmp_path / "engine"
    shutil.copytree(eagle_engine[0], engine)
    raw = json.loads((engine / "manifest.json").read_text())
    raw["eagle"] = {}
    (engine / "manifest.json").write_text(json.dumps(raw))
    # (verify_index and verify_uniform are a plain ONNX Runtime engine's too, for prompt_logprobs and
    # prompt lookup: the draft tree's mask is what gives the graph away)
    with pytest.raises(mf.ManifestError, match="the graph has an input 'tree_mask', which the manifest's "
                                               "eagle.tree does not call for"):
        load_engine(engine)
