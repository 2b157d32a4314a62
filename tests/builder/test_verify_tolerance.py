"""The build check (builder/verify.py). Its float32 tolerance scales with the logits: a correct
engine of a model whose logits reach tens of thousands is off by about 0.01 in float32 arithmetic,
which an absolute 1e-3 failed as "the build is wrong". And it fails engines that are wrong: by a
fraction (exactness) or by more than their number format's floor (agreement)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from trtllm.builder import checkpoint as ckpt
from trtllm.builder import verify
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build


@pytest.fixture
def huge_logits(tiny_checkpoint, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama"), model)
    weights = load_file(model / "model.safetensors")
    save_file({k: v * 3000 if k.endswith("norm.weight") else v for k, v in weights.items()},
              model / "model.safetensors", metadata={"format": "pt"})
    return model


def build_it(model, out):
    return build(BuildConfig(model=str(model), output=str(out), max_batch_size=1, max_input_len=32,
                             max_kv_cache_capacity=64), log=lambda m: None)


def test_huge_logits_pass_within_float32_s_relative_tolerance(huge_logits, tmp_path):
    report = json.loads((build_it(huge_logits, tmp_path / "engine") / "verify.json").read_text())
    assert report["max_abs_logit"] > 1e4 and report["tokens_agree"]
    assert report["max_abs_error"] <= verify.RTOL * report["max_abs_logit"]


def test_the_absolute_tolerance_alone_fails_them(huge_logits, tmp_path, monkeypatch):
    """The wrong variant: without RTOL (nor the float64 opinion below), the same correct engine is refused."""
    from trtllm.builder import verify_logits

    monkeypatch.setattr(verify_logits, "RTOL", 0.0)  # (where the bounds are judged)
    monkeypatch.setattr(verify, "RTOL", 0.0)
    monkeypatch.setattr(verify, "near_miss", lambda *a: False)
    with pytest.raises(verify.VerifyError, match="the build is wrong"):
        build_it(huge_logits, tmp_path / "engine")


def test_a_near_miss_is_judged_against_transformers_in_float64(huge_logits, tmp_path, monkeypatch):
    """Past the absolute bound by less than 10x, the check asks transformers in float64: the correct engine
    is as close to it as twice transformers' own float32 is, and passes (the report says so)."""
    from trtllm.builder import verify_logits

    monkeypatch.setattr(verify_logits, "RTOL", 0.0)
    monkeypatch.setattr(verify, "RTOL", 0.0)
    monkeypatch.setattr(verify, "near_miss", lambda err, atol, top: err > atol)  # (however far past: ~1e-2 here)
    report = json.loads((build_it(huge_logits, tmp_path / "engine") / "verify.json").read_text())
    assert report["max_abs_error"] > 1e-3 and report["max_abs_logit"] > 1e4
    wide = report["float64"]
    assert wide["max_abs_error"] <= 2 * wide["transformers_float32_error"]


@pytest.mark.parametrize("arch", ["qwen3_moe", "gemma4-moe"])
def test_the_float64_opinion_runs_a_mixture_of_experts(arch, tiny_checkpoint, tiny_engine):
    """transformers' experts run grouped_mm, which takes no float64: the float64 copy runs its eager loop, and
    the engine's logits are as close to it as transformers' own float32 is (about)."""
    from trtllm.builder.verify import engine_logits, hf_logits
    from trtllm.runtime.engine import load_engine

    ck, ids = ckpt.load(str(tiny_checkpoint(arch))), [5, 17, 42, 99, 7]
    generated, got = engine_logits(load_engine(tiny_engine(arch)), ids, 4)
    ref = hf_logits(ck.model, ids + generated[:-1])[len(ids) - 1:]
    wide = verify.float64_opinion(ck.model, ids + generated[:-1], len(ids) - 1, got, ref)
    assert 0 < wide["transformers_float32_error"] < 1e-4 and wide["max_abs_error"] < 1e-4


