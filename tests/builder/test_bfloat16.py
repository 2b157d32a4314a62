"""--dtype bfloat16: on our CPU kernels (bfloat16 weights and cache, float32 arithmetic) and in the
canonical llm.onnx that TensorRT builds (bfloat16 throughout, run here by the stand-in: see
tests/fakes/tensorrt/_bfloat16.py), against transformers."""
from __future__ import annotations

import contextlib
import json
import sys

import numpy as np
import onnx
import pytest
import torch
import transformers
from onnx import TensorProto

from tests import fakes
from tests.engine_helpers import check_batched_and_restored
from trtllm.builder.config import BuildConfig, ConfigError
from trtllm.builder.export import build
from trtllm.builder.verify import engine_logits
from trtllm.plugins import cpu as cpu_kernels
from trtllm.plugins.lint import lint_model
from trtllm.runtime.engine import load_engine

LIMITS = dict(max_input_len=64, max_kv_cache_capacity=128, max_batch_size=3, verify=False)
PROMPT = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11]
TARGETS = {  # where the engine runs: our kernels, or the TensorRT stand-in with each graph
    "cpu": ({"backend": "onnxruntime"}, None),
    "tensorrt-modern": ({"backend": "tensorrt"}, {}),
    "tensorrt-legacy": ({"backend": "tensorrt", "graph": "legacy", "trt_version": "10.3"},
                        {"FAKE_TRT_VERSION": "10.3.0.30"}),
}


def stand_in(target: str, **env):
    """The TensorRT stand-in for the TensorRT targets (with `env`), nothing for ours."""
    extra = TARGETS[target][1]
    return contextlib.nullcontext() if extra is None else fakes.installed(**extra, **env)


def build_bf16(ckpt, out, target: str):
    with stand_in(target):
        return build(BuildConfig(model=str(ckpt), output=str(out), dtype="bfloat16", **TARGETS[target][0], **LIMITS),
                     log=lambda m: None)


def run_engine(out, target: str, rounding: bool = True, num_decode: int = 6):
    """Greedy tokens and logits; on the stand-in, `rounding` False computes the bfloat16 graph in
    float32 (its weights and KV still bfloat16): our kernels' arithmetic."""
    with stand_in(target, FAKE_TRT_FLOAT32_ARITHMETIC="0" if rounding else "1"):
        return engine_logits(load_engine(out), PROMPT, num_decode=num_decode)


