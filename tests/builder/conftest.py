"""Fixtures of the builder's tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def untied_llama(tmp_path_factory):
    """A tiny Llama checkpoint with its own lm_head (written as GGUF files by tests/gguf_files.py)."""
    from tests.tiny_models import make_checkpoint

    return make_checkpoint("llama", tmp_path_factory.mktemp("gguf-src"), tie=False)
