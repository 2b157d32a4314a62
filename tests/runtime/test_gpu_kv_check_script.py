"""scripts/gpu_kv_check.py (the device KV cache against the host one, for a CUDA GPU) on the
cuda-python stand-in, so the script cannot rot before a GPU is lent; a broken device op fails it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_kv_check", ROOT / "scripts" / "gpu_kv_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_kv_matches_host_kv_on_the_stand_in(tmp_path):
    out = tmp_path / "kv.json"
    assert load_script().main([str(out), "--fake", "--ops", "200"]) == 0
    report = json.loads(out.read_text())
    assert [r["kv_dtype"] for r in report["results"]] == ["float32", "float16", "bfloat16", "int8"]
    assert all(r["reads"] > 40 and not r["problems"] for r in report["results"])


def test_a_device_op_gone_wrong_is_reported(tmp_path, monkeypatch):
    """The wrong variant: beam search's copies without the scratch buffer (a destination written
    before another copy reads it as its source) must show as differences."""
    from trtllm.runtime.backends.tensorrt import DeviceKVCache

    def direct(self, dst, src, start, stop):
        for b, heads, cap, dim, size in self.layers():
            pitch, width, offset = cap * dim * self.itemsize, (stop - start) * dim * self.itemsize, start * dim * self.itemsize
            for d, s in zip(dst, src):
                self.stream.copy_2d(b.ptr + int(d) * size + offset, pitch,
                                    b.ptr + int(s) * size + offset, pitch, width, heads, "d2d")

    monkeypatch.setattr(DeviceKVCache, "copy_positions", direct)
    out = tmp_path / "kv.json"
    assert load_script().main([str(out), "--fake", "--ops", "200"]) == 1
    assert any(r["problems"] for r in json.loads(out.read_text())["results"])
