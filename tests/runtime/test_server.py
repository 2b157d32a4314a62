"""trtllm-serve on a tiny engine, over HTTP: requests arriving while others run answer as
trtllm-run answers each alone, streamed or not; bad requests get OpenAI's error naming the body's
field without disturbing their neighbours; a client that goes away ends its request."""
from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from trtllm.runtime import generate, server

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf

PROMPTS = ["Hello there", "The quick brown fox jumps over the lazy dog " * 8, "Paris", "One two three four",
           "What is the capital of France?", "Tell me a story"]


@pytest.fixture
def serve(tiny_engine, tmp_path):
    """serve(**options) -> (port, httpd): trtllm-serve on the tiny llama engine, stopped at the end."""
    started = []

    def start(settings=None, batch_size=None, context_reuse=True, engine=None, spec=None):
        httpd = server.build(engine or tiny_engine("llama"), "127.0.0.1", 0, None, settings or {}, {}, batch_size, 1,
                             tmp_path / "kv", 1 << 30, context_reuse, spec)
        httpd.quiet = True
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append(httpd)
        return httpd.server_address[1], httpd

    yield start
    for httpd in started:
        httpd.shutdown()
        server.stop(httpd)


def post(port: int, body, path="/v1/chat/completions") -> tuple[int, object]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", path, body if isinstance(body, (str, bytes)) else json.dumps(body))
    r = c.getresponse()
    data = r.read().decode()
    if r.getheader("Content-Type") == "text/event-stream":
        return r.status, [json.loads(e[6:]) if e != "data: [DONE]" else "[DONE]" for e in data.split("\n\n") if e]
    return r.status, json.loads(data)


def chat(prompt: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], **fields}


def streamed_text(events: list, index: int = 0) -> str:
    return "".join(c["delta"].get("content", "") for e in events if isinstance(e, dict) and "choices" in e
                   for c in e["choices"] if c["index"] == index)


def test_requests_arriving_while_others_run_answer_as_trtllm_run(serve, run_cli, tiny_engine):
    port, _ = serve()
    fields = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
    bodies = [chat(prompt, **fields, stream=i % 2 == 1) for i, prompt in enumerate(PROMPTS)]  # every other streamed
    assert staggered(port, bodies) == plain_answers(run_cli, tiny_engine("llama"), bodies)


def test_an_eagle_engines_head_drafts_for_requests_arriving_in_flight(serve, run_cli, tiny_checkpoint,
                                                                        tmp_path_factory):
    from tests.runtime.eagle_cli import build_engine

    engine, _ = build_engine(tiny_checkpoint, tmp_path_factory)
    port, httpd = serve(engine=engine)
    bodies = [chat("Edge devices run small language models", temperature=0, max_tokens=16),
              chat("What is the capital of France?", temperature=0.8, top_k=20, seed=7, max_tokens=16),
              chat("The quick brown fox", temperature=0, max_tokens=16, stream=True),
              chat("Numbers 0 1 2 3", temperature=0, max_tokens=16, stop=["4"])]
    answers = staggered(port, bodies)
    assert httpd.app.service.runner.timing.drafted_tokens > 0
    assert answers == plain_answers(run_cli, engine, bodies)


def test_a_kv_cache_that_does_not_grow_for_late_requests_fails_it(serve, monkeypatch):
    """The wrong variant: a scheduler fed requests after it started must grow its KV for them (it
    starts small, not knowing them); without that a long prompt arriving later fails."""
    monkeypatch.setattr(generate.Scheduler, "ensure", lambda self, need: None)
    port, _ = serve()
    status, out = post(port, chat(PROMPTS[1], temperature=0, max_tokens=8))
    assert status == 500 and "the engine failed" in out["error"]["message"]


def test_sampled_answers_take_openai_defaults(serve, run_cli, tiny_engine):
    """No top_p, top_k or max_tokens in the body: OpenAI's (top_p 1, no top_k), not the input
    file's (0.8, 50); a seeded sample equals trtllm-run's with those."""
    port, _ = serve()
    status, out = post(port, chat("Hello there", seed=7, n=2, max_tokens=10, logprobs=True, top_logprobs=3))
    assert status == 200, out
    _, want = run_cli(tiny_engine("llama"), {"top_p": 1.0, "top_k": 0, "seed": 7, "n": 2, "max_generate_length": 10,
                                             "num_logprobs": 3, "requests": [{"messages": [{"role": "user",
                                                                                              "content": "Hello there"}]}]})
    for choice, response in zip(out["choices"], want["responses"]):
        assert choice["message"]["content"] == response["output_text"]
        steps = choice["logprobs"]["content"]
        assert [s["token"] for s in steps] == [e["token"] for e in response["token_logprobs"]]
        assert [len(s["top_logprobs"]) for s in steps] == [3] * len(steps)
    assert out["usage"]["completion_tokens"] == sum(r["output_tokens"] for r in want["responses"])


