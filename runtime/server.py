"""trtllm-serve --engine ENGINE_DIR [--host 127.0.0.1] [--port 8000] [--set NAME=VALUE ...]

An OpenAI-compatible HTTP server (vLLM's `vllm serve`, llama.cpp's `llama-server`):
`POST /v1/chat/completions` (streamed as server-sent events with `"stream": true`),
`POST /v1/completions` (prompts without the chat template), vLLM's `POST /tokenize` and
`POST /detokenize`, `GET /v1/models`, `GET /health` and `GET /metrics`. Requests are admitted into the batch that is running as they arrive
(runtime/serving.py), up to --batch-size at once; each answers as trtllm-run answers the same
request. A conversation's next turn restores the KV of the turns before it (trtllm-run
--context-reuse's store, in a temporary directory unless --kv-cache-dir). A client that goes
away ends its request at the next step. Ctrl-C or SIGTERM stop the server.
"""
from __future__ import annotations

import hmac
import json
import queue
import select
import signal
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import click

from trtllm.runtime import input_checks, stdout
from trtllm.runtime import input_format as fmt
from trtllm.runtime import loading
from trtllm.runtime import openai_api as api
from trtllm.runtime.chat import document, settings_of
from trtllm.runtime.metrics import Metrics
from trtllm.runtime.cli import fail_usage as fail
from trtllm.runtime.strict_json import decode

MAX_BODY = 16 << 20  # bytes of a request body
POLL = 0.25  # seconds between looks at whether a waiting client is still there
ENDPOINTS = ("POST /v1/chat/completions, POST /v1/completions, POST /tokenize, POST /detokenize, GET /v1/models, "
             "GET /health, GET /metrics")
GENERATE = ("/v1/chat/completions", "/v1/completions")
COUNT = ("/tokenize", "/detokenize")  # (vLLM's paths)
CLIENT_GONE = 499  # (nginx's: the client closed its connection before the answer)


