"""scripts/bench_moe.py reads llama.cpp's own tools' output into the figures scripts/bench.py pairs
(the tools themselves are not run here: canned output of the shape they print)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import bench_moe  # noqa: E402

PROMPT = json.dumps([{"n_prompt": 128, "n_gen": 0, "avg_ts": 256.0}, {"n_prompt": 512, "n_gen": 0, "avg_ts": 200.0}])
DECODE = json.dumps([{"n_prompt": 0, "n_gen": 64, "n_depth": 128, "avg_ts": 31.5}])
BATCHED = "main: n_kv_max = 2048\n" + json.dumps({"pp": 128, "tg": 64, "pl": 8, "speed_tg": 80.25, "speed_pp": 300.0})


def test_llama_cpp_figures_are_read_as_ours_are_given(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, timeout, env=None):
        calls.append((cmd, env))
        out = BATCHED if "llama-batched-bench" in cmd[0] else PROMPT if "128,512" in cmd else DECODE
        return out, 0, 100.0

    monkeypatch.setattr(bench_moe.bench, "run_measured", fake_run)
    args = SimpleNamespace(threads=2, runs=3, gen=64, timeout=60, llama_libs=tmp_path / "noamx")
    res = bench_moe.measure_llama("llamacpp-q4_1", tmp_path, tmp_path / "bin", args)
    assert res == {"peer": "llamacpp-q4_1", "precision": "int4", "ttft128_ms": 500.0, "ttft512_ms": 2560.0,
                   "dec_b1_tps": 31.5, "dec_b8_tps": 80.2, "peak_rss_mb": 100.0}
    # every tool loads the libraries of the build without AMX; decode is timed after a 128-token context
    assert all(env["LD_LIBRARY_PATH"] == str(tmp_path / "noamx") for _, env in calls)
    assert any(cmd[-4:] == ["-n", "64", "-d", "128"] for cmd, _ in calls)


def test_output_it_cannot_read_is_an_error_not_a_figure(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_moe.bench, "run_measured", lambda cmd, timeout, env=None: ("Segmentation fault", 139, 1.0))
    args = SimpleNamespace(threads=2, runs=1, gen=8, timeout=60, llama_libs=tmp_path)
    res = bench_moe.measure_llama("llamacpp-f32", tmp_path, tmp_path, args)
    assert "error" in res and "ttft128_ms" not in res
