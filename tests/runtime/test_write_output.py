"""trtllm-run's output writer: atomic for files, yet it keeps links, modes and pipes as they were."""
from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from trtllm.runtime.cli import write_atomic


def test_new_file_gets_the_umask_mode_not_600(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "out.json", {"a": 1}, indent=2)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.json").stat().st_mode) == 0o644
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary file left behind


def test_existing_file_keeps_its_mode(tmp_path):
    out = tmp_path / "out.json"
    out.write_text("{}")
    out.chmod(0o640)
    write_atomic(out, {"b": 2}, indent=2)
    assert stat.S_IMODE(out.stat().st_mode) == 0o640
    assert json.loads(out.read_text()) == {"b": 2}


def test_symlink_is_followed_and_kept(tmp_path):
    target = tmp_path / "real" / "out.json"
    target.parent.mkdir()
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, {"c": 3}, indent=2)
    assert link.is_symlink()
    assert json.loads(target.read_text()) == {"c": 3}
    assert sorted(os.listdir(target.parent)) == ["out.json"]


def test_pipe_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_atomic(fifo, {"d": 4}, indent=2)
    reader.join(timeout=10)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert json.loads(got[0]) == {"d": 4}


def test_failed_write_keeps_the_old_file(tmp_path):
    out = tmp_path / "out.json"
    out.write_text('{"good": true}')
    with pytest.raises(TypeError):
        write_atomic(out, {"bad": object()}, indent=2)
    assert json.loads(out.read_text()) == {"good": True}
    assert os.listdir(tmp_path) == ["out.json"]
