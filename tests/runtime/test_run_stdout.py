"""trtllm-run's stdout: a pipe whose reader goes away (before the first line, or part-way through
a large answer), a full device, a closed descriptor, a file appended to; what goes there is UTF-8."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf


def chat(text, **extra):
    return {"messages": [{"role": "user", "content": text}], **extra}


def run_process(tmp_path, engine, payload, *extra, stdout=subprocess.PIPE):
    (tmp_path / "in.json").write_text(json.dumps(payload))
    return subprocess.Popen([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine", str(engine),
                             *extra], stdout=stdout, stderr=subprocess.PIPE, text=True)


def test_output_to_redirected_stdout_appends(tmp_path, tiny_engine):
    # `trtllm-run ... --output /dev/stdout >> log`: the log keeps its lines, the answers follow them
    log = tmp_path / "log"
    log.write_text("earlier line\n")
    with open(log, "a") as f:
        proc = run_process(tmp_path, tiny_engine("llama"), {"requests": [chat("a")], "max_generate_length": 2, "temperature": 0},
                           "--output", "/dev/stdout", stdout=f)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    first, rest = log.read_text().split("\n", 1)
    assert first == "earlier line" and json.loads(rest)["responses"][0]["finish_reason"] == "max-length"
    assert "[0] (max-length)" in err  # the summary lines go to stderr when the JSON is on stdout


@pytest.mark.parametrize("with_output", [True, False])
def test_stream_reader_gone(tmp_path, tiny_engine, with_output):
    # `trtllm-run --stream ... | head -1`: the stream stops; the run still writes --output, or, with
    # nothing to write, ends as a program killed by SIGPIPE would
    extra = ["--output", str(tmp_path / "out.json")] if with_output else []
    proc = run_process(tmp_path, tiny_engine("llama"), {"requests": [chat("a"), chat("b")], "max_generate_length": 3, "temperature": 0},
                       "--stream", *extra)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read()
    proc.wait(timeout=300)
    if with_output:
        assert proc.returncode == 0, err
        assert [r["finish_reason"] for r in json.loads((tmp_path / "out.json").read_text())["responses"]] == \
            ["max-length"] * 2
        assert "Broken pipe" not in err and "Exception" not in err
    else:
        assert proc.returncode == 141, err


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("redirect", [">/dev/full", ">&-"])
def test_a_failing_stdout_with_output_loses_nothing(tmp_path, tiny_engine, stream, redirect):
    """stdout on a full device, or closed: the run goes on, --output gets every answer, the exit is
    0; before, the streamed write's error failed every request and the file was never written."""
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a"), chat("b")], "max_generate_length": 3, "temperature": 0}))
    command = [sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
               "--output", str(tmp_path / "out.json"), *(["--stream"] if stream else [])]
    proc = subprocess.run(["bash", "-c", f'exec "$@" {redirect}', "_", *command], stderr=subprocess.PIPE, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [r["finish_reason"] for r in json.loads((tmp_path / "out.json").read_text())["responses"]] == \
        ["max-length"] * 2
    assert "Traceback" not in proc.stderr
    # the streamed lines' failure is told; the summary lines' is not: nothing was lost
    assert ("stdout could not be written" in proc.stderr) == stream


def test_output_on_a_closed_stdout_is_refused(tmp_path, tiny_engine):
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")], "max_generate_length": 2, "temperature": 0}))
    command = [sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
               "--output", "/dev/stdout"]
    proc = subprocess.run(["bash", "-c", 'exec "$@" >&-', "_", *command], stderr=subprocess.PIPE, text=True, timeout=300)
    assert proc.returncode == 2 and "is stdout, which is closed" in proc.stderr, proc.stderr


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_stdout_without_output_exits_3(tmp_path, tiny_engine, stream):
    """With no --output, stdout was the answers' only way out: exit 3 and a line that says so (141
    stays for a reader that went away: test_stream_reader_gone)."""
    with open("/dev/full", "w") as full:
        proc = run_process(tmp_path, tiny_engine("llama"), {"requests": [chat("a")], "max_generate_length": 2, "temperature": 0},
                           *(["--stream"] if stream else []), stdout=full)
        err = proc.communicate(timeout=300)[1]
    assert proc.returncode == 3, err
    assert "stdout could not be written" in err and "Traceback" not in err


def test_a_reader_gone_mid_answer_exits_141(tmp_path, tiny_engine):
    """`trtllm-run in.json | head -c 10` with an answer of several pipe buffers: the write is cut
    short after the first 64 KiB. Before, Python's buffered stdout dropped that error: the run
    exited 0 with the rest of the answer lost; now it ends as a program killed by SIGPIPE would."""
    payload = {"temperature": 0, "max_generate_length": 40, "ignore_eos": True, "num_logprobs": 50,
               "requests": [{"messages": [{"role": "user", "content": "a"}]}]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    proc = subprocess.Popen([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine",
                             str(tiny_engine("llama"))], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert head.startswith(b'{') and "Traceback" not in err


def test_answers_on_stdout_are_utf8_whatever_the_locale(tmp_path, tiny_engine):
    """The JSON on stdout is UTF-8 (RFC 8259) under an ASCII locale too, as the --output file is."""
    payload = {"temperature": 0, "max_generate_length": 2,
               "requests": [{"messages": [{"role": "user", "content": "é 中 🙂"}]}]}
    (tmp_path / "in.json").write_text(json.dumps(payload), encoding="utf-8")
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine",
                           str(tiny_engine("llama"))], capture_output=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    out = json.loads(proc.stdout.decode("utf-8"))
    assert out["responses"][0]["messages"][0]["content"][0]["text"] == "é 中 🙂"


def test_lines_hold_no_other_line_breaks(tmp_path, tiny_engine):
    """An answer with U+2028, U+2029 and U+0085 (held to them by a regex) keeps each --stream record
    and the output file's layout whole for readers that end lines there too (Python's
    splitlines): the three are escaped, as json escapes the other line breaks."""
    text = "a\u2028b\u0085c\u2029d"
    payload = {"temperature": 0, "max_generate_length": 12,
               "requests": [chat("x", guided_decoding={"regex": "a\u2028b\u0085c\u2029d"})]}
    proc = run_process(tmp_path, tiny_engine("llama"), payload, "--stream", "--output", str(tmp_path / "out.json"))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert "".join(r["text"] for r in records) == text and records[-1]["finish_reason"] == "end-of-sequence"
    written = (tmp_path / "out.json").read_text(encoding="utf-8")
    assert json.loads(written)["responses"][0]["output_text"] == text
    assert written.splitlines() == written.split("\n")[:-1] and "\\u2028" in written


def test_a_failing_stderr_fails_nothing(tmp_path, tiny_engine):
    """stderr's reader gone (`2>&1 | head -1`, a closed terminal): a warning raised while generating
    (saved KV that cannot be written) failed every request with BrokenPipeError, and a clean run
    exited 1 without its --profile. Now stderr is silenced and the run is what it would be."""
    payload = {"temperature": 0, "max_generate_length": 2, "requests": [
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": w}],
         "save_system_prompt_kv_cache": True} for w in ("a", "b")]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone
    proc = subprocess.run([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine",
                           str(tiny_engine("llama")), "--output", str(tmp_path / "out.json"), "--kv-cache-dir",
                           "/proc/no-kv", "--profile", str(tmp_path / "profile.json")],
                          stdout=subprocess.DEVNULL, stderr=write_end, timeout=300)
    os.close(write_end)
    assert proc.returncode == 0
    assert [r["finish_reason"] for r in json.loads((tmp_path / "out.json").read_text())["responses"]] == \
        ["max-length"] * 2
    assert json.loads((tmp_path / "profile.json").read_text())
