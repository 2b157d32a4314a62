"""trtllm-serve's translation of OpenAI's chat completions bodies into input documents, and of
input_format's errors back into the body's names (runtime/openai_api.py)."""
from __future__ import annotations

import pytest

from trtllm.runtime import input_format as fmt
from trtllm.runtime import openai_api as api

HI = [{"role": "user", "content": "Hi"}]


def translate(body: dict, defaults: dict | None = None, adapters=frozenset()) -> api.Translated:
    return api.translate({"messages": HI, **body}, "demo", adapters, defaults or {}, 4096)


def request(t: api.Translated) -> fmt.Request:
    return fmt.parse_input(t.document, ()).requests[0]


def test_openai_names_and_defaults():
    t = translate({"max_tokens": 9, "min_tokens": 2, "stop": "END", "top_k": -1, "logprobs": True,
                   "top_logprobs": 3, "user": "u1", "seed": 4})
    r = request(t)
    assert (r.max_generate_length, r.min_new_tokens, r.stop, r.top_k, r.num_logprobs, r.seed) == (9, 2, ("END",), 0, 3, 4)
    assert r.top_p == 1.0 and t.top_logprobs == 3 and not t.stream
    guided = request(translate({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}))
    assert guided.guided_decoding is not None
    plain = request(translate({}))  # OpenAI's defaults, not the input file's (top_p 0.8, top_k 50, 256 tokens)
    assert (plain.top_p, plain.top_k, plain.max_generate_length, plain.num_logprobs) == (1.0, 0, 4096, 0)


def test_logprobs_without_top_ones_still_give_each_tokens_own():
    t = translate({"logprobs": True})
    assert request(t).num_logprobs == 1 and t.top_logprobs == 0


def test_server_defaults_lose_to_the_body_and_win_over_openais():
    r = request(translate({"temperature": 0.5}, {"temperature": 0.1, "top_p": 0.9, "reasoning_parser": "qwen3"}))
    assert (r.temperature, r.top_p, r.reasoning_parser) == (0.5, 0.9, "qwen3")


def test_template_switches_go_to_the_top_level_and_adapters_are_models():
    t = translate({"add_generation_prompt": False, "continue_final_message": True,
                   "messages": HI + [{"role": "assistant", "content": "Hel"}], "model": "tuned"},
                  adapters=frozenset({"tuned"}))
    assert t.document["add_generation_prompt"] is False and t.document["requests"][0]["lora_name"] == "tuned"
    assert t.model == "tuned"


@pytest.mark.parametrize("body, param", [
    ({"max_tokens": 1, "max_generate_length": 2}, "max_tokens"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
    ({"requests": []}, "requests"),
    ({"model": "other"}, "model"),
])
def test_refusals_name_the_bodys_field(body, param):
    with pytest.raises(api.ApiError) as e:
        translate(body)
    assert e.value.param == param


def test_input_format_errors_come_back_in_the_bodys_names():
    t = translate({"max_completion_tokens": -1})
    with pytest.raises(fmt.InputError) as e:
        fmt.parse_input(t.document, ())
    error = t.error(e.value)
    assert error.param == "max_completion_tokens" and str(error).startswith("`max_completion_tokens` must be")
    assert "requests[0]" not in str(error)


def test_answers_in_openais_shape():
    t = translate({"logprobs": True, "top_logprobs": 1})
    entry = {"token_id": 5, "token": "Hi", "bytes": [72, 105], "logprob": -0.5}
    response = {"output_text": "<tool_call>...", "content": "", "finish_reason": "end-of-sequence",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                "prompt_tokens": 7, "output_tokens": 1, "logprobs": [[entry, entry]], "token_logprobs": [entry]}
    out = api.completion("id1", 0, t, [response], 3)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"] == response["tool_calls"]
    assert choice["logprobs"]["content"][0] == {"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                                                "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]}
    assert out["usage"] == {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8,
                            "prompt_tokens_details": {"cached_tokens": 3}}
    assert api.delta_choice(0, "", {}, t) is None  # (a held-back token: nothing to send)
    assert api.delta_choice(0, "x", {"reasoning_text": "hm"}, t)["delta"] == {"reasoning_content": "hm"}


