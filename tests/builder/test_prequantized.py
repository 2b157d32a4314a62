"""Checkpoints quantized before: GPTQ and AWQ (builder/prequantized.py) unpacked exactly into the
float model transformers runs and the engine is checked against, their 4-bit grid kept by
--quantization int4, and the layouts refused by name; a GGUF's 4-bit blocks, whose grid int4 finds
again (quantize.grid_steps)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder import checkpoint as ckpt  # noqa: E402
from trtllm.builder import prequantized  # noqa: E402
from trtllm.builder.cli import main  # noqa: E402
from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.quantize import QuantScheme, dequantize, quantize  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

from tests.prequantized_files import engine_weights, error_in_steps, write_prequantized  # noqa: E402

pytestmark = pytest.mark.hf

VARIANTS = {
    "gptq": dict(method="gptq"),  # symmetric, groups of 32
    "gptq-act-order": dict(method="gptq", act_order=True),  # groups of 32 over permuted inputs
    "gptq-8bit": dict(method="gptq", bits=8, group=64),
    "awq": dict(method="awq", sym=False),  # zero points, groups of 32
    "awq-g64": dict(method="awq", sym=False, group=64),
}
PROMPT = [5, 17, 42, 99, 7, 31, 8]


@pytest.fixture(scope="module")
def packed(tiny_checkpoint, tmp_path_factory):
    """packed(variant) -> (checkpoint dir, {weight name: the float weight it packs})."""
    made = {}

    def get(name: str):
        if name not in made:
            out = tmp_path_factory.mktemp(name) / "ckpt"
            made[name] = out, write_prequantized(tiny_checkpoint("llama"), out, **VARIANTS[name])
        return made[name]

    return get


def reference_model(tiny_checkpoint, weights: dict):
    """transformers' float tiny model with `weights` in place of its own."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama"), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, w in weights.items():
            model.get_parameter(name).copy_(torch.from_numpy(w))
    return model


def mismatched(model, reference: dict) -> list[str]:
    state = model.state_dict()
    return [name for name, w in reference.items() if not np.array_equal(state[name].numpy(), w)]


@pytest.mark.parametrize("name", VARIANTS)
def test_packed_projections_load_as_the_weights_they_stand_for(name, packed, tiny_checkpoint):
    """Every projection unpacks to scale * (q - zero) exactly, whatever the bits, group or act order;
    everything else is the float checkpoint's; no packed tensor is left over as unused."""
    path, reference = packed(name)
    ck = ckpt.load(str(path))
    assert len(reference) == 14 and mismatched(ck.model, reference) == []
    float_state = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama")).state_dict()
    for key, value in ck.model.state_dict().items():
        if key not in reference:
            assert torch.equal(value, float_state[key]), key
    assert ck.unused == ()
    assert ck.source["prequantized"] == {"method": VARIANTS[name]["method"], "bits": VARIANTS[name].get("bits", 4),
                                         "group_size": VARIANTS[name].get("group", 32)}


def test_awq_read_without_its_interleave_is_the_wrong_model(packed, monkeypatch):
    """The deliberately wrong variant: AWQ's words hold outputs 0 2 4 6 1 3 5 7; read in plain order,
    the same check must fail."""
    path, reference = packed("awq")
    monkeypatch.setattr(prequantized, "AWQ_ORDER", tuple(range(8)))
    assert len(mismatched(ckpt.load(str(path)).model, reference)) == len(reference)


def test_a_float_engine_of_a_gptq_checkpoint_is_transformers_on_its_weights(packed, tiny_checkpoint, tmp_path):
    """Built without --quantization (act order: int4 could not keep its grid), the engine computes
    transformers with the unpacked weights, at float32 tolerance; the build says so."""
    path, reference = packed("gptq-act-order")
    said = []
    out = build(BuildConfig(model=str(path), output=str(tmp_path / "e"), max_input_len=64,
                            max_kv_cache_capacity=128), log=said.append)
    assert any("the GPTQ 4-bit checkpoint (group size 32) is built with float weights" in m and
               "would quantize them again from those weights (act order" in m for m in said), said
    generated, got = engine_logits(load_engine(out), PROMPT, num_decode=4)
    with torch.no_grad():
        ref = reference_model(tiny_checkpoint, reference)(torch.tensor([PROMPT + generated[:-1]])).logits
    np.testing.assert_allclose(got, ref[0, len(PROMPT) - 1:].numpy(), atol=1e-4, rtol=0)
    assert json.loads((out / "manifest.json").read_text())["source"]["prequantized"]["method"] == "gptq"


