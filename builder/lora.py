"""LoRA at build time: `--max-lora-rank` gives the graph LoRA inputs (builder/decoder.py), and
`--lora NAME=PEFT_DIR` bundles adapters into ENGINE_DIR/lora/NAME/, checked by the same loader the
runtime uses (runtime/lora.py), so an adapter that would fail at run time fails the build instead."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from trtllm.builder.config import MAX_LORA_RANK, BuildConfig, ConfigError
from trtllm.runtime import lora as rt_lora
from trtllm.runtime.manifest import Manifest

BUNDLE_DIR = "lora"


def peft_files(path: str) -> tuple[Path, Path]:
    """A bundled adapter's PEFT files: the build checks it against PEFT itself, which cannot read
    Edge-LLM's processed form."""
    config, weights = rt_lora.adapter_files(path)
    if rt_lora.processed_config(config):
        raise rt_lora.AdapterError(f"{path} is Edge-LLM's processed adapter: bundle the PEFT adapter it was made "
                                   "from (a processed one is read at run time, through available_lora_weights)")
    return config, weights


def adapter_rank(path: str) -> int:
    """The largest rank among an adapter's modules (its lora_A matrices are [r, in])."""
    _, weights = peft_files(path)
    ranks = [t.shape[0] for k, t in rt_lora.read_safetensors(weights).items() if ".lora_A." in k and t.ndim == 2]
    if not ranks:
        raise rt_lora.AdapterError(f"{weights} holds no lora_A matrices")
    return max(ranks)


def with_rank(config: BuildConfig) -> BuildConfig:
    """--max-lora-rank defaults to the largest rank of the bundled adapters; one below it is refused
    here, before the export (it may come from a --profile)."""
    if not config.lora:
        return config
    ranks = {}
    for name, path in config.lora:  # the files and the config now, not after the export
        try:
            rt_lora.read_config(peft_files(path)[0])
            ranks[name] = adapter_rank(path)
        except rt_lora.AdapterError as e:
            raise ConfigError(f"--lora {name}: {e}") from None
        if ranks[name] > MAX_LORA_RANK:
            raise ConfigError(f"--lora {name}: rank {ranks[name]} is above trtllm-edge's largest LoRA rank, {MAX_LORA_RANK}")
    if not config.max_lora_rank:
        return dataclasses.replace(config, max_lora_rank=max(ranks.values()))
    over = [(name, rank) for name, rank in ranks.items() if rank > config.max_lora_rank]
    if over:
        name, rank = over[0]
        raise ConfigError(f"--lora {name}: rank {rank}, above the engine's max_lora_rank {config.max_lora_rank}; rebuild "
                          f"with --max-lora-rank {max(ranks.values())} (that {config.max_lora_rank} is --max-lora-rank's, "
                          "or a --profile's max_lora_rank where it is not given)")
    return config


def bundle(config: BuildConfig, manifest: Manifest, out_dir: Path, log) -> Manifest:
    """Check each --lora adapter against the engine and copy its two files to lora/NAME/."""
    adapters = {}
    for name, path in config.lora:
        try:
            files = peft_files(path)
            adapter = rt_lora.load_adapter(name, path, manifest)
        except rt_lora.AdapterError as e:
            raise ConfigError(f"--lora {name}: {e}") from None
        dest = out_dir / BUNDLE_DIR / name
        dest.mkdir(parents=True)
        for src, file_name in zip(files, (rt_lora.CONFIG_NAME, rt_lora.WEIGHTS_NAME)):
            shutil.copyfile(src, dest / file_name)
        adapters[name] = f"{BUNDLE_DIR}/{name}"
        log(f"bundled LoRA adapter {name} (rank {adapter.rank}) from {path}")
    return dataclasses.replace(manifest, lora={**manifest.lora, "adapters": adapters})
