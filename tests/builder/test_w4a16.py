"""--quantization int8|int4 with --dtype float16: for TensorRT, llm.onnx with float16 activations and
KV cache on the quantized weights (W4A16, as Jetson builds run); on our CPU kernels, float32
activations and a float16 KV cache (half the KV memory). Against transformers on the dequantized
weights, with what the engine stores in float16 rounded so."""
from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest
import torch

from tests import fakes
from tests.engine_helpers import check_batched_and_restored
from tests.builder.test_moe import dense_experts
from tests.builder.test_quantized import dequantized_model
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build
from trtllm.builder.quantize import QuantScheme
from trtllm.builder.verify import engine_logits
from trtllm.plugins import cpu as cpu_kernels
from trtllm.runtime.engine import load_engine
from trtllm.runtime.kv_cache import bytes_per_token
from trtllm.runtime.manifest import load as load_manifest

LIMITS = dict(max_input_len=64, max_kv_cache_capacity=128, max_batch_size=3, verify=False)
PROMPT = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11]


def stand_in(target: str):
    """The TensorRT stand-in computing float16 in float32 (the KV still stored in float16), or nothing."""
    return fakes.installed(FAKE_TRT_FLOAT32_ARITHMETIC="1") if target == "tensorrt" else contextlib.nullcontext()


def build_w4a16(ckpt, out, name: str, target: str):
    with stand_in(target):
        return build(BuildConfig(model=str(ckpt), output=str(out), quantization=name, dtype="float16", backend=target,
                                 **LIMITS), log=lambda m: None)


def reference(ckpt, name: str, ids, monkeypatch, canonical: bool, round_cache: bool = True) -> np.ndarray:
    """transformers on the dequantized weights, the cache's keys (after rotary) and values rounded
    to float16 as stored; `canonical`: the other float weights (norms, biases) and the rotary tables
    too, as llm.onnx holds them in float16."""
    model = dequantized_model(ckpt, QuantScheme.named(name))
    with torch.no_grad():  # a mixture of experts' experts, quantized as the other projections on our kernel
        for param_name, p in model.named_parameters():
            if param_name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(torch.from_numpy(dense_experts(p.numpy().copy(), QuantScheme.named(name))))
    code = sys.modules[type(model).__module__]
    rotary = code.apply_rotary_pos_emb

    def rounded(q, k, cos, sin, *args, **kwargs):
        if canonical:
            cos, sin = cos.half().float(), sin.half().float()
        q, k = rotary(q, k, cos, sin, *args, **kwargs)
        return q, k.half().float() if round_cache else k

    monkeypatch.setattr(code, "apply_rotary_pos_emb", rounded)
    if round_cache:
        for layer in model.model.layers:
            layer.self_attn.v_proj.register_forward_hook(lambda mod, inp, out: out.half().float())
    with torch.no_grad():
        if canonical:
            for param_name, p in model.named_parameters():
                if "norm" in param_name or param_name.endswith("bias"):
                    p.copy_(p.half().float())
        return model(ids).logits[0, len(PROMPT) - 1:].numpy()


