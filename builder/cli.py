"""trtllm-build --model HF_DIR|HUB_ID|FILE.gguf --output ENGINE_DIR [options]"""
from __future__ import annotations

import importlib.util
import sys
import time

import click

from trtllm.builder.config import (ACTIVATIONS, BACKENDS, CPU_KERNELS, DTYPES, GRAPHS, KV_CACHE_DTYPES,
                                   LM_HEAD_QUANTIZATIONS, QUANTIZATIONS, BuildConfig, CheckpointError, ConfigError,
                                   profile_defaults)
from trtllm.builder.tensorrt import TensorRTUnavailable  # (no tensorrt import: that is lazy)
from trtllm.runtime.interrupt import terminate_as_interrupt

# Shown in --help; the chosen --profile supplies these when the option is not given.
DEFAULTS = profile_defaults("cpu-default")
TENSORRT_OPTIONS = ("workspace_gib", "opt_level", "timing_cache")  # they shape the TensorRT builder only
BUILD_MODULES = ("torch", "transformers", "onnx", "safetensors")  # the build extra's, which the runtime leaves out


def parse_lora(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    pairs = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"must be NAME=PEFT_DIR, got {v!r}", param_hint="--lora")
        pairs.append((name, path))
    return tuple(pairs)


def resolve(options: dict, profile: str) -> dict:
    """Command-line values where given, else the profile's (BuildConfig's own defaults fill the rest).
    A profile's bfloat16 gives way to --quantization (whose scales are float16 values) as float32."""
    defaults = profile_defaults(profile)
    defaults.pop("description", None)
    values = {**defaults, **{k: v for k, v in options.items() if v is not None}}
    if options.get("quantization") not in (None, "none") and options.get("dtype") is None \
            and values.get("dtype") == "bfloat16":
        click.echo(f"note: --quantization {options['quantization']} builds with --dtype float32 (the profile's "
                   "bfloat16 does not hold its float16 scales)", err=True)
        values["dtype"] = "float32"
    return values


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model", required=True, help="Hugging Face checkpoint directory, .gguf file, or hub ID.")
@click.option("--output", required=True, help="Engine directory to write.")
@click.option("--profile", default="cpu-default", show_default=True,
              help="Build profile: cpu-default, tensorrt-modern (TensorRT >= 10.15), tensorrt-legacy (older TensorRT), "
                   "jetson-orin-jp6 (= tensorrt-legacy), jetson-thor-jp7 (JetPack 7.0/7.1), or a .json file.")
@click.option("--backend", type=click.Choice(BACKENDS), help=f"[profile; default {DEFAULTS['backend']}]")
@click.option("--dtype", type=click.Choice(DTYPES), help=f"[profile; default {DEFAULTS['dtype']}]")
@click.option("--quantization", type=click.Choice(QUANTIZATIONS), default="none", show_default=True)
@click.option("--lm-head-quantization", type=click.Choice(LM_HEAD_QUANTIZATIONS), default="auto", show_default=True,
              help="--quantization's lm_head (and a tied token table's scores): auto holds it in int8; int4 "
                   "reads half its bytes a token (a large vocabulary's decode is mostly its lm_head) for some "
                   "accuracy (the build's check takes 70% top-1 agreement). The token embedding stays int8.")
@click.option("--cpu-kernels", type=click.Choice(CPU_KERNELS), default="auto", show_default=True,
              help="ONNX Runtime engines: run attention and the quantized MatMuls on trtllm-edge's native "
                   "kernels (plugins/cpu, built by scripts/setup.sh) or on ONNX Runtime's own (GroupQueryAttention, "
                   "MatMulNBits); auto takes native when the library is built.")
@click.option("--activations", type=click.Choice(ACTIVATIONS), default="float32", show_default=True,
              help="--quantization on our CPU kernels: quantize each decode step's activations per block of 32 "
                   "and multiply in integers (VNNI). int16: within 3e-5 of each block's largest value, faster "
                   "at batch 1; int8: as llama.cpp does, faster still with batches, less accurate. Prompt steps "
                   "stay float32.")
@click.option("--kv-cache-dtype", type=click.Choice(KV_CACHE_DTYPES), default="auto", show_default=True,
              help="ONNX Runtime engines on our CPU kernels: int8 keeps each cached key and value row as int8 with "
                   "a float32 scale (a quarter of a float32 cache, half of a float16 one; within 1/254 of the "
                   "row's largest value). auto: --dtype's.")
@click.option("--graph", type=click.Choice(GRAPHS), help="Graph op set: modern (opset 24) or legacy (opset 20). [profile]")
@click.option("--max-batch-size", type=int, help=f"[profile; default {DEFAULTS['max_batch_size']}]")
@click.option("--max-input-len", type=int, help=f"[profile; default {DEFAULTS['max_input_len']}]")
@click.option("--max-kv-cache-capacity", type=int, help=f"[profile; default {DEFAULTS['max_kv_cache_capacity']}] "
                                                          "at most the model's max_position_embeddings")
@click.option("--workspace-gib", type=float, help="TensorRT builder workspace in GiB. [profile; default 4]")
@click.option("--opt-level", type=int, help="TensorRT builder optimization level 0-5. [profile; default 3]")
@click.option("--timing-cache", type=click.Path(dir_okay=False), help="TensorRT timing cache file (read and updated).")
@click.option("--sampling-plugin", is_flag=True, default=None,
              help="TensorRT >= 10.6: run the sampler as its Triton kernel plugin (needs torch and triton "
                   "wherever the engine runs) instead of TensorRT's import of the ONNX body.")