def test_null_is_not_given_and_developer_is_system():
    r = request(translate({"max_tokens": None, "temperature": None, "n": None, "top_p": None,
                           "messages": [{"role": "developer", "content": "Be brief."}] + HI}))
    assert (r.max_generate_length, r.temperature, r.n, r.top_p) == (4096, 1.0, 1, 1.0)
    assert [m.role for m in r.messages] == ["system", "user"]


@pytest.mark.parametrize("text, param", [('{"messages": []}', "messages"),
                                         ('{"messages": [{"role": "user", "content": "Hi"}], "n": 1, "n": 2}', "n")])
def test_no_messages_and_keys_given_twice_are_refused(text, param):
    from trtllm.runtime.strict_json import decode

    with pytest.raises(api.ApiError) as e:
        api.translate(decode(text.encode(), "the body"), "demo", frozenset(), {}, 4096)
    assert e.value.param == param


def test_a_completions_body_is_its_prompt_without_the_template():
    t = api.translate({"prompt": ["Once upon"], "logprobs": 3, "stop": "."}, "demo", frozenset(), {}, 4096, text=True)
    assert t.document["apply_chat_template"] is False and t.top_logprobs == 3 and t.text
    r = request(t)
    assert r.messages[0].content == "Once upon" and (r.max_generate_length, r.num_logprobs, r.stop) == (16, 3, (".",))
    with pytest.raises(api.ApiError) as e:
        api.translate({"messages": HI}, "demo", frozenset(), {}, 4096, text=True)
    assert e.value.param == "messages"
    t = api.translate({"prompt": "Hi", "max_tokens": -1}, "demo", frozenset(), {}, 4096, text=True)
    with pytest.raises(fmt.InputError) as e:
        fmt.parse_input(t.document, ())
    assert t.error(e.value).param == "max_tokens"


