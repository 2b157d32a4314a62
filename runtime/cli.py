"""trtllm-run INPUT.json --engine ENGINE_DIR [--output OUT.json] [--profile PROFILE.json]

Exit codes: 0 every request succeeded; 1 some request failed (its response says why);
2 the input file or command line is invalid (nothing was run).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import click

from trtllm.runtime import input_format as fmt


def write_atomic(path: Path, data: dict, indent: int) -> None:
    """Write next to the target and rename: a crash never leaves half a file where a good one was.

    A symlink is followed (its target is replaced, the link kept); a device or pipe such as
    /dev/stdout cannot be renamed over, so it is written directly. The new file gets the mode the
    old one had, or what the umask allows, not mkstemp's 600.
    """
    text = json.dumps(data, indent=indent, ensure_ascii=False) + "\n"
    path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~current_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def current_umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


def check_writable(path: Path | None, option: str) -> None:
    """Exit 2 now, before anything runs, if `path` cannot be written: its answers would be lost."""
    if path is None:
        return
    target = Path(os.path.realpath(path))
    if target.is_dir():
        fail_usage(f"{option} {path} is a directory")
    if target.exists() and not target.is_file():
        return  # a pipe or device: written in place
    ancestor = target.parent
    while not ancestor.exists():  # the directories write_atomic would create
        ancestor = ancestor.parent
    try:
        if not ancestor.is_dir():
            raise NotADirectoryError(f"{ancestor} is not a directory")
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=".trtllm-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        fail_usage(f"{option} {path} cannot be written: {e}")


def print_line(record: dict) -> None:
    click.echo(json.dumps(record, ensure_ascii=False))
    sys.stdout.flush()


def print_chunk(sample, text: str, finish_reason: str | None) -> None:
    """One streamed piece: {"request_idx", "sample_idx", "text"[, "finish_reason"]} per line."""
    record = {"request_idx": sample.prepared.index, "sample_idx": sample.sample_idx, "text": text}
    if finish_reason:
        record["finish_reason"] = finish_reason
    print_line(record)


def fail_usage(message: str) -> None:
    click.echo(f"error: {message}", err=True)
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


def check_engine_limits(inp: fmt.InputFile, manifest) -> None:
    if inp.batch_size > manifest.limits.max_batch_size:
        fail_usage(f"batch_size must be <= {manifest.limits.max_batch_size} (the engine's max_batch_size), "
                   f"got {inp.batch_size}; rebuild with a larger --max-batch-size")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("input_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--engine", "engine_dir", required=True, type=click.Path(path_type=Path),
              help="Engine directory written by trtllm-build.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Output JSON file (default: print it to stdout).")
@click.option("--profile", type=click.Path(dir_okay=False, path_type=Path),
              help="Write timing and peak memory to this JSON file.")
@click.option("--stream", is_flag=True,
              help="Print each request's text to stdout as it is generated, as JSON lines.")
@click.option("--kv-cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where saved system-prompt KV lives (default: ENGINE_DIR/cache). Several engines may share one.")
@click.option("--kv-cache-size", default="2G", show_default=True,
              help="Size limit of --kv-cache-dir; least recently used entries are removed beyond it.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: all cores).")
@click.option("--huge-pages/--no-huge-pages", default=True, show_default=True,
              help="Put the engine's weights on huge pages (Linux, CPU backend): faster decode, a second "
                   "or so more to load. TRTLLM_HUGE_PAGES=0 turns it off too.")
@click.option("--spec-draft-step", default="auto", show_default=True, callback=lambda ctx, param, v: draft_step(v),
              help="EAGLE engines: tokens the draft head proposes per verification step: a number (0: no "
                   "speculative decoding), or auto: 0-4 per step, whatever has given the most tokens per "
                   "second so far in the run, starting from the engine's draft_step (1 on ONNX Runtime, 4 on "
                   "TensorRT).")
def main(input_file: Path, engine_dir: Path, output: Path | None, profile: Path | None, stream: bool,
         kv_cache_dir: Path | None, kv_cache_size: str, threads: int | None, huge_pages: bool,
         spec_draft_step: int | str) -> None:
    """Answer the requests in INPUT_FILE with the engine in --engine."""
    from trtllm.runtime import manifest as mf

    try:  # the adapters bundled in the engine are names a request may use; a bad engine is reported below
        bundled = tuple(mf.load(engine_dir).lora.get("adapters", {}))
    except mf.ManifestError:
        bundled = ()
    try:
        inp = fmt.read_input(input_file, bundled)
    except fmt.InputError as e:
        fail_usage(f"{input_file}: {e}")
    check_writable(output, "--output")
    check_writable(profile, "--profile")
    from trtllm.runtime.prefix_cache import PrefixStore, engine_identity, parse_size

    try:
        max_bytes = parse_size(kv_cache_size)
    except ValueError as e:
        fail_usage(str(e))
    from trtllm.runtime.chat_template import ChatTemplate
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.lora import AdapterSet
    from trtllm.runtime.manifest import ManifestError
    from trtllm.runtime.runner import Runner
    from trtllm.runtime.tokenizer import Tokenizer

    def identity_now() -> str | None:
        try:
            return engine_identity(engine_dir)
        except OSError:
            return None  # no manifest: load_engine says what is wrong

    identity = identity_now()  # what saved KV is keyed by: it must be the engine that gets loaded
    try:
        engine = load_engine(engine_dir, num_threads=threads, huge_pages=huge_pages)
    except ManifestError as e:
        fail_usage(str(e))
    if identity is None or identity_now() != identity:
        fail_usage(f"{engine_dir} changed while it was loading (a trtllm-build replacing it?); run again")
    check_engine_limits(inp, engine.manifest)
    # Problems only the engine can see (a token id past its vocabulary) fail that request alone.
    m = engine.manifest
    engine_errors: dict[int, str] = {}
    for i, problem in [*fmt.check_limits(inp, m.max_top_k, m.model.vocab_size),
                       *fmt.check_against_engine(inp, m.model.vocab_size)]:
        engine_errors[i] = f"{engine_errors[i]}; {problem}" if i in engine_errors else problem  # all of them
    prefixes = PrefixStore(kv_cache_dir or engine_dir / "cache", identity, max_bytes=max_bytes)
    from trtllm.runtime.speculative import Drafter

    source = click.get_current_context().get_parameter_source("spec_draft_step")
    if not engine.manifest.eagle and source is click.core.ParameterSource.COMMANDLINE:
        click.echo(f"warning: --spec-draft-step ignored: {engine_dir} has no EAGLE draft head "
                   "(trtllm-build --eagle adds one)", err=True)
    try:
        drafter = Drafter.load(engine_dir, engine.manifest, spec_draft_step, huge_pages=huge_pages)
    except ManifestError as e:
        fail_usage(str(e))
    try:
        tokenizer, template = Tokenizer.from_engine_dir(engine_dir), ChatTemplate.from_engine_dir(engine_dir)
    except Exception as e:  # noqa: BLE001 - a missing or broken tokenizer file: the engine dir is incomplete
        fail_usage(f"{engine_dir}: its tokenizer or chat template cannot be loaded ({type(e).__name__}: {e}); "
                   "rebuild it with trtllm-build")
    runner = Runner(engine, tokenizer, template, prefixes, drafter)
    adapters = AdapterSet.for_run(engine, inp.available_lora_weights, input_file.parent)
    responses = runner.run(inp, engine_errors, on_text=print_chunk if stream else None, adapters=adapters)
    result = {"input_file": str(input_file), "responses": responses}
    if stream:
        for r in responses:  # requests that never ran still end their stream
            if r["finish_reason"] == "error":
                print_line({"request_idx": r["request_idx"], "sample_idx": r.get("sample_idx", 0), "text": "",
                            "finish_reason": "error", "error": r.get("error")})
    if output is not None:
        write_atomic(output, result, indent=4)
        click.echo(f"wrote {len(responses)} responses to {output}", err=True)
    if stream:
        pass  # stdout already carries the text, as JSON lines
    elif output is None:
        click.echo(json.dumps(result, indent=4, ensure_ascii=False))
    else:
        for r in responses:
            click.echo(f"[{r['request_idx']}] ({r['finish_reason']}) {r['output_text']}")
    if profile is not None:
        write_atomic(profile, runner.profile(), indent=2)
    failed = sum(r["finish_reason"] == "error" for r in responses)
    if failed:
        click.echo(f"{failed} of {len(responses)} requests failed", err=True)
    sys.exit(1 if failed else 0)
