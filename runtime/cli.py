"""trtllm-run INPUT.json|- --engine ENGINE_DIR [--output OUT.json] [--profile PROFILE.json]  (-: stdin)

Exit codes: 0 every request succeeded; 1 some request failed (its response says why: a bad value
in the request, naming its JSON path, or what the engine could not do); 2 the input file's JSON or
top level, or the command line, is invalid (nothing was run); 3 --output or --profile could not be
written at the end (the answers then go to stdout), or stdout could not be written where it was the
answers' only way out (no --output); 130 interrupted: a Ctrl-C while generating ends every
unfinished request as "cancelled" with its text so far and writes the answers; one while loading
leaves the files as they were; after the one that ends generation, or once generation is over, one
more waits for the answers to be written, and a further one stops at once (interrupt.Watch);
141 stdout's reader went away (a closed pipe) and there is no --output to write. With --output, a
stdout that fails only stops the printing.
"""
from __future__ import annotations

import json
import os
import re
import sys
import warnings
from pathlib import Path

import click

from trtllm.runtime import files
from trtllm.runtime import input_format as fmt
from trtllm.runtime import input_checks
from trtllm.runtime import grammar, interrupt, reasoning, stdout
from trtllm.runtime.generation_config import CONFIG_NAMES, model_defaults
from trtllm.runtime.input_fields import MAX_NUM_LOGPROBS
from trtllm.runtime.tool_calls import PARSERS

# --prefill-chunk's default. On the demo model (2 threads) a 256-token chunk takes about 0.5 s, so
# the other streams keep a token per half second while a 2000-token prompt (4 s whole) is
# prefilled; that prompt's own prefill took no longer in chunks (docs/kv_cache.md).
PREFILL_CHUNK = 256
# The output JSON is indented down to each response's lists; deeper (a message, one token's
# logprobs) each on one line: files.dumps.
OUTPUT_INLINE = 4
# Threads past this many per core only slow a run down, and ten thousand of them exhaust memory
# while the engine loads (and no signal stops that): refused up front
MAX_THREADS = max(64, 4 * (os.cpu_count() or 1))


def check_writable(path: str | None, option: str) -> None:
    """Exit 2 now, before anything runs, if `path` cannot be written: its answers would be lost."""
    if path is not None:
        try:
            files.check_writable(path)
        except files.NotWritable as e:
            fail_usage(f"{option} {files.shown(path) or repr(path)} {e}")


def same_file(path: str, other: str | Path) -> bool:
    try:
        return os.path.samefile(path, other)  # hard links too
    except OSError:  # not there yet
        return os.path.realpath(path) == os.path.realpath(other)


def inside(path: str, directory: Path) -> bool:
    """Whether `path` lies in `directory` (the engine's: an answer written there could replace one of
    its files), links resolved."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))
    except OSError:
        return False


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (saved system-prompt KV that cannot be written, say) as one plain line, not
    Python's file:line and source text."""
    stdout.say(f"warning: {message}")


def shown_text(text: str) -> str:
    """An answer on one terminal line: its line breaks as \\n and \\r, other control characters as
    \\xNN, U+2028 and U+2029 as \\u2028 and \\u2029 (a model steered to write ESC[2J cleared the
    screen; the file has the text itself)."""
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # C0 and C1 but tab; Unicode's line breaks


def fail_usage(message: str) -> None:
    stdout.say(f"error: {message}")
    sys.exit(2)


def draft_step(value: str) -> int | str:
    """--spec-draft-step: "auto" or a number >= 0."""
    if value == "auto":
        return value
    try:
        step = int(value)
    except ValueError:
        step = -1
    if step < 0:
        raise click.BadParameter(f"must be auto or an integer >= 0, got {value!r}")
    return step