@pytest.mark.parametrize("arch, target", [("qwen2", "onnxruntime"), ("qwen2", "tensorrt"), ("qwen3_moe", "onnxruntime")])
@pytest.mark.parametrize("name", ["int8", "int4"])
def test_quantized_float16_engine_is_transformers_on_dequantized_weights(name, arch, target, tiny_checkpoint, tmp_path,
                                                                         monkeypatch):
    """Our kernels, and llm.onnx computed in float32 by the stand-in, against transformers on the
    dequantized weights with the float16 cache: within 1e-4 of the largest logit (measured 1e-6 to
    3e-5; a key within float32's error of a rounding boundary is stored a float16 step away). The
    deliberately wrong variant, a float32 cache (1.0e-3 to 2.0e-3 off), misses it. Qwen2 has biases;
    Qwen3-MoE's experts run on our MoEBlockQuant (quantized experts are not built for TensorRT yet)."""
    ckpt = tiny_checkpoint(arch)
    out = build_w4a16(ckpt, tmp_path / "e", name, target)
    manifest = load_manifest(out)
    assert manifest.dtype == manifest.model.kv_dtype == "float16" and manifest.quantization == name
    with stand_in(target):
        generated, got = engine_logits(load_engine(out), PROMPT, num_decode=6)
    ids = torch.tensor([PROMPT + generated[:-1]])
    ref = reference(ckpt, name, ids, monkeypatch, canonical=target == "tensorrt")
    monkeypatch.undo()
    unrounded = reference(ckpt, name, ids, monkeypatch, canonical=target == "tensorrt", round_cache=False)
    tol = 1e-4 * np.abs(ref).max()
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)
    assert np.abs(got - unrounded).max() > 3 * tol


def test_what_a_w4a16_engine_holds(tiny_checkpoint, tmp_path):
    """llm.onnx: float16 activations and KV, the weights' DequantizeLinear in float16 (their scales
    are float16 values); our kernels' form: float32 activations on MatMulBlockQuant, a float16 KV
    cache on our attention, half the KV bytes of a float32 engine."""
    import onnx
    from onnx import TensorProto, numpy_helper

    ckpt = tiny_checkpoint("llama")
    out = build_w4a16(ckpt, tmp_path / "e", "int4", "onnxruntime")
    canonical = onnx.load(str(out / "llm.onnx"))
    types = {v.name: v.type.tensor_type.elem_type for v in [*canonical.graph.input, *canonical.graph.output]}
    assert types["past_key.0"] == types["present_value.1"] == TensorProto.FLOAT16
    scales = [i for i in canonical.graph.initializer if i.name.endswith("weight_scale")]
    assert scales and all(i.data_type == TensorProto.FLOAT16 for i in scales)
    manifest = load_manifest(out)
    assert cpu_kernels.LOWERING in manifest.lowerings and cpu_kernels.ATTENTION_LOWERING in manifest.lowerings
    compiled = onnx.load(str(out / manifest.files["compiled"]))
    kv = {v.name: v.type.tensor_type.elem_type for v in compiled.graph.input}
    assert kv["past_key.0"] == TensorProto.FLOAT16 and kv["input_ids"] == TensorProto.INT64
    full = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "f"), quantization="int4", **LIMITS),
                 log=lambda m: None)
    assert 2 * bytes_per_token(manifest.model) == bytes_per_token(load_manifest(full).model)
    # int4's offsets in float16 are the float32 engine's exactly: the same weights in both forms
    exact = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(full / "llm.onnx")).graph.initializer}
    offsets = [i for i in canonical.graph.initializer if i.name.endswith("weight_offset")]
    assert offsets and all(i.data_type == TensorProto.FLOAT16 for i in offsets)
    for i in offsets:
        assert np.array_equal(numpy_helper.to_array(i).astype(np.float32), exact[i.name])


def test_a_w4a16_engine_answers_batched_and_restores_its_saved_prompt(tiny_checkpoint, tmp_path, run_cli):
    """trtllm-run end to end on our kernels: answers alone equal answers in one batch, and a saved
    system prompt's float16 KV gives a later run the same answers."""
    out = build_w4a16(tiny_checkpoint("qwen2"), tmp_path / "e", "int4", "onnxruntime")
    check_batched_and_restored(run_cli, out, tmp_path)


