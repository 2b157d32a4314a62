"""What trtllm-chat and trtllm-serve load before their first request: the engine (and an EAGLE
engine's draft head), its tokenizer and chat template, their settings checked as an input file's,
and a Runner over a KV store that keeps earlier requests' KV (--context-reuse's). trtllm-run loads
the same pieces in its own order, between its checks for an engine replaced while it loads."""
from __future__ import annotations

from pathlib import Path

from trtllm.runtime import input_format as fmt
from trtllm.runtime.cli import PREFILL_CHUNK
from trtllm.runtime.cli import fail_usage as fail


def load(engine_dir: Path, threads: int | None):
    """(engine, drafter, tokenizer, template, bundled adapter names or None), or exit 2 naming the problem."""
    from trtllm.runtime import grammar
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.manifest import ManifestError
    from trtllm.runtime.speculative import Drafter
    from trtllm.runtime.tokenizer import Tokenizer

    try:
        engine = load_engine(engine_dir, num_threads=threads)
        grammar.use_threads(threads)
        drafter = Drafter.load(engine_dir, engine.manifest)  # (an EAGLE engine's head drafts, as in trtllm-run)
        tokenizer = Tokenizer.from_engine_dir(engine_dir, engine.manifest.files)
        template = ChatTemplate.from_engine_dir(engine_dir, engine.manifest.files)
    except ManifestError as e:
        fail(str(e))
    bundled = tuple(engine.manifest.lora.get("adapters", {})) if engine.manifest.lora else None
    return engine, drafter, tokenizer, template, bundled


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

    engine, drafter, tokenizer, template, _ = loaded
    store = PrefixStore(store_dir, prefix_identity(engine_identity(engine_dir), engine), max_bytes=max_bytes)
    out = Runner(engine, tokenizer, template, store, drafter, PREFILL_CHUNK)
    if context_reuse:
        out.contexts = ContextCache(store)
    return out