def reference(ckpt, ids, monkeypatch, round_weights: bool = True, canonical: bool = False) -> np.ndarray:
    """transformers in float32 with the weights rounded to bfloat16 and the cache's keys (after
    rotary) and values rounded as they are stored. `canonical`: the rotary tables too, as llm.onnx
    holds them in bfloat16 (transformers casts them to a bfloat16 model's type)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    code = sys.modules[type(model).__module__]
    rotary = code.apply_rotary_pos_emb

    def rounded_keys(q, k, cos, sin, *args, **kwargs):
        if canonical:
            cos, sin = cos.bfloat16().float(), sin.bfloat16().float()
        q, k = rotary(q, k, cos, sin, *args, **kwargs)
        return q, k.bfloat16().float()

    monkeypatch.setattr(code, "apply_rotary_pos_emb", rounded_keys)
    for layer in model.model.layers:
        attn = layer.self_attn
        if hasattr(attn, "qkv_proj"):  # Phi-3: q|k|v in one projection, the values last
            width = attn.config.num_key_value_heads * attn.head_dim
            attn.qkv_proj.register_forward_hook(
                lambda mod, inp, out: torch.cat([out[..., :-width], out[..., -width:].bfloat16().float()], -1))
        else:
            attn.v_proj.register_forward_hook(lambda mod, inp, out: out.bfloat16().float())
    with torch.no_grad():
        if round_weights:
            for p in model.parameters():
                p.copy_(p.bfloat16().float())
        return model(ids).logits[0, len(PROMPT) - 1:].numpy()


@pytest.mark.parametrize("arch, target", [(a, t) for a in ("llama", "qwen3") for t in TARGETS] +
                         [("gemma3", "cpu"), ("gemma3", "tensorrt-modern"), ("gemma3", "tensorrt-legacy"),
                          ("gemma2", "cpu"), ("gemma2", "tensorrt-modern"), ("phi3", "cpu")])
def test_bfloat16_engine_is_transformers_on_bfloat16_weights(arch, target, tiny_checkpoint, tmp_path, monkeypatch):
    """Our kernels (and the canonical graphs computed in float32) are transformers in float32 on the
    bfloat16 weights and cache. Not to float32's 1e-5: a key that lands within float32's error of a
    rounding boundary is stored one bfloat16 step (1/256) away from transformers' (Qwen3's normed
    heads: 2.6e-4 of the largest logit; Llama 1e-6), so the bound is 1e-3. The deliberately wrong
    variant, weights not rounded (3e-3 to 1.6e-2 off), must miss it."""
    ckpt = tiny_checkpoint(arch)
    out = build_bf16(ckpt, tmp_path / "e", target)
    generated, got = run_engine(out, target, rounding=False)
    ids = torch.tensor([PROMPT + generated[:-1]])
    ref = reference(ckpt, ids, monkeypatch, canonical=target != "cpu")
    unrounded = reference(ckpt, ids, monkeypatch, round_weights=False, canonical=target != "cpu")
    tol = 1e-3 * np.abs(ref).max()
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0)
    assert np.abs(got - unrounded).max() > 3 * tol


@pytest.mark.parametrize("arch, target", [("llama", "tensorrt-modern"), ("llama", "tensorrt-legacy"),
                                          ("gemma3", "tensorrt-modern")])
def test_bfloat16_graph_stays_close_to_transformers_in_bfloat16(arch, target, tiny_checkpoint, tmp_path):
    """A smoke test of the stand-in's bfloat16 path: the canonical graph with every bfloat16 value
    rounded (as a strongly typed bfloat16 network stores them) runs, and stays within bfloat16's
    noise of transformers run in bfloat16 on the same tokens: logits within 6e-2 of the largest,
    each greedy token transformers' own but for a tie in bfloat16 (logits within two of its steps:
    tiny Gemma has one). That bound does not tell bfloat16 from float32 arithmetic (transformers in
    float32 is 1-4e-2 from itself in bfloat16); the graph's arithmetic is checked to 1e-3 above."""
    ckpt = tiny_checkpoint(arch)
    out = build_bf16(ckpt, tmp_path / "e", target)
    generated, got = run_engine(out, target, num_decode=8)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT + generated[:-1]])).logits[0, len(PROMPT) - 1:].float().numpy()
    np.testing.assert_allclose(got, ref, atol=6e-2 * np.abs(ref).max(), rtol=0)
    best = ref.max(-1)
    step = 2.0 ** (np.floor(np.log2(np.abs(best))) - 7)  # bfloat16's step at each row's largest logit
    chosen = ref[np.arange(len(generated)), generated]
    assert (chosen >= best - 2 * step).all(), (generated, list(ref.argmax(-1)))
    assert sum(g == int(a) for g, a in zip(generated, ref.argmax(-1))) >= len(generated) - 1


def test_what_a_bfloat16_engine_holds(tiny_checkpoint, tmp_path):
    """The manifest says bfloat16; llm.onnx is bfloat16 (weights, KV, activations; float32 logits)
    and passes the op lint; our kernels' form keeps bfloat16 weights for trtllm.cpu::MatMulHalf."""
    out = build_bf16(tiny_checkpoint("llama"), tmp_path / "e", "cpu")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "bfloat16" and manifest["model"]["kv_dtype"] == "bfloat16"
    assert cpu_kernels.HALF_LOWERING in manifest["lowerings"]
    canonical = onnx.load(str(out / "llm.onnx"))
    assert lint_model(canonical, "10.16") == []
    types = {v.name: v.type.tensor_type.elem_type for v in [*canonical.graph.input, *canonical.graph.output]}
    assert types["past_key.0"] == types["present_value.1"] == TensorProto.BFLOAT16
    assert types["logits"] == TensorProto.FLOAT
    weights = {i.name: i.data_type for i in canonical.graph.initializer}
    assert weights["model.embed_tokens.weight"] == TensorProto.BFLOAT16
    compiled = onnx.load(str(out / manifest["files"]["compiled"]))
    halves = [n for n in compiled.graph.node if n.op_type == cpu_kernels.HALF]
    weights = {i.name: i.data_type for i in compiled.graph.initializer}
    assert halves and all(weights[n.input[1]] == TensorProto.BFLOAT16 for n in halves)
    kv = {v.name: v.type.tensor_type.elem_type for v in compiled.graph.input}
    assert kv["past_key.0"] == TensorProto.BFLOAT16