class App:
    """What the HTTP threads share: the model's names and limits, and the generation loop."""

    def __init__(self, service, manifest, served: str, adapters: frozenset[str], bundled, defaults: dict):
        self.service, self.manifest, self.served, self.adapters = service, manifest, served, adapters
        self.bundled, self.defaults = bundled, defaults
        self.capacity = manifest.limits.max_kv_cache_capacity
        self.created = api.now()
        self.busy = 0  # handlers answering now (shutdown waits for them a little)
        self.metrics = Metrics()
        self.lock = threading.Lock()

    def models(self) -> dict:
        card = {"object": "model", "created": self.created, "owned_by": "trtllm-edge",
                "max_model_len": self.capacity}
        return {"object": "list", "data": [{"id": self.served, **card},
                                           *({"id": a, **card, "parent": self.served} for a in sorted(self.adapters))]}

    def job(self, raw: bytes, text: bool = False, counting: bool = False):
        """The body as a Job and its Translated, or the ApiError that refuses it (`text`: /v1/completions;
        `counting`: /tokenize's body, which is either's)."""
        from trtllm.runtime.serving import Job

        try:
            body = decode(raw, "the body")
        except fmt.InputError as e:
            raise api.ApiError(str(e)) from None
        strs = False
        if counting:
            body, text, strs = api.counting_body(body)
        t = api.translate(body, self.served, self.adapters, self.defaults, self.capacity, text)
        t.token_strs = strs
        if counting and t.prompts > 1:
            raise api.ApiError("`prompt`: /tokenize takes one prompt", "prompt")
        try:
            inp = fmt.parse_input(t.document, self.bundled)
        except fmt.InputError as e:
            raise t.error(e) from None
        m = self.manifest
        for _, problem in [*input_checks.check_limits(inp, m.max_top_k, m.model.vocab_size),
                           *input_checks.check_against_engine(inp, m.model.vocab_size)]:
            raise t.refused(problem)
        return Job(inp, t.stream, t.echo, counting), t

    def detokenize(self, raw: bytes) -> dict:
        """vLLM's /detokenize: {"prompt": the ids' text, special tokens kept}. (Decoding needs no
        template: the tokenizer's Rust decoder is safe from any thread.)"""
        try:
            body = decode(raw, "the body")
        except fmt.InputError as e:
            raise api.ApiError(str(e)) from None
        ids = api.detokenize_ids(body, self.served, self.adapters, self.manifest.model.vocab_size)
        return {"prompt": self.service.runner.tokenizer.decode(ids, skip_special_tokens=False, clean_up=False)}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # (keep-alive: a client's requests share a connection)
    server_version = "trtllm-serve"
    timeout = 300  # seconds an idle kept-alive connection is held

    @property
    def app(self) -> App:
        return self.server.app

    def log_message(self, format, *args) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        if not self.server.quiet:
            stdout.say(f"{self.address_string()} {format % args}")

    def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
        path = urlsplit(self.path).path.rstrip("/")
        if path in ("/health", "/v1/health"):  # (open: a load balancer's probe carries no key)
            self.send_json(200, {"status": "ok"})
        elif not self.allowed():
            return
        elif path == "/v1/models":
            self.send_json(200, self.app.models())
        elif path == "/metrics":
            self.send_bytes(200, self.app.metrics.text(*self.app.service.counts(), self.app.served).encode(),
                            "text/plain; version=0.0.4")
        elif path in GENERATE + COUNT:
            self.send_json(405, api.ApiError(f"POST a request to {path}", status=405,
                                             kind="MethodNotAllowed").body())
        else:
            self.not_found(path)

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path.rstrip("/")
        if not self.allowed():
            self.close_connection = True  # (its body is not read)
            return
        if path not in GENERATE + COUNT:
            self.close_connection = True
            self.not_found(path)
            return
        with self.app.lock:
            self.app.busy += 1
        try:
            if path in COUNT:
                self.count(path)
            else:
                self.chat(text=path == "/v1/completions")
        finally:
            with self.app.lock:
                self.app.busy -= 1

    def do_OPTIONS(self) -> None:  # noqa: N802 - a browser's CORS preflight
        self.send_response(204)
        self.send_header("Allow", "GET, POST, OPTIONS")
        if self.cors_origin() is not None:
            self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", "Authorization, Content-Type")
            self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def end_headers(self) -> None:
        if (origin := self.cors_origin()) is not None:  # (--allowed-origins: browsers may read the answer)
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Vary", "Origin")
        super().end_headers()

    def cors_origin(self) -> str | None:
        """The Access-Control-Allow-Origin for this request's Origin (None: not allowed, or none)."""
        origin, allowed = self.headers.get("Origin"), self.server.origins
        if origin is None or not allowed:
            return None
        return "*" if "*" in allowed else origin if origin in allowed else None

    def allowed(self) -> bool:
        """Whether the request carries the server's --api-key (as OpenAI's clients send it); else a 401."""
        key = self.server.api_key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip().encode(), key.encode()):
            return True
        self.send_json(401, api.ApiError("a valid API key is required (Authorization: Bearer KEY)", status=401,
                                         kind="AuthenticationError", code="invalid_api_key").body())
        return False

    def not_found(self, path: str) -> None:
        self.send_json(404, api.ApiError(f"no endpoint {path or '/'} here ({ENDPOINTS})", status=404,
                                         kind="NotFoundError").body())

    def chat(self, text: bool) -> None:
        """Answer a request, and record it in /metrics: (HTTP status, usage, time to first text)."""
        start = time.perf_counter()
        status, usage, first_text = self.respond(text, start)
        self.app.metrics.answered("completions" if text else "chat/completions", status, time.perf_counter() - start,
                                  usage, first_text)

    def count(self, path: str) -> None:
        """/tokenize (the prompt's ids, as a request of the same body would run them: template,
        `--set` defaults and all) or /detokenize; counted in /metrics by endpoint."""
        try:
            if path == "/detokenize":
                self.send_json(200, self.app.detokenize(self.body()))
                status = 200
            else:
                status = self.tokenize()
        except api.ApiError as e:
            self.send_json(e.status, e.body())
            status = e.status
        self.app.metrics.answered(path.lstrip("/"), status)  # (a count, not a request's latency)

    def tokenize(self) -> int:
        """Answer /tokenize; its HTTP status."""
        job, t = self.app.job(self.body(), counting=True)
        first = self.opening(job, t)
        if isinstance(first, int):  # (refused, or gone: said already)
            return first
        self.send_json(200, api.tokenized(first[1][0], self.app.capacity, t.token_strs, self.app.service.runner.tokenizer))
        return 200

    def opening(self, job, t: api.Translated) -> tuple | int:
        """The job submitted and its first event; where there is none to answer from, its status: the
        refusal sent (503: closing; the request's error) or the client gone (CLIENT_GONE, nothing sent)."""
        if self.app.manifest.vision and not job.counting:
            warm_images(self.app.service.runner, job.inp)
        if not self.app.service.submit(job):
            self.send_json(503, api.ApiError("the server is shutting down", status=503,
                                             kind="ServiceUnavailableError").body())
            return 503
        first = self.next_event(job)
        if first is None:
            return CLIENT_GONE
        if first[0] == "error":
            status = first[2] if len(first) > 2 else 400
            self.send_json(status, t.refused(first[1], status).body())
            return status
        return first

    def respond(self, text: bool, start: float) -> tuple[int, dict | None, float | None]:
        try:
            job, t = self.app.job(self.body(), text)
        except api.ApiError as e:
            self.send_json(e.status, e.body())
            return e.status, None, None
        first = self.opening(job, t)
        if isinstance(first, int):
            return first, None, None
        if t.stream:
            return self.stream(job, t, first, start)
        return self.answer(t, *first[1:])

    def body(self) -> bytes:
        """The request's body, by its Content-Length or in chunks. Where it is refused unread, the
        connection closes after the answer (what follows on it is no request)."""
        try:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                return self.chunked()
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                raise api.ApiError("a Content-Length header (a number of bytes) is required", status=411) from None
            if length < 0:
                raise api.ApiError(f"Content-Length must be a number of bytes, got {length}")
            if length > MAX_BODY:
                raise api.ApiError(f"the body must be at most {MAX_BODY} bytes, got {length}", status=413)
            return self.rfile.read(length)
        except api.ApiError:
            self.close_connection = True
            raise

    def chunked(self) -> bytes:
        """A body sent with Transfer-Encoding: chunked (HTTP/1.1's size lines, then a 0 and the end)."""
        data = bytearray()
        while True:
            line = self.rfile.readline(1024).split(b";")[0].strip()
            try:
                size = int(line, 16)
            except ValueError:
                raise api.ApiError(f"a chunk size must be hexadecimal, got {line[:40]!r}") from None
            if size < 0 or len(data) + size > MAX_BODY:
                raise api.ApiError(f"the body must be at most {MAX_BODY} bytes", status=413)
            if size == 0:
                while self.rfile.readline(1024).strip():  # (trailers, to the empty line)
                    pass
                return bytes(data)
            data += self.rfile.read(size)
            self.rfile.readline(1024)  # (the chunk's CRLF)

    def next_event(self, job):
        """The job's next event, or None where the client went away first (the job is then ended)."""
        while True:
            try:
                return job.events.get(timeout=POLL)
            except queue.Empty:
                if self.gone():
                    self.app.service.cancel(job)
                    self.close_connection = True
                    return None

    def gone(self) -> bool:
        """Whether the client closed its end (a readable socket with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def answer(self, t: api.Translated, responses: list[dict], cached: int) -> tuple[int, dict | None, None]:
        if (failed := t.failure(responses)) is not None:
            self.send_json(500, failed.body())
            return 500, None, None
        out = api.completion(api.completion_id(t), api.now(), t, responses, cached)
        self.send_json(200, out)
        return 200, out["usage"], None

    def stream(self, job, t: api.Translated, event, start: float) -> tuple[int, dict | None, float | None]:
        """Server-sent events: a role chunk per choice, the text as it comes, the usage where asked
        for, then [DONE]. A write that fails (the client went away) ends the job."""
        first_text = None
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        cid, created, n = api.completion_id(t), api.now(), sum(r.n for r in job.inp.requests)  # (choices)
        sent = [bytearray() for _ in range(n)]  # (each choice's tokens so far: completions' text offsets)
        try:
            if not t.text:  # (a chat stream opens with each choice's role)
                self.event(api.chunk(cid, created, t, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                        "logprobs": None, "finish_reason": None} for i in range(n)]))
            while event is not None:
                if event[0] == "line":
                    _, index, text, finish, fields = event
                    reason = None if finish is None else api.finish_reason({**fields, "finish_reason": finish})
                    choice = api.delta_choice(index, text, fields, t, reason, sent[index])
                    if choice is not None:
                        self.event(api.chunk(cid, created, t, [choice]))
                        if text and first_text is None:
                            first_text = time.perf_counter() - start
                elif event[0] == "error":  # (the answer could not be made: runtime/serving.py settle)
                    self.event(t.refused(event[1], 500).body())
                    self.done()
                    return 500, None, first_text
                elif event[0] == "done":
                    responses, cached = event[1:]
                    failed = t.failure(responses)
                    usage = None if failed else api.usage(responses, cached)
                    if failed:
                        self.event(failed.body())
                    elif t.include_usage:
                        self.event(api.chunk(cid, created, t, [], usage))
                    self.done()
                    return (500 if failed else 200), usage, first_text
                event = self.next_event(job)
        except OSError:
            self.app.service.cancel(job)
        return CLIENT_GONE, None, first_text

    def event(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")
        self.wfile.flush()

    def done(self) -> None:
        """A stream's last event."""
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def send_json(self, status: int, obj: dict) -> None:
        self.send_bytes(status, json.dumps(obj, ensure_ascii=False).encode(), "application/json")

    def send_bytes(self, status: int, data: bytes, content_type: str) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True  # (a kept-alive connection's thread does not hold the shutdown)
    app: App
    quiet = False
    api_key: str | None = None  # --api-key: every request but /health must carry it
    origins: tuple[str, ...] = ()  # --allowed-origins: the browser origins CORS lets read the answers


