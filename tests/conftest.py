"""Shared fixtures: tiny engines built once per session, the demo engine built once per checkout."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for `tests.tiny_models`

DEMO_MODEL = ROOT / "models" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """tiny_checkpoint(arch) -> HF checkpoint dir, made once per arch."""
    from tests.tiny_models import make_checkpoint

    made = {}

    def get(arch: str) -> Path:
        if arch not in made:
            made[arch] = make_checkpoint(arch, tmp_path_factory.mktemp(f"{arch}-ckpt"))
        return made[arch]

    return get


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint, tmp_path_factory):
    """tiny_engine(arch) -> engine dir built (and verified) from the tiny checkpoint."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    built = {}

    def get(arch: str) -> Path:
        if arch not in built:
            out = tmp_path_factory.mktemp(f"{arch}-engine") / "engine"
            build(BuildConfig(model=str(tiny_checkpoint(arch)), output=str(out), max_batch_size=4,
                              max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
            built[arch] = out
        return built[arch]

    return get


@pytest.fixture(scope="session")
def demo_model():
    if not (DEMO_MODEL / "config.json").is_file():
        pytest.fail(f"the demo model is missing at {DEMO_MODEL}: run python scripts/fetch_demo_model.py")
    return DEMO_MODEL


@pytest.fixture(scope="session")
def demo_engine(demo_model, tmp_path_factory):
    """Built fresh for the session (about 15 s), so tests never run a stale engine from engines/."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    out = tmp_path_factory.mktemp("demo-engine") / "engine"
    build(BuildConfig(model=str(demo_model), output=str(out), max_batch_size=8, max_input_len=1024,
                      max_kv_cache_capacity=2048), log=lambda m: None)
    return out


@pytest.fixture
def run_cli(tmp_path):
    """run_cli(engine, payload, *args) -> (click result, parsed output JSON or None)."""
    import json

    from click.testing import CliRunner

    from trtllm.runtime.cli import main

    def run(engine, payload, *extra):
        inp = tmp_path / "input.json"
        inp.write_text(payload if isinstance(payload, str) else json.dumps(payload))
        out = tmp_path / "out.json"
        result = CliRunner().invoke(main, [str(inp), "--engine", str(engine), "--output", str(out), *extra])
        return result, (json.loads(out.read_text()) if out.exists() else None)

    return run