@pytest.mark.parametrize("name", ["gptq", "awq-g64"])
def test_int4_keeps_the_checkpoints_codes_and_scales(name, packed, tiny_checkpoint, tmp_path, monkeypatch):
    """--quantization int4 takes each projection's codes and scales as the checkpoint has them (only
    a block's minimum may move, by a fraction of a float16 step, so that it and its offset are float16
    values: AWQ's zero points): the engine's weights are the checkpoint's within 1/50 of a step,
    where quantizing the float weights again with their blocks' minimum and maximum (without looking
    for the grid they lie on: quantize.grid_steps) is off by up to half a step. Its logits are
    transformers' on the weights it holds (the int8 embedding and lm_head in the engine's rounding)."""
    path, reference = packed(name)
    said = []
    out = build(BuildConfig(model=str(path), output=str(tmp_path / "e"), quantization="int4", max_input_len=64,
                            max_kv_cache_capacity=128, verify=False), log=said.append)
    assert any("int4 keeps its codes and scales for 14 of 14 packed projections" in m for m in said), said
    scheme = QuantScheme.named("int4")
    held = engine_weights(out, reference)
    kept_error = error_in_steps(held, reference)
    from trtllm.builder import quantize as quantize_module

    monkeypatch.setattr(quantize_module, "quantized_before", lambda *args: False)
    again = {k: dequantize(*quantize(w.T.copy(), scheme), 32).T for k, w in reference.items()}
    again_error = error_in_steps(again, reference)
    assert kept_error < 0.02 and again_error > 0.2, (kept_error, again_error)
    if name == "gptq":  # symmetric: every minimum, -8 scale, is a float16 value already
        assert all(np.array_equal(held[k], reference[k]) for k in reference)
    embed = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama")).model.embed_tokens.weight
    rounded = dequantize(*quantize(embed.detach().numpy().T.copy(), scheme.for_lm_head()), 32).T.copy()
    model = reference_model(tiny_checkpoint, {**held, "model.embed_tokens.weight": rounded})
    generated, got = engine_logits(load_engine(out), PROMPT, num_decode=4)
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT + generated[:-1]])).logits[0, len(PROMPT) - 1:].numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)


def test_int4_quantizes_an_act_order_checkpoint_again_and_says_why(packed, tmp_path):
    path, _ = packed("gptq-act-order")
    said = []
    build(BuildConfig(model=str(path), output=str(tmp_path / "e"), quantization="int4", max_input_len=64,
                      max_kv_cache_capacity=128, verify=False), log=said.append)
    assert any("quantized again to int4 from their exact float weights (act order" in m for m in said), said


