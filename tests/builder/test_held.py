"""A 16-bit checkpoint held in its type (builder/held.py) is the float32 model to everything the build
computes with it: transformers' logits bit for bit, and every weight the graph writer reads."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.tiny_models import ARCHS, make_checkpoint
from trtllm.builder import checkpoint as ckpt
from trtllm.builder import export, held
from trtllm.builder.architectures import spec_for, weights_of
from trtllm.builder.config import BuildConfig

IDS = torch.tensor([[1, 5, 9, 20, 33, 7, 2, 11, 40, 3, 8, 15]])


def sixteen_bit(arch: str, out_dir, dtype=torch.bfloat16, **options):
    """A tiny `arch` checkpoint saved in `dtype` (as most releases are)."""
    path = make_checkpoint(arch, out_dir, **options)
    AutoModelForCausalLM.from_pretrained(path, dtype=dtype).save_pretrained(path)
    return path


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_the_held_model_computes_as_the_float32_one(arch, tmp_path):
    path = sixteen_bit(arch, tmp_path)
    wide, kept = ckpt.load(str(path)), ckpt.load(str(path), hold=True)
    assert wide.held is None and kept.held == "bfloat16"
    # (held as transformers' 16-bit load holds it: a class's float32 modules stay so, ERNIE 4.5 MoE's router
    # and AFMoE's expert_bias)
    native = {p.dtype for p in AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).parameters()}
    assert {p.dtype for p in kept.model.parameters()} == native and torch.bfloat16 in native
    assert torch.equal(logits(kept.model), logits(wide.model))
    assert {p.dtype for p in kept.model.parameters()} == native  # (each given back after its forward)
    spec = spec_for(wide.model)
    want, got = weights_of(wide.model, spec), weights_of(kept.model, spec_for(kept.model))
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == np.float32 and np.array_equal(got[name], want[name]), name
        assert got.shape(name) == want[name].shape, name  # (read without widening where the entry knows it)


def test_without_its_buffers_made_in_float32_a_held_model_computes_otherwise(tmp_path, monkeypatch):
    """The wrong variant: Gemma 4's per-layer scalars, loaded as the 16-bit type made them, move its logits."""
    path = sixteen_bit("gemma4", tmp_path)
    monkeypatch.setattr(held, "float32_buffers", lambda model, dtype: None)
    assert not torch.equal(logits(ckpt.load(str(path), hold=True).model), logits(ckpt.load(str(path)).model))


def test_float16_is_held_too_and_float32_weights_the_16_bit_load_would_round_are_not(tmp_path):
    path = sixteen_bit("llama", tmp_path / "half", torch.float16)
    assert held.held_dtype(path) == (torch.float16, [])
    assert ckpt.load(str(path), hold=True).held == "float16"
    wide = make_checkpoint("llama", tmp_path / "wide")
    assert held.held_dtype(wide) == (None, []) and ckpt.load(str(wide), hold=True).held is None
    model = AutoModelForCausalLM.from_pretrained(wide, dtype=torch.bfloat16)
    model.model.norm.weight.data = model.model.norm.weight.data.float()  # (a float32 norm: the 16-bit load rounds it)
    shutil.copytree(wide, tmp_path / "mixed")
    model.save_pretrained(tmp_path / "mixed")
    assert held.held_dtype(tmp_path / "mixed") == (torch.bfloat16, ["model.norm.weight"])
    mixed = ckpt.load(str(tmp_path / "mixed"), hold=True)
    assert mixed.held is None and mixed.model.model.norm.weight.dtype == torch.float32
    assert torch.equal(mixed.model.model.norm.weight, model.model.norm.weight)


def built(path, out, monkeypatch, hold: bool, **options):
    if not hold:
        load = ckpt.load
        monkeypatch.setattr(ckpt, "load", lambda arg, hold=False: load(arg))
    said = []
    engine = export.build(BuildConfig(model=str(path), output=str(out), max_batch_size=1, max_input_len=32,
                                      max_kv_cache_capacity=64, **options), log=said.append)
    monkeypatch.undo()
    return engine, said


@pytest.mark.parametrize("arch,options", [("llama", {"quantization": "int4", "verify": False}),
                                          ("phi3", {}), ("gemma3", {"dtype": "bfloat16"}),
                                          ("qwen3_moe", {"quantization": "int8", "verify": False})])
def test_a_held_build_writes_the_float32_build_s_engine(arch, options, tmp_path, monkeypatch):
    """The same graphs and data files, byte for byte, and its check passes (a tiny random model's
    quantized logits are too near one another for the check's agreement floor: those are compared
    unchecked)."""
    path = sixteen_bit(arch, tmp_path / "ckpt")
    kept, said = built(path, tmp_path / "kept", monkeypatch, True, **options)
    wide, _ = built(path, tmp_path / "wide", monkeypatch, False, **options)
    assert any("holding the checkpoint's bfloat16 weights" in line for line in said)
    if options.get("verify", True):
        report = json.loads((kept / "verify.json").read_text())
        assert report["tokens_agree"] and report["mismatches"] <= report["allowed_mismatches"]
    files = sorted(p.name for p in wide.iterdir() if p.name.startswith("llm."))
    assert files == sorted(p.name for p in kept.iterdir() if p.name.startswith("llm.")) and files
    for name in files:
        assert (kept / name).read_bytes() == (wide / name).read_bytes(), name


