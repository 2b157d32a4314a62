"""The engine directory trtllm-build writes: what may be replaced (an earlier engine, and nothing a
user keeps in it), and how the new one takes its place (renamed over it, or swapped in entry by
entry where a rename cannot work)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from trtllm.builder.config import BuildConfig, ConfigError, listed
from trtllm.runtime import files
from trtllm.runtime import manifest as mf


def is_engine(path: Path) -> bool:
    """Whether `path` holds an engine of ours (of any format version): a manifest.json that parses
    as one. A web app's or an extension's manifest.json is not one, and its directory is kept."""
    try:
        manifest = json.loads((path / mf.MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    # (build_id since format 2; a format-1 engine, which the runtime asks to rebuild, has the rest)
    return isinstance(manifest, dict) and {"format_version", "backend", "model", "io", "build_config"} <= manifest.keys()


def check_output(config: BuildConfig, out_dir: Path) -> None:
    """Replacing the output is only safe for an earlier engine: never delete anything else, nor an
    input of this build kept inside it."""
    engine = is_engine(out_dir)
    outer = next((p for p in out_dir.resolve().parents if is_engine(p)), None)
    if outer is not None:  # (that engine could then never be replaced: it would hold what no build writes)
        raise ConfigError(f"--output {config.output} is inside the engine directory {outer}; choose a directory "
                          "outside it")
    if out_dir.exists() and not engine and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"--output {config.output} exists and is not an engine directory; choose a new or empty "
                          "directory (only an earlier engine is replaced)")
    inputs = [("--model", config.model), ("--eagle", config.eagle), *(("--lora", p) for _, p in config.lora)]
    for option, value in inputs:
        if value and out_dir.exists() and Path(value).expanduser().resolve().is_relative_to(out_dir):
            raise ConfigError(f"{option} {value} is inside --output {config.output}, which the build replaces; "
                              "move it out first")
    strangers = sorted(e.name for e in out_dir.iterdir() if not built_entry(e.name)) if engine else []
    if strangers:
        raise ConfigError(f"--output {config.output} is an earlier engine that also holds what no build writes "
                          f"({listed(strangers)}); the build replaces the whole directory: move them out first")


# What an engine directory of any build holds: its graphs and plans, the tokenizer files
# transformers' save_pretrained writes (additional_chat_templates: a tokenizer's named templates),
# the saved system-prompt KV (cache), adapters, the draft head and a vision-language model's image encoder.
BUILT = re.compile(r"manifest\.json|verify\.json|verify_reference\.npz|checksums\.sha256|cache|lora|eagle|llm\..*|"
                   r"vision\.onnx(\.data)?|"
                   r".*\.(jinja|model)|"
                   r"tokenizer.*|generation_config\.json|special_tokens_map\.json|added_tokens\.json|vocab\..*|"
                   r"merges\.txt|chat_template\.json|additional_chat_templates")
# Hidden entries no one keeps on purpose: macOS's and NFS's, and a killed in-place build's own.
LITTER = re.compile(r"\.DS_Store|\._.*|\.nfs.*|\..+\.(partial|old)-.*")


def built_entry(name: str) -> bool:
    """Whether a build could have written this entry of an engine directory, or it is a file
    manager's litter (other hidden entries, .git, .env, are someone's work)."""
    return BUILT.fullmatch(name) is not None or LITTER.fullmatch(name) is not None


def in_place(out_dir: Path) -> bool:
    """Whether the engine must be assembled and swapped in entry by entry inside `out_dir` rather
    than renamed over it: the directory a shell stands in (--output .), a mount point (a Docker
    volume, an SD card: a rename over it fails, and the parent is another file system), or a
    directory whose parent this user may not write."""
    if not out_dir.is_dir():
        return False
    return (Path.cwd().is_relative_to(out_dir) or os.path.ismount(out_dir)
            or not os.access(out_dir.parent, os.W_OK))


def replace_engine(new: Path, out_dir: Path, stage: Path) -> None:
    """Put the built engine `new` at `out_dir`. An earlier engine is swapped out as a directory (two
    renames: a trtllm-run starting meanwhile sees the old engine or the new one, never a mix), and
    deleted after. In place (see in_place) the entries are swapped instead, and moved back if a
    move fails, so the old engine is whole or the new one is; a mount point inside (a cache
    directory on its own volume) stays where it is."""
    if not out_dir.exists():
        os.replace(new, out_dir)
        return
    old = Path(tempfile.mkdtemp(dir=stage, prefix=f".{out_dir.name}.old-"))  # empty: a rename may replace it
    try:
        if stage != out_dir:
            os.replace(out_dir, old)
            try:
                os.replace(new, out_dir)
            except BaseException:
                os.replace(old, out_dir)
                raise
        else:
            swap_entries(new, out_dir, old)
    finally:
        shutil.rmtree(old, ignore_errors=True)


def swap_entries(new: Path, out_dir: Path, old: Path) -> None:
    moved: list[tuple[Path, Path]] = []  # (from, to), to undo in reverse
    staging = re.compile(re.escape(f".{out_dir.name}.") + r"(partial|old)-.*")

    def running(entry: Path) -> bool:
        """Another in-place build's staging, written to within the hour: moving it into `old`, then
        deleting it, failed that build half-way (the last build to swap wins, as beside the
        directory). An older one is a killed build's, and goes with the old engine."""
        try:
            return staging.fullmatch(entry.name) is not None and time.time() - entry.stat().st_mtime < 3600
        except OSError:
            return False

    try:
        for entry in list(out_dir.iterdir()):
            if entry in (new, old) or os.path.ismount(entry) or running(entry):
                continue
            os.replace(entry, old / entry.name)
            moved.append((entry, old / entry.name))
        for entry in list(new.iterdir()):
            os.replace(entry, out_dir / entry.name)
            moved.append((entry, out_dir / entry.name))
    except BaseException:
        for source, target in reversed(moved):
            os.replace(target, source)
        raise
    new.rmdir()


