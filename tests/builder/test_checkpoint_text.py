"""A checkpoint's chat template and EOS ids are checked as trtllm-run will read them: what the
runtime would refuse in the engine (where rebuilding cannot help) fails the build, naming --model."""
from __future__ import annotations

import json
import shutil

import pytest

from trtllm.builder.checkpoint import CheckpointError
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build


def variant(tiny_checkpoint, tmp_path, edit):
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint("llama"), model)
    edit(model)
    return model


def build_it(model, tmp_path):
    return build(BuildConfig(model=str(model), output=str(tmp_path / "engine"), max_batch_size=1,
                             max_input_len=32, max_kv_cache_capacity=64, verify=False), log=lambda m: None)


def test_a_chat_template_that_does_not_compile_fails_the_build(tiny_checkpoint, tmp_path):
    model = variant(tiny_checkpoint, tmp_path, lambda m: (m / "chat_template.jinja").write_text("{% if %}broken"))
    with pytest.raises(CheckpointError, match="its chat template cannot be used: chat template does not compile"):
        build_it(model, tmp_path)
    assert not (tmp_path / "engine").exists()


def test_a_chat_template_that_fails_on_a_user_turn_fails_the_build(tiny_checkpoint, tmp_path):
    """It compiles, and then every chat request would fail: the checkpoint's to fix."""
    model = variant(tiny_checkpoint, tmp_path, lambda m: (m / "chat_template.jinja").write_text("{{ 1 // 0 }}"))
    with pytest.raises(CheckpointError, match="its chat template cannot be used: chat template failed to render: "
                                              "ZeroDivisionError"):
        build_it(model, tmp_path)


def test_a_template_that_refuses_a_turn_by_itself_still_builds(tiny_checkpoint, tmp_path):
    """Its raise_exception is for the requests it refuses (each fails alone at run time)."""
    source = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('a system turn first') }}{% endif %}x"
    model = variant(tiny_checkpoint, tmp_path, lambda m: (m / "chat_template.jinja").write_text(source))
    assert (build_it(model, tmp_path) / "manifest.json").is_file()


def test_an_eos_id_past_the_vocabulary_fails_the_build(tiny_checkpoint, tmp_path):
    def edit(m):
        config = json.loads((m / "generation_config.json").read_text())
        (m / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [2, 999]}))

    with pytest.raises(CheckpointError, match=r"generation_config.json's eos_token_id has \[999\], not a token id "
                                              r"\(0 to the vocabulary size 400 - 1"):
        build_it(variant(tiny_checkpoint, tmp_path, edit), tmp_path)
