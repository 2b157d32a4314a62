"""scripts/gpu_kernel_check.py (the prepared GPU run for the Triton sampler) in its CPU interpreter
mode, so the script cannot rot before a GPU is lent."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def test_interpret_mode_runs_and_reports(tmp_path):
    out = tmp_path / "kernel.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_kernel_check.py"), str(out), "--interpret",
                           "--cases", "1", "--reps", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["checks"] and not any(c["problems"] for c in report["checks"])
    assert all(t["same_tokens_as_ort"] for t in report["timings"])
