"""trtllm-run and its files: the engine directory (missing, malformed, replaced while loading, a
corrupt model), the input file's name, and outputs that cannot or must not be written."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.runtime.test_run_stdout import chat
from trtllm.runtime.cli import main
from trtllm.runtime.manifest import FORMAT_VERSION

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf


@pytest.mark.parametrize("option", ["--output", "--profile"])
def test_an_output_that_is_the_input_file_is_refused(tmp_path, tiny_engine, option):
    payload = json.dumps({"requests": [chat("a")], "max_generate_length": 2, "temperature": 0})
    (tmp_path / "in.json").write_text(payload)
    (tmp_path / "link.json").hardlink_to(tmp_path / "in.json")
    for target in ("in.json", "link.json"):
        result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")), option,
                                           str(tmp_path / target)])
        assert result.exit_code == 2 and f"{option} " in result.output and "is the input file" in result.output
    assert (tmp_path / "in.json").read_text() == payload


@pytest.mark.parametrize("option", ["--output", "--profile"])
def test_an_output_inside_the_engine_directory_is_refused(tmp_path, tiny_engine, option):
    """It could replace one of the engine's files (its manifest: the next run blamed the version)."""
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")], "max_generate_length": 2}))
    manifest = (engine / "manifest.json").read_bytes()
    (tmp_path / "link").symlink_to(engine)
    for target in (engine / "manifest.json", engine / "new.json", tmp_path / "link" / "manifest.json"):
        result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine), option, str(target)])
        assert result.exit_code == 2 and "is inside the engine directory" in result.output, result.output
    assert (engine / "manifest.json").read_bytes() == manifest and not (engine / "new.json").exists()


def test_invalid_input_keeps_the_previous_output(run_cli, tmp_path, tiny_engine):
    out = tmp_path / "out.json"
    out.write_text('{"good": true}')
    result, kept = run_cli(tiny_engine("llama"), {"requests": []})
    assert result.exit_code == 2
    assert kept == {"good": True}


def test_engine_dir_errors(tmp_path):
    (tmp_path / "input.json").write_text(json.dumps({"requests": [chat("x")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "input.json"), "--engine", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "trtllm-build" in result.output
    (tmp_path / "eng").mkdir()
    (tmp_path / "eng" / "manifest.json").write_text(json.dumps({"format_version": 99, "backend": "onnxruntime"}))
    result = CliRunner().invoke(main, [str(tmp_path / "input.json"), "--engine", str(tmp_path / "eng")])
    assert result.exit_code == 2 and "format_version" in result.output and "trtllm-build" in result.output
    for broken, needle in ((b"[]", "must hold a JSON object"), (b"\xff", "is not valid JSON"),
                           (b'{"responses": []}', "is not an engine manifest (it has no format_version)"),
                           (json.dumps({"format_version": FORMAT_VERSION, "backend": "onnxruntime", "limits": 3}).encode(),
                            "is malformed")):
        (tmp_path / "eng" / "manifest.json").write_bytes(broken)
        result = CliRunner().invoke(main, [str(tmp_path / "input.json"), "--engine", str(tmp_path / "eng")])
        assert result.exit_code == 2 and needle in result.output and "trtllm-build" in result.output, result.output


def test_unwritable_output_is_refused_before_running(tmp_path, tiny_engine):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    for option in ("--output", "--profile"):
        result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                           option, str(tmp_path / "afile" / "out.json")])
        assert result.exit_code == 2 and f"{option} {tmp_path / 'afile' / 'out.json'} cannot be written" in result.output
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                       "--output", str(tmp_path / "new" / "dirs" / "out.json")])
    assert result.exit_code == 0 and (tmp_path / "new" / "dirs" / "out.json").is_file()


def test_engine_without_tokenizer_is_a_usage_error(tmp_path, tiny_engine):
    import shutil

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (engine / "tokenizer.json").unlink()
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine)])
    assert result.exit_code == 2 and "tokenizer" in result.output and "trtllm-build" in result.output


def test_engine_replaced_while_loading_is_refused(tmp_path, tiny_engine, monkeypatch):
    """Saved KV is keyed by the engine's manifest: a rebuild landing between reading it and loading
    the engine would file one engine's KV under the other's name, so the run stops instead."""
    import shutil

    from trtllm.runtime import engine as engine_mod

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    real = engine_mod.load_engine

    def rebuilt_meanwhile(*args, **kwargs):
        loaded = real(*args, **kwargs)
        manifest = json.loads((engine / "manifest.json").read_text())
        (engine / "manifest.json").write_text(json.dumps({**manifest, "build_id": "another build"}))
        return loaded

    monkeypatch.setattr(engine_mod, "load_engine", rebuilt_meanwhile)
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine)])
    assert result.exit_code == 2 and "changed while it was loading" in result.output