def build(engine_dir: Path, host: str, port: int, served: str | None, settings: dict, loras: dict[str, str],
          batch_size: int | None, threads: int | None, store_dir: Path, max_bytes: int, context_reuse: bool,
          spec: dict | None = None):
    """The server, listening, and its generation loop, started. Exits 2 (click) on a bad option.
    `spec`: loading.load's speculative options (ngram, draft_dir, draft_step)."""
    from trtllm.runtime.lora import AdapterSet
    from trtllm.runtime.serving import Service

    loaded = loading.load(engine_dir, threads, **(spec or {}))
    engine, bundled = loaded[0], loaded[4]
    m = engine.manifest
    if loras and bundled is None:
        fail(f"--lora: {engine_dir} takes no LoRA adapters (trtllm-build --max-lora-rank makes one that does)")
    checked = loading.check_settings({**document(settings, [{"role": "user", "content": "-"}]),
                                      "available_lora_weights": loras}, bundled, "--set / --lora")
    limit = m.limits.max_batch_size
    if batch_size is not None and batch_size > limit:
        fail(f"--batch-size {batch_size}: the engine runs at most {limit} at once (its --max-batch-size)")
    adapters = AdapterSet.for_run(engine, checked.available_lora_weights, Path.cwd())
    runner = loading.runner(engine_dir, loaded, store_dir, max_bytes, context_reuse)
    if runner.engine.manifest.vision:  # (made here: request threads and the generation loop share it)
        runner.image_encoder()
    service = Service(runner, adapters, batch_size or limit)
    try:
        httpd = Server((host, port), Handler)
    except OSError as e:
        fail(f"--host {host} --port {port}: cannot listen there ({e})")
    httpd.app = App(service, m, served or engine_dir.resolve().name, frozenset((bundled or ()) + tuple(loras)),
                    bundled, {**settings, **({"available_lora_weights": loras} if loras else {})})
    service.start()
    return httpd


