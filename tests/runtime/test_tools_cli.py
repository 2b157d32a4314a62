"""Tool use through trtllm-run on a tiny engine: `tools`, an assistant's tool_calls and tool results
reach the chat template as transformers passes them, are echoed back, and a request whose tools
the template would never show fails alone, saying so."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from tests.runtime.test_chat_template_tools import QWEN_TOOLS
from tests.runtime.tool_deltas import assemble
from trtllm.runtime import request_checks, tool_calls

pytest.importorskip("torch")  # the tiny engine is built with the builder
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf
# short: the tiny engine's prompts are at most 256 of its (mostly one-character) tokens
TOOLS = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
TOOL_CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "W?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "w", "arguments": {"c": "P"}}}]},
             {"role": "tool", "content": "18 C", "tool_call_id": "1", "name": "w"},
             {"role": "user", "content": "ok?"}]


def test_tools_reach_the_template_and_fail_alone_where_it_ignores_them(run_cli, tmp_path, tiny_engine):
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    payload = {"temperature": 0, "max_generate_length": 4, "tools": TOOLS,
               "requests": [{"messages": TOOL_CHAT}, {"messages": TOOL_CHAT[1:2], "tools": []},
                            {"messages": TOOL_CHAT[1:2], "tools": TOOLS}]}
    result, out = run_cli(engine, payload)  # the tiny engine's template (SmolLM2's) never reads tools
    assert result.exit_code == 1
    assert out["responses"][0]["error"] == "`tools`: the engine's chat template does not show tools to the model"
    assert "error" not in out["responses"][1]  # its own tools, none, replace the file's
    assert out["responses"][2]["error"].startswith("`requests[2].tools`: the engine's chat template")
    result, out = run_cli(engine, {**payload, "apply_chat_template": False})
    assert out["responses"][0]["error"].startswith("`tools` needs the chat template")
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "requests": [
        {"messages": TOOL_CHAT}, {"messages": [m for m in TOOL_CHAT if "tool_calls" not in m]}]})
    assert out["responses"][0]["error"] == ("`requests[0].messages[2].tool_calls`: the engine's chat template does "
                                            "not show tool calls to the model")
    assert "error" not in out["responses"][1]  # a tool result alone: the template renders its role as any other

    (engine / "chat_template.jinja").write_text(QWEN_TOOLS)
    result, out = run_cli(engine, payload)
    assert result.exit_code == 0, result.output
    hf = transformers.AutoTokenizer.from_pretrained(engine)
    hf.chat_template = QWEN_TOOLS
    first, second, third = out["responses"]
    assert first["formatted_complete_request"] == hf.apply_chat_template(TOOL_CHAT, tools=TOOLS, tokenize=False,
                                                                         add_generation_prompt=True)
    assert "<tools>" not in second["formatted_complete_request"] and "<tools>" in third["formatted_complete_request"]
    echoed = first["messages"]  # each message as given, its content as typed items
    assert echoed[2]["tool_calls"] == TOOL_CHAT[2]["tool_calls"] and echoed[3]["tool_call_id"] == "1"
    assert json.dumps(echoed[3]["content"]) == json.dumps([{"type": "text", "text": "18 C"}])


# a template that reads the tools without spelling them out: the tiny engine takes 256 prompt tokens
SHORT = "{% for m in messages %}{{ m.content }}{% endfor %}{{ tools | length }}"
WEATHER = [{"type": "function", "function": {"name": "wx", "parameters": {
    "type": "object", "properties": {"c": {"enum": ["P", "R"]}}, "required": ["c"],
    "additionalProperties": False}}},
    {"type": "function", "function": {"name": "t"}}]
CALL = '<tool_call>\n{"name": "wx", "arguments": {"c": "R"}}\n</tool_call>'
UNIQUE = {"type": "function", "function": {"name": "u", "parameters": {
    "type": "object", "properties": {"l": {"type": "array", "uniqueItems": True}}}}}  # (llguidance has no uniqueItems)


def _calls(response: dict) -> list[tuple[str, object]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in response["tool_calls"]]


def test_tool_choice_forces_calls_and_a_parser_reads_them(run_cli, tmp_path, tiny_engine):
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (engine / "chat_template.jinja").write_text(SHORT)
    ask = [{"role": "user", "content": "W?"}]
    forced = {"type": "function", "function": {"name": "wx"}}
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 96, "tools": WEATHER, "requests": [
        {"messages": ask, "tool_choice": forced},
        {"messages": ask, "tool_choice": "required"},
        {"messages": ask, "tool_choice": forced},
        # the random model would not write a call by itself: a grammar makes it write one
        {"messages": ask, "tool_call_parser": "hermes", "guided_decoding": {"regex": "Hi\\." + re.escape(CALL)}},
        {"messages": ask, "tool_call_parser": "hermes", "tool_choice": "none",
         "guided_decoding": {"regex": re.escape(CALL)}},
        {"messages": ask, "tool_call_parser": "hermes", "guided_decoding": {"regex": "<tool_call>\\{x"}}]})
    assert result.exit_code == 0, result.output
    named, required, again, parsed, none, broken = out["responses"]
    assert again["output_text"] == named["output_text"]  # the same answer, another request: another id
    assert again["tool_calls"][0]["id"] != named["tool_calls"][0]["id"]
    assert _calls(named)[0][0] == "wx" and _calls(named)[0][1] in ({"c": "P"}, {"c": "R"})
    assert named["content"] is None and json.loads(named["output_text"]) == _calls(named)[0][1]
    assert required["tool_calls"] and all(name in ("wx", "t") for name, _ in _calls(required))
    assert [{"name": n, "parameters": a} for n, a in _calls(required)] == json.loads(required["output_text"])
    assert parsed["output_text"] == "Hi." + CALL and parsed["content"] == "Hi."
    assert _calls(parsed) == [("wx", {"c": "R"})]
    assert parsed["tool_calls"][0]["id"].startswith("call_") and parsed["tool_calls"][0]["type"] == "function"
    for free in (none, broken):  # "none" reads no calls; a malformed one leaves the answer as text
        assert "tool_calls" not in free and "content" not in free and free["finish_reason"] == "end-of-sequence"
    thought = "<think>hm</think>" + "Hi." + CALL  # a thinking model's answer: reasoning, then the rest is read
    _, out3 = run_cli(engine, {"temperature": 0, "max_generate_length": 96, "tools": WEATHER, "requests": [
        {"messages": ask, "guided_decoding": {"regex": re.escape(thought)}}]}, "--reasoning-parser", "qwen3",
        "--tool-call-parser", "hermes")
    read = out3["responses"][0]
    assert read["output_text"] == thought and read["reasoning_content"] == "hm" and read["content"] == "Hi."
    assert _calls(read) == [("wx", {"c": "R"})]
    # streamed: each line's text split into reasoning and content as it comes; a request whose
    # answer is read for tool calls gets the content before the call, and the call as it ends
    # (`new_tool_calls`, with its index), the same as the last line's
    streamed, _ = run_cli(engine, {"temperature": 0, "max_generate_length": 96, "tools": WEATHER, "requests": [
        {"messages": ask, "guided_decoding": {"regex": re.escape(thought)}},
        {"messages": ask, "guided_decoding": {"regex": re.escape(thought)}, "tool_choice": "none"}]},
        "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--stream")
    lines = [json.loads(line) for line in streamed.output.splitlines() if line.startswith("{")]
    for idx, content in ((0, "Hi."), (1, "Hi." + CALL)):
        own = [line for line in lines if line["request_idx"] == idx]
        assert "".join(line.get("reasoning_text", "") for line in own) == "hm" and len(own) > 3, own
        assert "".join(line.get("content_text", "") for line in own) == content
        assert own[-1]["reasoning_content"] == "hm"
        given = [call for line in own for call in line.get("new_tool_calls", [])]
        assert given == ([] if idx else [{"index": 0, **call} for call in read["tool_calls"]])
        assert own[-1].get("tool_calls") == (None if idx else read["tool_calls"])
        # and piece by piece: the call opens with its name before it ends, its pieces make its arguments
        pieces, opened = assemble([line.get("tool_call_deltas", []) for line in own])
        assert pieces == ([] if idx else read["tool_calls"])
        ended = next((n for n, line in enumerate(own) if "new_tool_calls" in line), None)
        assert idx or opened[0] < ended
    _, out2 = run_cli(engine, {"temperature": 0, "max_generate_length": 96, "tools": WEATHER, "requests": [
        {}, {}, {}, {"messages": ask, "tool_call_parser": "pythonic",
                     "guided_decoding": {"regex": "Hi\\." + re.escape(CALL)}}]},
        "--tool-call-parser", "hermes")  # vLLM's option, over the file's
    assert out2["responses"][3]["tool_calls"] == parsed["tool_calls"]  # the ids are the same on every run
    streamed, _ = run_cli(engine, {"temperature": 0, "max_generate_length": 96, "tools": WEATHER, "requests": [
        {"messages": ask, "tool_choice": forced}, {"messages": ask}]}, "--stream")
    lines = [json.loads(line) for line in streamed.output.splitlines() if line.startswith("{")]
    last = [line for line in lines if line["request_idx"] == 0][-1]  # the calls come with the last line
    assert last["tool_calls"] == named["tool_calls"] and last["content"] is None
    assert not any("tool_calls" in line for line in lines if line is not last)
    given = [call for line in lines if line["request_idx"] == 0 for call in line.get("new_tool_calls", [])]
    assert given == [{"index": 0, **named["tool_calls"][0]}]  # (as it ends: a forced call is the answer)
    own = [line for line in lines if line["request_idx"] == 0]
    assert assemble([line.get("tool_call_deltas", []) for line in own]) == (named["tool_calls"], [0])  # (its name known: it opens on the first line)
    assert not any("content_text" in line for line in lines if line["request_idx"] == 0)


def test_tool_choice_errors_name_the_field_and_fail_alone(run_cli, tmp_path, tiny_engine, monkeypatch):
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (engine / "chat_template.jinja").write_text(SHORT)
    ask = [{"role": "user", "content": "W?"}]
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "tools": WEATHER, "requests": [
        {"messages": ask, "tool_choice": {"type": "function", "function": {"name": "wxx"}}},
        {"messages": ask, "tool_choice": "required", "guided_decoding": {"json_object": True}},
        {"messages": ask, "tool_choice": "auto"},
        {"messages": ask, "tool_choice": "required", "tools": []},
        {"messages": ask, "tool_choice": "required", "ignore_eos": True},
        {"messages": ask, "tool_call_parser": "hermes2"},
        {"messages": ask, "tool_choice": "auto", "tool_call_parser": "pythonic"},
        # a tool whose parameters do not compile is named, not the (sound) tool choice (a review's point)
        {"messages": ask, "tool_choice": {"type": "function", "function": {"name": "u"}}, "tools": [*WEATHER, UNIQUE]},
        {"messages": ask, "tool_choice": "required", "tools": [*WEATHER, UNIQUE]}]})
    assert result.exit_code == 1
    errors = [r.get("error") for r in out["responses"]]
    for i in (7, 8):
        assert errors[i].startswith(f"`requests[{i}].tools[2].function.parameters` does not compile: "), errors[i]
    assert errors[0] == ("`requests[0].tool_choice.function.name` must be the name of one of the request's tools "
                         "('wx', 't'), got 'wxx'; did you mean 'wx'?")
    assert errors[1].startswith('`requests[1].tool_choice` must be "auto" or "none" with '
                                "`requests[1].guided_decoding`")
    assert errors[2].startswith("`requests[2].tool_choice` must be given with `tool_call_parser`")
    assert errors[3].startswith('`requests[3].tool_choice` must be "auto" or "none" when the request has no `tools`')
    assert errors[4].startswith("`requests[4].ignore_eos` must be false with `requests[4].tool_choice`")
    assert errors[5].startswith("`requests[5].tool_call_parser` must be one of 'hermes', 'lfm2', 'llama3_json', "
                                "'mistral', 'pythonic'")
    assert errors[6] is None and "tool_calls" not in out["responses"][6]  # free text: no calls in it

    def broken(*args):  # a bug in reading one request fails that request alone, saying so
        raise ZeroDivisionError("boom")
    monkeypatch.setattr(tool_calls, "forced_guide", broken)
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "tools": WEATHER, "requests": [
        {"messages": ask}, {"messages": ask, "tool_choice": "required"}]})
    assert result.exit_code == 1 and "error" not in out["responses"][0]
    assert out["responses"][1]["error"].startswith("`requests[1]` could not be read (ZeroDivisionError: boom; a bug")
    monkeypatch.setattr(request_checks, "unread_kwargs", broken)  # and so does one in preparing it
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "requests": [{"messages": ask}]})
    assert result.exit_code == 1 and out["responses"][0]["error"].startswith(
        "`requests[0]` could not be prepared (ZeroDivisionError: boom; a bug")


KWARGS_TEMPLATE = ("{% for m in messages %}{{ m.content }}{% endfor %}{% if reasoning_effort %}[{{ reasoning_effort }}]"
                   "{% endif %}{% if enable_thinking %}<think>{% endif %}{% if opts %}{{ opts.n + 1 }}{% endif %}")


def test_chat_template_kwargs_reach_the_template_as_transformers_passes_them(run_cli, tmp_path, tiny_engine):
    """vLLM's chat_template_kwargs (top level, or a request's replacing it): the template renders as
    transformers' apply_chat_template(**kwargs) does, and they win over enable_thinking. A variable
    the template never reads, or one without a template, fails its request alone, naming it."""
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (engine / "chat_template.jinja").write_text(KWARGS_TEMPLATE)
    ask = [{"role": "user", "content": "Hi"}]
    result, out = run_cli(engine, {"max_generate_length": 2, "temperature": 0, "enable_thinking": False,
                                   "chat_template_kwargs": {"reasoning_effort": "high", "opts": {"n": 2}},
                                   "requests": [{"messages": ask},
                                                {"messages": ask, "chat_template_kwargs": {"enable_thinking": True}},
                                                {"messages": ask, "chat_template_kwargs": {"effort": 1}},
                                                {"messages": ask, "chat_template_kwargs": {"tools": []}}]})
    assert result.exit_code == 1, result.output
    first, second, unread, reserved = out["responses"]
    hf = transformers.AutoTokenizer.from_pretrained(engine)
    hf.chat_template = KWARGS_TEMPLATE
    assert first["formatted_complete_request"] == hf.apply_chat_template(
        ask, tokenize=False, add_generation_prompt=True, reasoning_effort="high", opts={"n": 2}) == "Hi[high]3"
    assert second["formatted_complete_request"] == "Hi<think>"  # its own replace the file's
    assert unread["error"] == "`requests[2].chat_template_kwargs.effort`: the engine's chat template does not read it"
    assert reserved["error"].startswith("`requests[3].chat_template_kwargs.tools` must be a variable other than")
    result, out = run_cli(engine, {"apply_chat_template": False, "chat_template_kwargs": {"opts": 1},
                                   "requests": [{"messages": ask}]})
    assert out["responses"][0]["error"].startswith("`chat_template_kwargs` needs the chat template")


def test_a_template_that_shows_tools_from_xml_tools_takes_the_requests_tools(run_cli, tmp_path, tiny_engine):
    """SmolLM3's template reads its tools from xml_tools (chat_template_kwargs), not tools: a request
    that gives them there may give `tools` too, for the parser to read its calls (as with vLLM);
    without xml_tools, its `tools` would not reach the model and are refused."""
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (engine / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}"
                                                "{% if xml_tools %}{{ xml_tools | length }}{% endif %}")
    ask = {"messages": [{"role": "user", "content": "W?"}], "tool_call_parser": "hermes",
           "guided_decoding": {"regex": re.escape(CALL)}}
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 96, "tools": WEATHER, "requests": [
        {**ask, "chat_template_kwargs": {"xml_tools": WEATHER}}, ask]})
    given, unshown = out["responses"]
    assert given["formatted_complete_request"] == "W?2" and _calls(given) == [("wx", {"c": "R"})]
    assert unshown["error"] == "`tools`: the engine's chat template does not show tools to the model"



def test_a_moved_thought_gives_no_tool_content_on_the_last_line(run_cli, tmp_path, tiny_engine):
    """Where the reasoning split moves text already given (a Qwen3 answer with thinking off writing
    `</think>` unopened), nothing more comes on any line, as the docs say: the text the tool-call
    stream held back (a possible `<tool_call>`) is reasoning now, not content (it came as
    content_text on the last line)."""
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    (engine / "chat_template.jinja").write_text(SHORT)
    answer = "ab<tool</think>x"
    streamed, out = run_cli(engine, {"temperature": 0, "max_generate_length": 32, "tools": WEATHER, "requests": [
        {"messages": [{"role": "user", "content": "W?"}], "guided_decoding": {"regex": re.escape(answer)}}]},
        "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--stream")
    lines = [json.loads(line) for line in streamed.output.splitlines() if line.startswith("{")]
    assert "".join(line["text"] for line in lines) == answer
    assert (lines[-1]["reasoning_content"], lines[-1]["content"]) == ("ab<tool", "x")
    assert "".join(line.get("content_text", "") for line in lines) == "ab"  # (given before `</think>` moved it)


def test_thinking_is_on_only_where_the_template_reads_enable_thinking(run_cli, tmp_path, tiny_engine):
    """A qwen3 answer without `</think>` is all reasoning where the request's template had thinking
    on; a top-level enable_thinking that the template never reads (the tiny model's ChatML, as
    SmolLM2's) turned nothing on: the answer is content (it was all reasoning)."""
    reads = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), reads)
    (reads / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}"
                                               "{% if enable_thinking %}<think>{% endif %}")
    ask = {"temperature": 0, "max_generate_length": 8, "enable_thinking": True, "reasoning_parser": "qwen3",
           "requests": [{"messages": [{"role": "user", "content": "W?"}], "guided_decoding": {"regex": "abc"}}]}
    opens = tmp_path / "opens"  # (Qwen3-Thinking-2507's: its prompt opens the thought, the switch unread)
    shutil.copytree(tiny_engine("llama"), opens)
    (opens / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}<think>\n")
    for engine, want in ((reads, ("abc", None)), (tiny_engine("llama"), (None, "abc")), (opens, ("abc", None))):
        result, out = run_cli(engine, ask)
        assert result.exit_code == 0, result.output
        response = out["responses"][0]
        assert (response["reasoning_content"], response["content"]) == want, response
