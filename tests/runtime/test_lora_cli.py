"""LoRA through trtllm-build and trtllm-run: bundled adapters, adapters named by the input file,
mixed batches, a bad adapter failing only its requests, saved system-prompt KV kept per adapter,
the legacy graph and the TensorRT engine (tests/fakes) giving the ONNX Runtime engine's answers."""
from __future__ import annotations

import json

import numpy as np

import pytest

from scripts.bench_lora import ALL
from scripts.bench_lora import random_adapter as write_adapter
from tests import fakes
from trtllm.builder.config import BuildConfig, ConfigError
from trtllm.builder.export import build
from trtllm.plugins.lint import lint_model
from trtllm.runtime import lora
from trtllm.runtime import manifest as mf

pytest.importorskip("safetensors.numpy")  # the adapters' files
pytestmark = pytest.mark.hf
LIMITS = dict(max_batch_size=4, max_input_len=96, max_kv_cache_capacity=192)


def random_adapter(path, manifest: mf.Manifest, rank: int, seed: int, modules=ALL):
    """scripts/bench_lora.py's adapter, strong enough (N(0, 0.3), alpha 2r) that it changes the text."""
    return write_adapter(path, manifest, rank, seed, modules, std=0.3, alpha=2 * rank)


@pytest.fixture(scope="module")
def lora_engines(tiny_checkpoint, tmp_path_factory):
    """{ort, legacy, trt}: LoRA engines (max rank 4) of one checkpoint, the first with a bundled adapter;
    plus the adapters' directory."""
    root, ckpt = tmp_path_factory.mktemp("lora-cli"), str(tiny_checkpoint("llama"))
    plain = build(BuildConfig(model=ckpt, output=str(root / "probe"), max_lora_rank=4, verify=False, **LIMITS),
                  log=lambda m: None)
    m = mf.load(plain)
    adapters = root / "inputs" / "adapters"
    random_adapter(root / "bundled", m, 4, seed=0)
    random_adapter(adapters / "a", m, 2, seed=1, modules=["q_proj", "v_proj", "down_proj"])
    random_adapter(adapters / "big", m, 8, seed=2)
    random_adapter(adapters / "b", m, 2, seed=4, modules=["q_proj", "v_proj", "down_proj"])  # a's shapes: no growth
    engines = {"ort": build(BuildConfig(model=ckpt, output=str(root / "ort"), lora=(("bundled", str(root / "bundled")),),
                                        **LIMITS), log=lambda m: None),
               "legacy": build(BuildConfig(model=ckpt, output=str(root / "legacy"), graph="legacy", trt_version="10.3",
                                           max_lora_rank=4, backend="onnxruntime", **LIMITS), log=lambda m: None)}
    with fakes.installed():
        engines["trt"] = build(BuildConfig(model=ckpt, output=str(root / "trt"), backend="tensorrt", max_lora_rank=4,
                                           **LIMITS), log=lambda m: None)
    return engines, adapters


def chat(text, **extra):
    return {"messages": [{"role": "user", "content": text}], **extra}


def payload(adapters, requests, **top):
    return {"temperature": 0, "max_generate_length": 8, "batch_size": 4,
            "available_lora_weights": {"a": "adapters/a", "b": "adapters/b", "big": str(adapters / "big")},
            "requests": requests, **top}


@pytest.fixture
def cli(run_cli, tmp_path, lora_engines):
    """Runs with the input file next to the adapters directory (relative paths resolve from it)."""
    import shutil

    engines, adapters = lora_engines
    shutil.copytree(adapters, tmp_path / "adapters")

    def go(engine: str, requests, *extra, **top):
        result, out = run_cli(engines[engine], payload(tmp_path / "adapters", requests, **top), *extra)
        return result, out

    return go


def texts(out):
    return [r["output_text"] for r in out["responses"]]


