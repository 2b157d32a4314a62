"""How Runner.prepare turns a request into prompt ids when no chat template is applied."""
from __future__ import annotations

import json
import types

from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models, pre_tokenizers, processors

from trtllm.runtime.input_format import parse_input
from trtllm.runtime.runner import Runner
from trtllm.runtime.tokenizer import Tokenizer

ENGINE = types.SimpleNamespace(manifest=types.SimpleNamespace(limits=types.SimpleNamespace(max_input_len=64), vision={}))


def bos_tokenizer(tmp_path) -> Tokenizer:
    """A base model's tokenizer: its post-processor puts <s> first, as Llama's does."""
    backend = BackendTokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "hello": 2, "world": 3, "SYS": 4},
                                                unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<s>"])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "unk_token": "<unk>"}))
    return Tokenizer.from_engine_dir(tmp_path)


def prompt_ids(runner, **top):
    inp = parse_input({**top, "requests": [{"messages": [{"role": "user", "content": "hello world"}]}]})
    p = runner.prepare(0, inp.requests[0], inp, None)
    assert p.error is None
    return p.prompt_ids


def test_without_a_template_the_text_gets_the_tokenizers_special_tokens(tmp_path):
    # an engine without a chat template (a base model): apply_chat_template then changes nothing,
    # and the prompt starts with BOS, as transformers' tokenizer("hello world") does
    runner = Runner(ENGINE, bos_tokenizer(tmp_path), None)
    assert prompt_ids(runner) == prompt_ids(runner, apply_chat_template=False) == [1, 2, 3]
    transformers = __import__("pytest").importorskip("transformers")
    assert transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))("hello world")[
        "input_ids"] == [1, 2, 3]


def test_default_system_prompt_without_a_template(tmp_path):
    runner = Runner(ENGINE, bos_tokenizer(tmp_path), None)
    assert prompt_ids(runner, default_system_prompt="SYS") == [1, 4, 2, 3]
    inp = parse_input({"default_system_prompt": "SYS", "requests": [
        {"messages": [{"role": "system", "content": "world"}, {"role": "user", "content": "hello"}]}]})
    assert runner.prepare(0, inp.requests[0], inp, None).prompt_ids == [1, 3, 2]  # a system message of its own wins


def rendered(runner, request: dict) -> str:
    inp = parse_input({"requests": [request]})
    p = runner.prepare(0, inp.requests[0], inp, None)
    assert p.error is None
    return runner.tokenizer.decode(p.prompt_ids)


def test_text_parts_reach_a_template_that_reads_no_list(tmp_path):
    """Content as an array of text parts: a template that only tests the content's type (Qwen3's
    `content if content is string else ''`, Llama 3.1's `| trim` of every turn) gets the text
    joined, as vLLM gives it; one that loops over the parts (Gemma 3's, SmolVLM's) gets the list.
    The wrong variant (a type test taken as reading a list, as a review found) lost the question,
    or printed the list's Python text."""
    from trtllm.runtime.chat_template import ChatTemplate

    runner = Runner(ENGINE, bos_tokenizer(tmp_path), None)
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"},
                                                        {"type": "text", "text": " world"}]}]}
    qwen3 = "{% for m in messages %}{% set c = m.content if m.content is string else '' %}SYS {{ c }}{% endfor %}"
    llama = "{% for m in messages %}{% if m.content is iterable and m.role == 'tool' %}{% endif %}{{ m.content | trim }}{% endfor %}"
    loop = "{% for m in messages %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endfor %}"
    for source in (qwen3, llama, loop):
        runner.template = ChatTemplate(source, {})
        assert runner.template.takes_parts == (source is loop)
        assert rendered(runner, parts).endswith("hello world"), source


def test_a_requests_empty_tools_are_none(tmp_path):
    """`"tools": []` in a request (the docs: none) renders as no tools: a template that tests
    `tools is not none` (Llama 3.1's) would otherwise ask for a call with no function to call."""
    from trtllm.runtime.chat_template import ChatTemplate

    runner = Runner(ENGINE, bos_tokenizer(tmp_path), None)
    runner.template = ChatTemplate("{% if tools is not none %}SYS {% endif %}{% for m in messages %}{{ m.content }}"
                                   "{% endfor %}", {})
    ask = {"messages": [{"role": "user", "content": "hello"}]}
    assert rendered(runner, {**ask, "tools": []}) == rendered(runner, ask) == "hello"
