"""What keeps a build's memory down: the graph writer puts each weight in the data file as it makes
it (GraphWriter.store_in), and the build lets transformers' model go once transformers' side of its
check is computed, before ONNX Runtime's session or TensorRT's builder comes (build_check.py)."""
from __future__ import annotations

import gc
import json
import weakref

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

from trtllm.builder import build_memory, export
from trtllm.builder import checkpoint as ckpt
from trtllm.builder.config import BuildConfig
from trtllm.builder.graph import EXTERNAL_BYTES, PAGE, GraphWriter

WEIGHTS = {  # every kind a graph holds: float tables, 16-bit, packed 4-bit codes, int8, small constants
    "table": np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32),
    "half": np.random.default_rng(1).standard_normal((40, 32)).astype(np.float16),
    "brain": np.random.default_rng(2).standard_normal((40, 32)).astype(ml_dtypes.bfloat16),
    "codes": np.random.default_rng(3).integers(-8, 8, (64, 48)).astype(ml_dtypes.int4),
    "bytes": np.random.default_rng(4).integers(-128, 128, (64, 48)).astype(np.int8),
    "large": np.random.default_rng(5).standard_normal((520, 512)).astype(np.float32),  # (past ALIGN_BYTES)
    "small": np.arange(5, dtype=np.int64),
    "scalar": np.array(2.5, np.float32),
}


def written(tmp_path, stored: bool) -> onnx.ModelProto:
    g = GraphWriter("weights")
    g.weight("table", WEIGHTS["table"])  # (held before store_in: written out by it)
    if stored:
        g.store_in(tmp_path / "m.onnx")
    for name, array in WEIGHTS.items():
        if name != "table":
            g.weight(name, array)
    g.output("table", TensorProto.FLOAT, [64, 48])
    return g.model("test")


def test_stored_weights_are_in_the_data_file_and_read_back_as_written(tmp_path):
    model = written(tmp_path, stored=True)
    large = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert {t.name for t in large} == {"table", "half", "brain", "codes", "bytes", "large"}
    assert not any(t.HasField("raw_data") for t in large)  # (the writer holds none of their bytes)
    inline = {t.name for t in model.graph.initializer if t.data_location != TensorProto.EXTERNAL}
    assert inline == {"small", "scalar"} and all(WEIGHTS[n].nbytes < EXTERNAL_BYTES for n in inline)
    offsets = {t.name: int({e.key: e.value for e in t.external_data}["offset"]) for t in large}
    assert offsets["large"] % PAGE == 0 and offsets["large"] > 0  # (where ONNX Runtime maps it, not copies it)
    export.save(model, tmp_path, "m.onnx")
    back = onnx.load(str(tmp_path / "m.onnx"))
    for t in back.graph.initializer:
        got, want = numpy_helper.to_array(t), WEIGHTS[t.name]
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got.astype(np.float32), want.astype(np.float32)), t.name
    assert np.array_equal(ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {})[0], WEIGHTS["table"])


def test_a_graph_written_as_before_is_the_same_graph(tmp_path):
    """The same model saved the old way (held whole, made external by onnx.save_model) reads back the same."""
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    export.save(written(tmp_path / "old", stored=False), tmp_path / "old", "m.onnx")
    export.save(written(tmp_path / "new", stored=True), tmp_path / "new", "m.onnx")
    old, new = (onnx.load(str(tmp_path / d / "m.onnx")) for d in ("old", "new"))
    assert len(old.graph.initializer) == len(new.graph.initializer) == len(WEIGHTS)
    for a, b in zip(old.graph.initializer, new.graph.initializer):
        assert a.name == b.name and a.data_type == b.data_type and list(a.dims) == list(b.dims)
        assert numpy_helper.to_array(a).tobytes() == numpy_helper.to_array(b).tobytes(), a.name


def build_watching(tmp_path, tiny_checkpoint, monkeypatch) -> dict:
    """Build the tiny llama, noting whether transformers' model was still alive when the engine was compiled."""
    seen, loaded = {}, []
    load, compile_onnxruntime = ckpt.load, export.compile_onnxruntime

    def load_noted(*args, **kwargs):
        ck = load(*args, **kwargs)
        loaded.append(weakref.ref(ck.model))
        return ck

    def compile_noted(*args, **kwargs):
        gc.collect()
        seen["alive"] = loaded[0]() is not None
        return compile_onnxruntime(*args, **kwargs)

    monkeypatch.setattr(ckpt, "load", load_noted)
    monkeypatch.setattr(export, "compile_onnxruntime", compile_noted)
    out = export.build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "engine"),
                                   max_batch_size=1, max_input_len=32, max_kv_cache_capacity=64), log=lambda m: None)
    seen["report"] = json.loads((out / "verify.json").read_text())
    return seen


