"""trtllm-build --if-changed (builder/current.py): the engine is left as it is only when this build
would write the same one: same options, checkpoint and code, and a check that passed."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtllm.builder.cli import main

pytestmark = pytest.mark.hf
LIMITS = ["--max-batch-size", "1", "--max-input-len", "32", "--max-kv-cache-capacity", "64"]


@pytest.fixture
def model(tiny_checkpoint, tmp_path):
    return shutil.copytree(tiny_checkpoint("llama"), tmp_path / "model")


def build(model, out, *extra):
    result = CliRunner().invoke(main, ["--model", str(model), "--output", str(out), *LIMITS, "--if-changed", *extra])
    assert result.exit_code == 0, result.output
    build_id = json.loads((Path(out) / "manifest.json").read_text())["build_id"]
    return "is up to date" in result.output, build_id


def test_the_same_build_is_left_out_and_any_change_builds(model, tmp_path, monkeypatch):
    from trtllm.builder import provenance

    out = tmp_path / "engine"
    skipped, first = build(model, out)
    assert not skipped
    assert build(model, out) == (True, first)  # nothing changed: the engine is the first build's
    assert build(model, out, "--max-batch-size", "2")[0] is False  # another option
    skipped, second = build(model, out, "--max-batch-size", "2")
    assert skipped and second != first
    template = model / "chat_template.jinja"  # a checkpoint file edited after the build
    template.write_text(template.read_text() + "\n")
    assert build(model, out, "--max-batch-size", "2")[0] is False
    weights, built = model / "model.safetensors", (out / "manifest.json").stat().st_mtime
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # other weights, with the file's time set back (cp -p of another checkpoint's)
    weights.write_bytes(bytes(data))
    os.utime(weights, (built - 60, built - 60))
    assert build(model, out, "--max-batch-size", "2")[0] is False
    monkeypatch.setattr(provenance, "code_fingerprint", lambda: "other code")
    assert build(model, out, "--max-batch-size", "2")[0] is False


def test_an_unverified_or_incomplete_engine_is_built_again(model, tmp_path):
    out = tmp_path / "engine"
    build(model, out, "--no-verify")
    assert build(model, out, "--no-verify")[0] is False  # (no check recorded the code that built it)
    build(model, out)
    (out / "tokenizer.json").unlink()
    assert build(model, out)[0] is False


def test_the_same_directories_spelled_otherwise_are_the_same_build(model, tmp_path, monkeypatch):
    out = tmp_path / "engine"
    _, first = build(model, out)
    monkeypatch.chdir(tmp_path)
    assert build(f"./{model.name}/", f"{out.name}/") == (True, first)  # (relative, trailing slashes)


def test_a_checkpoint_missing_a_shard_is_the_build_s_to_name(model, tmp_path):
    """A shard the index names, deleted (no other file's time changes): the check falls through to
    the build, which refuses the checkpoint (exit 2), not a traceback."""
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({k: weights[k] for k in keys}, str(model / shard))
    (model / "model.safetensors").unlink()
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in halves.items() for k in keys}}))
    out = tmp_path / "engine"
    assert build(model, out)[0] is False
    (model / "model-00001-of-00002.safetensors").unlink()
    result = CliRunner().invoke(main, ["--model", str(model), "--output", str(out), *LIMITS, "--if-changed"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output


def test_a_file_deleted_from_the_checkpoint_builds_again(model, tmp_path):
    """A deleted generation_config.json (its stop ids and sampling defaults) or an older GPTQ
    repository's quantize_config.json changes no remaining file's time, only the directory's."""
    out = tmp_path / "engine"
    build(model, out)
    assert build(model, out)[0] is True
    (model / "generation_config.json").unlink()
    assert build(model, out)[0] is False