@pytest.mark.parametrize("options, message", [
    ({"cpu_kernels": "onnxruntime"}, "--dtype bfloat16 on ONNX Runtime runs on our CPU kernels"),
    ({"graph": "legacy"}, "--dtype bfloat16 on ONNX Runtime runs on our CPU kernels"),
    ({"quantization": "int4"}, "takes --dtype float32 or float16"),
])
def test_bfloat16_refusals_name_the_fix(options, message):
    with pytest.raises(ConfigError, match=message):
        BuildConfig(model="m", output="o", dtype="bfloat16", backend="onnxruntime", **options)


def test_bfloat16_refused_where_auto_picks_onnx_runtime_without_our_kernels(tiny_checkpoint, tmp_path):
    """--backend auto is resolved at build time: ONNX Runtime (no TensorRT here) with its own
    kernels cannot run bfloat16, and the message says which option stands in the way."""
    with pytest.raises(ConfigError, match="got --graph modern --cpu-kernels onnxruntime; use --dtype float16"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), dtype="bfloat16",
                          cpu_kernels="onnxruntime", **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()


def test_a_bfloat16_engine_answers_batched_and_restores_its_saved_prompt(tiny_checkpoint, tmp_path, run_cli):
    """trtllm-run end to end: answers alone equal answers in one batch (our kernels are batch
    invariant), and a system prompt's bfloat16 KV saved by one run gives a later run the same answers."""
    out = build_bf16(tiny_checkpoint("qwen2"), tmp_path / "e", "cpu")
    check_batched_and_restored(run_cli, out, tmp_path)


def test_without_our_kernels_the_engine_names_a_rebuild_that_works(tiny_checkpoint, tmp_path, monkeypatch):
    """ONNX Runtime's own kernels have no bfloat16: the fix offered is the library or --dtype float16,
    not --cpu-kernels onnxruntime (which the builder refuses for bfloat16)."""
    from trtllm.runtime.manifest import ManifestError

    out = build_bf16(tiny_checkpoint("llama"), tmp_path / "e", "cpu")
    monkeypatch.setattr(cpu_kernels, "library", lambda: None)
    with pytest.raises(ManifestError, match="rebuild the engine with --dtype float16"):
        load_engine(out)


def test_a_16_bit_model_our_kernels_cannot_take_is_told_which_dimension(monkeypatch):
    """The refusal names what stands in the way (a review found an either-or text, and for
    --kv-cache-dtype int8 with float16 a library 'built from other sources' that was not)."""
    from types import SimpleNamespace

    from trtllm.builder import kernel_choice as export
    from trtllm.builder.config import BuildConfig, ConfigError

    spec = SimpleNamespace(head_dim=16, hidden_size=64, intermediate_size=80, num_heads=4, moe=None, global_head_dim=None,
                           per_layer_input=0, wide_mlp_layers=(), mamba_layers=())
    assert "its intermediate_size (80), a projection's input width, is not a multiple of 32" in export.half_obstacle(spec)
    assert "head size (8) is not a multiple of 16" in export.half_obstacle(SimpleNamespace(**{**vars(spec), "head_dim": 8}))
    monkeypatch.setattr(export.cpu_kernels, "library", lambda: "libtrtllm_cpu.so")
    with pytest.raises(ConfigError, match=r"intermediate_size \(80\)"):
        export.refuse_bfloat16(BuildConfig(model="m", output="o", dtype="bfloat16"), "onnxruntime", False, spec)
