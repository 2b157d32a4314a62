"""trtllm-run interrupted (Ctrl-C, SIGTERM) on a tiny engine: what is answered is kept, the rest is
cancelled with its own line, and no output file is left half-written."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import pytest
from click.testing import CliRunner

from tests.runtime.test_run_stdout import chat, run_process
from trtllm.runtime.cli import main

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf


def test_an_interrupt_while_the_output_is_written_waits_for_it(tmp_path, tiny_engine, monkeypatch):
    """A Ctrl-C that comes while --output is written (a file renamed into place, milliseconds) takes
    effect after it: the answers are kept, the exit is 130. The wrong variant, the write not
    deferred, leaves the old file and loses the answers."""
    import signal

    from trtllm.runtime import files, interrupt

    write = files.write_atomic

    def interrupted_write(path, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of the write
        time.sleep(0.05)
        write(path, *args, **kwargs)

    engine = tiny_engine("llama")
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")], "max_generate_length": 2, "temperature": 0}))

    def run():
        (tmp_path / "out.json").write_text('{"old": true}')
        result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine),
                                           "--output", str(tmp_path / "out.json")])
        return result.exit_code, json.loads((tmp_path / "out.json").read_text())

    monkeypatch.setattr(files, "write_atomic", interrupted_write)
    code, out = run()
    assert code == 130 and out["responses"][0]["finish_reason"] == "max-length"
    monkeypatch.setattr(interrupt, "settle", lambda: None)
    code, out = run()
    assert code == 130 and out == {"old": True}


def test_an_interrupt_after_generation_waits_for_the_answers(tmp_path, tiny_engine, monkeypatch):
    """Every request has finished and the answers are being put together (for a large output, a
    noticeable time) when a Ctrl-C comes: they are written, the exit is 130 and says so."""
    import signal

    from trtllm.runtime.runner import Runner

    response, calls = Runner.response, []

    def interrupted(self, smp):
        if not calls:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        calls.append(1)
        return response(self, smp)

    monkeypatch.setattr(Runner, "response", interrupted)
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a"), chat("b")], "max_generate_length": 2, "temperature": 0}))
    (tmp_path / "out.json").write_text('{"old": true}')
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                       "--output", str(tmp_path / "out.json")])
    assert result.exit_code == 130 and "interrupted once generation was over: the answers were written first" in result.output
    out = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert [r["finish_reason"] for r in out] == ["max-length"] * 2


def test_an_interrupt_while_an_engine_failure_is_handled_loses_no_answer(tmp_path, tiny_engine, monkeypatch):
    """The engine fails in step 6, after request 0 finished, and a Ctrl-C comes while the unfinished
    requests are failed: request 0 keeps its answer, the file is written, the exit is 130."""
    import signal

    from trtllm.runtime.backends import onnxruntime as ort_backend
    from trtllm.runtime.generate import RowState

    step, calls, fail = ort_backend.OnnxRuntimeEngine.step, [0], RowState.fail

    def broken_at_step_6(self, inputs, kv, want_logits=False):
        calls[0] += 1
        if calls[0] == 6:
            raise RuntimeError("device lost")
        return step(self, inputs, kv, want_logits)

    def interrupted_fail(self, why):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        fail(self, why)

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", broken_at_step_6)
    monkeypatch.setattr(RowState, "fail", interrupted_fail)
    payload = {"batch_size": 1, "temperature": 0, "max_generate_length": 4, "requests": [chat("a"), chat("b")]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    (tmp_path / "out.json").write_text('{"old": true}')
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                       "--output", str(tmp_path / "out.json")])
    assert result.exit_code == 130, result.output
    first, second = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert first["finish_reason"] == "max-length" and second["finish_reason"] == "error"
    assert "device lost" in second["error"]


def test_a_ctrl_c_inside_a_streamed_line_comes_after_it(tmp_path, tiny_engine, monkeypatch):
    """--stream's JSON lines stay whole: a Ctrl-C in the middle of writing one (its first half
    out) stops generation once the line is written; every line parses, each request ends with
    one. The wrong variant, the line not held, leaves half a line."""
    import signal

    import click

    from trtllm.runtime import cli, interrupt

    echo, calls = click.echo, []

    def split_echo(message=None, *args, **kwargs):
        if not kwargs.get("err") and isinstance(message, str) and message.startswith("{") and len(calls) == 2:
            echo(message[:10], *args, **{**kwargs, "nl": False})
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            message = message[10:]
        calls.append(1)
        echo(message, *args, **kwargs)

    monkeypatch.setattr(cli.click, "echo", split_echo)
    payload = {"temperature": 0, "max_generate_length": 40, "ignore_eos": True, "requests": [chat("a"), chat("b")]}
    (tmp_path / "in.json").write_text(json.dumps(payload))

    def run():
        calls.clear()
        result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                           "--stream", "--output", str(tmp_path / "out.json")])
        return result, [ln for ln in result.stdout.splitlines() if ln.strip()]

    result, lines = run()
    assert result.exit_code == 130, result.output
    records = [json.loads(ln) for ln in lines]  # every line whole
    assert {r["request_idx"] for r in records if r.get("finish_reason") == "cancelled"} == {0, 1}
    monkeypatch.setattr(interrupt, "held", contextlib.nullcontext)
    result, lines = run()
    with pytest.raises(json.JSONDecodeError):
        [json.loads(ln) for ln in lines]


def test_an_interrupt_while_the_engine_loads_keeps_the_old_output(tmp_path, tiny_engine, monkeypatch):
    """Before generation nothing is answered: the exit is 130 and the old file stays (once
    generating, the answers so far replace it: the tests below)."""
    from trtllm.runtime import engine as engine_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    engine = tiny_engine("llama")
    monkeypatch.setattr(engine_module, "load_engine", interrupted)
    (tmp_path / "out.json").write_text('{"good": true}')
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine),
                                       "--output", str(tmp_path / "out.json")])
    assert result.exit_code == 130 and "interrupted: files not yet written were left as they were" in result.output
    assert json.loads((tmp_path / "out.json").read_text()) == {"good": True}


def test_interrupts_on_a_stream_nobody_reads_still_write_the_output(tmp_path, tiny_engine):
    """`--stream --output` with a stdout pipe whose reader stopped reading (a pager left open): the
    stream's write hangs once the pipe is full. The first Ctrl-C waits for the line, the second
    breaks the write and ends generation; the cancelled rows' lines are no longer printed, so the
    answers reach --output (they hung on the same pipe: two more Ctrl-Cs left the old file)."""
    import array
    import fcntl
    import signal
    import subprocess
    import termios

    payload = {"temperature": 0, "max_generate_length": 400, "ignore_eos": True, "num_logprobs": 20,
               "requests": [chat(str(i)) for i in range(4)]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    (tmp_path / "out.json").write_text('{"old": true}')
    read_end, write_end = os.pipe()  # nobody reads read_end
    try:
        proc = subprocess.Popen([sys.executable, "-m", "trtllm.runtime", str(tmp_path / "in.json"), "--engine",
                                 str(tiny_engine("llama")), "--stream", "--output", str(tmp_path / "out.json")],
                                stdout=write_end, stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        deadline, waiting = time.time() + 240, array.array("i", [0])
        while time.time() < deadline and proc.poll() is None and waiting[0] < 60_000:  # (a pipe holds 64 KiB)
            time.sleep(0.5)
            fcntl.ioctl(read_end, termios.FIONREAD, waiting)
        time.sleep(1)
        assert proc.poll() is None, "the run ended before the pipe was full"
        for _ in range(2):
            proc.send_signal(signal.SIGINT)
            time.sleep(1.5)
        err = proc.communicate(timeout=60)[1]
    finally:
        os.close(read_end)
    assert proc.returncode == 130, err
    reasons = [r["finish_reason"] for r in json.loads((tmp_path / "out.json").read_text())["responses"]]
    assert len(reasons) == 4 and "cancelled" in reasons, reasons


def three_in_one_slot(tmp_path, engine) -> tuple[list[str], list[dict]]:
    """(trtllm-run's arguments, the answers uninterrupted) of three 4-token requests on one slot:
    request 0 takes steps 1-4, request 1's prefill is step 5."""
    payload = {"batch_size": 1, "temperature": 0, "max_generate_length": 4, "requests": [chat("a"), chat("b"), chat("c")]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    args = [str(tmp_path / "in.json"), "--engine", str(engine), "--output", str(tmp_path / "out.json")]
    CliRunner().invoke(main, [*args[:3], "--output", str(tmp_path / "full.json")])
    return args, json.loads((tmp_path / "full.json").read_text())["responses"]


def at_step(monkeypatch, n: int, action) -> None:
    """The ONNX Runtime engine's n-th step runs action() first (an interrupt, a signal)."""
    from trtllm.runtime.backends import onnxruntime as ort_backend

    step, calls = ort_backend.OnnxRuntimeEngine.step, [0]

    def stepped(self, inputs, kv, want_logits=False):
        calls[0] += 1
        if calls[0] == n:
            action()
        return step(self, inputs, kv, want_logits)

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", stepped)


def ctrl_c():
    raise KeyboardInterrupt


@pytest.mark.parametrize("stream, second", [(False, False), (True, False), (False, True)])
def test_interrupt_while_generating_keeps_the_answers_and_cancels_the_rest(tmp_path, tiny_engine, monkeypatch,
                                                                           stream, second):
    """One slot, three requests of 4 tokens: request 0 takes steps 1-4, request 1's prefill is step 5,
    and a Ctrl-C comes in step 6. Request 0 keeps its answer, request 1 ends with its one token as
    "cancelled", request 2 never ran; the output is written and the exit code is 130. `second`: a
    SIGHUP follows while the rest are cancelled, and waits for the answers too."""
    args, full = three_in_one_slot(tmp_path, tiny_engine("llama"))
    at_step(monkeypatch, 6, ctrl_c)
    if second:  # and the terminal closes (or `timeout` follows up) while the rest are cancelled
        import signal

        from trtllm.runtime.generate import RowState

        cancel, sent = RowState.cancel, []

        def hangup_then_cancel(self):
            if not sent:
                sent.append(os.kill(os.getpid(), signal.SIGHUP))
                time.sleep(0.05)
            cancel(self)

        monkeypatch.setattr(RowState, "cancel", hangup_then_cancel)
    result = CliRunner().invoke(main, args + (["--stream"] if stream else []))
    assert result.exit_code == 130 and "2 of 3 requests were cancelled" in result.output, result.output
    assert "the other 1 finished" in result.output
    first, second, third = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert first == full[0]
    assert second["finish_reason"] == "cancelled" and second["batch_idx"] == 0 and "error" not in second
    assert full[1]["output_text"].startswith(second["output_text"]) and second["output_text"]
    assert (third["finish_reason"], third["output_text"], third["batch_idx"]) == ("cancelled", "", None)
    if stream:
        lines = [json.loads(ln) for ln in result.stdout.splitlines() if ln.startswith("{")]
        for k, response in enumerate((first, second, third)):
            mine = [ln for ln in lines if ln["request_idx"] == k]
            assert "".join(ln["text"] for ln in mine) == response["output_text"]
            assert mine[-1]["finish_reason"] == response["finish_reason"]


def test_sigterm_while_generating_writes_the_answers(tmp_path, tiny_engine):
    """docker stop sends SIGTERM: handled as Ctrl-C, the answers so far are written (cancelled)."""
    import signal

    payload = {"temperature": 0, "max_generate_length": 100000, "ignore_eos": True, "requests": [chat("a")]}
    proc = run_process(tmp_path, tiny_engine("llama"), payload, "--stream", "--output", str(tmp_path / "out.json"))
    proc.stdout.readline()  # generating
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (response,) = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert response["finish_reason"] == "cancelled" and response["output_text"]


def test_an_interrupt_inside_the_backends_import_exits_130(tmp_path, tiny_engine, monkeypatch):
    """onnxruntime's C extension turns a KeyboardInterrupt raised inside its initialisation into
    ImportError("initialization failed"): the import is held, then interrupted (130, nothing
    written). The wrong variant, the import not held, exits 1 with a traceback."""
    import signal

    from trtllm.runtime import engine as engine_mod

    engine = tiny_engine("llama")  # (built, and loaded by its check, before the backend is replaced)
    (tmp_path / "slow_backend.py").write_text(
        "import os, signal, time\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(0.05)\n"
        "except KeyboardInterrupt:\n"
        "    raise ImportError('initialization failed')\n"
        "Engine = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "slow_backend", raising=False)
    monkeypatch.setitem(engine_mod.BACKENDS, "onnxruntime", "slow_backend:Engine")
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat("a")], "max_generate_length": 2}))
    (tmp_path / "out.json").write_text('{"old": true}')
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine),
                                       "--output", str(tmp_path / "out.json")])
    assert result.exit_code == 130 and "interrupted" in result.output, result.output
    assert json.loads((tmp_path / "out.json").read_text()) == {"old": True}
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the dropped one)
def test_an_interrupt_a_finalizer_swallowed_still_ends_generation(tmp_path, tiny_engine, monkeypatch):
    """A Ctrl-C whose KeyboardInterrupt Python drops (raised in a finalizer, during step 6) ends
    generation at the next step, as one that was not dropped: request 0 keeps its answer, the rest
    are cancelled, exit 130. It went on to the end (and a second Ctrl-C was only kept)."""
    import signal

    from tests.builder.test_build_output import SignalInFinalizer

    args, full = three_in_one_slot(tmp_path, tiny_engine("llama"))
    at_step(monkeypatch, 6, lambda: SignalInFinalizer(signal.SIGINT))  # dropped at once: its __del__ runs here
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and "2 of 3 requests were cancelled" in result.output, result.output
    first, second, third = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert first == full[0] and second["finish_reason"] == third["finish_reason"] == "cancelled"


