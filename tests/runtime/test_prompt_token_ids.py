"""A request's prompt as token ids (`prompt_token_ids`, vLLM's tokens prompt): the ids go to the
model as they are, answered as the same ids from text; each bad one fails its own request, named."""
from __future__ import annotations

import pytest

from tests.runtime.test_run_stdout import chat
from trtllm.runtime import input_format as fmt
from trtllm.runtime.tokenizer import Tokenizer

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf
TEXTS = ["The quick brown fox", "Hello there, Paris"]


def ids_of(engine, text: str) -> list[int]:
    return Tokenizer.from_engine_dir(engine).encode(text, add_special_tokens=True)


def test_token_ids_answer_as_the_same_prompt_as_text(run_cli, tiny_engine):
    """Greedy answers to token-id prompts are those to the same prompts as text without the chat
    template (its ids, as the tokenizer encodes them), in one batch with a chat request; the response
    says the prompt's length and its text (the ids decoded, special tokens kept)."""
    engine = tiny_engine("llama")
    top = {"temperature": 0, "max_generate_length": 8, "batch_size": 3}
    _, text = run_cli(engine, {**top, "apply_chat_template": False, "requests": [chat(t) for t in TEXTS]})
    ids = [ids_of(engine, t) for t in TEXTS]
    result, out = run_cli(engine, {**top, "requests": [{"prompt_token_ids": ids[0]}, chat("Paris"),
                                                       {"prompt_token_ids": ids[1], "n": 2, "seed": 3}]})
    assert result.exit_code == 0, result.output
    r = out["responses"]
    assert [x["output_ids"] for x in (r[0], r[2], r[3])] == [text["responses"][i]["output_ids"] for i in (0, 1, 1)]
    assert [x["prompt_tokens"] for x in (r[0], r[2])] == [len(i) for i in ids]
    assert r[0]["messages"] == [] and r[0]["formatted_system_prompt"] == ""
    assert r[0]["formatted_complete_request"] == text["responses"][0]["formatted_complete_request"]
    _, alone = run_cli(engine, {**top, "requests": [chat("Paris")]})
    assert alone["responses"][0]["output_ids"] == r[1]["output_ids"]


def test_truncation_and_prompt_logprobs_read_the_ids(run_cli, tiny_engine):
    """truncate_prompt_tokens keeps the ids' last k; prompt_logprobs scores each given id."""
    engine = tiny_engine("llama")
    ids = ids_of(engine, TEXTS[1])
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "requests": [
        {"prompt_token_ids": ids, "truncate_prompt_tokens": 3}, {"prompt_token_ids": ids[-3:]},
        {"prompt_token_ids": ids, "prompt_logprobs": 0}]})
    assert result.exit_code == 0, result.output
    r = out["responses"]
    assert r[0]["prompt_tokens"] == 3 and r[0]["output_ids"] == r[1]["output_ids"]
    scored = r[2]["prompt_token_logprobs"]
    assert scored[0] is None and [e["token_id"] for e in scored[1:]] == ids[1:]


@pytest.mark.parametrize("request_, message", [
    ({"prompt_token_ids": [1, 2], "messages": [{"role": "user", "content": "hi"}]},
     "`requests[1].prompt_token_ids` must be absent when `messages` is given (the prompt is one or the other), "
     "got both"),
    ({"prompt_token_ids": []}, "`requests[1].prompt_token_ids` must be a non-empty array of token ids (the prompt)"),
    ({"prompt_token_ids": [1, -2]}, "`requests[1].prompt_token_ids[1]` must be an integer >= 0, got -2"),
    ({"prompt_token_ids": [1, "2"]}, "`requests[1].prompt_token_ids[1]` must be an integer"),
    ({"prompt_token_ids": [1, 2], "continue_final_message": True},
     "`requests[1].continue_final_message` must be false with `prompt_token_ids`"),
    ({}, "`requests[1].messages` must be given (or `prompt_token_ids`: a request needs a prompt), got nothing"),
])
def test_a_malformed_token_prompt_fails_its_request_alone(request_, message):
    inp = fmt.parse_input({"requests": [chat("fine"), request_]}, isolate=True)
    assert inp.invalid[1].startswith(message), inp.invalid[1]
    assert 0 not in inp.invalid


def test_what_needs_the_engine_fails_its_request_alone(run_cli, tiny_engine):
    """An id past the vocabulary, a prompt past max_input_len, tools (no template shows them) and
    template variables: each request fails naming its field; the others are answered."""
    engine = tiny_engine("llama")
    from trtllm.runtime import manifest

    m = manifest.load(engine)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 4, "requests": [
        {"prompt_token_ids": [5, 2 ** 40]}, {"prompt_token_ids": [5] * (m.limits.max_input_len + 1)},
        {"prompt_token_ids": [5, 6], "tools": [tool]}, {"prompt_token_ids": [5, 6], "chat_template_kwargs": {"x": 1}},
        {"prompt_token_ids": [5, 6]}]})
    assert result.exit_code == 1
    r = out["responses"]
    assert r[0]["error"].startswith(f"`requests[0].prompt_token_ids[1]` must be a token id below the vocabulary "
                                    f"size {m.model.vocab_size}") and "bug" not in r[0]["error"]
    assert r[0]["error"].count("must be a token id") == 1  # (the engine's check and preparing: said once)
    assert r[1]["error"].startswith(f"`requests[1].prompt_token_ids`: the prompt is {m.limits.max_input_len + 1} "
                                    "tokens, more than the engine's max_input_len")
    assert r[2]["error"].startswith("`requests[2].tools` needs the chat template")
    assert r[3]["error"].startswith("`requests[3].chat_template_kwargs` needs the chat template")
    assert [x["finish_reason"] for x in r] == ["error"] * 4 + [r[4]["finish_reason"]] and "error" not in r[4]
