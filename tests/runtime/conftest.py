"""Fixtures of the runtime tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def eagle_engine(tiny_checkpoint, tmp_path_factory):
    """(engine dir, draft head dir) of test_eagle_cli.py and test_eagle_forms.py: built once."""
    from tests.runtime.eagle_cli import build_engine

    return build_engine(tiny_checkpoint, tmp_path_factory)
