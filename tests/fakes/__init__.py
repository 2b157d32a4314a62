"""Stand-ins for TensorRT and cuda-python (tests/fakes/tensorrt, tests/fakes/cuda), used by the
TensorRT backend's tests on machines without either. `installed()` puts them on the import path
for the duration of a block and removes every trace after, so other tests still see no TensorRT."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

FAKES = Path(__file__).resolve().parent
MODULES = ("tensorrt", "cuda")


def _drop_modules() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] in MODULES]:
        del sys.modules[name]


@contextmanager
def installed(**env: str):
    """`with installed(FAKE_TRT_VERSION="10.3.0.30"):` imports of tensorrt / cuda get the fakes."""
    old_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _drop_modules()
    sys.path.insert(0, str(FAKES))
    try:
        yield
    finally:
        sys.path.remove(str(FAKES))
        _drop_modules()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
