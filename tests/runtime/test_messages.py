"""Tests for a request's messages (runtime/messages.py): text and media, the echo form, and the
fields tool use adds, each checked by JSON path. Fast, no model."""

import copy

import pytest

from tests.runtime.input_samples import FULL
from trtllm.runtime.input_format import ContentItem, InputError, Message, Request, parse_input


def test_message_text_and_media_types():
    inp = parse_input(copy.deepcopy(FULL))
    assert inp.requests[0].messages[1].text() == "Hi"
    assert inp.requests[1].messages[0].text() == "Describe this."
    assert inp.requests[0].media_types() == set()
    assert inp.requests[1].media_types() == {"image"}
    media = (ContentItem("audio", "a.wav"), ContentItem("video", "v.mp4"))
    req = Request((Message("user", media),), None, False, False, (), {}, 0)
    assert req.media_types() == {"audio", "video"}


def test_to_json_echoes_content_as_an_array():
    inp = parse_input(copy.deepcopy(FULL))
    assert inp.requests[0].messages[1].to_json() == {
        "role": "user", "content": [{"type": "text", "text": "Hi"}]}
    assert inp.requests[1].messages[0].to_json() == {"role": "user", "content": [
        {"type": "text", "text": "Describe "},
        {"type": "image", "image": "cat.png", "do_resize": True},
        {"type": "text", "text": "this."},
    ]}
    # the echo form is itself valid input content
    echo = {"requests": [{"messages": [m.to_json() for m in inp.requests[1].messages]}]}
    assert parse_input(echo).requests[0].messages == inp.requests[1].messages


CALL = {"type": "function", "function": {"name": "w", "arguments": {"city": "Paris"}}}


@pytest.mark.parametrize("message, path, says", [
    ({"role": "user", "content": "x", "tool_calls": [CALL]}, "requests[0].messages[0].tool_calls",
     "absent from a message of role 'user'"),
    ({"role": "assistant", "content": "x", "tool_call_id": "1"}, "requests[0].messages[0].tool_call_id",
     "absent from a message of role 'assistant'"),
    ({"role": "assistant", "content": None}, "requests[0].messages[0].content", "a string or an array"),
    ({"role": "assistant"}, "requests[0].messages[0].content", "must be given"),
    ({"role": "assistant", "content": "", "tool_calls": [5]}, "requests[0].messages[0].tool_calls[0]", "a tool call"),
    ({"role": "assistant", "content": "", "tool_calls": [{"a": float("nan")}]},
     "requests[0].messages[0].tool_calls[0].a", "finite"),
    ({"role": "tool", "content": "18", "tool_call_id": ""}, "requests[0].messages[0].tool_call_id", "non-empty"),
    ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": "{'city': 1}"}}]},
     "requests[0].messages[0].tool_calls[0].function.arguments", "a string of JSON (OpenAI's shape), got invalid JSON"),
    ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": '{"a": NaN}'}}]},
     "requests[0].messages[0].tool_calls[0].function.arguments", "NaN is not JSON"),
    ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": '{"a": 1e400}'}}]},
     "requests[0].messages[0].tool_calls[0].function.arguments.a", "finite"),
    ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": '{"a": "\\ud800"}'}}]},
     "requests[0].messages[0].tool_calls[0].function.arguments.a", "lone surrogate"),
    ({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": '{"a": 1, "a": 2}'}}]},
     "requests[0].messages[0].tool_calls[0].function.arguments.a", "once"),
    ({"role": "assistant", "content": "", "tool_calls": [{"a": "x" * 140_000}]}, "requests[0].messages[0].tool_calls",
     "at most 131072 UTF-8 bytes"),
    ({"role": "user", "content": "x", "name": "n" * 257}, "requests[0].messages[0].name", "at most 256 UTF-8 bytes"),
    ({"role": "tool", "content": "18", "tool_call_id": "i" * 300}, "requests[0].messages[0].tool_call_id",
     "at most 256 UTF-8 bytes"),
])
def test_tool_fields_of_a_message_are_checked_by_path(message, path, says):
    with pytest.raises(InputError) as e:
        parse_input({"requests": [{"messages": [message]}]})
    assert e.value.json_path == path and says in str(e.value), str(e.value)


