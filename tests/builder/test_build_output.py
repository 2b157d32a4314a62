"""trtllm-build's output directory: a failed, interrupted or refused build keeps the old engine and
the user's files; a rebuild swaps in place."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
from trtllm.builder.cli import main  # noqa: E402

pytestmark = pytest.mark.hf


def test_failed_build_keeps_the_old_engine(tmp_path, tiny_checkpoint, tiny_engine):
    import shutil

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    before = (engine / "manifest.json").read_text()
    bad = tmp_path / "bad"
    shutil.copytree(tiny_checkpoint("llama"), bad)
    config = json.loads((bad / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (bad / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["--model", str(bad), "--output", str(engine)])
    assert result.exit_code == 2 and "hidden_act" in result.output  # a checkpoint it cannot build: usage
    assert (engine / "manifest.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad", "engine"]  # no partial engine left


def test_rebuild_in_place_keeps_the_directory(tmp_path, tiny_checkpoint, monkeypatch):
    """--output . rebuilds the engine the shell stands in: the directory stays (same inode), its old
    files are replaced, and every file is readable as the umask allows (onnx writes data as 600)."""
    engine = tmp_path / "engine"
    engine.mkdir()
    monkeypatch.chdir(engine)
    old_mask = os.umask(0o022)
    try:
        for extra in ([], ["--max-input-len", "32"]):
            inode = engine.stat().st_ino
            result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", ".",
                                               "--no-verify", *extra])
            assert result.exit_code == 0, result.output
            assert engine.stat().st_ino == inode
    finally:
        os.umask(old_mask)
    assert json.loads((engine / "manifest.json").read_text())["limits"]["max_input_len"] == 32
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]  # no partial or old engine left
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in engine.rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o644}, modes
    # From elsewhere the engine is replaced as a whole directory (a run starting meanwhile never sees
    # half of each build)
    monkeypatch.chdir(tmp_path)
    inode = engine.stat().st_ino
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(engine), "--no-verify"])
    assert result.exit_code == 0, result.output
    assert engine.stat().st_ino != inode and sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def test_an_in_place_swap_leaves_another_running_build_s_staging(tmp_path, tiny_checkpoint, monkeypatch):
    """Two builds to --output . at once: the first to finish swapped the other's staging directory
    out with the old engine and deleted it (the other then failed half-way). A fresh one stays; one
    an hour old is a killed build's, and goes."""
    engine = tmp_path / "engine"
    engine.mkdir()
    monkeypatch.chdir(engine)
    args = ["--model", str(tiny_checkpoint("llama")), "--output", ".", "--no-verify"]
    assert CliRunner().invoke(main, args).exit_code == 0
    running, killed = engine / ".engine.partial-abc123", engine / ".engine.partial-old999"
    for d in (running, killed):
        d.mkdir()
        (d / "llm.onnx").write_bytes(b"half")
    stale = os.stat(killed).st_mtime - 7200
    os.utime(killed, (stale, stale))
    result = CliRunner().invoke(main, args + ["--max-input-len", "32"])
    assert result.exit_code == 0, result.output
    assert (running / "llm.onnx").read_bytes() == b"half" and not killed.exists()


def test_output_that_is_not_an_engine_is_never_deleted(tmp_path, tiny_checkpoint):
    """--output over a checkpoint or any other non-empty directory is refused (exit 2), nothing deleted."""
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "notes.txt").write_text("x")
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(keep)])
    assert result.exit_code == 2 and "is not an engine directory" in result.output
    assert (keep / "notes.txt").read_text() == "x"


def test_an_earlier_engine_holding_the_user_s_files_is_not_replaced(tmp_path, tiny_checkpoint, tiny_engine):
    """Rebuilding over an engine replaces the whole directory: a file no build writes (notes put
    there) is refused, named, and kept; the engine's own files, its KV cache and hidden files are not."""
    import shutil

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (engine / "my_notes.txt").write_text("keep")
    (engine / ".git").mkdir()
    (engine / "cache").mkdir(exist_ok=True)  # (a run may have saved KV in the tiny engine's own)
    (engine / "additional_chat_templates").mkdir()  # a tokenizer's named templates (transformers writes it)
    (engine / ".DS_Store").write_text("")
    args = ["--model", str(tiny_checkpoint("llama")), "--output", str(engine), "--no-verify"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "also holds what no build writes (.git, my_notes.txt)" in result.output, \
        result.output
    assert (engine / "my_notes.txt").read_text() == "keep" and (engine / ".git").is_dir()
    (engine / "my_notes.txt").unlink()
    (engine / ".git").rmdir()
    assert CliRunner().invoke(main, args).exit_code == 0


def test_a_directory_with_someone_elses_manifest_is_not_an_engine(tmp_path, tiny_checkpoint):
    """A web app's manifest.json does not make its directory an engine to replace."""
    app = tmp_path / "webapp"
    (app / "src").mkdir(parents=True)
    (app / "manifest.json").write_text('{"name": "My PWA"}')
    (app / "src" / "app.js").write_text("code")
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(app), "--no-verify"])
    assert result.exit_code == 2 and "is not an engine directory" in result.output
    assert (app / "src" / "app.js").read_text() == "code"


