"""The weight files of a checkpoint and their hash, which an engine's manifest records (source.sha256).
No torch: `trtllm-build --if-changed` reads them before it decides to load anything."""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path


def weights_hash(paths: list[Path]) -> str:
    """sha256 over the weight files' names and bytes, so an engine records what it was built from."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def loaded_weight_files(path: Path) -> list[Path]:
    """The weight files transformers reads (safetensors before pickles, the shards an index names):
    what an engine records the hash of, not a consolidated copy or training state beside them."""
    # (transformers' order: one file before an index, safetensors before pickles)
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if (path / single).is_file():
            return [path / single]
        if (path / index).is_file():
            try:
                shards = sorted(set(json.loads((path / index).read_text())["weight_map"].values()))
                return [path / name for name in shards]
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                break  # (transformers has read it: an odd one is hashed whole, as below)
    return [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin")]


FLOATS = {"F32", "F16", "BF16", "F64"}


def float_counts(path: Path, names: dict | None = None) -> dict[str, int] | None:
    """{safetensors dtype: parameters} over the float weights a checkpoint directory's safetensors hold,
    from their headers (nothing loaded); None where that is not known: a GGUF, pickles, or packed integer
    weights (a GPTQ/AWQ checkpoint). `names`, where given, gets {dtype: [tensor names]}."""
    if not path.is_dir():
        return None
    files = loaded_weight_files(path)
    if not files or any(f.suffix != ".safetensors" for f in files):
        return None
    counts: dict[str, int] = {}
    try:
        for f in files:
            with open(f, "rb") as handle:
                header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
            for name, entry in header.items():
                if name == "__metadata__":
                    continue
                if entry["dtype"] not in FLOATS:
                    return None
                counts[entry["dtype"]] = counts.get(entry["dtype"], 0) + math.prod(entry["shape"])
                if names is not None:
                    names.setdefault(entry["dtype"], []).append(name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # (transformers says what is wrong with such a file, when it loads it)
    return counts