# sha256sum's format: `cd ENGINE && sha256sum -c checksums.sha256` checks a copied engine whole
CHECKSUMS_NAME = "checksums.sha256"


def engine_files(engine_dir: Path) -> list[Path]:
    """Every file of a built engine but the checksums themselves, in a fixed order."""
    return sorted(p for p in engine_dir.rglob("*") if p.is_file() and p.name != CHECKSUMS_NAME)


def binary_sizes(engine_dir: Path) -> dict[str, int]:
    """The graphs', weights', plans', adapters' and draft head's sizes (manifest.sizes): what the
    runtime checks at every load, so that an engine copied to a device in part (an interrupted copy)
    is refused by name. Text files (a chat template, generation_config.json) are left out: a user
    may edit those."""
    return {p.relative_to(engine_dir).as_posix(): p.stat().st_size for p in engine_files(engine_dir)
            if p.name.startswith(("llm.", "vision.")) or (p.relative_to(engine_dir).parts[0] in ("lora", "eagle")
                                             and p.suffix != ".json")}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:  # (in pieces: hashlib.file_digest is Python 3.11's)
        for piece in iter(lambda: f.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def read_checksums(engine_dir: Path) -> dict[str, str]:
    """checksums.sha256 as file -> digest ({} where there is none)."""
    listed = engine_dir / CHECKSUMS_NAME
    lines = listed.read_text().splitlines() if listed.is_file() else []
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines)}


def write_checksums(engine_dir: Path) -> None:
    lines = [f"{file_sha256(path)}  {path.relative_to(engine_dir).as_posix()}\n" for path in engine_files(engine_dir)]
    (engine_dir / CHECKSUMS_NAME).write_text("".join(lines))


def readable_by_all(engine_dir: Path) -> None:
    """Files as the umask allows (onnx writes external data as 600): an engine is copied to devices
    and run by other users."""
    mask = files.current_umask()
    for path in [engine_dir, *engine_dir.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)