@pytest.mark.parametrize("arch,tie,options", [("llama", True, {"quantization": "int4", "verify": False}),
                                              ("llama", False, {"quantization": "int8", "verify": False}),
                                              ("llama", False, {}),
                                              ("gemma3", True, {"dtype": "bfloat16"}),
                                              ("gemma4", False, {"quantization": "int4", "verify": False}),
                                              ("qwen3_moe", True, {"quantization": "int8", "verify": False}),
                                              ("qwen3_moe", True, {"dtype": "bfloat16", "verify": False})])
def test_a_held_build_widens_its_tables_a_slice_at_a_time(arch, tie, options, tmp_path, monkeypatch):
    """The token tables and the lm_head (Gemma 4's per-layer table too) are quantized or converted a few
    rows at a time, and a mixture's stacked experts one expert at a time, each slice widened alone,
    never the whole table in float32; the engine is the float32 build's, byte for byte."""
    from trtllm.builder import quantize

    path = sixteen_bit(arch, tmp_path / "ckpt", tie=tie)
    wide, _ = built(path, tmp_path / "wide", monkeypatch, False, **options)
    whole, sliced = [], []
    widen, rows = ckpt.Widened.__call__, ckpt.Widened.__getitem__
    monkeypatch.setattr(ckpt.Widened, "__call__", lambda self: whole.append(self.shape) or widen(self))
    monkeypatch.setattr(ckpt.Widened, "__getitem__", lambda self, at: sliced.append(self.shape) or rows(self, at))
    monkeypatch.setattr(quantize, "SLICE_BYTES", 4096)  # (a few rows of a tiny table)
    config = json.loads((path / "config.json").read_text())
    tables = {(config["vocab_size"], config["hidden_size"])}
    if arch == "gemma4":
        tables.add((config["vocab_size_per_layer_input"], config["num_hidden_layers"] *
                    config["hidden_size_per_layer_input"]))
    if arch == "qwen3_moe":  # gate|up and down, stacked
        e, h, inner = config["num_local_experts"], config["hidden_size"], config["moe_intermediate_size"]
        tables |= {(e, 2 * inner, h), (e, h, inner)}
    kept = export.build(BuildConfig(model=str(path), output=str(tmp_path / "kept"), max_batch_size=1,
                                    max_input_len=32, max_kv_cache_capacity=64, **options), log=lambda line: None)
    monkeypatch.undo()
    assert not tables & set(whole), whole
    assert tables <= set(sliced) and len(sliced) > 2 * len(tables)
    files = sorted(p.name for p in wide.iterdir() if p.name.startswith("llm."))
    for name in files:
        assert (kept / name).read_bytes() == (wide / name).read_bytes(), name


def test_slices_of_rows_give_the_whole_array_s_values(monkeypatch):
    """in_slices (converted, or transposed too) and quantize_rows (packed for our kernels too), a few rows at
    a time, give what the whole array gives: every float type's rounding, infinities, NaN and subnormals
    included."""
    import ml_dtypes

    from trtllm.builder import quantize

    monkeypatch.setattr(quantize, "SLICE_BYTES", 1000)
    a = (np.random.default_rng(0).standard_normal((301, 96)) * 1e3).astype(np.float32)
    a[0, :5] = [np.inf, -np.inf, np.nan, 1e-40, 65519.0]
    held = ckpt.Widened(torch.from_numpy(a).to(torch.bfloat16))
    for rows, whole in ((a, a), (held, held())):
        for dtype in (ml_dtypes.bfloat16, np.float16, np.float32):
            for transposed in (False, True):
                with np.errstate(over="ignore"):  # (65,536 as float16: infinity, both ways)
                    got = quantize.in_slices(rows, dtype, transposed)
                    want = (whole.T if transposed else whole).astype(dtype)
                assert got.flags.c_contiguous and got.dtype == want.dtype and got.tobytes() == want.tobytes()
    b = a[1:288]  # (no infinities: blocks of 32 inputs)
    for scheme in (quantize.QuantScheme(4, asymmetric=True), quantize.QuantScheme(8)):
        whole = quantize.quantize_columns(b.T, scheme)
        for got, want in zip(quantize.quantize_rows(b, scheme), whole):
            assert (got is None and want is None) or np.array_equal(got, want)
        for got, want in zip(quantize.quantize_rows(b, scheme, packed=True), quantize.pack_rows(*whole, scheme.bits)):
            assert (got is None and want is None) or (got.dtype == want.dtype and np.array_equal(got, want))