def count_or_auto(value: str, what: str) -> int | str:
    """--spec-draft-top-k, --spec-verify-size: "auto" or a number at least the one `what` names."""
    if value == "auto":
        return value
    least = int(what.rsplit(" ", 1)[1])
    try:
        number = int(value)
    except ValueError:
        number = least - 1
    if number < least:
        raise click.BadParameter(f"must be {what}, got {value!r}")
    return number


def prefill_chunk(value: int) -> int:
    """--prefill-chunk: 0 (off), or at least MIN_CHUNK tokens."""
    if value < 0 or 0 < value < MIN_CHUNK:
        raise click.BadParameter(f"must be 0 (prompts whole) or at least {MIN_CHUNK} tokens, got {value}")
    return value


MIN_CHUNK = 16  # smaller chunks only add steps: a step's cost is mostly reading the weights


def generation_defaults(engine_dir: Path, manifest) -> tuple[dict, dict]:
    """--sampling-defaults model: the engine's generation_config.json as transformers' generate()
    reads it (none: its defaults, greedy), each value checked as an input file's top level would be:
    (the values, the refused ones' messages: they stop the run only where the file and the command
    line leave them to the config, fmt.read_input)."""
    path = engine_dir / manifest.files.get("generation_config", "generation_config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        fail_usage(f"--sampling-defaults model: {files.shown(path)} cannot be read ({e})")
    def refusal(e: fmt.InputError) -> str:  # named by the config's key
        theirs = CONFIG_NAMES.get(e.json_path, e.json_path)
        return (f"--sampling-defaults model: {files.shown(path)}: its `{theirs}` is refused ("
                f"{str(e).replace(f'`{e.json_path}`', f'`{theirs}`')})")
    try:
        defaults = model_defaults(config)
    except fmt.InputError as e:  # (the config itself inconsistent: temperature 0 with do_sample)
        fail_usage(refusal(e))
    refused, kept = {}, dict(defaults)
    while True:  # (each refused value taken out in turn: the others are checked together, as they apply)
        try:
            settings = fmt.parse_input({**kept, "requests": [{"messages": []}]})
            limits = input_checks.check_limits(settings, manifest.max_top_k, manifest.model.vocab_size)
            if limits:  # (a value the engine cannot take, as a request's would be)
                raise fmt.InputError("top_k", limits[0][1])
            from trtllm.runtime.beam_requests import unrunnable  # (the run's modules load after the checks)

            if (beams := unrunnable(settings.requests[0], 0, manifest)) is not None:
                raise fmt.InputError("num_beams", beams)
            return defaults, refused
        except fmt.InputError as e:
            if e.json_path not in kept:
                fail_usage(refusal(e))
            refused[e.json_path] = refusal(e)
            del kept[e.json_path]


def check_batch_size(inp: fmt.InputFile, manifest) -> None:
    """A batch_size above the engine's max_batch_size runs max_batch_size at a time (Runner.run):
    the rest waits its turn, as on a server. The answers are the same, only later: say so."""
    most = manifest.limits.max_batch_size
    if inp.batch_size > most:
        stdout.say(f"warning: batch_size {inp.batch_size} is more than the engine's max_batch_size {most}: "
                   f"running {most} at a time (rebuild with --max-batch-size {inp.batch_size} for more)")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
# (a str: Path would make ./- into -, which is stdin)
@click.argument("input_file", type=click.Path(dir_okay=False))
@click.option("--engine", "engine_dir", required=True, type=click.Path(path_type=Path),
              help="Engine directory written by trtllm-build.")
@click.option("--output", type=click.Path(dir_okay=False),  # a str: Path would drop a trailing /
              help="Output JSON file (default: print it to stdout).")
@click.option("--profile", type=click.Path(dir_okay=False),
              help="Write timing and peak memory to this JSON file.")
@click.option("--batch-size", type=click.IntRange(1, fmt.MAX_BATCH_SIZE), default=None,
              help="Replace the input file's batch_size (Edge-LLM's --batchSize).")
@click.option("--max-generate-length", type=click.IntRange(min=0), default=None,
              help="Replace the input file's max_generate_length, top level and in each request that sets "
                   "its own (Edge-LLM's --maxGenerateLength).")
@click.option("--num-logprobs", type=click.IntRange(0, MAX_NUM_LOGPROBS), default=None,
              help="Replace the input file's num_logprobs, top level and in each request that sets its own "
                   "(Edge-LLM's --numLogprobs).")
@click.option("--reasoning-parser", type=click.Choice(reasoning.PARSERS), default=None,
              help="Split a thinking model's answers into reasoning_content and content: replaces the input "
                   "file's reasoning_parser, top level and in each request that sets its own (vLLM's "
                   "--reasoning-parser).")
@click.option("--tool-call-parser", type=click.Choice(PARSERS), default=None,
              help="Read tool calls in this format out of the answers to requests with tools: replaces the "
                   "input file's tool_call_parser, top level and in each request that sets its own (vLLM's "
                   "--tool-call-parser).")
@click.option("--sampling-defaults", type=click.Choice(["file", "model"]), default="file", show_default=True,
              help="Where the settings an input file leaves out come from: Edge-LLM's defaults (file), or the "
                   "model's generation_config.json, as transformers' generate() reads it (model).")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Answer the first request this many times before the run, without saved system-prompt "
                   "KV and without output; --profile counts the run alone.")