def stop(httpd: Server, wait: float = 5.0) -> None:
    """End what runs ("abort"), let the handlers write their last lines, and close."""
    httpd.app.service.close()
    deadline = time.monotonic() + wait
    while httpd.app.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    httpd.server_close()


def _stop(signum, frame):
    raise KeyboardInterrupt


def lora_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise click.UsageError(f"--lora {pair}: give NAME=PATH")
        out[name] = path
    return out


def warm_images(runner, inp) -> None:
    """A request's images encoded here, in its own thread, before it joins the batch: the generation
    loop then takes them (runtime/media.py ImageEncoder.warm) instead of stopping every stream for
    them. One that cannot be read is the loop's to refuse, naming its item."""
    from trtllm.runtime import images, media

    for req in inp.requests:
        for _, item in media.image_items(req, 0):
            try:
                data = images.data_url(item.value)
            except ValueError:
                continue
            runner.image_encoder().warm(data)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", "engine_dir", required=True, type=click.Path(path_type=Path),
              help="Engine directory written by trtllm-build.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every one).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: a free one, printed).")
@click.option("--model-name", default=None, help="The name clients give as `model` (default: the engine directory's).")
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE",
              help="A default for every request, top-level or a request's own (docs/input_format.md; VALUE is JSON, "
                   "or else a string), e.g. --set reasoning_parser=qwen3. A request's own value wins.")