def test_the_build_records_limits_and_bundles_adapters(lora_engines):
    engines, _ = lora_engines
    m = mf.load(engines["ort"])
    assert m.limits.max_lora_rank == 4  # from the bundled adapter's rank
    assert "trtllm.cpu::LoraAdd" in m.lowerings  # the ONNX Runtime form's deltas run on our kernel
    assert m.lora["adapters"] == {"bundled": "lora/bundled"} and set(m.lora["sites"]) == {"qkv", "o", "gate_up", "down"}
    assert (engines["ort"] / "lora" / "bundled" / lora.WEIGHTS_NAME).is_file()
    report = json.loads((engines["ort"] / "verify.json").read_text())["adapters"]["bundled"]
    assert report["max_abs_error"] < 1e-4 and report["tokens_agree"]  # checked against transformers, merged
    assert report["reference"] == "peft"  # by PEFT itself, not by our reading of the adapter
    assert lint_model(str(engines["ort"] / "llm.onnx")) == []
    shapes = {p["name"]: p["shapes"] for p in mf.load(engines["trt"]).tensorrt["profiles"]}
    assert shapes["decode"][m.io.lora_a.format(i=0, module="self_attn.q_proj")] == [[1, 64, 0], [1, 64, 4], [4, 64, 4]]
    assert shapes["prefill"][m.io.lora_b.format(i=1, module="mlp.down_proj")] == [[1, 0, 64], [1, 4, 64], [4, 4, 64]]


def test_requests_pick_adapters_and_a_bad_one_fails_alone(cli):
    requests = [chat("hello"), chat("hello", lora_name="a"), chat("hello", lora_name="bundled"),
                chat("hello", lora_name="big"), chat("hello", lora_name="a")]
    result, out = cli("ort", requests)
    assert result.exit_code == 1, result.output
    r = out["responses"]
    assert r[3]["finish_reason"] == "error" and "rank 8, above the engine's max_lora_rank 4" in r[3]["error"]
    # the value to fix is the input's entry for it (the request names it)
    assert r[3]["error"].startswith('`available_lora_weights["big"]` (`requests[3].lora_name`): ')
    assert [x["finish_reason"] for x in r[:3] + r[4:]] == ["max-length"] * 4
    assert len({r[0]["output_text"], r[1]["output_text"], r[2]["output_text"]}) == 3  # each adapter changes the text
    assert r[1]["output_text"] == r[4]["output_text"]
    alone = [texts(cli("ort", [q], batch_size=1)[1])[0] for q in requests[:3]]
    assert alone == texts(out)[:3]  # mixed in one batch = each alone


def test_beam_requests_take_their_adapters(cli):
    """Beam searches with adapters (and without) side by side: each request's beams are what it
    gives alone, and its adapter changes them; a bad adapter fails its beam request alone."""
    requests = [chat("hello", num_beams=2, n=2, lora_name="a"), chat("hello", num_beams=2),
                chat("hello", num_beams=2, lora_name="bundled"), chat("hello", num_beams=2, lora_name="big")]
    result, out = cli("ort", requests)
    assert result.exit_code == 1, result.output
    r = out["responses"]
    assert [x["request_idx"] for x in r] == [0, 0, 1, 2, 3]
    assert r[4]["finish_reason"] == "error" and "above the engine's max_lora_rank 4" in r[4]["error"]
    assert all(x["beam_score"] is not None for x in r[:4])
    assert len({r[0]["output_text"], r[2]["output_text"], r[3]["output_text"]}) == 3  # each adapter changes them
    alone = [cli("ort", [q], batch_size=1)[1]["responses"] for q in requests[:3]]
    assert [[x["output_ids"] for x in a] for a in alone] == [[x["output_ids"] for x in r[:2]], [r[2]["output_ids"]],
                                                             [r[3]["output_ids"]]]
    assert [x["beam_score"] for a in alone for x in a] == pytest.approx([x["beam_score"] for x in r[:4]])


def test_unknown_adapter_name_fails_that_request(cli):
    result, out = cli("ort", [chat("hi"), chat("hi", lora_name="nope")])
    assert result.exit_code == 1 and [r["finish_reason"] for r in out["responses"]] == ["max-length", "error"]
    error = out["responses"][1]["error"]
    assert "requests[1].lora_name" in error and "bundled" in error


def test_saved_system_prompt_kv_is_kept_per_adapter(cli, tmp_path):
    system = [{"role": "system", "content": "You are a terse assistant that answers in one line."}]
    req = {"messages": system + [{"role": "user", "content": "hi"}], "save_system_prompt_kv_cache": True}
    cache = ["--kv-cache-dir", str(tmp_path / "kv")]
    fresh = texts(cli("ort", [dict(req, lora_name="a")], "--kv-cache-dir", str(tmp_path / "other"))[1])
    assert cli("ort", [req], *cache)[0].exit_code == 0               # saves the base model's prefix KV
    result, out = cli("ort", [dict(req, lora_name="a")], *cache, "--profile", str(tmp_path / "p.json"))
    assert texts(out) == fresh
    assert json.loads((tmp_path / "p.json").read_text())["prefill"]["reused_tokens"] == 0
    result, out = cli("ort", [dict(req, lora_name="a")], *cache, "--profile", str(tmp_path / "p.json"))
    assert texts(out) == fresh                                      # now its own saved prefix
    assert json.loads((tmp_path / "p.json").read_text())["prefill"]["reused_tokens"] > 0