@pytest.mark.parametrize("variant, extra, needle", [
    ("gptq", {"bits": 3}, "config.quantization_config.bits is 3; a GPTQ checkpoint is read with 4 or 8"),
    ("gptq", {"checkpoint_format": "gptq_v2"}, "config.quantization_config.checkpoint_format is 'gptq_v2'"),
    ("awq", {"version": "gemv"}, "config.quantization_config.version is 'gemv'"),
    ("awq", {"zero_point": False}, "config.quantization_config.zero_point is False"),
    ("gptq", {"group_size": 0}, "config.quantization_config.group_size is 0"),
    ("gptq", {"format": "gptq_v2", "checkpoint_format": None}, "config.quantization_config.format is 'gptq_v2'"),  # transformers' newer name
    ("awq", {"format": "gemv", "version": None}, "config.quantization_config.format is 'gemv'"),
    ("awq", {"backend": "llm-awq"}, "config.quantization_config.backend is 'llm-awq'"),
    ("gptq", {"group_size": 64}, "GPTQ tensors of another layout than quantization_config says (bits 4, group_size 64)"),
    ("gptq", {"group_size": 64}, "model.layers.0.mlp.down_proj.qzeros [4, 8] (expected [2, 8])"),  # as stored
])
def test_a_layout_it_does_not_read_is_refused_by_name(variant, extra, needle, tiny_checkpoint, tmp_path):
    path = tmp_path / "ckpt"
    write_prequantized(tiny_checkpoint("llama"), path, **VARIANTS[variant], config_extra=extra)
    result = CliRunner().invoke(main, ["--model", str(path), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and needle in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "e").exists()


def test_a_projection_without_its_zeros_is_refused(tiny_checkpoint, tmp_path):
    from safetensors.numpy import load_file, save_file

    path = tmp_path / "ckpt"
    write_prequantized(tiny_checkpoint("llama"), path, method="gptq")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.qzeros"]
    save_file(tensors, path / "model.safetensors")
    result = CliRunner().invoke(main, ["--model", str(path), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "a GPTQ projection lacks tensors: model.layers.1.mlp.down_proj.qzeros" \
        in result.output, result.output


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_an_older_repositorys_side_config_is_read(method, tiny_checkpoint, tmp_path):
    """Older AutoGPTQ and AutoAWQ repositories describe the packing in quantize_config.json or
    quant_config.json (AutoAWQ's w_bit, q_group_size, version "GEMM"), not in config.json."""
    path = tmp_path / "ckpt"
    reference = write_prequantized(tiny_checkpoint("llama"), path, method, sym=method == "gptq", side_file=True)
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    ck = ckpt.load(str(path))
    assert mismatched(ck.model, reference) == [] and ck.source["prequantized"]["method"] == method


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_projections_stored_whole_keep_their_grid_split(method, tiny_checkpoint, tmp_path):
    """Phi-3 stores q|k|v and gate|up whole: their grids are split by outputs as the weights are
    (the build writes q, k, v, gate and up), and int4 keeps every one; the engine verifies."""
    path = tmp_path / "ckpt"
    reference = write_prequantized(tiny_checkpoint("phi3"), path, method, sym=method == "gptq")
    assert any(name.endswith("qkv_proj.weight") for name in reference)
    said = []
    build(BuildConfig(model=str(path), output=str(tmp_path / "e"), quantization="int4", max_input_len=64,
                      max_kv_cache_capacity=128), log=said.append)
    assert any("int4 keeps its codes and scales for 14 of 14 packed projections" in m for m in said), said


def test_an_awq_slice_that_splits_its_words_keeps_the_codes():
    """AWQ packs 8 outputs a word: a part of a whole projection that starts or ends inside a word
    holds its codes unpacked."""
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, size=(64, 32))
    from tests.prequantized_files import pack_awq

    grid = prequantized.Grid("awq", 4, pack_awq(q), np.ones((2, 32), np.float32), np.full((2, 32), 8, np.int16),
                             np.arange(64) // 32)
    assert np.array_equal(grid.codes(), q)
    for start, stop in ((8, 24), (3, 13)):
        part = grid.columns(start, stop)
        assert np.array_equal(part.codes(), q[:, start:stop]) and (part.qweight is None) == (start % 8 != 0)


def test_int8_keeps_a_symmetric_8_bit_gptq_grid(packed, tmp_path):
    """An 8-bit GPTQ checkpoint (zero 128) under --quantization int8: codes q - 128 and the
    checkpoint's scales, so the engine's weights are the checkpoint's, but in a block holding -128
    (int8's codes span -127..127), which takes quantize()'s own. The float build says int8 keeps it."""
    from onnx import numpy_helper

    import onnx

    path, reference = packed("gptq-8bit")
    said = []
    build(BuildConfig(model=str(path), output=str(tmp_path / "f"), max_input_len=64, max_kv_cache_capacity=128,
                      verify=False), log=said.append)
    assert any("--quantization int8 would keep the codes and scales of 14 of its 14" in m for m in said), said
    said = []
    out = build(BuildConfig(model=str(path), output=str(tmp_path / "e"), quantization="int8", max_input_len=64,
                            max_kv_cache_capacity=128, verify=False), log=said.append)
    assert any("int8 keeps its codes and scales for 14 of 14 packed projections" in m for m in said), said
    init = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out / "llm.onnx")).graph.initializer}
    p = "model.layers.0.mlp.down_proj"
    codes, scale = init[f"{p}.weight_q8"], init[f"{p}.weight_scale"]
    held = dequantize(codes, scale, None, 32).T                            # [out, in]
    ref = reference[f"{p}.weight"]
    exact = (held == ref).reshape(ref.shape[0], -1, 32).all(axis=2)       # [out, blocks]
    assert exact.mean() > 0.5 and (np.abs(held - ref) <= np.repeat(scale.T, 32, axis=1) / 2 + 1e-7).all()
    plain = dequantize(*quantize(ref.T.copy(), QuantScheme.named("int8")), 32).T
    again = (plain == ref).reshape(ref.shape[0], -1, 32).all(axis=2)    # (only where a block reaches +-127)
    assert exact.mean() > again.mean() + 0.2, (exact.mean(), again.mean())


