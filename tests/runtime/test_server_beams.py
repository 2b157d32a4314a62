"""trtllm-serve with num_beams (runtime/serving.py: a beam request's searches run whole between the
running rows' steps): its choices are trtllm-run's best beams, a request running beside it answers as
it would alone, and what beam search does not take is refused naming the field."""
from __future__ import annotations

import threading

import pytest

from tests.runtime.test_server import chat, post, serve  # noqa: F401 - serve: the fixture

pytestmark = pytest.mark.hf
QUESTION = "What is the capital of France?"


def test_beam_choices_are_trtllm_runs_beams_beside_a_running_request(serve, run_cli, tiny_engine):  # noqa: F811
    port, _ = serve()
    plain = chat("The quick brown fox", temperature=0, max_tokens=30, ignore_eos=True)
    beside = {}
    running = threading.Thread(target=lambda: beside.update(out=post(port, plain)))
    running.start()
    status, out = post(port, chat(QUESTION, temperature=0, max_tokens=10, ignore_eos=True, num_beams=3, n=3,
                                  length_penalty=0.5))
    running.join()
    assert status == 200, out
    _, want = run_cli(tiny_engine("llama"), {"temperature": 0, "max_generate_length": 10, "ignore_eos": True,
                                             "requests": [{"messages": [{"role": "user", "content": QUESTION}],
                                                           "num_beams": 3, "n": 3, "length_penalty": 0.5}]})
    assert [c["message"]["content"] for c in out["choices"]] == [r["output_text"] for r in want["responses"]]
    assert len({c["message"]["content"] for c in out["choices"]}) == 3  # (three beams, not one answer thrice)
    _, alone = run_cli(tiny_engine("llama"), {"temperature": 0, "max_generate_length": 30, "ignore_eos": True,
                                              "requests": [{"messages": [{"role": "user",
                                                                          "content": "The quick brown fox"}]}]})
    assert beside["out"][0] == 200 and beside["out"][1]["choices"][0]["message"]["content"] == \
        alone["responses"][0]["output_text"]


def test_a_streamed_beam_request_streams_each_beam(serve):  # noqa: F811
    port, _ = serve()
    status, events = post(port, chat(QUESTION, temperature=0, max_tokens=8, ignore_eos=True, num_beams=2, n=2,
                                     stream=True))
    assert status == 200 and events[-1] == "[DONE]"
    texts = {i: "".join(c["delta"].get("content", "") for e in events[:-1] for c in e["choices"] if c["index"] == i)
             for i in (0, 1)}
    _, whole = post(port, chat(QUESTION, temperature=0, max_tokens=8, ignore_eos=True, num_beams=2, n=2))
    assert [texts[0], texts[1]] == [c["message"]["content"] for c in whole["choices"]]


def test_what_beam_search_does_not_take_is_refused_by_name(serve):  # noqa: F811
    port, _ = serve()
    status, out = post(port, chat(QUESTION, num_beams=2))  # (OpenAI's default temperature is 1)
    assert status == 400 and "temperature" in out["error"]["message"] and "beam search does not sample" in \
        out["error"]["message"], out