def test_a_stream_has_openai_chunks(serve):
    port, _ = serve()
    body = chat("Hello there", temperature=0, max_tokens=6, ignore_eos=True)
    _, whole = post(port, body)
    status, events = post(port, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == events[0]["id"] for e in events[:-1])
    assert streamed_text(events) == whole["choices"][0]["message"]["content"]
    assert [c["finish_reason"] for e in events[:-2] for c in e["choices"]][-1] == "length"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 6


def test_the_next_turn_restores_the_conversation(serve):
    port, _ = serve()
    first = chat("Hello there", temperature=0, max_tokens=5)
    _, out = post(port, first)
    reply = out["choices"][0]["message"]["content"]
    second = {**first, "messages": first["messages"] + [{"role": "assistant", "content": reply},
                                                        {"role": "user", "content": "And then?"}]}
    _, out = post(port, second)
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] >= out["usage"]["prompt_tokens"] // 2


@pytest.mark.parametrize("body, param, words", [
    (chat("Hi", temperature=-1), "temperature", "`temperature` must be"),
    (chat("Hi", max_tokens="x"), "max_tokens", "`max_tokens` must be"),
    (chat("Hi", max_tokens=3, max_completion_tokens=4), "max_completion_tokens", "give one of"),
    (chat("Hi", top_logprobs=2), "top_logprobs", "needs `logprobs`"),
    (chat("Hi", frobnicate=1), "frobnicate", "known key"),
    (chat("Hi", batch_size=2), "batch_size", "cannot be given"),
    (chat("Hi", response_format={"type": "yaml"}), "response_format", "`response_format` must be"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role", "`messages[0].role` must be"),
    ({"messages": "Hi"}, "messages", "`messages` must be"),
])
def test_a_bad_request_names_the_field_and_its_neighbour_still_runs(serve, body, param, words):
    port, _ = serve()
    slow = {}
    neighbour = threading.Thread(target=lambda: slow.update(
        out=post(port, chat("Paris", temperature=0, max_tokens=40, ignore_eos=True))))
    neighbour.start()
    status, out = post(port, body)
    neighbour.join()
    assert status == 400 and out["error"]["param"] == param and words in out["error"]["message"], out
    assert slow["out"][0] == 200 and slow["out"][1]["usage"]["completion_tokens"] == 40


def test_other_refusals(serve):
    port, _ = serve()
    assert post(port, "{\"messages\": [")[0] == 400
    status, out = post(port, chat("Hi", model="gpt-4"))
    assert status == 404 and out["error"]["code"] == "model_not_found"
    assert post(port, {}, "/v1/embeddings")[0] == 404
    status, out = post(port, chat("x" * 3000, max_tokens=2))  # past the engine's max_input_len
    assert status == 400 and "max_input_len" in out["error"]["message"]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/models")
    models = json.loads(c.getresponse().read())
    assert [m["id"] for m in models["data"]] == ["engine"] and models["data"][0]["max_model_len"] == 512


def test_a_client_that_goes_away_ends_its_request(serve):
    port, httpd = serve()
    ended, runner = [], httpd.app.service.runner
    real = runner.response

    def response(smp):  # (the loop's thread) an answered sample, and how its row ended
        ended.append((smp.row.finish_reason, len(smp.row.output_ids)))
        return real(smp)

    runner.response = response
    body = json.dumps(chat("Hello", max_tokens=500, ignore_eos=True, stream=True)).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert sock.recv(100).startswith(b"HTTP/1.1 200")  # its first bytes, then gone
    deadline = time.monotonic() + 20
    while not ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ended and ended[0][0] == "cancelled" and ended[0][1] < 500


@pytest.mark.parametrize("args, words", [
    (["--set", "temperature=-1"], "temperature"),
    (["--batch-size", "9"], "--batch-size 9"),
    (["--set", "messages=[]"], "--set requests / messages"),
    (["--lora", "x"], "NAME=PATH"),
])
def test_bad_options_exit_2_naming_them(tiny_engine, args, words):
    result = CliRunner().invoke(server.main, ["--engine", str(tiny_engine("llama")), "--port", "0", *args])
    assert result.exit_code == 2 and words in result.output, result.output


def test_stopping_the_server_ends_a_running_request_with_what_it_has(serve):
    port, httpd = serve()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/chat/completions", json.dumps(chat("Hello", max_tokens=500, ignore_eos=True, stream=True)))
    r = c.getresponse()
    assert r.fp.readline().startswith(b"data: ")  # it runs
    httpd.shutdown()
    server.stop(httpd)
    events = [json.loads(e[6:]) if e != "data: [DONE]" else "[DONE]"
              for e in r.read().decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    finish = [ch["finish_reason"] for e in events[:-1] for ch in e["choices"] if ch["finish_reason"]]
    assert finish == ["abort"]
    assert post_refused_after_stop(port)


def post_refused_after_stop(port: int) -> bool:
    try:
        post(port, chat("Hi"))
    except OSError:
        return True
    return False


def test_a_follower_cancelled_while_its_leader_prefills_leaves_the_others_running(serve, monkeypatch):
    """Two equal prompts admitted together: the second waits to copy the first's KV (generate.py
    shared) while the first is prefilled in chunks beside a decoding request; the second's client
    goes away meanwhile. Nothing else may notice."""
    from trtllm.runtime import loading

    monkeypatch.setattr(loading, "PREFILL_CHUNK", 16)  # (many chunks: a wide window)
    port, httpd = serve()
    service = httpd.app.service
    decoding = {}
    runner = threading.Thread(target=lambda: decoding.update(out=post(port, chat("Hello", temperature=0, max_tokens=120,
                                                                               ignore_eos=True))))
    runner.start()
    while not service.jobs:
        time.sleep(0.01)
    body = json.dumps({"messages": [{"role": "system", "content": PROMPTS[1]}, {"role": "user", "content": "Hi"}],
                       "temperature": 0, "max_tokens": 5}).encode()  # (what they share: the system prompt)
    (leader, _), (follower, _) = httpd.app.job(body), httpd.app.job(body)
    service.submit(leader)
    service.submit(follower)
    while not follower.samples:
        time.sleep(0.001)
    service.cancel(follower)
    events = []
    while not events or events[-1][0] == "line":
        events.append(leader.events.get(timeout=60))
    runner.join()
    assert events[-1][0] == "done" and events[-1][1][0]["finish_reason"] == "max-length", events[-1]
    assert decoding["out"][0] == 200 and decoding["out"][1]["usage"]["completion_tokens"] == 120


def test_an_answer_that_cannot_be_made_fails_its_request_alone(serve, monkeypatch):
    port, httpd = serve()
    runner = httpd.app.service.runner
    real = runner.response
    monkeypatch.setattr(runner, "response", lambda smp: 1 / 0 if smp.prepared.request.seed == 13 else real(smp))
    status, out = post(port, chat("Hi", seed=13, max_tokens=3))
    assert status == 500 and "ZeroDivisionError" in out["error"]["message"]
    assert post(port, chat("Hi", seed=14, max_tokens=3))[0] == 200  # (the loop goes on)


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        return data


def test_bodies_in_chunks_and_refused_lengths(serve):
    port, _ = serve()
    body = json.dumps(chat("Hi", max_tokens=2)).encode()
    half = len(body) // 2
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    out = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                    b"Connection: close\r\n\r\n" + chunked)
    assert out.startswith(b"HTTP/1.1 200") and b"chat.completion" in out
    # refused unread: one answer, then the connection closes (what follows is no request)
    out = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + body)
    assert out.startswith(b"HTTP/1.1 400") and out.count(b"HTTP/1.1") == 1
    out = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n" + body)
    assert out.startswith(b"HTTP/1.1 411") and out.count(b"HTTP/1.1") == 1
    assert raw(port, b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 405")


def test_a_text_completion_answers_its_prompt_without_the_template(serve, run_cli, tiny_engine):
    port, _ = serve()
    body = {"prompt": "The quick brown fox", "temperature": 0, "max_tokens": 8, "ignore_eos": True, "logprobs": 2}
    status, out = post(port, body, "/v1/completions")
    assert status == 200 and out["object"] == "text_completion", out
    _, want = run_cli(tiny_engine("llama"), {"apply_chat_template": False, "temperature": 0, "max_generate_length": 8,
                                             "ignore_eos": True, "requests": [{"messages": [
                                                 {"role": "user", "content": "The quick brown fox"}]}]})
    choice = out["choices"][0]
    assert choice["text"] == want["responses"][0]["output_text"] and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == 8 and all(len(top) <= 2 for top in choice["logprobs"]["top_logprobs"])
    status, events = post(port, {**body, "stream": True}, "/v1/completions")
    assert events[-1] == "[DONE]" and "".join(c["text"] for e in events[:-1] for c in e["choices"]) == choice["text"]
    status, out = post(port, {"prompt": "x" * 3000, "max_tokens": 2}, "/v1/completions")
    assert status == 400 and out["error"]["param"] == "prompt", out
    # the prompt as token ids (OpenAI's array of integers, or a list of one): the same answer as its text
    from trtllm.runtime.tokenizer import Tokenizer

    ids = Tokenizer.from_engine_dir(tiny_engine("llama")).encode("The quick brown fox", add_special_tokens=True)
    for prompt in (ids, [ids]):
        status, out = post(port, {**body, "prompt": prompt}, "/v1/completions")
        assert status == 200 and out["choices"][0]["text"] == choice["text"], out
        assert out["usage"]["prompt_tokens"] == len(ids)
    for prompt, param, says in (([1, 10 ** 6], "prompt[1]", "`prompt[1]` must be a token id below the vocabulary"),
                                ([1] * 3000, "prompt", "`prompt`: the prompt is 3000 tokens"),
                                ([["a"]], "prompt", "a non-empty array of token ids"),
                                (["a", [1, 10 ** 6]], "prompt[1][1]", "`prompt[1][1]` must be a token id")):
        status, out = post(port, {"prompt": prompt, "max_tokens": 2}, "/v1/completions")
        assert status == 400 and out["error"]["param"] == param and says in out["error"]["message"], out


def test_several_prompts_are_answered_in_openais_order(serve):
    """A completion of an array of prompts (text and token ids) with n = 2: choice i * n + j is prompt i's
    sample j, each what that prompt gets alone, streamed too; the usage counts every prompt once."""
    from trtllm.runtime.tokenizer import Tokenizer

    port, httpd = serve()
    ids = Tokenizer.from_engine_dir(httpd.app.service.runner.engine.engine_dir).encode("Hello there",
                                                                                     add_special_tokens=True)
    body = {"temperature": 0.8, "seed": 11, "n": 2, "max_tokens": 6, "ignore_eos": True}
    alone = [post(port, {**body, "prompt": p}, "/v1/completions")[1] for p in ("The quick brown fox", ids)]
    status, out = post(port, {**body, "prompt": ["The quick brown fox", ids]}, "/v1/completions")
    assert status == 200, out
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in out["choices"]] == [c["text"] for a in alone for c in a["choices"]]
    assert out["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert out["usage"]["completion_tokens"] == 24
    status, events = post(port, {**body, "prompt": ["The quick brown fox", ids], "stream": True}, "/v1/completions")
    texts = ["", "", "", ""]
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] += c["text"]
    assert texts == [c["text"] for c in out["choices"]]


