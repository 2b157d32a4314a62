"""The runtime must run on a device with only numpy, tokenizers, jinja2 and onnxruntime:
each runtime module (its backends included) is imported in a fresh interpreter, which must not
load torch, transformers or onnx. And the runtime never imports the builder."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import trtllm.runtime

FORBIDDEN = ("torch", "transformers", "onnx", "trtllm.builder", "tensorrt")
MODULES = sorted(
    m.name for m in pkgutil.walk_packages(trtllm.runtime.__path__, prefix="trtllm.runtime.")
    if not m.name.endswith("__main__")  # runs the CLI
) + ["trtllm.runtime", "trtllm.plugins.sample.reference", "trtllm.plugins.sample.schema"]


def heavy_modules_loaded_by(module: str, path: list[str] = ()) -> str:
    """The forbidden modules that importing `module` in a fresh interpreter loads, comma-separated."""
    code = (
        "import sys, importlib\n"
        f"sys.path[:0] = {list(path)!r}\n"
        f"importlib.import_module({module!r})\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r} or "
        f"any(m == f or m.startswith(f + '.') for f in {FORBIDDEN!r}))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_backends_are_checked():
    assert {"trtllm.runtime.backends.onnxruntime", "trtllm.runtime.backends.tensorrt",
            "trtllm.runtime.backends.cuda"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_runtime_module_imports_without_heavy_libraries(module):
    bad = heavy_modules_loaded_by(module)
    assert bad == "", f"{module} loaded {bad}"


def test_the_check_catches_a_heavy_import(tmp_path):
    """Deliberately wrong variant: the same check on a module that pulls in onnx must report it."""
    (tmp_path / "heavy_module.py").write_text("import onnx\n")
    assert "onnx" in heavy_modules_loaded_by("heavy_module", [str(tmp_path)]).split(",")