@click.option("--lora", "lora", multiple=True, metavar="NAME=PATH",
              help="A LoRA adapter clients may name as `model` or `lora_name` (an engine's bundled ones need none).")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Requests generated at once (default: the engine's --max-batch-size); more wait for a slot.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: all cores).")
@click.option("--kv-cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where saved system prompts and conversations' KV are kept (default: a temporary directory).")
@click.option("--kv-cache-size", default="2G", show_default=True,
              help="Size limit of that store; least recently used entries are removed beyond it.")
@click.option("--no-context-reuse", is_flag=True,
              help="Compute every prompt whole (default: restore the longest prefix an earlier request left).")
@loading.speculation
@click.option("--api-key", envvar="TRTLLM_API_KEY", default=None,
              help="Require `Authorization: Bearer KEY` on every request but /health (also from $TRTLLM_API_KEY).")
@click.option("--allowed-origins", "origins", multiple=True, metavar="ORIGIN",
              help="A browser origin (https://app.example) whose pages may read the answers (CORS); * for any.")
@click.option("--quiet", is_flag=True, help="No line per HTTP request.")
def main(engine_dir: Path, host: str, port: int, model_name: str | None, pairs: tuple[str, ...],
         lora: tuple[str, ...], batch_size: int | None, threads: int | None, kv_cache_dir: Path | None,
         kv_cache_size: str, no_context_reuse: bool, spec_ngram: int, spec_draft_engine: Path | None,
         spec_draft_step: int | str, api_key: str | None, origins: tuple[str, ...], quiet: bool) -> None:
    """Serve the engine in --engine over OpenAI's chat completions and completions APIs."""
    from trtllm.runtime import interrupt
    from trtllm.runtime.prefix_cache import parse_size

    stdout.hold()
    try:
        max_bytes = parse_size(kv_cache_size)
    except ValueError as e:
        fail(f"--kv-cache-size: {e}")
    settings = settings_of(pairs)
    if "requests" in settings or "messages" in settings:
        fail("--set requests / messages: each HTTP request brings its own")
    for sig in interrupt.SIGNALS:  # SIGTERM (systemd, docker stop) and SIGHUP stop it as Ctrl-C does
        signal.signal(sig, _stop)
    with tempfile.TemporaryDirectory(prefix="trtllm-serve-") as scratch:
        try:
            httpd = build(engine_dir, host, port, model_name, settings, lora_pairs(lora), batch_size, threads,
                          kv_cache_dir or Path(scratch), max_bytes, not no_context_reuse,
                          {"ngram": spec_ngram, "draft_dir": spec_draft_engine, "draft_step": spec_draft_step})
        except KeyboardInterrupt:
            stdout.say("interrupted")
            sys.exit(130)
        httpd.quiet, httpd.api_key, httpd.origins = quiet, api_key or None, origins
        address, bound = httpd.server_address[:2]
        stdout.say(f"serving {httpd.app.served} at http://{address}:{bound}/v1 ({ENDPOINTS}); Ctrl-C stops it")
        try:
            httpd.serve_forever(poll_interval=0.5)
        except KeyboardInterrupt:
            stdout.say("stopping: requests still running end here")
        finally:
            stop(httpd)


if __name__ == "__main__":
    main()