@pytest.mark.parametrize("when", ["load fails", "after load"])
def test_engine_replaced_during_load_names_the_rebuild(tmp_path, tiny_engine, monkeypatch, when):
    """A rebuild landing inside the load (the new build's graph, the old manifest) is not a broken
    engine to rebuild; one landing after it, while the tokenizer, template, draft head and adapters
    are read, would pair two builds' files: both say the engine changed, and nothing is answered."""
    import shutil

    from trtllm.runtime import engine as engine_mod
    from trtllm.runtime import tokenizer as tokenizer_mod
    from trtllm.runtime.manifest import ManifestError

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)

    def rebuild():
        manifest = json.loads((engine / "manifest.json").read_text())
        (engine / "manifest.json").write_text(json.dumps({**manifest, "build_id": "another build"}))

    if when == "load fails":
        def load(*args, **kwargs):
            rebuild()
            raise ManifestError(f"{engine}/llm.ort.onnx does not match {engine}/manifest.json; rebuild it")
        monkeypatch.setattr(engine_mod, "load_engine", load)
    else:
        real = tokenizer_mod.Tokenizer.from_engine_dir.__func__

        def read(cls, *args, **kwargs):
            rebuild()
            return real(cls, *args, **kwargs)
        monkeypatch.setattr(tokenizer_mod.Tokenizer, "from_engine_dir", classmethod(read))
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine), "--output", str(out)])
    assert result.exit_code == 2 and "changed while it was loading" in result.output, result.output
    assert "does not match" not in result.output and not out.exists()


def test_output_failing_at_the_end_prints_the_answers(tmp_path, tiny_engine, monkeypatch):
    from trtllm.runtime import files

    write = files.write_atomic

    def disk_full(path, data, indent, **layout):
        if str(path).endswith("out.json"):
            raise OSError(28, "No space left on device")
        write(path, data, indent, **layout)

    engine = tiny_engine("llama")
    monkeypatch.setattr(files, "write_atomic", disk_full)
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")], "max_generate_length": 2, "temperature": 0}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine), "--output",
                                       str(tmp_path / "out.json"), "--profile", str(tmp_path / "profile.json")])
    assert result.exit_code == 3
    assert json.loads(result.stdout)["responses"][0]["finish_reason"] == "max-length"
    assert "No space left on device" in result.stderr and "the answers are on stdout" in result.stderr
    assert (tmp_path / "profile.json").is_file()


def test_output_and_profile_must_differ(tmp_path, tiny_engine):
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                       "--output", str(tmp_path / "x.json"), "--profile", str(tmp_path / "x.json")])
    assert result.exit_code == 2 and "the same file" in result.output


def test_a_profile_on_the_stdout_the_answers_use_is_refused(tmp_path, tiny_engine):
    """--profile /dev/stdout beside answers (or --stream's lines) on stdout gave two JSON documents
    in one stream; beside --output FILE it is the one document there (the summaries go to stderr)."""
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")], "max_generate_length": 2}))
    base = [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")), "--profile", "/dev/stdout"]
    for extra, said in (([], "the answers go to"), (["--stream", "--output", str(tmp_path / "o.json")], "--stream")):
        result = CliRunner().invoke(main, base + extra)
        assert result.exit_code == 2 and "--profile /dev/stdout is stdout, which" in result.output, result.output
        assert said in result.output
    out = tmp_path / "fd1.txt"
    with open(out, "w") as f:  # (a real descriptor 1: CliRunner's stdout has none)
        proc = subprocess.run([sys.executable, "-m", "trtllm.runtime", *base, "--output", str(tmp_path / "o.json")],
                              stdout=f, stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    profile = json.loads(out.read_text())  # the one document there (a summary line would break it)
    assert profile and "responses" not in profile
    assert "[0] (max-length)" in proc.stderr


def test_summary_lines_show_control_characters_escaped():
    """The one-line summaries reach a terminal: an answer's ESC[2J (a model steered to write it)
    would clear the screen."""
    from trtllm.runtime.cli import shown_text

    assert shown_text("a\x1b[2J\tb\nc\r\x9b\x07é") == "a\\x1b[2J\tb\\nc\\r\\x9b\\x07é"
    assert shown_text("a\u2028b\u2029c") == "a\\u2028b\\u2029c"  # (splitlines() cut the record there)


def test_an_input_file_name_that_is_not_utf8(tmp_path, tiny_engine):
    """A file name may hold any bytes: the output JSON and the messages show them escaped."""
    import os

    name = os.fsdecode(bytes(tmp_path) + b"/in\xff.json")
    with open(name, "w") as f:
        json.dump({"temperature": 0, "max_generate_length": 2, "requests": [chat("a")]}, f)
    result = CliRunner().invoke(main, [name, "--engine", str(tiny_engine("llama")), "--output", str(tmp_path / "o.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o.json").read_text())["input_file"].endswith("in\\xff.json")
    with open(name, "w") as f:
        f.write("{")
    result = CliRunner().invoke(main, [name, "--engine", str(tiny_engine("llama"))])
    assert result.exit_code == 2 and "in\\xff.json" in result.output


def test_a_corrupt_model_file_is_a_usage_error(tmp_path, tiny_engine):
    import shutil

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    size = (engine / "llm.ort.onnx").stat().st_size  # (of its size: another is refused before ONNX Runtime)
    (engine / "llm.ort.onnx").write_bytes(b"not a model".ljust(size, b"\0"))
    (tmp_path / "input.json").write_text(json.dumps({"requests": [chat("x")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "input.json"), "--engine", str(engine)])
    assert result.exit_code == 2 and "cannot be loaded by ONNX Runtime" in result.output
    assert "trtllm-build" in result.output