@pytest.mark.parametrize("engine", ["legacy", "trt"])
@pytest.mark.parametrize("batch_size", [4, 2])
def test_legacy_graph_and_tensorrt_give_the_same_answers(engine, batch_size, cli):
    """batch_size 2: in flight, slots change adapters under a running row (device copies must follow)."""
    requests = [chat("hello there", lora_name="a"), chat("hello there"), chat("a longer prompt for this", lora_name="a"),
                chat("and one more", lora_name="b", max_generate_length=3), chat("the last one", lora_name="a")]
    want = texts(cli("ort", requests[:3])[1])
    assert want[0] != want[1]  # the adapter shows
    want = texts(cli("ort", requests, batch_size=batch_size)[1])
    with fakes.installed():
        result, out = cli(engine, requests, batch_size=batch_size)
    assert result.exit_code == 0, result.output
    assert texts(out) == want


def test_bundled_adapter_above_the_rank_fails_the_build(tiny_checkpoint, lora_engines, tmp_path):
    _, adapters = lora_engines
    with pytest.raises(ConfigError, match="rank 8, above the engine's max_lora_rank 4; rebuild with --max-lora-rank 8"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), max_lora_rank=4,
                          lora=(("big", str(adapters / "big")),), verify=False, **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists() and not (tmp_path / "e.partial").exists()


def test_the_build_check_catches_an_adapter_the_engine_gets_wrong(tiny_checkpoint, tmp_path, monkeypatch):
    """The wrong variant of the build's adapter check: transformers without the adapter merged."""
    from trtllm.builder import verify

    ckpt = str(tiny_checkpoint("llama"))
    probe = build(BuildConfig(model=ckpt, output=str(tmp_path / "probe"), max_lora_rank=4, verify=False, **LIMITS),
                  log=lambda m: None)
    adapter = random_adapter(tmp_path / "adapter", mf.load(probe), 4, seed=5)
    monkeypatch.setattr(verify, "peft_merged_model", lambda ck, path: ck.model)
    with pytest.raises(verify.VerifyError, match="with adapter x differ from transformers"):
        build(BuildConfig(model=ckpt, output=str(tmp_path / "e"), lora=(("x", str(adapter)),), **LIMITS),
              log=lambda m: None)
    failed = json.loads((tmp_path / "e.verify-failed.json").read_text())  # the figures, for a look
    assert failed["adapters"]["x"]["max_abs_error"] > 1e-3 and not (tmp_path / "e").exists()


@pytest.mark.parametrize("peft_installed", [True, False])
def test_the_build_check_reads_the_adapter_apart_from_the_engine(tiny_checkpoint, tmp_path, monkeypatch,
                                                                  peft_installed):
    """With PEFT installed the reference is PEFT's own merge, so a wrong reading of the adapter's
    config (here: rsLoRA's scale ignored) fails the build; without PEFT the reference shares our
    reading, and the report says so."""
    from trtllm.builder import verify

    ckpt = str(tiny_checkpoint("llama"))
    probe = build(BuildConfig(model=ckpt, output=str(tmp_path / "probe"), max_lora_rank=4, verify=False, **LIMITS),
                  log=lambda m: None)
    adapter = random_adapter(tmp_path / "adapter", mf.load(probe), 4, seed=5)
    config = json.loads((adapter / lora.CONFIG_NAME).read_text())
    (adapter / lora.CONFIG_NAME).write_text(json.dumps({**config, "use_rslora": True}))
    monkeypatch.setattr(lora, "module_scale", lambda cfg, layer, module, rank, prefix="model": cfg["lora_alpha"] / rank)
    if not peft_installed:
        monkeypatch.setattr(verify, "peft_merged_model", lambda ck, path: (_ for _ in ()).throw(ImportError("peft")))
        out = build(BuildConfig(model=ckpt, output=str(tmp_path / "e"), lora=(("x", str(adapter)),), **LIMITS),
                    log=lambda m: None)
        report = json.loads((out / "verify.json").read_text())["adapters"]["x"]
        assert report["reference"] == "the engine's reading of the adapter"
        return
    with pytest.raises(verify.VerifyError, match="with adapter x differ from transformers"):
        build(BuildConfig(model=ckpt, output=str(tmp_path / "e"), lora=(("x", str(adapter)),), **LIMITS),
              log=lambda m: None)