@pytest.mark.parametrize("target", ["onnxruntime", "tensorrt"])
def test_a_w4a16_engine_speculates_without_changing_an_answer(target, tiny_checkpoint, run_cli, tmp_path):
    """With an EAGLE-3 head (quantized as the model, its embedding float16, its KV float16 too),
    greedy answers with drafting equal those without."""
    from tests.eagle_drafts import random_draft
    from tests.runtime.eagle_cli import REQUESTS, answers, same

    ckpt = tiny_checkpoint("llama")
    draft = random_draft(ckpt, tmp_path / "draft", seed=3, aux=[0, 1, 1])
    with stand_in(target):
        out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization="int4", dtype="float16",
                                backend=target, eagle=str(draft), **LIMITS), log=lambda m: None)
        assert load_manifest(out).eagle["model"]["kv_dtype"] == "float16"
        plain, _ = answers(run_cli, out, tmp_path, "--spec-draft-step", "0", batch_size=3, requests=REQUESTS[:3])
        got, profile = answers(run_cli, out, tmp_path, "--spec-draft-step", "3", batch_size=3, requests=REQUESTS[:3])
    assert same(got, plain) and profile["eagle_generation"]["drafted_tokens"] > 0


def test_a_w4a16_engine_takes_lora_adapters(tiny_checkpoint, tmp_path):
    """The adapter in float16 (the engine's dtype; our kernels' form casts it to float32), against
    PEFT on transformers with the dequantized weights: float16 tolerance, the same greedy tokens;
    the adapter left out, the wrong variant, misses it."""
    import peft

    from tests.parity.test_lora_parity import ADAPTERS, MAX_RANK, make_adapter, peft_logits
    from trtllm.runtime import lora

    ckpt = tiny_checkpoint("qwen2")
    make_adapter(ckpt, tmp_path / "adapter", 5, **ADAPTERS["all"])
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization="int4", dtype="float16",
                            max_lora_rank=MAX_RANK, **LIMITS), log=lambda m: None)
    engine = load_engine(out)
    adapter = lora.load_adapter("a", tmp_path / "adapter", engine.manifest)
    assert all(a.dtype == np.float16 for a in adapter.arrays.values())
    generated, got = engine_logits(engine, PROMPT, num_decode=4, lora=adapter.arrays)
    pm = peft.PeftModel.from_pretrained(dequantized_model(ckpt, QuantScheme.named("int4")), tmp_path / "adapter").eval()
    ref = peft_logits(pm, PROMPT, generated)
    tol = 3e-3 * np.abs(ref).max()
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)
    assert list(ref.argmax(-1)) == generated
    plain = engine_logits(engine, PROMPT, num_decode=4)[1]
    assert np.abs(plain - ref).max() > 3 * tol


def test_a_mistyped_w4a16_graph_fails_the_stand_in_parser(tiny_checkpoint, tmp_path, monkeypatch):
    """The deliberately wrong variant for the graph's types: int4 offsets left float32 in the float16
    graph. The stand-in parses strongly typed, as TensorRT does, so the build fails; computing in
    float32 (the tests above) could not tell."""
    from trtllm.builder.graph import GraphWriter

    original = GraphWriter.weight

    def float32_offsets(self, name, array):  # (as written: the weights go to the data file as they are made)
        if name.endswith(".weight_offset") and np.asarray(array).dtype == np.float16:
            array = np.asarray(array).astype(np.float32)
        return original(self, name, array)

    monkeypatch.setattr(GraphWriter, "weight", float32_offsets)
    with pytest.raises(Exception, match="type check"):
        build_w4a16(tiny_checkpoint("llama"), tmp_path / "e", "int4", "tensorrt")


def test_onnx_runtimes_own_kernels_are_refused_under_backend_auto(tiny_checkpoint, tmp_path):
    """--backend auto resolves to ONNX Runtime at build time: the refusal names ONNX Runtime's own
    kernels as the reason (not a stale library), before the checkpoint loads."""
    from trtllm.builder.config import ConfigError

    with pytest.raises(ConfigError, match=r"ONNX Runtime's own \(MatMulNBits, GroupQueryAttention\) take one type "
                                          r"for both: use --dtype float32 or --cpu-kernels auto\|native"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), quantization="int8",
                          dtype="float16", cpu_kernels="onnxruntime", **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()