def test_tool_use_reads_as_openai_writes_it():
    """An assistant turn of tool calls alone (content null), tool results, and tools at the top level
    (the default) or per request (replacing it, [] none); each message keeps its fields in order."""
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    chat = [{"role": "user", "content": "W?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "content": "18 C", "tool_call_id": "1", "name": "w"},
            {"role": "assistant", "content": "Mild.", "reasoning_content": "18 is mild"}]
    first, second = parse_input({"tools": tools, "requests": [{"messages": chat}, {"messages": [], "tools": []}]}).requests
    assert first.tools == tuple(tools) and second.tools == ()
    assert [m.fields() for m in first.messages] == [{}, {"tool_calls": [CALL]}, {"tool_call_id": "1", "name": "w"},
                                                     {"reasoning_content": "18 is mild"}]
    assert first.messages[1].content == "" and first.messages[2].to_json()["tool_call_id"] == "1"
    for bad, path in (([5], "tools[0]"), ({"a": 1}, "tools"), ([{"x": "\ud800"}], "tools[0].x")):
        with pytest.raises(InputError) as e:
            parse_input({"tools": bad, "requests": [{"messages": []}]})
        assert e.value.json_path == path, str(e.value)


def test_tool_call_arguments_reach_the_template_as_vllm_hands_them():
    """OpenAI writes arguments as a string of JSON; templates write them with tojson, which would
    quote a string. As vLLM does, the template gets the value the string holds, and {} for none;
    the message keeps what was given (its echo in the output)."""
    calls = [{"type": "function", "function": {"name": "w", "arguments": '{"city": "Paris", "n": [1, 2]}'}},
             {"type": "function", "function": {"name": "w", "arguments": ""}}, {"type": "function", "function": {"name": "w"}},
             {"type": "function", "function": {"name": "w", "arguments": {"city": "Oslo"}}}, {"id": "x"}]
    message = parse_input({"requests": [{"messages": [{"role": "assistant", "content": None, "tool_calls": calls}]}]}
                          ).requests[0].messages[0]
    assert [c.get("function", {}).get("arguments") for c in message.fields()["tool_calls"]] == [
        {"city": "Paris", "n": [1, 2]}, {}, {}, {"city": "Oslo"}, None]
    assert message.fields()["tool_calls"][4] == {"id": "x"} and message.to_json()["tool_calls"] == calls


def test_every_bad_part_of_the_messages_is_reported_at_once():
    """As for a request's fields: each bad message, each bad part of one (its role, a tool field, its
    content, each content item) and each bad tool, in one error named by the first path."""
    with pytest.raises(InputError) as e:
        parse_input({"requests": [{"messages": [
            {"role": "bot", "content": 3, "tool_call_id": ""},
            {"content": [{"type": "text"}, {"type": "image"}]},
            {"role": "user", "content": "fine"}]}]})
    assert e.value.json_path == "requests[0].messages[0].role"
    assert str(e.value).split("; ") == [
        "`requests[0].messages[0].role` must be one of 'system', 'user', 'assistant', 'tool', got 'bot'",
        "`requests[0].messages[0].tool_call_id` must be a non-empty string, got ''",
        "`requests[0].messages[0].content` must be a string or an array of at most 18 content items, got 3",
        "`requests[0].messages[1].role` must be given (a message needs it), got nothing",
        "`requests[0].messages[1].content[0].text` must be given (an item of type 'text' needs it), got nothing",
        "`requests[0].messages[1].content[1].image` must be given (an item of type 'image' needs it), got nothing"]
    with pytest.raises(InputError) as e:
        parse_input({"tools": [5, {"a": float("nan")}, {}], "requests": [{"messages": []}]})
    assert [part.split("`")[1] for part in str(e.value).split("; ")] == ["tools[0]", "tools[1].a"]


def test_a_video_is_a_file_or_edge_llms_frames():
    """Edge-LLM (after 0.10) gives a video as its frames and a frame rate; either form reads (and is
    echoed as given), one of them."""
    def item(**fields):
        return parse_input({"requests": [{"messages": [{"role": "user", "content": [{"type": "video", **fields}]}]}]})

    got = item(frames=["a.jpg", "b.jpg"], fps=2, do_resize=False).requests[0]
    assert got.messages[0].to_json()["content"] == [{"type": "video", "frames": ["a.jpg", "b.jpg"], "fps": 2.0,
                                                     "do_resize": False}]
    assert got.media_types() == {"video"}
    for fields, path in (({}, "video"), ({"video": "v.mp4", "frames": ["a"]}, "video"), ({"frames": []}, "frames"),
                         ({"video": "v.mp4", "fps": 1}, "fps"), ({"frames": ["a"], "fps": 0}, "fps"),
                         ({"frames": ["a", 3]}, "frames[1]")):
        with pytest.raises(InputError) as e:
            item(**fields)
        assert e.value.json_path == f"requests[0].messages[0].content[0].{path}", fields


def test_every_text_a_request_carries_is_bounded():
    """The default system prompt (every request's system message) is one text, 128 KiB at most,
    refused at the top level; reasoning_content counts toward a request's 1 MiB like its content."""
    with pytest.raises(InputError) as e:
        parse_input({"default_system_prompt": "x" * 140_000, "requests": [{"messages": []}]})
    assert e.value.json_path == "default_system_prompt" and "at most 131072 UTF-8 bytes" in str(e.value)
    turns = [{"role": "assistant", "content": "ok", "reasoning_content": "r" * 130_000}] * 9
    with pytest.raises(InputError) as e:
        parse_input({"requests": [{"messages": turns}]})
    assert e.value.json_path == "requests[0].messages" and "content and reasoning_content" in str(e.value)
    parse_input({"requests": [{"messages": turns[:8]}]})  # (8 x 130,002 bytes: under 1 MiB)