def test_the_build_check_judges_adapters_of_a_float16_engine(tiny_checkpoint, tmp_path, monkeypatch):
    """Not only float32 engines: a float16 engine's adapter must reach the agreement floor too (the
    wrong variant again: transformers without the adapter merged)."""
    from trtllm.builder import verify

    ckpt = str(tiny_checkpoint("llama"))
    probe = build(BuildConfig(model=ckpt, output=str(tmp_path / "probe"), max_lora_rank=4, verify=False, **LIMITS),
                  log=lambda m: None)
    adapter = random_adapter(tmp_path / "adapter", mf.load(probe), 4, seed=5)
    config = BuildConfig(model=ckpt, output=str(tmp_path / "e"), lora=(("x", str(adapter)),), dtype="float16", **LIMITS)
    logs = []
    build(config, log=logs.append)
    assert any(line.startswith("verified adapter x:") for line in logs)
    monkeypatch.setattr(verify, "peft_merged_model", lambda ck, path: ck.model)
    with pytest.raises(verify.VerifyError, match="top-1 token with adapter x agrees with transformers at"):
        build(config, log=lambda m: None)


def test_the_build_check_refuses_logits_that_are_not_finite(tiny_checkpoint, tmp_path, monkeypatch):
    """One NaN position must fail the build (a NaN error compares False with every bound)."""
    from trtllm.builder import verify, verify_logits

    real = verify_logits.engine_logits

    def one_nan(*args, **kwargs):
        chosen, logits = real(*args, **kwargs)
        logits[min(3, len(logits) - 1)] = np.nan
        return chosen, logits

    monkeypatch.setattr(verify_logits, "engine_logits", one_nan)  # (where every check runs the engine: run_along)
    with pytest.raises(verify.VerifyError, match="logits are not finite at 1 of"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()


def test_a_tensorrt_build_whose_logits_overflow_fails_its_check(lora_engines, tiny_checkpoint, tmp_path):
    """A bundled adapter whose weights overflow the model: the check stops at the first step whose
    logits are not finite (the sampler's answer then may be past the vocabulary: fed back, it was
    read out of the embedding's bounds, an error of ONNX Runtime's on the stand-in, an out-of-bounds
    read on a GPU) and fails the build as on ONNX Runtime."""
    from trtllm.builder import verify

    engines, _ = lora_engines
    write_adapter(tmp_path / "huge", mf.load(engines["ort"]), 4, 7, ALL, std=1e18, alpha=4)
    with fakes.installed():
        with pytest.raises(verify.VerifyError, match="with adapter huge are not finite at 9 of 9 positions"):
            build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), backend="tensorrt",
                              lora=(("huge", str(tmp_path / "huge")),), **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()


def test_agreement_floor_allows_one_mismatch_on_a_short_text():
    from trtllm.builder.verify import allowed_mismatches

    assert allowed_mismatches(9, 0.95) == 1 and allowed_mismatches(127, 0.98) == 2
    assert allowed_mismatches(127, 0.90) == 12 and allowed_mismatches(100, 0.90) == 10


def test_an_adapter_that_overflows_fails_its_requests_alone(lora_engines, run_cli, tmp_path):
    """Huge (finite) adapter weights make the logits NaN: the sampler then answers token 0, inside
    the vocabulary. Those requests fail with an error, greedy or sampled; the neighbour without the
    adapter is answered; the output file stays strict JSON (no NaN)."""
    engines, _ = lora_engines
    write_adapter(tmp_path / "huge", mf.load(engines["ort"]), 4, 7, ALL, std=1e18, alpha=4)
    requests = [chat("The quick", lora_name="huge", num_logprobs=2), chat("The quick", lora_name="huge",
                                                                          temperature=1.0, seed=1), chat("The quick")]
    result, _ = run_cli(engines["ort"], {"temperature": 0, "max_generate_length": 6, "batch_size": 3,
                                         "available_lora_weights": {"huge": str(tmp_path / "huge")},
                                         "requests": requests})
    assert result.exit_code == 1, result.output

    def no_constants(name):
        raise AssertionError(f"{name} in the output JSON")

    out = json.loads((tmp_path / "out.json").read_text(), parse_constant=no_constants)
    bad, good = out["responses"][:2], out["responses"][2]
    assert [r["finish_reason"] for r in bad] == ["error", "error"]
    assert all("logits were not finite" in r["error"] and "its LoRA adapter 'huge' can make it" in r["error"] for r in bad)
    assert good["finish_reason"] == "max-length" and good["output_text"]