@click.option("--stream", is_flag=True,
              help="Print each request's text to stdout as it is generated, as JSON lines.")
@click.option("--context-reuse", is_flag=True,
              help="Keep each finished request's KV, its prompt's and its answer's, in the --kv-cache-dir "
                   "store, and restore the longest prefix of each prompt that one holds (a conversation's "
                   "next turn, another question on a document), in this run and later ones (Edge-LLM's "
                   "--enableContextReuse).")
@click.option("--kv-cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where saved system-prompt KV lives (default: ENGINE_DIR/cache). Several engines may share one.")
@click.option("--kv-cache-size", default="2G", show_default=True,
              help="Size limit of --kv-cache-dir; least recently used entries are removed beyond it.")
@click.option("--threads", type=click.IntRange(1, MAX_THREADS), default=None,
              help=f"CPU threads (default: all cores; at most {MAX_THREADS} on this machine).")
@click.option("--huge-pages/--no-huge-pages", default=True, show_default=True,
              help="Put the engine's weights on huge pages (Linux, CPU backend): faster decode, a second "
                   "or so more to load. TRTLLM_HUGE_PAGES=0 turns it off too.")
@click.option("--spin/--no-spin", default=True, show_default=True,
              help="ONNX Runtime's worker threads busy-wait between a step's parallel parts: the fastest on "
                   "cores of their own. --no-spin lets them sleep, for a machine whose cores other work "
                   "shares (there spinning workers take its time and the run's own).")
@click.option("--spec-draft-step", default="auto", show_default=True, callback=lambda ctx, param, v: draft_step(v),
              help="EAGLE engines: tokens the draft head proposes per verification step: a number (0: no "
                   "speculative decoding), or auto: 0-4 per step, whatever has given the most tokens per "
                   "second so far in the run, starting from the engine's draft_step (1 on ONNX Runtime, 4 on "
                   "TensorRT). With --spec-draft-engine: the draft engine's most guesses a step (auto: up to "
                   "8, while that gives more tokens per second than plain steps).")
@click.option("--spec-draft-top-k", default="auto", show_default=True,
              callback=lambda ctx, param, v: count_or_auto(v, "auto or an integer >= 1"),
              help="EAGLE engines: candidates per node of a draft tree, expanded --spec-draft-step deep and "
                   "verified in one step (1: a chain of the head's best guesses); auto: the engine's (1 on "
                   "ONNX Runtime, 4 on TensorRT).")