def test_echo_gives_the_prompt_and_its_logprobs_as_lm_eval_reads_them(serve, run_cli, tiny_engine):
    """echo with logprobs (lm-evaluation-harness's loglikelihood requests: max_tokens 1, or 0): the text
    opens with the prompt, and the tokens, logprobs and top logprobs with the prompt's, its first
    token's null; the prompt's are trtllm-run's prompt_logprobs for the same prompt."""
    port, _ = serve()
    prompt = "The quick brown fox"
    _, want = run_cli(tiny_engine("llama"), {"apply_chat_template": False, "temperature": 0, "max_generate_length": 1,
                                             "num_logprobs": 1, "prompt_logprobs": 1, "requests": [
                                                 {"messages": [{"role": "user", "content": prompt}]}]})
    w = want["responses"][0]
    for max_tokens in (1, 0):
        status, out = post(port, {"prompt": [prompt, prompt], "echo": True, "logprobs": 1, "max_tokens": max_tokens,
                                  "temperature": 0}, "/v1/completions")
        assert status == 200, out
        for c in out["choices"]:
            lp = c["logprobs"]
            assert c["text"] == prompt + (w["output_text"] if max_tokens else "")
            assert len(lp["tokens"]) == w["prompt_tokens"] + max_tokens
            assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
            assert lp["token_logprobs"][1:w["prompt_tokens"]] == [e["logprob"] for e in w["prompt_token_logprobs"][1:]]
            assert lp["top_logprobs"][1:w["prompt_tokens"]] == [{e["token"]: e["logprob"] for e in top}
                                                                for top in w["prompt_logprobs"][1:]]
            assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
            if max_tokens:
                assert lp["token_logprobs"][-1] == w["token_logprobs"][0]["logprob"]
    status, out = post(port, {"prompt": prompt, "echo": True, "stream": True}, "/v1/completions")
    assert status == 400 and out["error"]["param"] == "echo"


