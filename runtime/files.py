"""Writing trtllm-run's output files without ever losing a good one.

A file is written next to its target, synced and renamed over it, so a crash never leaves half a
file where a good one was (in a directory the user may not write, a file they may is rewritten in
place). A path naming one of this process's open descriptors (/dev/stdout, /dev/fd/N,
/proc/self/fd/N) is written to that descriptor: reopening it would truncate a file redirected with
`>>` and fail on a pipe, and renaming over the file behind it would unlink what the shell opened.
Any other pipe or device is written in place.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import select
import stat
import sys
import tempfile
from pathlib import Path

DESCRIPTOR = re.compile(r"/dev/(?:fd/(\d+)|(stdout|stderr))|/proc/(?:self|(\d+))/fd/(\d+)")
STANDARD = {"stdout": 1, "stderr": 2}


class NotWritable(Exception):
    """The path cannot take the output; the message says why."""


def current_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def shown(path: str | Path) -> str:
    """A path for a message or the output JSON: bytes that are not UTF-8 (a file name can hold any)
    written as escapes, since they cannot be encoded as they are."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def descriptor(path: str | Path) -> int | None:
    """The descriptor number if `path` names one of this process's open descriptors, else None."""
    match = DESCRIPTOR.fullmatch(os.path.abspath(path))
    if not match or (match[3] is not None and int(match[3]) != os.getpid()):
        return None
    return int(match[1] or match[4]) if match[2] is None else STANDARD[match[2]]


def check_writable(path: str | Path) -> None:
    """Raise NotWritable now, before anything runs, if `path` cannot be written: its answers would
    be lost at the end."""
    try:
        _check_writable(path)
    except OSError as e:  # a name too long, a directory on the way that cannot be searched, ...
        raise NotWritable(f"cannot be written: {e.strerror or type(e).__name__}") from None


def _check_writable(path: str | Path) -> None:
    if not str(path):  # (abspath would make it the current directory)
        raise NotWritable("is empty: name a file")
    fd = descriptor(path)
    if fd is not None:
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        except OSError:
            raise NotWritable(f"descriptor {fd} is not open") from None
        if flags & os.O_ACCMODE == os.O_RDONLY:
            raise NotWritable(f"descriptor {fd} is open for reading only")
        return
    if str(path).endswith(os.sep) and not Path(path).is_dir():  # a str: Path drops the /
        raise NotWritable("names a directory (it ends with /), not a file")
    try:
        os.path.realpath(path, strict=True)
    except OSError as e:  # a loop would otherwise be replaced by a file where its first link was
        if e.errno == errno.ELOOP:
            raise NotWritable("is a loop of symbolic links") from None
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise NotWritable("is a directory")
    if target.exists() and not target.is_file():
        return  # a pipe or device: written in place
    if target.is_file() and not os.access(target, os.W_OK):
        # The rename would replace it all the same: honour its protection, as the shell's > does.
        raise NotWritable("is read-only")
    ancestor = target.parent
    while not ancestor.exists():  # the directories write_atomic would create
        ancestor = ancestor.parent
    longest = os.pathconf(ancestor, "PC_NAME_MAX")
    if any(len(os.fsencode(part)) > longest for part in target.relative_to(ancestor).parts):
        raise NotWritable(f"cannot be written: a name in it is longer than the file system's {longest} bytes")
    try:
        if not ancestor.is_dir():
            raise NotADirectoryError(f"{ancestor} is not a directory")
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=".trtllm-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:  # the probe's own name would only confuse: say which directory refused
        # (a writable file in a read-only directory is rewritten in place)
        if not (isinstance(e, PermissionError) and target.is_file()):
            raise NotWritable(f"cannot be written: {shown(ancestor)} does not take new files "
                              f"({e.strerror or type(e).__name__})") from None


