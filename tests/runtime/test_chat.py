"""trtllm-chat on a tiny engine: each turn answers as trtllm-run answers the conversation so far,
restores the KV of the turns before it, and a stopped answer or a bad setting leaves the chat as
it should."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from trtllm.runtime import chat
from trtllm.runtime.runner import Runner

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf

SETTINGS = ["--set", "temperature=0", "--set", "max_generate_length=6"]


def recorded(monkeypatch) -> list:
    """Runner.run's (messages, answer, prefill's reused tokens so far, request) of each turn."""
    turns = []
    real = Runner.run

    def run(self, inp, *args, **kwargs):
        out = real(self, inp, *args, **kwargs)
        turns.append((inp.requests[0].messages, out[0], self.timing.reused_tokens, inp.requests[0]))
        return out

    monkeypatch.setattr(Runner, "run", run)
    return turns


def test_each_turn_answers_the_conversation_as_trtllm_run_does(tiny_engine, run_cli, monkeypatch):
    engine = tiny_engine("llama")
    turns = recorded(monkeypatch)
    result = CliRunner().invoke(chat.main, ["--engine", str(engine), *SETTINGS],
                                input="Hello there\n\nThe quick brown fox\n/exit\nnot read\n")
    assert result.exit_code == 0, result.output
    assert len(turns) == 2  # (an empty line is no turn, and nothing after /exit is read)
    first, second = turns[0][1]["output_text"], turns[1][1]["output_text"]
    assert first in result.stdout and second in result.stdout
    conversation = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": first},
                    {"role": "user", "content": "The quick brown fox"}]
    _, out = run_cli(engine, {"temperature": 0, "max_generate_length": 6, "requests": [{"messages": conversation}]})
    assert out["responses"][0]["output_ids"] == turns[1][1]["output_ids"]
    # the second turn restored the first's KV (its prompt and answer) instead of computing it again
    assert turns[1][2] - turns[0][2] >= len(turns[0][1]["output_ids"])


def test_reset_starts_over_and_a_system_prompt_leads_every_turn(tiny_engine, monkeypatch):
    turns = recorded(monkeypatch)
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), "--system", "Be brief.", *SETTINGS],
                                input="Hello there\n/reset\nParis\n")
    assert result.exit_code == 0, result.output
    assert [[m.role for m in messages] for messages, *_ in turns] == [["system", "user"], ["system", "user"]]


def test_a_stopped_answer_stays_in_the_conversation(tiny_engine, monkeypatch):
    """A Ctrl-C while it generates ends that answer (Runner.run: "cancelled", its text so far), and
    the chat goes on."""
    from trtllm.runtime import runner as runner_module

    turns = recorded(monkeypatch)
    real, calls = runner_module.run_rows, []

    def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "run_rows", interrupted_once)
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), *SETTINGS],
                                input="Hello there\nParis\n")
    assert result.exit_code == 0, result.output
    assert "(stopped)" in result.output
    assert turns[0][1]["finish_reason"] == "cancelled" and turns[1][1]["finish_reason"] != "cancelled"
    assert [m.role for m in turns[1][0]] == ["user", "assistant", "user"]


@pytest.mark.parametrize("setting, field", [("temperature=-1", "temperature"), ("top_k=\"x\"", "top_k"),
                                            ("requests=[]", "requests"), ("temperature", "NAME=VALUE")])
def test_a_bad_setting_is_refused_before_the_first_turn(tiny_engine, setting, field):
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), "--set", setting], input="Hi\n")
    assert result.exit_code == 2 and field in result.output, result.output


def test_a_request_s_own_settings_go_in_the_request_and_n_is_refused(tiny_engine, monkeypatch):
    turns = recorded(monkeypatch)
    engine = str(tiny_engine("llama"))
    result = CliRunner().invoke(chat.main, ["--engine", engine, *SETTINGS, "--set", 'stop=["zz"]'], input="Hi\n")
    assert result.exit_code == 0, result.output
    assert turns[0][0][-1].content == "Hi" and turns[0][1]["finish_reason"] != "error"
    assert "zz" in turns[0][3].stop
    refused = CliRunner().invoke(chat.main, ["--engine", engine, "--set", "n=2"], input="Hi\n")
    assert refused.exit_code == 2 and "--set n" in refused.output


def test_a_long_chat_leaves_out_its_oldest_turns(tiny_engine, monkeypatch):
    """A request holds at most MAX_MESSAGES messages (64): past that the oldest pairs of turns go."""
    monkeypatch.setattr(chat, "MAX_MESSAGES", 6)
    turns = recorded(monkeypatch)
    lines = "".join(f"turn {i}\n" for i in range(6))
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), *SETTINGS], input=lines)
    assert result.exit_code == 0, result.output
    assert len(turns) == 6 and "oldest turns are left out" in result.output
    for messages, answer, *_ in turns:
        assert len(messages) <= 6 and messages[0].role == "user" and answer["finish_reason"] != "error"
    assert turns[-1][0][-1].content == "turn 5" and turns[-1][0][0].content == "turn 3"


def test_sigterm_while_answering_ends_the_chat(tiny_engine, monkeypatch):
    """SIGTERM (timeout, docker stop) or SIGHUP (a closed terminal) ends the chat, exit 130, after
    the answer it stopped; a Ctrl-C would end that answer alone."""
    import os
    import signal

    from trtllm.runtime import runner as runner_module

    turns = recorded(monkeypatch)
    real = runner_module.run_rows

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(runner_module, "run_rows", terminated)
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), *SETTINGS], input="Hi\nParis\n")
    assert result.exit_code == 130, result.output
    assert len(turns) == 1 and turns[0][1]["finish_reason"] == "cancelled"


def test_a_stdout_that_fails_ends_the_chat(tiny_engine, monkeypatch):
    """A reader that went away (`| head -c 5`) ends the chat with 141, as trtllm-run; the answer
    stops at once instead of being generated to its end."""
    from trtllm.runtime import stdout

    turns = recorded(monkeypatch)

    def gone(text):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(stdout, "write", gone)
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), *SETTINGS], input="Hi\nParis\n")
    assert result.exit_code == 141, result.output
    assert len(turns) == 1 and turns[0][1]["finish_reason"] == "cancelled"
    monkeypatch.undo()  # a later chat in this process writes again
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), *SETTINGS], input="Hi\n")
    assert result.exit_code == 0 and result.stdout.strip(), result.output


def test_image_on_a_text_engine_says_so_and_the_chat_goes_on(tiny_engine, monkeypatch):
    turns = recorded(monkeypatch)
    result = CliRunner().invoke(chat.main, ["--engine", str(tiny_engine("llama")), *SETTINGS],
                                input="/image cat.png\nHello there\n")
    assert result.exit_code == 0, result.output
    assert "error: /image needs a vision-language engine" in result.output
    assert [m.content for m in turns[0][0]] == ["Hello there"]  # (the turn went without it)