def test_tokenize_counts_what_a_request_of_the_same_body_runs(serve):
    """vLLM's /tokenize: a chat body's ids are those its completion's prompt runs (the template, and the
    server's --set default system prompt), its count the usage's prompt_tokens; a prompt's are the
    tokenizer's, with its pieces on request; a prompt past max_input_len is still counted.
    /detokenize gives the ids' text back; bad bodies are 400s naming the field."""
    from trtllm.runtime.tokenizer import Tokenizer

    port, httpd = serve({"default_system_prompt": "You are terse."})
    tok = Tokenizer.from_engine_dir(httpd.app.service.runner.engine.engine_dir)
    messages = [{"role": "user", "content": "Hello there"}]
    status, out = post(port, {"messages": messages}, "/tokenize")
    assert status == 200, out
    _, answer = post(port, chat("Hello there", max_tokens=1))
    assert out["count"] == len(out["tokens"]) == answer["usage"]["prompt_tokens"]
    assert out["max_model_len"] == httpd.app.capacity and out["token_strs"] is None
    assert "You are terse." in tok.decode(out["tokens"], skip_special_tokens=False)
    status, out = post(port, {"prompt": "The quick brown fox", "return_token_strs": True}, "/tokenize")
    assert out["tokens"] == tok.encode("The quick brown fox", add_special_tokens=True)
    assert "".join(out["token_strs"]).replace("Ġ", " ") == "The quick brown fox"
    status, out = post(port, {"prompt": "x " * 5000}, "/tokenize")
    assert status == 200 and out["count"] > httpd.app.manifest.limits.max_input_len
    ids = tok.encode("Hi", add_special_tokens=True)
    for generation in ({"max_tokens": 100, "min_tokens": 50}, {"n": 2, "best_of": 2}, {"top_k": 10 ** 6},
                       {"stream": True, "stream_options": {"include_usage": True}}, {"prompt_logprobs": 1}):
        status, out = post(port, {"prompt": "Hi", **generation}, "/tokenize")  # (a generation body, counted)
        assert (status, out.get("tokens")) == (200, ids), (generation, out)
    status, out = post(port, {"tokens": tok.encode("The quick brown fox")}, "/detokenize")
    assert (status, out) == (200, {"prompt": "The quick brown fox"})
    for path, body, param in (("/tokenize", {"prompt": "a", "add_special_tokens": False}, "add_special_tokens"),
                              ("/tokenize", {"prompt": ["a", "b"]}, "prompt"),
                              ("/tokenize", {"messages": [{"role": "nobody", "content": "a"}]}, "messages[0].role"),
                              ("/detokenize", {"tokens": [1, 10 ** 7]}, "tokens[1]"),
                              ("/detokenize", {"tokens": "1 2"}, "tokens"),
                              ("/detokenize", {"tokens": [1], "model": "other"}, "model")):
        status, out = post(port, body, path)
        assert status in (400, 404) and out["error"]["param"] == param, (path, body, out)