def test_an_engine_of_the_first_format_is_replaced(tmp_path, tiny_checkpoint):
    """The runtime asks to rebuild a format-1 engine (no build_id) in place: the build must take it."""
    engine = tmp_path / "engine"
    args = ["--model", str(tiny_checkpoint("llama")), "--output", str(engine), "--no-verify"]
    assert CliRunner().invoke(main, args).exit_code == 0
    manifest = json.loads((engine / "manifest.json").read_text())
    del manifest["build_id"]
    manifest["format_version"] = 1
    (engine / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads((engine / "manifest.json").read_text())["format_version"] > 1


def test_an_input_inside_the_output_is_refused(tmp_path, tiny_checkpoint):
    engine = tmp_path / "engine"
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(engine), "--no-verify"])
    assert result.exit_code == 0, result.output
    shutil.copytree(tiny_checkpoint("llama"), engine / "hf_source")
    result = CliRunner().invoke(main, ["--model", str(engine / "hf_source"), "--output", str(engine), "--no-verify"])
    assert result.exit_code == 2 and "--model" in result.output and "is inside --output" in result.output
    assert (engine / "hf_source" / "config.json").is_file()


def test_an_in_place_swap_that_fails_puts_the_old_engine_back(tmp_path, tiny_checkpoint, monkeypatch):
    """--output . (or a mount point): the entries are swapped one by one; a move that fails half way
    (a busy mount, Ctrl-C) moves back what was moved, so the old engine is whole, and no hidden
    directory is left."""
    from trtllm.builder import engine_dir

    engine = tmp_path / "engine"
    args = ["--model", str(tiny_checkpoint("llama")), "--output", ".", "--no-verify"]
    engine.mkdir()
    monkeypatch.chdir(engine)
    assert CliRunner().invoke(main, args).exit_code == 0
    before = {p.name: p.read_bytes() for p in engine.iterdir() if p.is_file()}
    real, calls = os.replace, [0]

    def busy_on_the_third_new_entry(src, dst):
        if ".partial-" in str(src):
            calls[0] += 1
            if calls[0] == 3:
                raise OSError(16, "Device or resource busy")
        return real(src, dst)

    monkeypatch.setattr(engine_dir.os, "replace", busy_on_the_third_new_entry)  # (where the swap renames)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1 and "Device or resource busy" in result.output
    assert {p.name: p.read_bytes() for p in engine.iterdir() if p.is_file()} == before
    assert not [p for p in engine.iterdir() if p.name.startswith(".")]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_broken_checkpoint_is_named_and_the_old_engine_kept(tmp_path, tiny_checkpoint):
    """NaN weights: transformers' own logits are NaN, so the checkpoint is at fault, not the build;
    the old engine stays, and the failed report is beside it."""
    from safetensors.numpy import load_file, save_file

    engine = tmp_path / "engine"
    assert CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(engine)]).exit_code == 0
    good = (engine / "verify.json").read_text()
    ckpt = tmp_path / "nan"
    shutil.copytree(tiny_checkpoint("llama"), ckpt)
    weights = load_file(str(ckpt / "model.safetensors"))
    weights["model.norm.weight"][:] = float("nan")
    save_file(weights, str(ckpt / "model.safetensors"))
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(engine)])
    assert result.exit_code == 2 and "the checkpoint is broken" in result.output, result.output  # (a bad checkpoint)
    assert f"the report: {tmp_path / 'engine.verify-failed.json'}" in result.output
    assert "changed during the build" not in result.output
    failed = json.loads((tmp_path / "engine.verify-failed.json").read_text())
    assert failed["code"] == json.loads(good)["code"] and failed["code_changed_during_build"] is False
    assert (engine / "verify.json").read_text() == good
    assert CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(engine)]).exit_code == 0
    assert not (tmp_path / "engine.verify-failed.json").exists()  # a later success clears it


def test_a_rebuild_leaves_the_users_old_and_partial_alone(tmp_path, tiny_checkpoint):
    engine = tmp_path / "engine"
    for name in ("engine.old", "engine.partial"):  # a user's backup, say
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("keep")
    for _ in range(2):
        result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(engine),
                                           "--no-verify"])
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine", "engine.old", "engine.partial"]
    assert all((tmp_path / name / "notes.txt").read_text() == "keep" for name in ("engine.old", "engine.partial"))


