"""trtllm-build --model HF_DIR|HUB_ID|FILE.gguf --output ENGINE_DIR [options]"""
from __future__ import annotations

import sys
import time

import click

from trtllm.builder.config import BACKENDS, DTYPES, QUANTIZATIONS, BuildConfig, ConfigError, profile_defaults

DEFAULTS = profile_defaults("cpu-default")


def parse_lora(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"must be NAME=PEFT_DIR, got {v!r}", param_hint="--lora")
        pairs.append((name, path))
    return tuple(pairs)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", required=True, help="Hugging Face checkpoint directory, .gguf file, or hub ID.")
@click.option("--output", required=True, help="Engine directory to write.")
@click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True)
@click.option("--dtype", type=click.Choice(DTYPES), default=DEFAULTS["dtype"], show_default=True)
@click.option("--quantization", type=click.Choice(QUANTIZATIONS), default="none", show_default=True)
@click.option("--max-batch-size", type=int, default=DEFAULTS["max_batch_size"], show_default=True)
@click.option("--max-input-len", type=int, default=DEFAULTS["max_input_len"], show_default=True)
@click.option("--max-kv-cache-capacity", type=int, default=DEFAULTS["max_kv_cache_capacity"], show_default=True)
@click.option("--lora", multiple=True, metavar="NAME=PEFT_DIR", help="LoRA adapter (not supported yet).")
@click.option("--eagle", metavar="DRAFT_DIR", help="EAGLE draft head (not supported yet).")
@click.option("--no-verify", is_flag=True, help="Skip the logit check against transformers after building.")
def main(model, output, backend, dtype, quantization, max_batch_size, max_input_len, max_kv_cache_capacity,
         lora, eagle, no_verify):
    """Build an engine directory from a checkpoint."""
    try:
        config = BuildConfig(model=model, output=output, backend=backend, dtype=dtype, quantization=quantization,
                             max_batch_size=max_batch_size, max_input_len=max_input_len,
                             max_kv_cache_capacity=max_kv_cache_capacity, lora=parse_lora(lora), eagle=eagle,
                             verify=not no_verify)
    except ConfigError as e:
        raise click.UsageError(str(e)) from e
    from trtllm.builder.checkpoint import CheckpointError
    from trtllm.builder.export import build

    start = time.perf_counter()

    def log(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.1f}s] {message}", err=True)

    try:
        out = build(config, log)
    except CheckpointError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except Exception as e:
        click.echo(f"error: the build failed: {type(e).__name__}: {e}", err=True)
        sys.exit(1)
    log(f"engine written to {out}")