SPECULATED = [chat("the cat the cat the cat the cat", temperature=0, max_tokens=32),
              chat("Hi", temperature=0.7, seed=3, max_tokens=32)]


def staggered(port: int, bodies: list[dict]) -> list[str]:
    """The answers to bodies sent a little apart, each arriving while the ones before run."""
    answers = [None] * len(bodies)

    def ask(i):
        status, out = post(port, bodies[i])
        assert status == 200, out  # (else its answer stays None)
        answers[i] = streamed_text(out) if bodies[i].get("stream") else out["choices"][0]["message"]["content"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    return answers


def plain_answers(run_cli, engine, bodies: list[dict]) -> list[str]:
    out = []
    for body in bodies:
        request = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
        _, got = run_cli(engine, {"top_p": 1.0, "top_k": 0, "max_generate_length": body["max_tokens"],
                                  "requests": [request]})
        out.append(got["responses"][0]["output_text"])
    return out


def test_prompt_lookup_guesses_for_requests_in_flight(serve, run_cli, tiny_engine):
    port, httpd = serve(spec={"ngram": 5})
    assert staggered(port, SPECULATED) == plain_answers(run_cli, tiny_engine("llama"), SPECULATED)
    assert httpd.app.service.runner.timing.drafted_tokens > 0


def test_a_draft_engine_guesses_for_requests_in_flight(run_cli, tiny_engine, tmp_path):
    """In a server process of its own: a draft engine's model shares its pool of workers
    (spec_options.check_draft), which would be every later session's in this process."""
    target, draft = tiny_engine("llama"), tiny_engine("qwen2")
    proc = subprocess.Popen([sys.executable, "-m", "trtllm.runtime.server", "--engine", str(target), "--port", "0",
                             "--spec-draft-engine", str(draft), "--spec-draft-step", "3", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving" in line, line + proc.stdout.read()
        port = int(line.split("/v1")[0].rsplit(":", 1)[1])
        assert staggered(port, SPECULATED) == plain_answers(run_cli, target, SPECULATED)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "warning" not in out, out


def request(port: int, method: str, path: str, headers: dict, body: bytes | None = None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request(method, path, body, headers)
    r = c.getresponse()
    return r.status, dict(r.getheaders()), r.read()


def test_an_api_key_is_required_where_given_and_origins_may_read_answers(serve):
    port, httpd = serve()
    httpd.api_key, httpd.origins = "s3cret", ("https://app.example",)
    body = json.dumps(chat("Hi", max_tokens=2)).encode()
    status, _, out = request(port, "POST", "/v1/chat/completions", {}, body)
    assert status == 401 and json.loads(out)["error"]["code"] == "invalid_api_key"
    assert request(port, "POST", "/v1/chat/completions", {"Authorization": "Bearer wrong"}, body)[0] == 401
    assert request(port, "GET", "/v1/models", {})[0] == 401
    assert request(port, "GET", "/health", {})[0] == 200  # (a probe carries no key)
    status, headers, _ = request(port, "POST", "/v1/chat/completions",
                                 {"Authorization": "Bearer s3cret", "Origin": "https://app.example"}, body)
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "https://app.example"
    status, headers, _ = request(port, "OPTIONS", "/v1/chat/completions",
                                 {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
    assert status == 204 and "Authorization" in headers["Access-Control-Allow-Headers"]
    _, headers, _ = request(port, "GET", "/health", {"Origin": "https://elsewhere.example"})
    assert "Access-Control-Allow-Origin" not in headers


def test_a_cancel_is_not_counted_as_a_waiting_request():
    """The loop is woken by a None in the queue (a cancel, a close): /metrics' waiting gauge counts
    the queued requests, not the wake-ups (it used to count a cancel as one more, for a moment)."""
    from trtllm.runtime.serving import Job, Service

    service = Service(runner=None, adapters=None, num_slots=2)  # (its loop not started)
    job = Job(inp=None, stream=False)
    assert service.submit(job) and service.counts() == (0, 1)
    service.cancel(job)
    assert service.counts() == (0, 1)


def test_metrics_count_requests_tokens_and_times(serve):
    port, _ = serve()
    post(port, chat("Hello there", temperature=0, max_tokens=5, ignore_eos=True))
    post(port, chat("Paris", temperature=0, max_tokens=3, ignore_eos=True, stream=True))
    post(port, chat("Hi", temperature=-1))
    status, headers, out = request(port, "GET", "/metrics", {})
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in out.decode().splitlines()
              if line and not line.startswith("#")}
    model = 'model_name="engine"'
    assert values[f'trtllm_requests_total{{{model},endpoint="chat/completions",status="200"}}'] == 2
    assert values[f'trtllm_requests_total{{{model},endpoint="chat/completions",status="400"}}'] == 1
    assert values[f"trtllm_generation_tokens_total{{{model}}}"] == 8
    assert values[f"trtllm_time_to_first_token_seconds_count{{{model}}}"] == 1  # (streams only)
    assert values[f"trtllm_e2e_request_latency_seconds_count{{{model}}}"] == 3
    assert values[f'trtllm_e2e_request_latency_seconds_bucket{{{model},le="+Inf"}}'] == 3
    assert values[f"trtllm_num_requests_running{{{model}}}"] == 0
