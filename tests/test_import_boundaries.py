"""The runtime must run on a device with only numpy, tokenizers, jinja2 and onnxruntime:
each runtime module is imported in a fresh interpreter, which must not load torch,
transformers or onnx. And the runtime never imports the builder."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import trtllm.runtime

FORBIDDEN = ("torch", "transformers", "onnx", "trtllm.builder", "tensorrt")
MODULES = sorted(
    f"trtllm.runtime.{m.name}" for m in pkgutil.walk_packages(trtllm.runtime.__path__, prefix="")
    if m.name != "__main__"  # runs the CLI
) + ["trtllm.runtime", "trtllm.plugins.sample.reference", "trtllm.plugins.sample.schema"]


@pytest.mark.parametrize("module", MODULES)
def test_runtime_module_imports_without_heavy_libraries(module):
    code = (
        "import sys, importlib\n"
        f"importlib.import_module({module!r})\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or "
        f"any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} loaded {out.stdout.strip()}"


def test_the_check_catches_a_heavy_import():
    """Deliberately wrong variant: a module that pulls in onnx must be reported."""
    code = "import sys, onnx\nprint('onnx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