@click.option("--spec-verify-size", default="auto", show_default=True,
              callback=lambda ctx, param, v: count_or_auto(v, "auto or an integer >= 2"),
              help="EAGLE draft trees: the most tokens a verification step checks per request, the root "
                   "included (auto: top-k x depth + 1).")
@click.option("--spec-ngram", type=click.IntRange(0, 16), default=0, show_default=True,
              help="Prompt lookup decoding (vLLM's ngram method): requests guess up to this many "
                   "tokens a step from their own prompt and answer, checked in one step, the answer "
                   "unchanged (0: off). ONNX Runtime engines without an EAGLE head.")
@click.option("--spec-draft-engine", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Draft-model speculative decoding (vLLM's draft model, llama.cpp's --model-draft): an engine "
                   "of a smaller (or more quantized) model with the same vocabulary proposes --spec-draft-step "
                   "tokens a step (auto: up to 8, while that gives more tokens per second than plain steps), "
                   "checked in one step, the answer unchanged. ONNX Runtime engines without an EAGLE head.")
@click.option("--prefill-chunk", type=int, default=PREFILL_CHUNK, show_default=True,
              callback=lambda ctx, param, v: prefill_chunk(v),
              help="While other requests generate, prefill a new prompt at most this many tokens per step, "
                   "with a decode step between chunks, so their streams keep going (0: each prompt in one "
                   "step).")
def main(input_file: str, engine_dir: Path, output: str | None, profile: str | None, batch_size: int | None,
         max_generate_length: int | None, num_logprobs: int | None, reasoning_parser: str | None,
         tool_call_parser: str | None, sampling_defaults: str, warmup: int, stream: bool, context_reuse: bool,
         kv_cache_dir: Path | None, kv_cache_size: str, threads: int | None, huge_pages: bool, spin: bool,
         spec_draft_step: int | str, spec_draft_top_k: int | str, spec_verify_size: int | str,
         spec_ngram: int, spec_draft_engine: Path | None, prefill_chunk: int) -> None:
    """Answer the requests in INPUT_FILE (`-`: read it from stdin) with the engine in --engine."""
    stdout.hold()
    try:
        with warnings.catch_warnings(), interrupt.watch() as interrupts:  # (both restored after the run)
            warnings.showwarning = show_warning
            overrides = {name: value for name, value in (("batch_size", batch_size),
                                                         ("max_generate_length", max_generate_length),
                                                         ("num_logprobs", num_logprobs),
                                                         ("reasoning_parser", reasoning_parser),
                                                         ("tool_call_parser", tool_call_parser))
                         if value is not None}
            serve(input_file, engine_dir, output, profile, stream, kv_cache_dir, kv_cache_size, threads, huge_pages,
                  spec_draft_step, spec_draft_top_k, spec_verify_size, prefill_chunk, interrupts, overrides, warmup,
                  sampling_defaults == "model", context_reuse, spec_ngram, spin, spec_draft_engine)
    except KeyboardInterrupt:  # not click's Abort: its exit code 1 means "some request failed"
        stdout.say("interrupted: files not yet written were left as they were")
        sys.exit(130)


