"""The weight files of a checkpoint and their hash, which an engine's manifest records (source.sha256).
No torch: `trtllm-build --if-changed` reads them before it decides to load anything."""
from __future__ import annotations

import hashlib
import json
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