def test_a_q4_0_gguf_keeps_its_grid_under_int4(untied_llama, tmp_path, monkeypatch):
    """llama.cpp's Q4_0 is d * (q - 8) per block of 32: a block whose codes do not reach both 0 and
    15 lies on a grid that its minimum and maximum do not give. int4 finds each block's grid, so the
    engine holds the GGUF's weights within 1/50 of a step; with the minimum and maximum alone (the
    wrong variant) it was off by more than 1/5 (the demo model as Q4_0: 68% top-1, now 100%)."""
    from tests.gguf_files import write_llama_gguf
    from trtllm.builder import quantize as quantize_module

    path = write_llama_gguf(untied_llama, tmp_path / "m.gguf", weight_type="Q4_0")
    ck = ckpt.load(str(path))
    assert ck.source["tensor_types"]["Q4_0"] == 14
    reference = {k: v.numpy() for k, v in ck.model.state_dict().items() if k.endswith("_proj.weight")}
    out = build(BuildConfig(model=str(path), output=str(tmp_path / "e"), quantization="int4", max_input_len=64,
                            max_kv_cache_capacity=128, verify=False), log=lambda m: None)
    scheme = QuantScheme.named("int4")
    assert error_in_steps(engine_weights(out, reference), reference) < 0.02
    monkeypatch.setattr(quantize_module, "quantized_before", lambda *args: False)
    again = {k: dequantize(*quantize(w.T.copy(), scheme), 32).T for k, w in reference.items()}
    assert error_in_steps(again, reference) > 0.2


def test_an_int4_gguf_build_that_fails_its_check_names_the_wider_types():
    """A small model's Q4_K_M is mostly Q5_0 (the demo's: 88.7% top-1 under int4, the build fails):
    the failure says which of the GGUF's layer types hold more than 4 bits, and what to build instead.
    The source records only the layers' weights: llama-quantize's Q8_0 or Q6_K token_embd and output
    are int8 under int4 too, and a Q4_0 file (whose one Q8_0 tensor is token_embd) gets no hint."""
    from trtllm.builder.gguf import gguf_int4_hint

    source = {"kind": "gguf", "tensor_types": {"F32": 61, "Q4_K": 16, "Q5_0": 166, "Q6_K": 14}}
    assert gguf_int4_hint(source, "int4") == (
        "; the GGUF's Q5_0, Q6_K layer weights are not on int4's grid (more bits, two scales a block of 32, or "
        "uneven levels), and int4 rounds them again: --quantization int8 keeps them closer")
    assert gguf_int4_hint(source, "int8") == ""
    assert gguf_int4_hint({"tensor_types": {"Q4_0": 14}}, "int4") == ""
    # 4-bit types whose values are not one even grid a block of 32: non-uniform levels, 16-weight scales
    assert "IQ4_NL, IQ4_XS layer weights" in gguf_int4_hint({"tensor_types": {"IQ4_NL": 9, "IQ4_XS": 2}}, "int4")
    assert "Q3_K layer weights" in gguf_int4_hint({"tensor_types": {"Q4_0": 9, "Q3_K": 2}}, "int4")


def test_a_q8_0_embedding_is_not_counted_among_a_ggufs_layer_types(untied_llama, tmp_path):
    from tests.gguf_files import write_llama_gguf

    path = write_llama_gguf(untied_llama, tmp_path / "m.gguf", weight_type="Q4_0")
    assert ckpt.load(str(path)).source["tensor_types"] == {"Q4_0": 14}


def test_q_k_v_of_an_interleaved_rope_are_quantized_again_and_listed(tiny_checkpoint, tmp_path):
    """Helium's RoPE turns pairs of dimensions: the build reorders q's and k's rows, so their grids
    no longer give the weights written (the check in on_blocks), and q|k|v, one MatMul, are quantized
    again; the float build's note does not count them either."""
    path = tmp_path / "ckpt"
    write_prequantized(tiny_checkpoint("helium"), path, "gptq")
    said = []
    build(BuildConfig(model=str(path), output=str(tmp_path / "f"), max_input_len=64, max_kv_cache_capacity=128,
                      verify=False), log=said.append)
    assert any("--quantization int4 would keep the codes and scales of 8 of its 14 packed" in m for m in said), said
    said = []
    build(BuildConfig(model=str(path), output=str(tmp_path / "e"), quantization="int4", max_input_len=64,
                      max_kv_cache_capacity=128), log=said.append)
    note = next(m for m in said if "packed projections" in m)
    assert "keeps its codes and scales for 8 of 14" in note and "model.layers.0.self_attn.v_proj" in note, note


