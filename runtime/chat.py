"""trtllm-chat --engine ENGINE_DIR [--system TEXT] [--set NAME=VALUE ...]

A conversation with an engine at the terminal (llama.cpp's llama-cli in conversation mode). Each
line read is a user turn, and the answer is printed as it is generated. Every turn restores the KV
of the conversation so far (trtllm-run --context-reuse's store, in a temporary directory unless
--kv-cache-dir), so a turn computes only its own new tokens. `/reset` starts the conversation over,
`/exit` or the end of the input ends it. Ctrl-C stops an answer (what it said so far stays in the
conversation); at the prompt it ends the chat, and SIGTERM or SIGHUP end it (exit 130). Settings
are the input file's (docs/input_format.md), checked as trtllm-run checks them.
"""
from __future__ import annotations

import base64
import json
import signal
import sys
import tempfile
from pathlib import Path

import click

from trtllm.runtime import input_format as fmt
from trtllm.runtime import interrupt, loading, stdout
from trtllm.runtime.cli import fail_usage as fail
from trtllm.runtime.messages import MAX_MESSAGES


class Out:
    """What became of stdout: a write that failed stops the answer and ends the chat (exit 141
    where its reader went away, as trtllm-run; 3 otherwise)."""

    error: OSError | None = None


def settings_of(pairs: tuple[str, ...]) -> dict:
    """--set NAME=VALUE: VALUE as JSON where it parses (0.7, true, [1, 2]), else as a string."""
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--set {pair}: give NAME=VALUE, e.g. --set temperature=0.7")
        try:
            settings[name] = json.loads(value)
        except ValueError:
            settings[name] = value
    return settings


def document(settings: dict, messages: list[dict]) -> dict:
    """A turn as trtllm-run's input file holds it: the settings, and one request of the conversation
    (a request's own fields, such as stop or lora_name, in the request)."""
    top = {k: v for k, v in settings.items() if k in fmt.TOP_LEVEL}
    own = {k: v for k, v in settings.items() if k not in fmt.TOP_LEVEL}
    return {**top, "requests": [{**own, "messages": messages}]}


def show(sample, text: str, finish_reason, token_ids, fields=None) -> None:
    """Runner.run's on_text: the answer's text as it comes. A stdout that fails stops the answer as
    a Ctrl-C does (Runner.run keeps what it has); the chat then ends (ask)."""
    if Out.error is not None:
        return
    try:
        stdout.write(text)
    except OSError as e:
        Out.error = e
        raise KeyboardInterrupt from None


def closed() -> None:
    """End the chat for a stdout that failed."""
    if isinstance(Out.error, BrokenPipeError):
        sys.exit(141)
    stdout.say(f"error: stdout could not be written ({Out.error})")
    sys.exit(3)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", "engine_dir", required=True, type=click.Path(path_type=Path),
              help="Engine directory written by trtllm-build.")
@click.option("--system", default=None, help="The system prompt (default: the chat template's own, if it has one).")
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE",
              help="An input-file setting for every turn, top-level or a request's own, e.g. --set temperature=0.7 "
                   "--set max_generate_length=512 --set 'stop=[\"END\"]' (docs/input_format.md; VALUE is JSON, or "
                   "else a string). Repeat for more.")
@click.option("--kv-cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the conversation's KV is kept between turns (default: a temporary directory, removed "
                   "at the end); with a directory, a later chat with the same start restores it too.")
@click.option("--kv-cache-size", default="2G", show_default=True,
              help="Size limit of that store; least recently used entries are removed beyond it.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: all cores).")
@loading.speculation
def main(engine_dir: Path, system: str | None, pairs: tuple[str, ...], kv_cache_dir: Path | None,
         kv_cache_size: str, threads: int | None, spec_ngram: int, spec_draft_engine: Path | None,
         spec_draft_step: int | str) -> None:
    """Chat with the engine in --engine, one line a turn (/reset starts over, /exit ends; on a
    vision-language engine, /image PATH gives the next turn an image)."""
    try:
        chat(engine_dir, system, settings_of(pairs), kv_cache_dir, kv_cache_size, threads,
             {"ngram": spec_ngram, "draft_dir": spec_draft_engine, "draft_step": spec_draft_step})
    except KeyboardInterrupt:  # (while loading, or between a turn's answer and the next prompt)
        stdout.say("interrupted")
        sys.exit(130)