def test_interrupted_build_exits_130(tmp_path, tiny_checkpoint, monkeypatch):
    from trtllm.builder import export

    def interrupted(config, log):
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "build", interrupted)
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "e")])
    assert result.exit_code == 130 and "interrupted" in result.output


def test_an_interrupt_while_the_builder_loads_exits_130(tmp_path, tiny_checkpoint, monkeypatch):
    """torch and transformers take seconds to import after the options are read: a Ctrl-C (or a
    SIGTERM, made one there) then exits 130 too, not click's Abort (1, "the build failed")."""

    class Interrupting:
        def find_spec(self, name, path=None, target=None):
            if name == "trtllm.builder.export":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "trtllm.builder.export", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "e")])
    assert result.exit_code == 130 and "interrupted" in result.output, result.output


def test_sigterm_cleans_up_as_ctrl_c(tmp_path, tiny_checkpoint):
    """timeout, docker stop: SIGTERM mid-build exits 130 and leaves no partial engine directory."""
    import signal

    proc = subprocess.Popen([sys.executable, "-m", "trtllm.builder", "--model", str(tiny_checkpoint("llama")),
                             "--output", str(tmp_path / "engine")], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "writing the" in line:  # the graph is being written into the partial directory
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest
    assert list(tmp_path.iterdir()) == []


def test_an_output_inside_an_engine_directory_is_refused(tiny_checkpoint, tiny_engine):
    """An engine built inside another would make that one impossible to replace (it would hold what
    no build writes): refused before anything is written."""
    engine = tiny_engine("llama")
    before = sorted(p.name for p in engine.iterdir())
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(engine / "sub" / "e")])
    assert result.exit_code == 2 and f"is inside the engine directory {engine.resolve()}" in result.output
    assert sorted(p.name for p in engine.iterdir()) == before


class SignalInFinalizer:
    """Sends `signum` to this process from its __del__: the KeyboardInterrupt its handler raises
    there is printed as "Exception ignored" and dropped by Python (as in an import's module-lock
    callback, where a review saw a SIGTERM lost and the build exit 0)."""

    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)
        time.sleep(0.05)  # (the handler runs here, inside the finalizer)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the dropped one)
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_an_interrupt_a_finalizer_swallowed_still_stops_the_build(tmp_path, tiny_checkpoint, monkeypatch, signum):
    """The build goes on after the dropped interrupt, but the engine does not replace the old one:
    exit 130, the old engine kept, no partial directory left."""
    import signal

    from trtllm.builder import export

    args = ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "engine"), "--no-verify",
            "--max-kv-cache-capacity", "64", "--max-input-len"]
    assert CliRunner().invoke(main, [*args, "16"]).exit_code == 0  # the old engine
    write_checksums = export.write_checksums

    def swallowed_then_checksums(path):
        SignalInFinalizer(getattr(signal, signum))  # dropped at once: its __del__ runs here
        write_checksums(path)

    monkeypatch.setattr(export, "write_checksums", swallowed_then_checksums)
    result = CliRunner().invoke(main, [*args, "32"])
    assert result.exit_code == 130 and "interrupted" in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]
    assert json.loads((tmp_path / "engine" / "manifest.json").read_text())["limits"]["max_input_len"] == 16


def test_the_export_holds_one_copy_of_the_weights_and_lints_the_saved_graph(tmp_path, tiny_checkpoint, monkeypatch):
    """The build's memory peak was the export: make_graph and make_model each copied every weight
    (three copies at once), and the op lint ran shape inference on the model in memory, which
    serialised every weight again (8x the weights' bytes for the demo model in float32; past 2 GiB it
    could not, and the lint checked nothing it needed types for). The writer's weights move into the
    model, and the lint reads the saved graph without them."""
    from trtllm.builder import export
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.graph import GraphWriter
    from trtllm.plugins import lint

    linted, real_lint = [], lint.lint_model
    monkeypatch.setattr(lint, "lint_model", lambda model, *a: linted.append(model) or real_lint(model, *a))
    moved, real_model = [], GraphWriter.model

    def model(self, *args, **kwargs):
        made = real_model(self, *args, **kwargs)
        moved.append((len(made.graph.initializer) > 0, len(self.initializers)))
        return made

    monkeypatch.setattr(GraphWriter, "model", model)
    export.build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), max_batch_size=1,
                             max_input_len=16, max_kv_cache_capacity=64, verify=False), log=lambda m: None)
    assert linted and all(isinstance(m, os.PathLike) and m.name == export.ONNX_NAME for m in linted), linted
    assert moved and all(has and left == 0 for has, left in moved), moved