def test_float64_close_takes_twice_transformers_own_error_and_no_more():
    from trtllm.builder.verify_logits import float64_close

    assert float64_close({"max_abs_error": 3e-3, "transformers_float32_error": 2e-3}, 1e-3)
    assert not float64_close({"max_abs_error": 5e-3, "transformers_float32_error": 2e-3}, 1e-3)
    assert float64_close({"max_abs_error": 9e-4, "transformers_float32_error": 0.0}, 1e-3)
    assert not float64_close(None, 1e-3)  # (no float64 copy: too large for the memory there is)
    assert verify.near_miss(5e-3, 1e-3, 1.0) and not verify.near_miss(2e-2, 1e-3, 1.0)
    assert not verify.near_miss(5e-4, 1e-3, 1.0)


def changed(tiny_checkpoint, tmp_path, change):
    """The tiny llama checkpoint with change(name, array) applied to its weights, loaded as the
    build loads one: the transformers model the check compares an engine against."""
    model = tmp_path / "changed"
    shutil.copytree(tiny_checkpoint("llama"), model)
    weights = load_file(model / "model.safetensors")
    save_file({k: change(k, v) for k, v in weights.items()}, model / "model.safetensors", metadata={"format": "pt"})
    return ckpt.load(str(model))


def test_a_float32_engine_off_by_a_fraction_fails_the_exactness_check(tiny_engine, tiny_checkpoint, tmp_path):
    """The engine of the llama checkpoint, checked against that checkpoint with its final norm 1%
    larger: every top-1 token still agrees (the logits only scale), the logits do not; the same
    engine against its own checkpoint passes."""
    engine = tiny_engine("llama")
    assert verify.verify_engine(engine, ckpt.load(str(tiny_checkpoint("llama"))))["tokens_agree"]
    wrong = changed(tiny_checkpoint, tmp_path, lambda k, v: v * 1.01 if k == "model.norm.weight" else v)
    with pytest.raises(verify.VerifyError, match="the build is wrong") as e:
        verify.verify_engine(engine, wrong)
    assert e.value.report["top1_agreement"] == 1.0 and e.value.report["max_abs_error"] > 1e-3


def test_an_engine_below_its_formats_floor_fails_the_agreement_check(tiny_engine, tiny_checkpoint, tmp_path):
    """Checked as int4 (no exactness check, the 90% floor): the engine passes against its own
    checkpoint and fails against one whose projections carry 30% noise."""
    engine = tiny_engine("llama")
    assert verify.verify_engine(engine, ckpt.load(str(tiny_checkpoint("llama"))), "int4")["top1_agreement"] == 1.0
    rng = np.random.default_rng(0)
    wrong = changed(tiny_checkpoint, tmp_path, lambda k, v: v + 0.3 * np.abs(v).mean() * rng.standard_normal(
        v.shape).astype(v.dtype) if k.endswith("proj.weight") else v)
    with pytest.raises(verify.VerifyError, match="too inaccurate") as e:
        verify.verify_engine(engine, wrong, "int4")
    assert e.value.report["top1_agreement"] < 0.9


def test_image_embeddings_a_near_miss_is_judged_against_float64():
    """The vision checks' bound (1e-4 of the largest value) past by less than 10x: ours pass where they are
    within twice transformers' own float32 distance from its float64 embeddings, and fail where they are
    not, or are 10x past (float64 is then not asked)."""
    from trtllm.builder.verify_logits import VerifyError, embeddings_error

    want = np.ones((2, 3))
    ours = want + 5e-4
    assert embeddings_error(ours, want, "x", lambda: want + 4e-4) == pytest.approx(5e-4)
    with pytest.raises(VerifyError, match="x's image embeddings differ"):
        embeddings_error(ours, want, "x", lambda: want)  # (transformers' float32 is exact: ours are off)
    with pytest.raises(VerifyError, match="x's image embeddings differ"):
        embeddings_error(want + 2e-3, want, "x", lambda: pytest.fail("float64 asked 20x past the bound"))
    with pytest.raises(VerifyError):
        embeddings_error(ours, want, "x", lambda: None)  # (no float64 copy fits in memory)
