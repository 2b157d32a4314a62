"""What trtllm-chat and trtllm-serve load before their first request: the engine (and an EAGLE
engine's draft head), its tokenizer and chat template, their settings checked as an input file's,
and a Runner over a KV store that keeps earlier requests' KV (--context-reuse's). trtllm-run loads
the same pieces in its own order, between its checks for an engine replaced while it loads."""
from __future__ import annotations

from pathlib import Path

import click

from trtllm.runtime import input_format as fmt
from trtllm.runtime.cli import PREFILL_CHUNK, draft_step
from trtllm.runtime.cli import fail_usage as fail


def speculation(command):
    """trtllm-run's --spec-ngram, --spec-draft-engine and --spec-draft-step, on another command
    (its function takes spec_ngram, spec_draft_engine and spec_draft_step)."""
    options = [
        click.option("--spec-ngram", type=click.IntRange(0, 16), default=0, show_default=True,
                     help="Prompt lookup decoding, as trtllm-run's (0: off)."),
        click.option("--spec-draft-engine", type=click.Path(path_type=Path, file_okay=False), default=None,
                     help="Draft-model speculative decoding, as trtllm-run's."),
        click.option("--spec-draft-step", default="auto", show_default=True,
                     callback=lambda ctx, param, v: draft_step(v),
                     help="Tokens --spec-draft-engine proposes a step (auto, or a number; 0: none)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def load(engine_dir: Path, threads: int | None, ngram: int = 0, draft_dir: Path | None = None,
         draft_step: int | str = "auto"):
    """(engine, drafter, tokenizer, template, bundled adapter names or None, lookup), or exit 2
    naming the problem. `ngram`, `draft_dir` and `draft_step`: trtllm-run's --spec-ngram,
    --spec-draft-engine and --spec-draft-step; `lookup` is their proposer (None: neither)."""
    from trtllm.runtime import grammar, spec_options, stdout
    from trtllm.runtime import manifest as mf
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.speculative import Drafter
    from trtllm.runtime.tokenizer import Tokenizer

    if ngram and draft_dir:
        fail("--spec-ngram and --spec-draft-engine each choose the guesses: give one")
    try:
        manifest = mf.load(engine_dir) if draft_dir else None
        # (a model that drafts with the draft engine shares its pool of workers: spec_options.check_draft)
        drafting = spec_options.check_draft(draft_dir, draft_step, engine_dir, manifest)
        engine = load_engine(engine_dir, num_threads=threads, shared_threads=drafting)
        grammar.use_threads(threads)
        drafter = Drafter.load(engine_dir, engine.manifest)  # (an EAGLE engine's head drafts, as in trtllm-run)
        tokenizer = Tokenizer.from_engine_dir(engine_dir, engine.manifest.files)
        template = ChatTemplate.from_engine_dir(engine_dir, engine.manifest.files)
        lookup = spec_options.proposer(engine_dir, engine.manifest, ngram, draft_dir, draft_step, stdout.say,
                                       num_threads=threads)
    except (mf.ManifestError, spec_options.OptionError) as e:
        fail(str(e))
    bundled = tuple(engine.manifest.lora.get("adapters", {})) if engine.manifest.lora else None
    return engine, drafter, tokenizer, template, bundled, lookup


def check_settings(document: dict, bundled, option: str) -> fmt.InputFile:
    """--set's settings in an input document of one request, checked once before the first one."""
    try:
        return fmt.parse_input(document, bundled)
    except fmt.InputError as e:
        fail(f"{option}: {e}")


def runner(engine_dir: Path, loaded, store_dir: Path, max_bytes: int, context_reuse: bool = True):
    """A Runner whose saved system prompts, and with `context_reuse` finished requests' KV, go to
    the store in `store_dir`."""
    from trtllm.runtime.context_cache import ContextCache
    from trtllm.runtime.prefix_cache import PrefixStore, engine_identity, prefix_identity
    from trtllm.runtime.runner import Runner

    engine, drafter, tokenizer, template, _, lookup = loaded
    store = PrefixStore(store_dir, prefix_identity(engine_identity(engine_dir), engine), max_bytes=max_bytes)
    out = Runner(engine, tokenizer, template, store, drafter, PREFILL_CHUNK)
    out.lookup = lookup
    if context_reuse:
        out.contexts = ContextCache(store)
    return out
