"""Tool use through trtllm-run on a tiny engine: `tools`, an assistant's tool_calls and tool results
reach the chat template as transformers passes them, are echoed back, and a request whose tools
the template would never show fails alone, saying so."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.runtime.test_chat_template import QWEN_TOOLS

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