def test_a_block_without_a_float16_pair_takes_quantizes_own(packed, monkeypatch):
    """on_blocks' fallback: where no minimum and offset are both float16 values (nearest_pair finds
    none: here every other column, forced), the block is quantize()'s, codes, scale and offset
    together (quantize() without its grid search here, so that its blocks differ from the grid's)."""
    from trtllm.builder import quantize as quantize_module

    path, _ = packed("awq-g64")  # (groups of 64: a block's codes need not reach 0 and 15, quantize()'s differ)
    grid = ckpt.load(str(path)).grids["model.layers.0.mlp.down_proj.weight"]
    w_t = grid.weight_t()
    real = prequantized.nearest_pair

    def half_found(lo, scale, half):
        best, found = real(lo, scale, half)
        found = found.copy()
        found[:, ::2] = False
        return best, found

    monkeypatch.setattr(prequantized, "nearest_pair", half_found)
    monkeypatch.setattr(quantize_module, "quantized_before", lambda *args: False)
    scheme = QuantScheme.named("int4")
    held = dequantize(*prequantized.on_blocks([grid], w_t, scheme), 32)
    own = dequantize(*quantize(w_t, scheme), 32)
    assert np.array_equal(held[:, ::2], own[:, ::2]) and not np.array_equal(held[:, 1::2], own[:, 1::2])
    steps = np.repeat(grid.scales[grid.groups[::32]], 32, axis=0)
    assert (np.abs(held - w_t) / steps)[:, 1::2].max() < 0.02


def test_a_side_files_refusal_names_its_file_and_field(tiny_checkpoint, tmp_path):
    path = tmp_path / "ckpt"
    write_prequantized(tiny_checkpoint("llama"), path, "awq", sym=False, side_file=True)
    side = path / "quant_config.json"
    side.write_text(json.dumps({**json.loads(side.read_text()), "w_bit": 8}))
    result = CliRunner().invoke(main, ["--model", str(path), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "quant_config.json's w_bit is 8; an AWQ checkpoint is read with 4" \
        in result.output, result.output


def test_packed_weights_without_a_quantization_config_are_named(tiny_checkpoint, tmp_path):
    """transformers would load them as unexpected tensors and the projections as missing ones."""
    path = tmp_path / "ckpt"
    write_prequantized(tiny_checkpoint("llama"), path, "gptq", side_file=True)
    (path / "quantize_config.json").unlink()
    result = CliRunner().invoke(main, ["--model", str(path), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "holds GPTQ/AWQ packed weights (qweight, qzeros, scales) without a " \
        "quantization config" in result.output, result.output


def test_a_float_checkpoint_that_kept_its_quantization_config_is_not_recorded_as_packed(tiny_checkpoint, tmp_path):
    import shutil

    path = shutil.copytree(tiny_checkpoint("llama"), tmp_path / "ckpt")
    (path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 32, "sym": True}))
    ck = ckpt.load(str(path))
    assert "prequantized" not in ck.source and not ck.grids


def test_the_float_note_says_what_int4_would_keep(packed, tmp_path):
    """Scales that are not float16 values are not promised to int4 (which quantizes them again), and a
    build whose graph takes no int4 says where the grid is kept."""
    path, _ = packed("gptq")
    ck = ckpt.load(str(path))
    from trtllm.builder.architectures import spec_for

    spec, packing = spec_for(ck.model), ck.source["prequantized"]
    grids = dict(ck.grids)
    note = prequantized.grid_note(packing, None, grids, [], spec)
    assert "would keep the codes and scales of 14 of its 14" in note
    name = "model.layers.0.mlp.down_proj.weight"
    grids[name] = dataclasses.replace(grids[name], scales=grids[name].scales * np.float32(1 + 3e-4))
    assert "would keep the codes and scales of 13 of its 14" in prequantized.grid_note(packing, None, grids, [], spec)
    assert "kept only by --quantization int4, on the modern graph" in \
        prequantized.grid_note(packing, None, grids, [], spec, takes_quantization=False)