def test_an_interrupted_beam_search_keeps_what_it_had(tmp_path, tiny_engine, monkeypatch):
    """A Ctrl-C in a beam search's 6th step: each of its samples is cancelled with what the search had
    for it (its best beams so far, each a prefix of what a whole search would keep or not), with the
    slots it took as batch_idx (it came back empty with batch_idx null, as a request that never ran)."""
    payload = {"temperature": 0, "max_generate_length": 12, "ignore_eos": True,
               "requests": [{**chat("a"), "num_beams": 2, "n": 2}]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    args = [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")), "--output", str(tmp_path / "out.json"),
            "--stream"]
    at_step(monkeypatch, 6, ctrl_c)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130 and "1 of 1 requests were cancelled" in result.output, result.output
    assert "the other" not in result.output  # (none finished)
    out = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert [r["finish_reason"] for r in out] == ["cancelled", "cancelled"] and [r["batch_idx"] for r in out] == [0, 0]
    assert all(len(r["output_ids"]) == 5 and r["output_text"] for r in out)  # (5 steps, a token each)
    assert out[0]["output_ids"] != out[1]["output_ids"] and "beam_score" not in out[0]
    lines = [json.loads(ln) for ln in result.stdout.splitlines() if ln.startswith("{")]
    for k, response in enumerate(out):
        mine = [ln for ln in lines if ln["sample_idx"] == k]
        assert "".join(ln["text"] for ln in mine) == response["output_text"] and mine[-1]["finish_reason"] == "cancelled"


def test_an_interrupted_beam_search_s_finished_hypothesis_keeps_its_stop_cut(tmp_path, tiny_engine, monkeypatch):
    """A hypothesis that ended on a stop string before the Ctrl-C: cancelled, its text cut before the
    stop as its stream's pieces were (its output_text held the stop string and what followed)."""
    engine = str(tiny_engine("llama"))
    payload = {"temperature": 0, "max_generate_length": 12, "ignore_eos": True,
               "requests": [{**chat("a"), "num_beams": 2, "n": 2}]}
    (tmp_path / "in.json").write_text(json.dumps(payload))
    args = [str(tmp_path / "in.json"), "--engine", engine, "--output", str(tmp_path / "out.json")]
    assert CliRunner().invoke(main, args).exit_code == 0
    whole = json.loads((tmp_path / "out.json").read_text())["responses"][0]["output_text"]
    stop = whole[len(whole) // 4:len(whole) // 4 + 3]  # met early by the best beam
    payload["requests"][0]["stop"] = stop
    (tmp_path / "in.json").write_text(json.dumps(payload))
    at_step(monkeypatch, 10, ctrl_c)
    result = CliRunner().invoke(main, [*args, "--stream"])
    assert result.exit_code == 130, result.output
    out = json.loads((tmp_path / "out.json").read_text())["responses"]
    lines = [json.loads(ln) for ln in result.stdout.splitlines() if ln.startswith("{")]
    assert any(whole.startswith(r["output_text"]) and len(r["output_text"]) < len(whole) // 4 + 3 for r in out)
    for k, response in enumerate(out):
        assert stop not in response["output_text"] and response["finish_reason"] == "cancelled"
        assert "".join(ln["text"] for ln in lines if ln["sample_idx"] == k) == response["output_text"]