def test_a_completion_leaves_out_the_servers_chat_settings_and_refuses_its_own():
    defaults = {"default_system_prompt": "SYS", "apply_chat_template": True, "reasoning_parser": "qwen3",
                "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.2}
    t = api.translate({"prompt": "Hi"}, "demo", frozenset(), defaults, 4096, text=True)
    r = request(t)
    assert t.document["apply_chat_template"] is False and "default_system_prompt" not in t.document
    assert (r.reasoning_parser, r.chat_template_kwargs, r.temperature) == (None, None, 0.2)
    with pytest.raises(api.ApiError) as e:
        api.translate({"prompt": "Hi", "apply_chat_template": True}, "demo", frozenset(), {}, 4096, text=True)
    assert e.value.param == "apply_chat_template"


def test_text_offsets_go_on_over_a_stream_and_count_whole_characters():
    t = api.translate({"prompt": "Hi", "logprobs": 0}, "demo", frozenset(), {}, 4096, text=True)
    e = lambda raw: {"token_id": 1, "token": raw.decode(errors="replace"), "bytes": list(raw), "logprob": -1.0}  # noqa: E731
    cat = "猫".encode()  # 3 bytes, split over two tokens below
    tokens = [e(b"a"), e(cat[:2]), e(cat[2:]), e(b"b")]
    whole = api.text_logprobs([[x] for x in tokens], tokens, 0)
    assert whole["text_offset"] == [0, 1, 1, 2]  # ("a", then the cat once whole, then "b")
    sent = bytearray()
    first = api.delta_choice(0, "a", {"token_logprobs": tokens[:2], "logprobs": [[x] for x in tokens[:2]]}, t, None, sent)
    second = api.delta_choice(0, "猫b", {"token_logprobs": tokens[2:], "logprobs": [[x] for x in tokens[2:]]}, t, None,
                              sent)
    assert first["logprobs"]["text_offset"] + second["logprobs"]["text_offset"] == whole["text_offset"]


def test_a_completion_of_token_ids_is_a_tokens_prompt():
    """OpenAI's prompt of token ids (or a list of one) is the request's prompt_token_ids; the errors about
    them name `prompt` and its items; messages or prompt_token_ids in the body are refused."""
    for prompt in ([5, 6, 7], [[5, 6, 7]]):
        r = request(api.translate({"prompt": prompt}, "demo", frozenset(), {}, 4096, text=True))
        assert r.prompt_token_ids == (5, 6, 7) and r.messages == ()
    t = api.translate({"prompt": [5, -1]}, "demo", frozenset(), {}, 4096, text=True)
    with pytest.raises(fmt.InputError) as e:
        fmt.parse_input(t.document, ())
    err = t.error(e.value)
    assert err.param == "prompt[1]" and str(err).startswith("`prompt[1]` must be an integer >= 0")
    for body, param in (({"prompt": [True]}, "prompt"), ({"prompt": [[]]}, "prompt"), ({"prompt": []}, "prompt"),
                        ({"prompt": ["a", [True]]}, "prompt[1]"), ({"prompt_token_ids": [1]}, "prompt_token_ids"),
                        ({"prompt": [[1]] * (api.MAX_PROMPTS + 1)}, "prompt")):
        with pytest.raises(api.ApiError) as e:
            api.translate(body, "demo", frozenset(), {}, 4096, text=True)
        assert e.value.param == param


def test_several_prompts_are_a_request_each_and_errors_name_theirs():
    """A completion's array of prompts (strings and arrays of ids) is a request each, with the body's
    settings; an error about one names `prompt[i]` (an id in it `prompt[i][j]`), and a shared
    setting by its own name."""
    t = api.translate({"prompt": ["Once", [5, 6], "upon"], "n": 2, "max_tokens": 3, "logprobs": 1, "echo": True},
                      "demo", frozenset(), {}, 4096, text=True)
    inp = fmt.parse_input(t.document, ())
    assert [(r.messages[0].content if r.messages else r.prompt_token_ids) for r in inp.requests] == ["Once", (5, 6),
                                                                                                       "upon"]
    assert all((r.n, r.max_generate_length, r.num_logprobs, r.prompt_logprobs) == (2, 3, 1, 1) for r in inp.requests)
    assert t.echo and t.prompts == 3
    t = api.translate({"prompt": ["a", [5, -1]]}, "demo", frozenset(), {}, 4096, text=True)
    with pytest.raises(fmt.InputError) as e:
        fmt.parse_input(t.document, ())
    assert t.error(e.value).param == "prompt[1][1]" and str(t.error(e.value)).startswith("`prompt[1][1]` must be")
    assert t.rename_path("requests[1].prompt_token_ids[1]") == "prompt[1][1]"
    assert t.rename_path("requests[0].messages[0].content") == "prompt[0]"
    assert t.rename_path("requests[1].temperature") == "temperature"
    assert t.refused("`requests[1].prompt_token_ids`: the prompt is 9 tokens").param == "prompt[1]"
    assert str(t.refused("`requests[1].messages[0].content` is bad")) == "`prompt[1]` is bad"
    for body, param in (({"prompt": "a", "echo": True, "stream": True}, "echo"),  # (scores come with the answer)
                        ({"prompt": "a", "prompt_logprobs": 1}, "prompt_logprobs"),  # (echo gives them)
                        ({"prompt": "a", "echo": True, "truncate_prompt_tokens": 2}, "truncate_prompt_tokens")):
        with pytest.raises(api.ApiError) as e:
            api.translate(body, "demo", frozenset(), {}, 4096, text=True)
        assert e.value.param == param
    with pytest.raises(api.ApiError) as e:  # (computed, a chat answer would drop them)
        api.translate({"messages": [{"role": "user", "content": "a"}], "prompt_logprobs": 1}, "demo", frozenset(), {},
                      4096)
    assert e.value.param == "prompt_logprobs" and "/v1/completions" in str(e.value)
    t = api.translate({"messages": [{"role": "user", "content": "a"}], "echo": True}, "demo", frozenset(), {}, 4096)
    with pytest.raises(fmt.InputError, match="echo"):  # (a chat body's echo: not ours, refused as any unknown key)
        fmt.parse_input(t.document, ())
