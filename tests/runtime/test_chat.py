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
    """Runner.run's answers, with the prefill's reused tokens after each turn."""
    turns = []
    real = Runner.run

    def run(self, inp, *args, **kwargs):
        out = real(self, inp, *args, **kwargs)
        turns.append((inp.requests[0].messages, out[0], self.timing.reused_tokens))
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
    assert [[m.role for m in messages] for messages, _, _ in turns] == [["system", "user"], ["system", "user"]]


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