def test_the_estimate_of_a_held_build_is_its_own(tmp_path, monkeypatch):
    """1.8x the float32 weights, held: 1.5x for a float32 engine, 1.1x for another (build_memory)."""
    from trtllm.builder import build_memory

    path = sixteen_bit("llama", tmp_path)
    monkeypatch.setattr(build_memory, "parameters_in", lambda arg: 10**9)
    monkeypatch.setattr(build_memory, "BASE_BYTES", 0)
    monkeypatch.setattr(build_memory, "available_memory", lambda: 1 << 40)
    lines = []
    for hold, wide in ((False, True), (True, True), (True, False)):
        build_memory.memory_note(str(path), lines.append, hold, float32_engine=wide)
    assert [line.rsplit("about ", 1)[1] for line in lines] == ["6.7 GB of memory", "5.6 GB of memory",
                                                                "4.1 GB of memory"]


def vision_checkpoint(family: str, out_dir):
    """A tiny vision-language checkpoint of `family`, saved in bfloat16."""
    from transformers import AutoModelForImageTextToText

    from tests.tiny_gemma3 import make_gemma3_checkpoint
    from tests.tiny_gemma4 import make_gemma4_vl_checkpoint
    from tests.tiny_idefics3 import make_idefics3_checkpoint
    from tests.tiny_qwen_vl import make_qwen_vl_checkpoint
    from tests.tiny_vlm import make_vlm_checkpoint

    path = {"internvl": make_vlm_checkpoint, "qwen2_5_vl": make_qwen_vl_checkpoint,
            "qwen3_vl": lambda out: make_qwen_vl_checkpoint(out, kind="qwen3_vl"),
            "idefics3": make_idefics3_checkpoint, "gemma3": make_gemma3_checkpoint,
            "gemma4": make_gemma4_vl_checkpoint}[family](out_dir)
    AutoModelForImageTextToText.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["internvl", "qwen2_5_vl", "qwen3_vl", "idefics3", "gemma3", "gemma4"])
def test_a_held_vision_language_build_writes_and_checks_as_the_float32_one(family, tmp_path, monkeypatch):
    """Its language model held, its encoders widened (held.loaded): the same engine files byte for byte,
    and its check (the vision graph's too) measures the same errors, so transformers' side is the same."""
    path = vision_checkpoint(family, tmp_path / "ckpt")
    kept, said = built(path, tmp_path / "kept", monkeypatch, True)
    wide, _ = built(path, tmp_path / "wide", monkeypatch, False)
    assert any("holding the checkpoint's bfloat16 weights" in line for line in said)
    files = sorted(p.name for p in wide.iterdir() if p.suffix in (".onnx", ".data") or p.name.endswith(".onnx.data"))
    assert files == sorted(p.name for p in kept.iterdir() if p.suffix in (".onnx", ".data")
                           or p.name.endswith(".onnx.data")) and any(n.startswith("vision") for n in files)
    for name in files:
        assert (kept / name).read_bytes() == (wide / name).read_bytes(), name
    report, want = (json.loads((e / "verify.json").read_text()) for e in (kept, wide))
    assert report == want and "vision" in report


def test_held_builds_with_a_lora_adapter_and_an_eagle_head_are_the_float32_ones(tmp_path, monkeypatch):
    """A bundled adapter's check merges it into a float32 copy (held.widened), and the EAGLE reference
    widens the embedding rows it reads: the same engine files and the same report (the adapter's and
    the EAGLE check's figures included). The head's graph takes the target's table a slice at a time."""
    from tests.eagle_drafts import random_draft
    from tests.runtime.test_lora_cli import random_adapter
    from trtllm.runtime import manifest as mf

    path = sixteen_bit("llama", tmp_path / "ckpt", num_layers=6)  # (EAGLE-3's default layers: [2, L/2, L-3])
    probe, _ = built(path, tmp_path / "probe", monkeypatch, True, max_lora_rank=4, verify=False)
    random_adapter(tmp_path / "math", mf.load(probe), 4, seed=3)
    draft = random_draft(path, tmp_path / "draft")
    table = tuple(json.loads((path / "config.json").read_text())[k] for k in ("vocab_size", "hidden_size"))
    for options in ({"lora": (("math", str(tmp_path / "math")),)}, {"eagle": str(draft)}):
        whole, widen = [], ckpt.Widened.__call__
        monkeypatch.setattr(ckpt.Widened, "__call__", lambda self: whole.append(self.shape) or widen(self))
        kept, said = built(path, tmp_path / "kept", monkeypatch, True, **options)
        assert table not in whole, whole
        wide, _ = built(path, tmp_path / "wide", monkeypatch, False, **options)
        assert any("holding the checkpoint's bfloat16 weights" in line for line in said)
        files = sorted(str(p.relative_to(wide)) for p in wide.rglob("*") if ".onnx" in p.name)
        assert files == sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if ".onnx" in p.name) and files
        for name in files:
            assert (kept / name).read_bytes() == (wide / name).read_bytes(), name
        report, want = (json.loads((e / "verify.json").read_text()) for e in (kept, wide))
        assert report == want and ("adapters" in report or "eagle" in report), report
        shutil.rmtree(kept), shutil.rmtree(wide)
