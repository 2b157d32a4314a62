"""Chat templates with tools: a request's `tools`, the assistant's tool_calls and the tool results
rendered as transformers' apply_chat_template renders them (the rest: test_chat_template.py)."""
from __future__ import annotations

import json

import pytest

from trtllm.runtime.chat_template import ChatTemplate

from tests.runtime.test_chat_template import SMOLLM2, SYS, _hf_tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf


# Qwen2.5's tool use, written from its structure: tools in the system turn, an assistant's
# tool_calls as <tool_call> JSON, tool results grouped into one user turn
QWEN_TOOLS = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}
{{- "\\n\\n# Tools\\n\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- for message in messages %}
{%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}
{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
{%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Today's weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
TOOL_CHAT = [{"role": "system", "content": SYS}, {"role": "user", "content": "Weather in Paris and Oslo?"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
             {"role": "tool", "content": "18 C, sunny", "tool_call_id": "1", "name": "get_weather"},
             {"role": "tool", "content": "4 C, rain", "tool_call_id": "2", "name": "get_weather"},
             {"role": "user", "content": "Which is warmer?"}]


def test_string_arguments_render_as_their_object(tmp_path):
    """A request that gives tool calls' arguments as OpenAI does, strings of JSON, is rendered as
    transformers renders the objects they hold (vLLM's reading): Qwen2.5's `tojson` would quote the
    string. The wrong variant, the strings passed as given, differs."""
    from trtllm.runtime.input_format import parse_input

    hf = _hf_tokenizer(QWEN_TOOLS, None, "<|im_end|>", tmp_path)
    ours = ChatTemplate.from_engine_dir(tmp_path)
    openai = [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                                   for c in m["tool_calls"]]} if "tool_calls" in m else m for m in TOOL_CHAT]
    read = parse_input({"requests": [{"messages": openai}]}).requests[0].messages
    messages = [{"role": m.role, "content": m.text(), **m.fields()} for m in read]
    expected = hf.apply_chat_template(TOOL_CHAT, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ours.format(messages, True, tools=TOOLS).text == expected and '"arguments": {"city": "Paris"}' in expected
    assert hf.apply_chat_template(openai, tools=TOOLS, tokenize=False, add_generation_prompt=True) != expected


@pytest.mark.parametrize("tools", [TOOLS, None])
@pytest.mark.parametrize("messages", [TOOL_CHAT, TOOL_CHAT[1:], [{"role": "user", "content": "Hi"}]])
def test_tools_and_tool_turns_render_as_transformers(tmp_path, tools, messages):
    """`tools` reach the template as transformers' apply_chat_template(tools=...) passes them, with
    the assistant's tool_calls and the tool results; the system prefix (the saved-KV key) holds the
    tools where the template puts them. The wrong variant, tools left out, differs."""
    hf = _hf_tokenizer(QWEN_TOOLS, None, "<|im_end|>", tmp_path)
    ours = ChatTemplate.from_engine_dir(tmp_path)
    assert ours.reads("tools") and not ChatTemplate(SMOLLM2, {}).reads("tools")
    expected = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    formatted = ours.format(messages, True, **({"tools": tools} if tools else {}))
    assert formatted.text == expected and expected.startswith(formatted.system_prefix)
    assert ("get_weather" in formatted.system_prefix) == (tools is not None)
    if tools:
        assert ours.format(messages, True).text != expected
