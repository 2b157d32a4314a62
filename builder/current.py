"""trtllm-build --if-changed: whether the engine at --output is what this build would write, so that
the build can be left out (a second quickstart: 20 s of export and check, and a 1 GB rewrite, for
the same engine). No torch: it is decided before anything heavy loads."""
from __future__ import annotations

import json
from pathlib import Path

from trtllm.builder.config import BuildConfig
from trtllm.builder.weight_files import loaded_weight_files, weights_hash


def unchanged(config: BuildConfig) -> str | None:
    """None when the build must run; else what makes the engine current: the same options (the
    profile's included), checkpoint weights of the same hash and no checkpoint file newer than the
    engine, built and checked by the same code (trtllm's sources and CPU kernel library: its check's
    report records them, so a --no-verify build always runs). Adapters and EAGLE heads are not
    tracked: a build with them always runs too."""
    from trtllm.builder import provenance

    out, model = Path(config.output), Path(config.model).expanduser()
    if not config.verify or config.lora or config.eagle or not (model.is_dir() or model.suffix.lower() == ".gguf" and model.is_file()):
        return None  # (a hub ID: what it names may change)
    try:
        manifest = json.loads((out / "manifest.json").read_text())
        report = json.loads((out / "verify.json").read_text())
        listed = [line.split(maxsplit=1)[1] for line in (out / "checksums.sha256").read_text().splitlines()]
    except (OSError, ValueError, IndexError):
        return None
    if same_paths(manifest.get("build_config")) != same_paths(json.loads(json.dumps(config.to_json()))) \
            or manifest.get("tensorrt") == {"plan": "pending"}:
        return None
    if report.get("code") != provenance.code_fingerprint():
        return None
    if not all((out / name).is_file() for name in listed):
        return None
    try:  # (a shard the index names gone, a file this user may not read: the build says what is wrong)
        built = (out / "manifest.json").stat().st_mtime
        # (the directory itself too: a file deleted or renamed there changes its time, not a file's)
        files = [model, *(p for p in model.iterdir() if p.is_file())] if model.is_dir() else [model]
        if any(p.stat().st_mtime > built for p in files):
            return None
        weights = loaded_weight_files(model) if model.is_dir() else [model]
        if (manifest.get("source") or {}).get("sha256") != weights_hash(weights):
            return None
    except OSError:
        return None
    return "the same options, checkpoint and code as its build"


def same_paths(build_config) -> object:
    """The build's options with --model and --output as the directories they name (models/x,
    ./models/x/ and /abs/models/x are one checkpoint)."""
    if not isinstance(build_config, dict):
        return build_config
    return {**build_config, **{key: str(Path(build_config[key]).expanduser().resolve())
                               for key in ("model", "output") if isinstance(build_config.get(key), str)}}