@click.option("--plan-later", is_flag=True, default=False,
              help="TensorRT: export the engine without llm.plan (no TensorRT or GPU needed here; checked through "
                   "ONNX Runtime), then build the plan on the device: python -m trtllm.builder.plan ENGINE_DIR "
                   "(TensorRT and onnx there, no torch or transformers: JetPack 6's Python 3.10).")
@click.option("--max-lora-rank", type=int,
              help="Give the graph LoRA inputs for adapters of rank up to this (0: none); requests pick an adapter "
                   "by lora_name at run time. [profile; default 0, or the largest --lora rank]")
@click.option("--lora", multiple=True, metavar="NAME=PEFT_DIR",
              help="Bundle a PEFT LoRA adapter into the engine under NAME (repeatable); implies LoRA inputs.")
@click.option("--eagle", metavar="DRAFT_DIR",
              help="An EAGLE-3 draft head (config.json + model.safetensors, as SpecForge writes them): the engine "
                   "then decodes requests speculatively (greedy and sampled ones).")
@click.option("--max-image-tiles", type=int,
              help="Vision-language models that tile images (InternVL, Idefics3, SmolVLM): at most this many tiles "
                   "an image, fewer than the checkpoint gives (InternVL: max_patches, plus the thumbnail; Idefics3 and "
                   "SmolVLM: the longest edge lowered to whole tiles, the whole image counted): fewer image tokens, "
                   "a faster prefill. [default: the checkpoint's]")
@click.option("--max-image-pixels", type=int,
              help="Vision-language models that resize each image to its own grid (Qwen-VL): at most this many "
                   "pixels an image, fewer than the checkpoint's max_pixels: fewer image tokens (one per 28 x 28 "
                   "pixels; Qwen3-VL: 32 x 32), a faster prefill. [default: the checkpoint's]")
@click.option("--max-image-tokens", type=int,
              help="Gemma 4: each image resized to at most this many tokens (its processor's max_soft_tokens: 70, "
                   "140, 280, 560 or 1120): fewer for a faster encoder and prefill, more for finer detail. "
                   "[default: the checkpoint's]")
@click.option("--no-verify", is_flag=True, help="Skip the logit check against transformers after building.")
@click.option("--if-changed", is_flag=True,
              help="Build only if --output does not already hold this build's engine (the same options, checkpoint "
                   "weights and files, and trtllm code; verified; no --lora or --eagle).")
def main(model, output, profile, lora, eagle, no_verify, if_changed, **options):
    """Build an engine directory from a checkpoint."""
    try:
        if options.get("max_lora_rank") == 0 and lora:  # 0 on the command line: "no LoRA inputs"
            raise ConfigError("--max-lora-rank 0 gives the graph no LoRA inputs, but --lora bundles adapters: "
                              "leave it out (it defaults to the largest adapter's rank) or give a rank")
        values = resolve(options, profile)
        given = tuple(f"--{name.replace('_', '-')}" for name in TENSORRT_OPTIONS if options.get(name) is not None)
        config = BuildConfig(model=model, output=output, profile=profile, lora=parse_lora(lora), eagle=eagle,
                             verify=not no_verify, tensorrt_options=given, **values)
    except ConfigError as e:
        # a value the profile gave: say so, the flag the message names was not on the command line
        try:
            given = profile_defaults(profile)
        except ConfigError:  # the profile itself is what is wrong
            given = {}
        # (a setting named before ", got ..." is what is refused or what it needs; those after it are
        # the context the message quotes, which the profile may well have set rightly)
        head = str(e).split(", got ")[0]
        from_profile = [key for key in given if options.get(key) is None and (
            f"--{key.replace('_', '-')} " in f"{head} " or head.startswith(f"{key} "))]  # (trt_version: no flag)
        where = f" (\"{from_profile[0]}\" comes from --profile {profile})" if from_profile else ""
        raise click.UsageError(f"{e}{where}") from e
    missing = [name for name in BUILD_MODULES if importlib.util.find_spec(name) is None]
    if missing:  # (a runtime-only install: the build would fail deep in the export, as "the build failed")
        raise click.UsageError(f"trtllm-build needs {', '.join(missing)}, which the runtime's install leaves out: "
                               "pip install \"trtllm-edge[build]\"")
    start = time.perf_counter()

    def log(message: str) -> None:
        click.echo(f"[{time.perf_counter() - start:6.1f}s] {message}", err=True)

    if if_changed:
        from trtllm.builder.current import unchanged

        why = unchanged(config)
        if why:
            log(f"{output} is up to date ({why}): not built again")
            return

    try:
        with terminate_as_interrupt():  # timeout, docker stop: clean up as for Ctrl-C
            # imported in here: torch and transformers take seconds to load, and an interrupt then is
            # one too (130), not click's Abort
            from trtllm.builder.export import build

            out = build(config, log)
    except KeyboardInterrupt:  # as trtllm-run: 130, not click's Abort (1, "the build failed")
        click.echo("interrupted: the build was stopped; an engine already at --output is left as it was", err=True)
        sys.exit(130)
    except (CheckpointError, TensorRTUnavailable, ConfigError) as e:  # ConfigError: a --lora adapter that does not fit
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except Exception as e:
        click.echo(f"error: the build failed: {type(e).__name__}: {e}", err=True)
        sys.exit(1)
    log(f"engine written to {out} (the build's peak memory: {peak_memory_gb():.2f} GB)")


def peak_memory_gb() -> float:
    """This process's peak resident memory: what a machine needs to build the model (README: about 1.8x its
    float32 weights above the process itself)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # (bytes on macOS, KiB on Linux)


if __name__ == "__main__":  # python -m trtllm.builder.cli, as python -m trtllm.builder
    main()
