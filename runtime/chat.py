"""trtllm-chat --engine ENGINE_DIR [--system TEXT] [--set NAME=VALUE ...]

A conversation with an engine at the terminal (llama.cpp's llama-cli in conversation mode). Each
line read is a user turn, and the answer is printed as it is generated. Every turn restores the KV
of the conversation so far (trtllm-run --context-reuse's store, in a temporary directory unless
--kv-cache-dir), so a turn computes only its own new tokens. `/reset` starts the conversation over,
`/exit` or the end of the input ends it. Ctrl-C stops an answer (what it said so far stays in the
conversation); at the prompt it ends the chat. Settings are the input file's
(docs/input_format.md), checked as trtllm-run checks them.
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

from trtllm.runtime import input_format as fmt
from trtllm.runtime import interrupt, stdout


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
    """A turn as trtllm-run's input file holds it: the settings, and one request of the conversation."""
    return {**settings, "requests": [{"messages": messages}]}


def show(sample, text: str, finish_reason, token_ids, fields=None) -> None:
    """Runner.run's on_text: the answer's text as it comes."""
    sys.stdout.write(text)
    sys.stdout.flush()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--engine", "engine_dir", required=True, type=click.Path(path_type=Path),
              help="Engine directory written by trtllm-build.")
@click.option("--system", default=None, help="The system prompt (default: the chat template's own, if it has one).")
@click.option("--set", "pairs", multiple=True, metavar="NAME=VALUE",
              help="An input-file setting for every turn, e.g. --set temperature=0.7 --set max_generate_length=512 "
                   "(docs/input_format.md; VALUE is JSON, or else a string). Repeat for more.")
@click.option("--kv-cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the conversation's KV is kept between turns (default: a temporary directory, removed "
                   "at the end); with a directory, a later chat with the same start restores it too.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: all cores).")
def main(engine_dir: Path, system: str | None, pairs: tuple[str, ...], kv_cache_dir: Path | None,
         threads: int | None) -> None:
    """Chat with the engine in --engine, one line a turn."""
    settings = settings_of(pairs)
    if "requests" in settings:
        raise click.UsageError("--set requests: the turns are the requests")
    stdout.hold()
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.context_cache import ContextCache
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.manifest import ManifestError
    from trtllm.runtime.prefix_cache import PrefixStore, engine_identity, prefix_identity
    from trtllm.runtime.runner import Runner
    from trtllm.runtime.tokenizer import Tokenizer

    def fail(message: str) -> None:
        stdout.say(f"error: {message}")
        sys.exit(2)

    try:
        engine = load_engine(engine_dir, num_threads=threads)
        tokenizer = Tokenizer.from_engine_dir(engine_dir, engine.manifest.files)
        template = ChatTemplate.from_engine_dir(engine_dir, engine.manifest.files)
    except ManifestError as e:
        fail(str(e))
    except KeyboardInterrupt:
        sys.exit(130)
    bundled = tuple(engine.manifest.lora.get("adapters", {})) if engine.manifest.lora else None
    first = [{"role": "system", "content": system}] if system is not None else []
    try:  # the settings are checked once, before the first turn
        fmt.parse_input(document(settings, first + [{"role": "user", "content": "-"}]), bundled)
    except fmt.InputError as e:
        fail(f"--set: {e}")
    with tempfile.TemporaryDirectory(prefix="trtllm-chat-") as scratch:
        store = PrefixStore(kv_cache_dir or Path(scratch), prefix_identity(engine_identity(engine_dir), engine))
        runner = Runner(engine, tokenizer, template, store)
        runner.contexts = ContextCache(store)
        converse(runner, first, settings, bundled)


def converse(runner, first: list[dict], settings: dict, bundled) -> None:
    """The turns, until /exit, the end of the input or a Ctrl-C at the prompt."""
    history: list[dict] = []
    prompt = "> " if sys.stdin.isatty() else ""
    while True:
        try:
            line = input(prompt)
        except (EOFError, KeyboardInterrupt):
            break
        line = line.strip()
        if line == "/exit":
            break
        if line == "/reset":
            history = []
            stdout.say("(the conversation starts over)")
            continue
        if not line:
            continue
        turn = {"role": "user", "content": line}
        inp = fmt.parse_input(document(settings, first + history + [turn]), bundled)
        with interrupt.watch():  # a Ctrl-C ends this answer (Runner.run keeps its text), not the chat
            answer = runner.run(inp, on_text=show)[0]
        runner.cancelled = False
        sys.stdout.write("\n")
        sys.stdout.flush()
        if answer["finish_reason"] == "error":  # (a turn the engine cannot take: the conversation stays as it was)
            stdout.say(f"error: {answer.get('error')} (/reset starts the conversation over)")
            continue
        if answer["finish_reason"] == "cancelled":
            stdout.say("(stopped)")
        history += [turn, {"role": "assistant", "content": answer["output_text"]}]


if __name__ == "__main__":
    main()