def test_the_model_is_gone_when_the_engine_is_compiled(tmp_path, tiny_checkpoint, monkeypatch):
    """The check still passes on transformers' side computed before (the engine fed its greedy tokens)."""
    seen = build_watching(tmp_path, tiny_checkpoint, monkeypatch)
    assert seen["alive"] is False
    assert seen["report"]["tokens_agree"] and seen["report"]["max_abs_error"] < 1e-4


def test_without_letting_it_go_the_model_is_still_there(tmp_path, tiny_checkpoint, monkeypatch):
    """The wrong variant: the build keeping its model is seen by the test above's probe."""
    monkeypatch.setattr(export, "let_model_go", lambda ck: None)
    assert build_watching(tmp_path, tiny_checkpoint, monkeypatch)["alive"] is True


def test_a_near_miss_loads_the_model_again_for_float64(tmp_path, tiny_checkpoint, monkeypatch):
    """The model let go, a near miss's float64 opinion comes from the checkpoint loaded again."""
    from trtllm.builder import verify

    monkeypatch.setattr(verify, "near_miss", lambda *a: True)
    loads = []
    load = ckpt.load
    monkeypatch.setattr(ckpt, "load", lambda *a, **k: loads.append(a) or load(*a, **k))
    out = export.build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "engine"),
                                   max_batch_size=1, max_input_len=32, max_kv_cache_capacity=64), log=lambda m: None)
    wide = json.loads((out / "verify.json").read_text())["float64"]
    assert len(loads) == 2 and wide["max_abs_error"] < 1e-4 and wide["transformers_float32_error"] < 1e-4


def test_letting_go_drops_the_model_the_whole_model_and_the_grids():
    ck = ckpt.Checkpoint(model=object(), tokenizer=None, source={}, grids={"w": 1}, vision=object())
    build_memory.let_model_go(ck)
    assert (ck.model, ck.vision, ck.grids) == (None, None, None)


def test_the_build_says_its_peak_memory(tmp_path, tiny_checkpoint):
    import re

    from click.testing import CliRunner

    from trtllm.builder.cli import main, peak_memory_gb

    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "e")])
    said = re.search(r"engine written to .* \(the build's peak memory: ([0-9.]+) GB\)", result.output)
    assert result.exit_code == 0 and said, result.output
    assert 0.05 < float(said.group(1)) <= peak_memory_gb() + 0.005  # (this process's, to 2 decimals: it built)


def test_the_estimate_counts_the_checkpoint_s_weights_from_its_headers(tiny_checkpoint):
    """parameters_in reads the safetensors headers alone: the count transformers' model has (a tied lm_head
    is stored once), and nothing where the files do not say (a GGUF, a missing directory)."""
    ck = ckpt.load(str(tiny_checkpoint("llama")))
    stored = {id(p): p.numel() for p in ck.model.parameters()}  # (shared parameters once)
    assert build_memory.parameters_in(str(tiny_checkpoint("llama"))) == sum(stored.values())
    assert build_memory.parameters_in("/nonexistent") is None


def test_a_machine_short_of_memory_is_warned_before_the_model_loads(tiny_checkpoint, monkeypatch):
    lines = []
    monkeypatch.setattr(build_memory, "available_memory", lambda: 1 << 20)
    build_memory.memory_note(str(tiny_checkpoint("llama")), lines.append)
    assert lines[0].startswith("warning: ") and "may be killed when memory runs out" in lines[0]
    monkeypatch.setattr(build_memory, "available_memory", lambda: 1 << 40)  # the wrong variant: plenty there
    build_memory.memory_note(str(tiny_checkpoint("llama")), lines.append)
    assert lines[1].startswith("note: ") and "the build takes about 0.3 GB of memory" in lines[1]


def test_packed_integer_weights_are_not_estimated(tmp_path):
    """A GPTQ checkpoint's int32 words hold 8 weights each: no estimate rather than a wrong one."""
    from safetensors.numpy import save_file

    save_file({"qweight": np.zeros((4, 8), np.int32), "scales": np.zeros((1, 8), np.float16)},
              str(tmp_path / "model.safetensors"))
    assert build_memory.parameters_in(str(tmp_path)) is None