def chat(engine_dir: Path, system: str | None, settings: dict, kv_cache_dir: Path | None, kv_cache_size: str,
         threads: int | None, spec: dict | None = None) -> None:
    stdout.hold()
    Out.error = None  # (a chat of its own: not one an earlier chat in this process had)
    from trtllm.runtime.lora import AdapterSet
    from trtllm.runtime.prefix_cache import parse_size

    if "requests" in settings or "messages" in settings:
        fail("--set requests / messages: the turns are the conversation")
    try:
        max_bytes = parse_size(kv_cache_size)
    except ValueError as e:
        fail(f"--kv-cache-size: {e}")
    loaded = loading.load(engine_dir, threads, **(spec or {}))
    engine, bundled = loaded[0], loaded[4]
    first = [{"role": "system", "content": system}] if system is not None else []
    checked = loading.check_settings(document(settings, first + [{"role": "user", "content": "-"}]), bundled, "--set")
    if checked.requests[0].n > 1:
        fail("--set n: a chat answers with one sample a turn")
    adapters = AdapterSet.for_run(engine, checked.available_lora_weights, Path.cwd())  # (loaded once, not per turn)
    with tempfile.TemporaryDirectory(prefix="trtllm-chat-") as scratch:
        runner = loading.runner(engine_dir, loaded, kv_cache_dir or Path(scratch), max_bytes)
        runner.media_dir = Path.cwd()  # (/image's paths: the user's own files, as they name them)
        converse(runner, first, settings, bundled, adapters)


def converse(runner, first: list[dict], settings: dict, bundled, adapters) -> None:
    """The turns, until /exit, the end of the input or a Ctrl-C at the prompt."""
    history: list[dict] = []
    images: list[str] = []  # /image's, for the next turn
    prompt = "> " if sys.stdin is not None and sys.stdin.isatty() else ""
    if prompt:
        import readline  # noqa: F401 - input() then edits the line and keeps a history of them
    while True:
        try:
            line = input(prompt)
        except (EOFError, KeyboardInterrupt):
            break
        line = line.strip()
        if line == "/exit":
            break
        if line == "/reset":
            history, images = [], []
            stdout.say("(the conversation starts over)")
            continue
        if line.split(maxsplit=1)[:1] == ["/image"]:
            path = line[len("/image"):].strip()
            if not runner.engine.manifest.vision:
                stdout.say("error: /image needs a vision-language engine; this one is text-only")
            elif not path:
                stdout.say("error: /image PATH: the image file the next message is about")
            else:
                try:
                    images.append(image_url(path))
                    stdout.say(f"(the next message comes with {path})")
                except ValueError as e:
                    stdout.say(f"error: /image: {e}" if str(e).startswith("image ") else f"error: /image {path}: {e}")
            continue
        if not line:
            continue
        turn = {"role": "user", "content": [*({"type": "image", "image": p} for p in images),
                                            {"type": "text", "text": line}] if images else line}
        images = []  # (a turn that fails takes them with it: its error says why)
        room = MAX_MESSAGES - len(first) - 1
        if len(history) > room:  # a request holds at most MAX_MESSAGES: the oldest turns (pairs) go
            keep = room - room % 2
            history = history[len(history) - keep:] if keep else []
            stdout.say(f"(the oldest turns are left out: a request holds at most {MAX_MESSAGES} messages)")
        try:
            inp = fmt.parse_input(document(settings, first + history + [turn]), bundled)
        except fmt.InputError as e:  # (this line: not UTF-8, too long)
            stdout.say(f"error: {e}")
            continue
        answer, ended = ask(runner, inp, adapters)
        if answer["finish_reason"] == "error":  # (a turn the engine cannot take: the conversation stays as it was)
            stdout.say(f"error: {answer.get('error')} (/reset starts the conversation over)")
            continue
        if answer["finish_reason"] == "cancelled":
            stdout.say("(stopped)")
        elif answer["finish_reason"] == "max-length":
            stdout.say(f"(cut at {inp.requests[0].max_generate_length} tokens: --set max_generate_length=N for more)")
        history += [turn, {"role": "assistant", "content": answer["output_text"]}]
        if ended:
            stdout.say("interrupted")
            sys.exit(130)


def image_url(path: str) -> str:
    """The image file as a data: URL, read and checked now: the conversation keeps the image itself
    (a file deleted or changed later would change what its turns were about)."""
    from trtllm.runtime import images

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot be read ({e.strerror or e})") from None
    images.load_image(data, path)  # (checked now: its error names the file)
    return f"data:application/octet-stream;base64,{base64.b64encode(data).decode()}"  # (Pillow tells the format)


def ask(runner, inp, adapters) -> tuple[dict, bool]:
    """One turn's answer, printed as it comes, and whether a SIGTERM or SIGHUP came (the chat then
    ends; a Ctrl-C ends only the answer: Runner.run keeps its text as "cancelled")."""
    ended = []
    with interrupt.watch() as watch:
        def ending(signum, frame):
            ended.append(signum)
            watch.handle(signum, frame)

        try:
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, ending)  # (watch() puts the handlers from before back)
        except ValueError:  # not the main thread
            pass
        answer = runner.run(inp, on_text=show, adapters=adapters)[0]
    runner.cancelled = False
    show(None, "\n", None, [])
    if Out.error is not None:
        closed()
    return answer, bool(ended)


if __name__ == "__main__":
    main()