def serve(input_file: str | Path, engine_dir: Path, output: str | None, profile: str | None, stream: bool,
          kv_cache_dir: Path | None, kv_cache_size: str, threads: int | None, huge_pages: bool,
          spec_draft_step: int | str, spec_draft_top_k: int | str, spec_verify_size: int | str,
          prefill_chunk: int, interrupts: interrupt.Watch | None = None, overrides: dict | None = None,
          warmup: int = 0, model_defaults: bool = False, context_reuse: bool = False, spec_ngram: int = 0,
          spin: bool = True, spec_draft_engine: Path | None = None) -> None:
    from trtllm.runtime import manifest as mf
    from trtllm.runtime.prefix_cache import PrefixStore, engine_identity, parse_size, prefix_identity

    def identity_now() -> str | None:
        try:
            return engine_identity(engine_dir)
        except OSError:
            return None  # no manifest: load_engine says what is wrong

    # What saved KV is keyed by, and what every file read from the engine must belong to: a
    # trtllm-build replacing it mid-load would pair one build's graph with another's tokenizer,
    # draft head or adapters (checked again once they are all read)
    identity = identity_now()

    def replaced_says_so() -> None:
        if identity_now() != identity:  # (None and None: no engine there, which load_engine names)
            fail_usage(f"{engine_dir} changed while it was loading (a trtllm-build replacing it?); run again")

    try:  # the adapters bundled in the engine are names a request may use; a bad engine is reported below
        manifest = mf.load(engine_dir)
        bundled = tuple(manifest.lora.get("adapters", {})) if manifest.lora else None  # None: it takes none
    except mf.ManifestError:
        manifest, bundled = None, ()
    defaults, refused = generation_defaults(engine_dir, manifest) if model_defaults and manifest is not None \
        else (None, {})
    from_stdin = os.fspath(input_file) == "-"
    try:
        inp = fmt.read_input(input_file, bundled, isolate=True, overrides=overrides,
                             defaults=defaults, refused=refused)  # a bad request fails alone
    except fmt.RefusedDefault as e:
        fail_usage(e.message)
    except fmt.InputError as e:
        fail_usage(str(e) if from_stdin else f"{files.shown(input_file)}: {e}")
    check_writable(output, "--output")
    check_writable(profile, "--profile")
    for option, path in (("--output", output), ("--profile", profile)):
        # the run would replace its own input (`-`: stdin, redirected from that file)
        if path is not None and same_file(path, "/dev/stdin" if from_stdin else input_file):
            fail_usage(f"{option} {files.shown(path)} is the input file")
        if path is not None and files.descriptor(path) is None and inside(path, engine_dir):  # or a file of the engine
            fail_usage(f"{option} {files.shown(path)} is inside the engine directory {files.shown(engine_dir)}: "
                       "write it elsewhere")
    to_stdout = output is not None and files.descriptor(output) == 1
    profile_to_stdout = profile is not None and files.descriptor(profile) == 1
    if profile_to_stdout and (output is None or to_stdout or stream):  # two JSON documents in one stream
        fail_usage(f"--profile {files.shown(profile)} is stdout, which "
                   + ("--stream writes its lines to" if stream else "the answers go to (give --output a file)"))
    if profile_to_stdout and stdout.CLOSED:
        fail_usage(f"--profile {files.shown(profile)} is stdout, which is closed")
    if output is not None and profile is not None and same_file(output, profile):
        fail_usage(f"--output and --profile are the same file ({files.shown(output)})")
    if to_stdout and stdout.CLOSED:
        fail_usage(f"--output {files.shown(output)} is stdout, which is closed")
    if stream and to_stdout:
        fail_usage(f"--output {files.shown(output)} is stdout, which --stream writes its lines to")
    try:
        max_bytes = parse_size(kv_cache_size)
    except ValueError as e:
        fail_usage(str(e))
    from trtllm.runtime import spec_options
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.lora import AdapterSet
    from trtllm.runtime.manifest import ManifestError
    from trtllm.runtime.runner import Runner
    from trtllm.runtime.tokenizer import Tokenizer

    if spec_ngram and spec_draft_engine:
        fail_usage("--spec-ngram and --spec-draft-engine each choose the guesses: give one")
    try:
        drafting = spec_options.check_draft(spec_draft_engine, spec_draft_step, engine_dir, manifest)
    except spec_options.OptionError as e:
        fail_usage(str(e))
    try:
        engine = load_engine(engine_dir, num_threads=threads, huge_pages=huge_pages, spin=spin,
                             shared_threads=drafting)
        grammar.use_threads(threads)
    except ManifestError as e:
        replaced_says_so()  # (a graph of the new build, a manifest of the old: not a broken engine)
        fail_usage(str(e))
    replaced_says_so()
    check_batch_size(inp, engine.manifest)
    # Problems only the engine can see (a token id past its vocabulary) fail that request alone.
    m = engine.manifest
    engine_errors: dict[int, str] = {}
    for i, problem in [*input_checks.check_limits(inp, m.max_top_k, m.model.vocab_size),
                       *input_checks.check_against_engine(inp, m.model.vocab_size)]:
        engine_errors[i] = f"{engine_errors[i]}; {problem}" if i in engine_errors else problem  # all of them
    # Saved KV is reused only where it would be computed again bit for bit: the same engine files,
    # and the same libraries and code path (an engine directory, and its cache, can be copied).
    prefixes = PrefixStore(kv_cache_dir or engine_dir / "cache", prefix_identity(identity, engine),
                           max_bytes=max_bytes)
    from trtllm.runtime.speculative import Drafter

    for option in ("spec_draft_step", "spec_draft_top_k", "spec_verify_size"):
        source = click.get_current_context().get_parameter_source(option)
        if option == "spec_draft_step" and spec_draft_engine:
            continue  # (it sets the draft engine's guesses a step)
        if not engine.manifest.eagle and source is click.core.ParameterSource.COMMANDLINE:
            stdout.say(f"warning: --{option.replace('_', '-')} ignored: {engine_dir} has no EAGLE draft head "
                       "(trtllm-build --eagle adds one)")
    try:
        drafter = Drafter.load(engine_dir, engine.manifest, spec_draft_step, spec_draft_top_k, spec_verify_size,
                               huge_pages=huge_pages)
    except ManifestError as e:
        replaced_says_so()
        fail_usage(str(e))
    try:
        named = engine.manifest.files
        tokenizer = Tokenizer.from_engine_dir(engine_dir, named)
        template = ChatTemplate.from_engine_dir(engine_dir, named)
    except Exception as e:  # noqa: BLE001 - a missing or broken tokenizer file: the engine dir is incomplete
        replaced_says_so()
        fail_usage(f"{engine_dir}: its tokenizer or chat template cannot be loaded ({type(e).__name__}: {e}); "
                   "rebuild it with trtllm-build")
    runner = Runner(engine, tokenizer, template, prefixes, drafter, prefill_chunk)
    runner.media_dir = Path(input_file).parent  # (relative image paths, as relative adapter paths)
    try:
        runner.lookup = spec_options.proposer(engine_dir, engine.manifest, spec_ngram, spec_draft_engine,
                                              spec_draft_step, stdout.say, num_threads=threads,
                                              huge_pages=huge_pages, spin=spin)
    except spec_options.OptionError as e:
        fail_usage(str(e))
    if m.model.state_shapes and (context_reuse or any(r.save_system_prompt_kv_cache for r in inp.requests)):
        stdout.say(f"note: {engine_dir}'s recurrent (Mamba) layers keep one state per sequence, not KV per "
                   "position: no system prompt's KV is saved or reused" + (", nor --context-reuse's" * context_reuse))
    if context_reuse:
        from trtllm.runtime.context_cache import ContextCache

        runner.contexts = ContextCache(prefixes)
    elif any(getattr(r, name) != getattr(fmt.PLACEHOLDER, name) for r in inp.requests for name in fmt.CONTEXT_FIELDS):
        stdout.say("warning: the context_cache_* policies apply with --context-reuse only")
    adapters = AdapterSet.for_run(engine, inp.available_lora_weights, Path(input_file).parent)
    adapters.preload({r.lora_name for r in inp.requests if r.lora_name} - set(inp.available_lora_weights))
    replaced_says_so()  # (the tokenizer, template, draft head and bundled adapters: all of one build)
    runner.warm_up(inp, warmup, adapters, frozenset(engine_errors))
    if runner.cancelled:
        stdout.say("interrupted while warming up: nothing was answered or written")
        sys.exit(130)
    printer = stdout.Printer(answers_wanted=output is not None)
    responses = runner.run(inp, engine_errors, on_text=printer.chunk if stream else None, adapters=adapters)
    result = {"input_file": files.shown(input_file), "responses": responses}
    if stream:
        for r in responses:  # requests that failed, or never ran, end their stream here
            if r["finish_reason"] == "error":
                printer.line({"request_idx": r["request_idx"], "sample_idx": r.get("sample_idx", 0), "text": "",
                              "token_ids": [], "finish_reason": "error", "error": r.get("error")})
    unwritten, reader_gone = [], False
    if output is not None:
        try:
            files.write_atomic(output, result, indent=4, inline_from=OUTPUT_INLINE)  # (an interrupt waits)
            count = f"{len(responses)} response{'' if len(responses) == 1 else 's'}"
            stdout.say(f"wrote {count} to {files.shown(output)}")
        except BrokenPipeError:
            if not to_stdout:
                raise
            reader_gone = True  # `--output /dev/stdout | head`: as a program killed by SIGPIPE
            stdout.silence()
        except OSError as e:
            unwritten.append(f"--output {files.shown(output)} could not be written ({e})")
    if stream:
        pass  # stdout already carries the text, as JSON lines
    elif output is None or (unwritten and not to_stdout):
        answers = stdout.Printer(answers_wanted=True, tell=False)  # a failure is told at the end, after --profile
        answers.text(files.dumps(result, 4, OUTPUT_INLINE))
        if isinstance(answers.error, BrokenPipeError):
            reader_gone = True
        elif answers.error is not None:
            unwritten.append(f"stdout could not be written ({answers.error}); the answers are lost")
    else:
        summary = stdout.Printer(answers_wanted=True, tell=False)  # the answers are in the file: a failing stdout loses nothing
        for r in responses:  # a line per answer; on stderr when a JSON document goes to stdout
            sample = f" #{r['sample_idx']}" if "sample_idx" in r else ""
            # (a failed request's line says why, not the output's fixed text: the reason is in its `error`)
            said = r.get("error") if r["finish_reason"] == "error" and r.get("error") else r["output_text"]
            line = f"[{r['request_idx']}{sample}] ({r['finish_reason']}) {shown_text(said)}"
            if to_stdout or profile_to_stdout:
                stdout.say(line)
            else:
                summary.text(line)
    if profile is not None:
        try:
            files.write_atomic(profile, runner.profile(), indent=2)
        except OSError as e:
            unwritten.append(f"--profile {files.shown(profile)} could not be written ({e})")
    failed = sorted({r["request_idx"] for r in responses if r["finish_reason"] == "error"})
    if failed:
        stdout.say(f"{len(failed)} of {len(inp.requests)} requests failed")
    if runner.cancelled:
        cut = sorted({r["request_idx"] for r in responses if r["finish_reason"] == "cancelled"})
        rest = len({r["request_idx"] for r in responses} - set(cut)
                   - {r["request_idx"] for r in responses if r["finish_reason"] == "error"})
        stdout.say(f"interrupted: {len(cut)} of {len(inp.requests)} requests were cancelled (their text so far is "
                   "their answer)" + (f"; the other {rest} finished" if rest else ""))
    late = interrupts is not None and bool(interrupts.kept)  # an interrupt that waited for the writes
    if late and not runner.cancelled:
        stdout.say("interrupted once generation was over" + ("" if unwritten else ": the answers were written first"))
    lost = any(p.startswith("stdout") for p in unwritten)
    for problem in unwritten:
        stdout.say(f"error: {problem}" + ("; the answers are on stdout" if "--output" in problem and not stream
                                          and not to_stdout and not lost else ""))
    sys.exit(3 if unwritten else 141 if reader_gone else 130 if runner.cancelled or late else 1 if failed else 0)


if __name__ == "__main__":  # python -m trtllm.runtime.cli, as python -m trtllm.runtime
    main()