def test_a_lora_graph_under_a_manifest_without_lora_is_refused(lora_engines, tmp_path):
    """Its LoRA inputs would go unfed: every request failed inside ONNX Runtime."""
    import shutil

    from trtllm.runtime.engine import load_engine

    engine = tmp_path / "engine"
    shutil.copytree(lora_engines[0]["ort"], engine)
    raw = json.loads((engine / "manifest.json").read_text())
    raw["limits"]["max_lora_rank"], raw["lora"] = 0, {}
    (engine / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(mf.ManifestError, match="the graph has LoRA inputs, and the manifest no lora section"):
        load_engine(engine)


def test_an_adapter_name_on_an_engine_without_lora_inputs_says_to_rebuild(tiny_engine, run_cli):
    """Not "add it to available_lora_weights", which would only lead to this same fix one run later."""
    result, out = run_cli(tiny_engine("llama"), {"max_generate_length": 1,
                                                 "requests": [chat("hi"), chat("hi", lora_name="x")]})
    assert result.exit_code == 1 and out["responses"][0]["finish_reason"] == "max-length"
    error = out["responses"][1]["error"]
    assert "requests[1].lora_name" in error and "rebuild it with trtllm-build --max-lora-rank N" in error
    assert "available_lora_weights`\n" not in error and "add it to" not in error


def test_a_profiles_lora_rank_below_an_adapters_is_refused_before_the_export(tiny_checkpoint, lora_engines, tmp_path,
                                                                              monkeypatch):
    """A --profile's max_lora_rank below a bundled adapter's: refused before the graph is written,
    saying where the rank came from (a review found it after the whole export)."""
    from trtllm.builder import export

    _, adapters = lora_engines
    monkeypatch.setattr(export, "export_onnx", lambda *a, **k: pytest.fail("exported before the refusal"))
    with pytest.raises(ConfigError, match="rank 8, above the engine's max_lora_rank 4; rebuild with --max-lora-rank 8 "
                                          r"\(that 4 is --max-lora-rank's, or a --profile's"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), max_lora_rank=4,
                          lora=(("big", str(adapters / "big")),), verify=False, **LIMITS), log=lambda m: None)


@pytest.mark.parametrize("kind", ["legacy", "ort"])
def test_a_shared_adapter_decodes_a_row_as_it_decodes_alone(kind, lora_engines):
    """Two rows on one adapter: the first row's decode logits equal its logits alone, bit for bit.
    On the standard-op form (the legacy graph) a shared [1, ...] adapter made MatMul fold the batch
    into one product (6e-6 off: a near tie flips with the neighbours); "ort" runs our LoraAdd."""
    import dataclasses

    from trtllm.runtime import sampling
    from trtllm.runtime.engine import StepInputs, load_engine
    from trtllm.runtime.generate import RowState, prefill_inputs
    from trtllm.runtime.kv_cache import KVCacheManager

    engines, adapters = lora_engines
    engine = load_engine(engines[kind], huge_pages=False)
    m = engine.manifest
    adapter = lora.load_adapter("a", adapters / "a", m)

    def decode_logits(prompts):
        rows = [RowState(prompt_ids=p, params=sampling.SamplingParams(temperature=0), rng=np.random.default_rng(0),
                         eos_ids=frozenset()) for p in prompts]
        n, step_adapters = len(rows), lora.StepAdapters(m, len(rows))
        kv = KVCacheManager(m.model, n, LIMITS["max_kv_cache_capacity"])
        feeds = step_adapters.feeds(0, [adapter] * n)
        batch = sampling.make_batch([r.params for r in rows], m.model.vocab_size, m.max_top_k)
        engine.step(dataclasses.replace(prefill_inputs(rows, m.pad_token_id, batch), lora=feeds), kv.view(0, n))
        at = np.array([len(p) for p in prompts], np.int64)
        step = StepInputs(input_ids=np.full((n, 1), 5, np.int64), position_ids=at[:, None], write_index=at,
                          last_index=np.zeros(n, np.int64), sampling=batch, lora=step_adapters.feeds(0, [adapter] * n))
        return engine.step(step, kv.view(0, n), want_logits=True).logits.copy()

    try:
        prompt = list(range(30, 52))
        alone = decode_logits([prompt])[0]
        for other in ([5, 17, 42, 9], list(range(60, 90))):
            assert np.array_equal(decode_logits([prompt, other])[0], alone)
    finally:
        engine.close()
