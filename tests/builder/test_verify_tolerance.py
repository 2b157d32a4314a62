"""The build check's float32 tolerance scales with the logits: a correct engine of a model whose
logits reach tens of thousands is off by about 0.01 in float32 arithmetic, which an absolute 1e-3
failed as "the build is wrong"."""
from __future__ import annotations

import json
import shutil

import pytest
from safetensors.numpy import load_file, save_file

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
    """The wrong variant: without RTOL, the same correct engine is refused."""
    monkeypatch.setattr(verify, "RTOL", 0.0)
    with pytest.raises(verify.VerifyError, match="the build is wrong"):
        build_it(huge_logits, tmp_path / "engine")
