"""trtllm-run's output writer: atomic for files, yet it keeps links, modes and pipes as they were."""
from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from trtllm.runtime.files import NotWritable, check_writable, descriptor, write_atomic


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


def test_a_full_non_blocking_pipe_is_waited_on():
    """A pipe another process made non-blocking: a write past its buffer raised BlockingIOError
    after writing part, which was taken for a stdout that failed (the answers lost, exit 3)."""
    from trtllm.runtime.files import write_all

    r, w = os.pipe()
    os.set_blocking(w, False)
    data = bytes(range(256)) * 1000  # 256 KB, four times a pipe's buffer
    got = bytearray()

    def read():
        while chunk := os.read(r, 65536):
            got.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        write_all(w, data)
    finally:
        os.close(w)
        reader.join(timeout=10)
        os.close(r)
    assert bytes(got) == data


def test_failed_write_keeps_the_old_file(tmp_path):
    out = tmp_path / "out.json"
    out.write_text('{"good": true}')
    with pytest.raises(TypeError):
        write_atomic(out, {"bad": object()}, indent=2)
    assert json.loads(out.read_text()) == {"good": True}
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_write_that_fails_part_way_keeps_the_old_file(tmp_path, monkeypatch):
    """Half the new text written, then the disk is full: the old file stays whole and nothing is
    left beside it (the failure above comes before any file is opened; a plain open("w") passed it)."""
    from trtllm.runtime import files

    out = tmp_path / "out.json"
    out.write_text('{"good": true}')

    def half_then_full(f, text):
        f.write(text[: len(text) // 2])
        f.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_synced", half_then_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(out, {"responses": ["x" * 1000]}, indent=2)
    assert json.loads(out.read_text()) == {"good": True}
    assert os.listdir(tmp_path) == ["out.json"]


def test_descriptor_paths():
    assert descriptor(Path("/dev/stdout")) == 1 and descriptor(Path("/dev/stderr")) == 2
    assert descriptor(Path("/dev/fd/7")) == 7 and descriptor(Path("/proc/self/fd/3")) == 3
    assert descriptor(Path(f"/proc/{os.getpid()}/fd/4")) == 4
    assert descriptor(Path("/proc/1/fd/4")) is None or os.getpid() == 1  # another process's
    assert descriptor(Path("/tmp/fd/1")) is None and descriptor(Path("out.json")) is None


def test_descriptor_of_an_appended_file_keeps_what_was_there(tmp_path):
    # `trtllm-run ... --output /dev/stdout >> log`: reopening /dev/stdout would truncate the log,
    # renaming over it would unlink it
    log = tmp_path / "log"
    log.write_text("earlier line\n")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        check_writable(Path(f"/dev/fd/{fd}"))
        write_atomic(Path(f"/dev/fd/{fd}"), {"e": 5}, indent=None)
    finally:
        os.close(fd)
    assert log.read_text() == 'earlier line\n{"e": 5}\n'
    assert os.listdir(tmp_path) == ["log"]


def test_descriptor_of_a_pipe_is_written(tmp_path):
    r, w = os.pipe()
    try:
        write_atomic(Path(f"/proc/self/fd/{w}"), {"f": 6}, indent=None)
        os.close(w)
        assert os.read(r, 100) == b'{"f": 6}\n'
    finally:
        os.close(r)


def test_a_loop_of_symlinks_is_refused(tmp_path):
    """Followed, it would end where it started, and the rename would replace the first link by a file."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(NotWritable, match="loop of symbolic links"):
        check_writable(tmp_path / "a")
    (tmp_path / "c").symlink_to(tmp_path / "missing.json")  # a dangling link is a file to be: written
    check_writable(tmp_path / "c")


def test_unwritable_descriptors_and_directories_are_refused(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(NotWritable, match="not open"):
        check_writable(Path(f"/dev/fd/{fd}"))
    r, w = os.pipe()
    try:
        with pytest.raises(NotWritable, match="reading only"):
            check_writable(Path(f"/dev/fd/{r}"))
    finally:
        os.close(r)
        os.close(w)
    with pytest.raises(NotWritable, match="ends with /"):
        check_writable(str(tmp_path / "newdir") + "/")
    with pytest.raises(NotWritable, match="is a directory"):
        check_writable(tmp_path)
    with pytest.raises(NotWritable, match="is empty: name a file"):  # (not the current directory)
        check_writable("")


def as_a_user(check) -> int:
    """check()'s result, run as a user without root's right to write anything: in a child that is
    uid 65534 when this is root."""
    import gc

    if os.geteuid() != 0:
        return check()
    gc.collect()  # (the parent's garbage goes here, with its threads)
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        # no collection in the child: freeing an ONNX Runtime object the parent left waits forever on
        # its thread pool, which the child does not have (a CI run hung here)
        gc.disable()
        code = 3
        try:
            os.setgid(65534)
            os.setuid(65534)
            code = check()
        finally:
            os._exit(code)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    assert code >= 0, f"the child was killed by signal {-code}"  # (not a result to compare)
    return code


@pytest.fixture
def shared_dir():
    """A directory under /tmp that uid 65534 can reach."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(dir="/tmp"))
    path.chmod(0o777)
    yield path
    path.chmod(0o777)
    shutil.rmtree(path)


def test_a_read_only_file_is_refused(shared_dir):
    """A file the user may not write is refused up front (the rename would replace it anyway)."""
    protected, open_file = shared_dir / "ro.json", shared_dir / "rw.json"
    for f, mode in ((protected, 0o444), (open_file, 0o666)):
        f.write_text("{}")
        f.chmod(mode)

    def check() -> int:
        try:
            check_writable(open_file)
        except NotWritable:
            return 2  # the writable one must pass
        try:
            check_writable(protected)
        except NotWritable as e:
            return 0 if "read-only" in str(e) else 3
        return 1

    assert as_a_user(check) == 0


def test_a_writable_file_in_a_read_only_directory_is_rewritten_in_place(shared_dir):
    """No temporary file can go beside it: the file itself is rewritten, as the shell's > would;
    a new file there is refused."""
    target = shared_dir / "out.json"
    target.write_text("{}")
    target.chmod(0o666)
    shared_dir.chmod(0o555)

    def check() -> int:
        check_writable(target)
        write_atomic(target, {"a": 1}, indent=None)
        try:
            check_writable(shared_dir / "new.json")
        except NotWritable as e:  # (naming the directory, not the probe file it tried: a review's point)
            if "does not take new files (Permission denied)" not in str(e) or "probe" in str(e):
                return 3
            return 0 if json.loads(target.read_text()) == {"a": 1} else 2
        return 1

    assert as_a_user(check) == 0


def test_a_full_disk_leaves_a_file_rewritten_in_place_whole(tmp_path, monkeypatch):
    """In place (a directory the user may not write), the new text's space is reserved first: a full
    disk leaves the old file as it was (opened with truncation, it became half a JSON document), and
    a shorter text leaves nothing of the longer old one."""
    import errno

    from trtllm.runtime import files

    target = tmp_path / "out.json"
    target.write_text(json.dumps({"good": "x" * 1000}))
    files.rewrite_in_place(target, b'{"a": 1}\n')
    assert json.loads(target.read_text()) == {"a": 1}
    target.write_text(json.dumps({"good": "x" * 1000}))

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match="No space left"):
        files.rewrite_in_place(target, json.dumps({"new": "y" * 5000}).encode())
    assert json.loads(target.read_text()) == {"good": "x" * 1000}


def test_dumps_inlines_deep_containers_and_keeps_the_data():
    """The output's layout: indented down to a response's lists, each logprob step or message on
    one line (C-encoded: the pure-Python indenting encoder took 3 s for 4,096 x 50 logprobs)."""
    from trtllm.runtime.files import dumps

    doc = {"input_file": "in.json", "responses": [
        {"output_text": "é\n", "empty": [], "none": {}, "messages": [{"role": "user", "content": "hi"}],
         "logprobs": [[{"token_id": 1, "token": "a", "bytes": [97], "logprob": -0.5}]] * 2}]}
    text = dumps(doc, 4, 4)
    assert json.loads(text) == doc
    lines = text.splitlines()
    assert '                {"role": "user", "content": "hi"}' in lines
    assert lines.count('                [{"token_id": 1, "token": "a", "bytes": [97], "logprob": -0.5}],') == 1
    assert '"output_text": "é\\n"' in text and '"empty": []' in text and '"none": {}' in text
    assert dumps(doc, 2) == json.dumps(doc, indent=2, ensure_ascii=False)
    with pytest.raises(TypeError, match="keys must be strings"):
        dumps({True: 1}, 4, 4)  # json writes "true"; str() would write "True"


def test_names_the_file_system_refuses_are_refused_before_the_run(tmp_path):
    """A name too long, a directory on the way that cannot be searched: refused as the others are
    (they raised OSError out of the check: a traceback and exit 1), and a name near the limit
    writes through its temporary file."""
    with pytest.raises(NotWritable, match="longer than the file system's 255 bytes"):
        check_writable(tmp_path / "new" / ("a" * 256 + ".json"))
    longest = tmp_path / ("b" * 250 + ".json")
    check_writable(longest)
    write_atomic(longest, {"g": 7}, indent=None)
    assert json.loads(longest.read_text()) == {"g": 7}
    with pytest.raises(NotWritable, match="cannot be written: File name too long"):  # (stat's own error)
        check_writable(tmp_path / ("a" * 256 + ".json"))