# Line breaks other than \n that ensure_ascii=False leaves raw in strings: Python's splitlines and
# many line readers (editors, JavaScript before ES2019) end a line at them, cutting a record in two.
_ESCAPED_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def json_text(data, indent: int | None = None) -> str:
    """json.dumps with the text as UTF-8 characters, but for U+0085, U+2028 and U+2029 (escaped)."""
    return json.dumps(data, indent=indent, ensure_ascii=False).translate(_ESCAPED_BREAKS)


def _encode(x) -> str:
    return _c_encode(x).translate(_ESCAPED_BREAKS)


_c_encode = json.JSONEncoder(ensure_ascii=False).encode  # without an indent: the C encoder


def dumps(data, indent: int | None, inline_from: int | None = None) -> str:
    """JSON text; with `inline_from`, containers nested that deep or deeper are written on one line.
    Python's encoder is pure Python with an indent, C without: an output with 4,096 tokens x 50
    logprobs took 2.9-3.2 s and 84 MB indented throughout, 1.1 s and 22 MB with each logprob step on
    its line. The levels above stay indented (the format's readable shape), but for arrays of
    numbers and strings (a response's output_ids), one line whatever their depth."""
    if indent is None or inline_from is None:
        return json_text(data, indent)

    def dump(x, depth: int) -> str:
        if depth >= inline_from or not isinstance(x, (dict, list)) or not x or (
                isinstance(x, list) and not any(isinstance(v, (dict, list)) for v in x)):
            return _encode(x)
        inner, outer = " " * (indent * (depth + 1)), " " * (indent * depth)
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):  # (json would write True as "true", not "True")
                raise TypeError(f"dumps: keys must be strings, got {[k for k in x if not isinstance(k, str)]}")
            items = [f"{inner}{_encode(k)}: {dump(v, depth + 1)}" for k, v in x.items()]
            return "{\n" + ",\n".join(items) + "\n" + outer + "}"
        return "[\n" + ",\n".join(inner + dump(v, depth + 1) for v in x) + "\n" + outer + "]"

    return dump(data, 0)


def write_atomic(path: str | Path, data: dict, indent: int | None, inline_from: int | None = None) -> None:
    """Write `data` as JSON to `path` (see the module's docstring; `dumps` for the layout). A
    symlink is followed (its target is replaced, the link kept). The new file gets the mode the old
    one had, or what the umask allows, not mkstemp's 600."""
    text = dumps(data, indent, inline_from) + "\n"
    fd = descriptor(path)
    if fd is not None:
        for stream in (sys.stdout, sys.stderr):  # what was printed before comes first
            if stream is not None:
                stream.flush()
        write_all(fd, text.encode("utf-8"))
        return
    path = Path(os.path.realpath(path))
    if path.exists() and not stat.S_ISREG(path.stat().st_mode):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~current_umask()
    try:
        # (a name near the file system's limit: the temporary one's prefix takes part of it)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:60]}.", suffix=".tmp")
    except PermissionError:
        if not path.is_file():
            raise
        # A directory we may not write, holding a file we may: rewrite the file in place, as the
        # shell's > would (not atomic: there is nowhere to put a temporary file).
        rewrite_in_place(path, text.encode("utf-8"))
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write_synced(f, text)  # on disk before the rename: a power cut leaves the old file or the new
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def rewrite_in_place(path: Path, data: bytes) -> None:
    """`data` over the file at `path`, its space reserved before the old content is touched: a full
    disk leaves the old file whole (opened with truncation, a good file became half a JSON document),
    and the file is cut to the new length once written."""
    fd = os.open(path, os.O_WRONLY)
    try:
        try:
            os.posix_fallocate(fd, 0, len(data))
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # (a file system without it: written as it is)
                raise
        write_all(fd, data)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(f, text: str | bytes) -> None:
    """Write to an open file and get it onto the disk before anything renames it."""
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


def write_all(fd: int, data: bytes) -> None:
    """All of `data`, past partial writes; a non-blocking descriptor (a pipe or terminal another
    process set so) that is full is waited on, not taken for a failed one."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])
