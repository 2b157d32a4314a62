"""--quantization int8|int4: the quantizer's maths, the canonical graph against transformers with
the same (dequantized) weights, the ONNX Runtime forms (our native kernels, and MatMulNBits), and
answers end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.quantize import QuantScheme, dequantize, quantize  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.plugins import cpu as cpu_kernels  # noqa: E402
from trtllm.plugins.lint import lint_model  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

from tests.engine_helpers import unoptimized_sessions  # noqa: E402
from tests.plugins.cpu_ops import portable_only  # noqa: E402

pytestmark = pytest.mark.hf
SCHEMES = ["int8", "int4"]  # and float16 below


@pytest.mark.parametrize("name", SCHEMES)
def test_quantizer_round_trip(name):
    scheme = QuantScheme.named(name)
    w = np.random.default_rng(0).standard_normal((128, 48)).astype(np.float32)
    codes, scale, offset = quantize(w, scheme)
    assert codes.shape == w.shape and scale.shape == (128 // scheme.block_size, 48)
    back = dequantize(codes, scale, offset, scheme.block_size)
    step = np.repeat(scale, scheme.block_size, axis=0)
    assert np.all(np.abs(back - w) <= 0.5 * step + 1e-6)  # round to nearest: at most half a step off
    ints = codes.astype(np.int8)
    assert ints.min() >= -(2 ** (scheme.bits - 1)) and ints.max() <= 2 ** (scheme.bits - 1) - 1


@pytest.fixture(scope="module")
def quantized(tiny_checkpoint, tmp_path_factory):
    """(checkpoint, {scheme: engine dir}); random tiny weights are too fragile for the build's
    agreement check, so these are built with verify off and checked here instead."""
    ckpt = tiny_checkpoint("qwen2")  # biases too
    engines = {}
    for name in SCHEMES:
        for kernels in ("native", "onnxruntime"):
            out = tmp_path_factory.mktemp(f"q-{name}-{kernels}") / "engine"
            build(BuildConfig(model=str(ckpt), output=str(out), quantization=name, max_input_len=128,
                              max_kv_cache_capacity=256, verify=False, cpu_kernels=kernels), log=lambda m: None)
            engines[name if kernels == "native" else f"{name}-ort"] = out
    return ckpt, engines


def dequantized_weight(w: np.ndarray, scheme: QuantScheme) -> np.ndarray:
    """w [out, in] as the graph computes with it: quantized, then dequantized."""
    codes, scale, offset = quantize(np.ascontiguousarray(w.T), scheme)
    return dequantize(codes, scale, offset, scheme.block_size).T


def dequantized_model(ckpt, scheme: QuantScheme):
    """transformers with every projection, the lm_head and the token embedding replaced by what the
    graph computes (the embedding and the lm_head in the lm_head's scheme; tied, one table)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    head = scheme.for_lm_head()

    def rounded(p, s):
        p.copy_(torch.from_numpy(dequantized_weight(p.numpy(), s).copy()))

    with torch.no_grad():
        for name, p in model.named_parameters():
            # (Gemma 4's per-layer embeddings: their gate and projections as well, and their table as the
            # token embedding's; LFM2's MLP: w1 w3 w2. Never a router: Gemma 4's is router.proj)
            if ".router." in name:
                continue
            if name.endswith(("proj.weight", "input_linear.weight", "output_linear.weight", "projection.weight",
                              "per_layer_input_gate.weight", "w1.weight", "w2.weight", "w3.weight")):
                rounded(p, scheme)
            elif name.endswith("embed_tokens_per_layer.weight"):
                rounded(p, head)
        rounded(model.model.embed_tokens.weight, head)  # a tied lm_head is this same tensor
        if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            rounded(model.lm_head.weight, head)
    return model


@pytest.mark.parametrize("name", SCHEMES)
def test_canonical_graph_matches_dequantized_transformers(name, quantized):
    """The canonical graph (ONNX Runtime with its optimisations off, as TensorRT would parse it)
    computes exactly transformers with the dequantized weights."""
    ckpt, engines = quantized
    with unoptimized_sessions():
        engine = load_engine(engines[name], graph="onnx")
    prompt = [5, 17, 42, 99, 7, 31, 8]
    generated, got = engine_logits(engine, prompt, num_decode=4)
    with torch.no_grad():
        ref = dequantized_model(ckpt, QuantScheme.named(name))(torch.tensor([prompt + generated[:-1]])).logits
    np.testing.assert_allclose(got, ref[0, len(prompt) - 1:].numpy(), atol=1e-4, rtol=0)
    # the deliberately wrong variant: the unquantized model must NOT match at this tolerance
    with torch.no_grad():
        exact = transformers.AutoModelForCausalLM.from_pretrained(ckpt)(torch.tensor([prompt])).logits[0, -1].numpy()
    assert np.abs(got[0] - exact).max() > 1e-3


@pytest.mark.parametrize("name", SCHEMES)
def test_native_kernel_engine_matches_dequantized_transformers(name, quantized):
    """The ONNX Runtime form on our kernels (float32 activations) is as exact as the canonical graph:
    the same logits as transformers with the dequantized weights, at float32 tolerance. MatMulNBits'
    form quantizes the activations to int8 and is only close."""
    ckpt, engines = quantized
    prompt = [5, 17, 42, 99, 7, 31, 8]
    generated, got = engine_logits(load_engine(engines[name]), prompt, num_decode=4)
    with torch.no_grad():
        ref = dequantized_model(ckpt, QuantScheme.named(name))(torch.tensor([prompt + generated[:-1]])).logits
    ref = ref[0, len(prompt) - 1:].numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    generated_ort, got_ort = engine_logits(load_engine(engines[f"{name}-ort"]), prompt, num_decode=4)
    assert np.abs(got_ort[0] - ref[0]).max() > 1e-4  # int8 activations: the wrong variant at this tolerance


# each arch's quantized nodes: Gemma 2 and 3's qkv, o, gate|up and down on each of 2 layers, and the lm_head;
# Gemma 4's on its 3 layers with KV, q instead of qkv on its 2 that share it, the per-layer embeddings'
# gate and projection on each of its 5 layers, and their projection from the token embeddings
QUANTIZED_NODES = {"gemma3": 2 * 4 + 1, "gemma2": 2 * 4 + 1, "gemma4": 5 * 4 + 5 * 2 + 1 + 1}


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("arch", ["gemma3", "gemma2", "gemma4"])
def test_gemma_on_our_kernels_matches_dequantized_transformers(arch, name, tiny_checkpoint, tmp_path):
    """Gemma's GELU MLP is not our kernels' fused SwiGLU: gate|up is one quantized node, split and
    activated in standard ops. The same logits as transformers with the dequantized weights (Gemma 2:
    with its soft-capped scores and logits; Gemma 4: with its per-layer embeddings' table in int8)."""
    import onnx

    ckpt = tiny_checkpoint(arch)
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization=name, max_input_len=64,
                            max_kv_cache_capacity=128, verify=False), log=lambda m: None)
    nodes = onnx.load(out / "llm.ort.onnx", load_external_data=False).graph.node
    assert not [n for n in nodes if any(a.name == "activation" for a in n.attribute)]  # no fused SwiGLU
    assert sum(n.op_type == cpu_kernels.OP for n in nodes) == QUANTIZED_NODES[arch]
    prompt = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11, 12, 13]  # past the window (8)
    generated, got = engine_logits(load_engine(out), prompt, num_decode=4)
    with torch.no_grad():
        ref = dequantized_model(ckpt, QuantScheme.named(name))(torch.tensor([prompt + generated[:-1]])).logits
    np.testing.assert_allclose(got, ref[0, len(prompt) - 1:].numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.parametrize("kernels", ["native", "onnxruntime"])
def test_fused_engine_answers_and_records_its_scheme(name, kernels, quantized, run_cli):
    _, engines = quantized
    engine = engines[name if kernels == "native" else f"{name}-ort"]
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["quantization"] == name and manifest["build_config"]["cpu_kernels"] == kernels
    assert manifest["quantization_scheme"]["bits"] == int(name[-1]) and manifest["quantization_scheme"]["block_size"] == 32
    assert (cpu_kernels.LOWERING in manifest["lowerings"]) == (kernels == "native")
    # MatMulNBits (accuracy level 4) quantizes its activations to int8, whatever --activations says
    assert manifest["quantization_scheme"]["activations"] == ("float32" if kernels == "native" else "int8")
    assert lint_model(str(engine / "llm.onnx")) == []
    import onnx

    ops = {n.op_type for n in onnx.load(engine / "llm.ort.onnx", load_external_data=False).graph.node}
    assert "DequantizeLinear" not in ops
    if kernels == "native":  # one node per projection, no offset kernels
        assert cpu_kernels.OP in ops and not {"MatMulNBits", "ReduceSum"} & ops
    else:  # ONNX Runtime fused the weight-only GEMMs
        assert "MatMulNBits" in ops and cpu_kernels.OP not in ops
    result, out = run_cli(engine, {"temperature": 0, "max_generate_length": 8,
                                          "requests": [{"messages": [{"role": "user", "content": "Hello"}]}]})
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["finish_reason"] in ("max-length", "end-of-sequence")


@pytest.fixture(scope="module")
def integer_activations(quantized, tmp_path_factory):
    """{activations: engine dir}: int4 on our kernels with --activations int16 and int8."""
    ckpt, _ = quantized
    engines = {}
    for activations in ("int16", "int8"):
        out = tmp_path_factory.mktemp(f"q-int4-{activations}") / "engine"
        build(BuildConfig(model=str(ckpt), output=str(out), quantization="int4", activations=activations,
                          max_input_len=128, max_kv_cache_capacity=256, verify=False), log=lambda m: None)
        engines[activations] = out
    return engines


def test_integer_activations_stay_close_to_transformers(quantized, integer_activations):
    """--activations against transformers with the dequantized weights, relative to the largest logit
    (the prompt step is float32, each decode step quantized): int16 within 2e-3 (measured
    5.6e-4), int8 within 0.2 (9.2e-2: random tiny weights amplify what a trained model shrugs off), and
    int16 far closer than int8. The float32-activation engine is the exact one (1e-4 above)."""
    ckpt, engines = quantized
    prompt = [5, 17, 42, 99, 7, 31, 8]
    forced = [3, 14, 15, 92, 65]
    with torch.no_grad():
        ref = dequantized_model(ckpt, QuantScheme.named("int4"))(torch.tensor([prompt + forced[:-1]])).logits
    ref = ref[0, len(prompt) - 1:].numpy()
    scale = np.abs(ref).max()
    errors = {}
    for activations in ("int16", "int8"):
        _, got = engine_logits(load_engine(integer_activations[activations]), prompt, num_decode=4, forced=forced)
        errors[activations] = np.abs(got - ref).max() / scale
    assert errors["int16"] < 2e-3 and errors["int8"] < 0.2, errors
    assert errors["int8"] > 20 * errors["int16"], errors


def test_integer_activations_are_recorded(integer_activations):
    import onnx

    for activations, engine in integer_activations.items():
        manifest = json.loads((engine / "manifest.json").read_text())
        assert manifest["build_config"]["activations"] == activations
        assert manifest["quantization_scheme"]["activations"] == activations
        nodes = [n for n in onnx.load(engine / "llm.ort.onnx", load_external_data=False).graph.node
                 if n.op_type == cpu_kernels.OP]
        attrs = [{a.name: a for a in n.attribute} for n in nodes]
        # every projection takes integer activations, the int8 lm_head too
        assert [a["activations"].s.decode() for a in attrs] == [activations] * len(nodes)
        assert sorted({a["bits"].i for a in attrs}) == [4, 8]
        canonical = onnx.load(engine / "llm.onnx", load_external_data=False)  # TensorRT's graph: unchanged
        assert cpu_kernels.OP not in {n.op_type for n in canonical.graph.node}


@pytest.mark.slow
@pytest.mark.parametrize("name, floor", [("int8", 0.93), ("int4", 0.90), ("float16", 0.95), ("bfloat16", 0.93),
                                         ("int4/int16", 0.90), ("int4/int8", 0.85), ("int8/int8", 0.90),
                                         ("int4/int8 onnxruntime", 0.85)])
def test_demo_model_quantized_builds_verify_and_answer(name, floor, demo_model, tmp_path, run_cli):
    """"onnxruntime": --cpu-kernels onnxruntime, whose MatMulNBits quantizes activations to int8 with
    --activations left at float32: checked (and recorded) as int8 activations."""
    name, _, kernels = name.partition(" ")
    quantization, _, activations = name.partition("/")
    options = ({"dtype": name} if name in ("float16", "bfloat16") else
               {"quantization": quantization, "cpu_kernels": kernels or "auto",
                "activations": "float32" if kernels else activations or "float32"})
    out = build(BuildConfig(model=str(demo_model), output=str(tmp_path / "engine"), max_input_len=512,
                            max_kv_cache_capacity=1024, **options), log=lambda m: None)
    report = json.loads((out / "verify.json").read_text())
    assert report["top1_agreement"] >= floor and report["quantization"] == name
    result, answers = run_cli(out, {"temperature": 0, "max_generate_length": 16, "requests": [
        {"messages": [{"role": "user", "content": "What is the capital of France?"}]}]})
    # (not "Paris": the first token of that answer is a near tie that int8 activations flip, as
    # the peers note for llama.cpp; accuracy is what the build's agreement check measures)
    assert result.exit_code == 0 and answers["responses"][0]["output_text"].strip()


@pytest.mark.parametrize("kernels", ["native", "onnxruntime"])
def test_float16_engine_matches_transformers(kernels, tiny_checkpoint, tmp_path, run_cli):
    """--dtype float16: weights and KV in half precision, logits float32 (activations too on our
    kernels, half precision on ONNX Runtime's); within float16 tolerance of transformers' float32 and
    the same greedy tokens on a short run."""
    ckpt = tiny_checkpoint("llama")
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "fp16"), dtype="float16", max_input_len=128,
                            max_kv_cache_capacity=256, cpu_kernels=kernels), log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "float16" and manifest["model"]["kv_dtype"] == "float16"
    assert (cpu_kernels.HALF_LOWERING in manifest["lowerings"]) == (kernels == "native")
    assert lint_model(str(out / "llm.onnx")) == []
    prompt = [5, 17, 42, 99, 7, 31, 8]
    generated, got = engine_logits(load_engine(out), prompt, num_decode=4)
    with torch.no_grad():
        ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt)(torch.tensor([prompt + generated[:-1]])).logits
    ref = ref[0, len(prompt) - 1:].numpy()
    np.testing.assert_allclose(got, ref, atol=3e-2 * np.abs(ref).max(), rtol=0)
    assert list(ref.argmax(-1)) == generated
    result, answers = run_cli(out, {"temperature": 0, "max_generate_length": 6, "requests": [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
         "save_system_prompt_kv_cache": True}]})  # the saved KV is float16 too
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("arch", ["llama", "qwen2", "granite", "olmo2", "arcee", "apertus"])
def test_float16_native_engine_is_transformers_on_float16_weights(arch, tiny_checkpoint, tmp_path, monkeypatch):
    """On trtllm.cpu::MatMulHalf and Attention, a float16 engine is transformers in float32 with the
    weights rounded to float16 and the cache's keys (after rotary) and values rounded as they are
    stored. The deliberately wrong variant (weights not rounded) must miss the tolerance."""
    import sys

    ckpt = tiny_checkpoint(arch)
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "fp16"), dtype="float16", max_input_len=128,
                            max_kv_cache_capacity=256, verify=False), log=lambda m: None)
    prompt = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11]
    generated, got = engine_logits(load_engine(out), prompt, num_decode=6)
    ids = torch.tensor([prompt + generated[:-1]])

    def reference(round_weights: bool):
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        code = sys.modules[type(model).__module__]
        rotary = code.apply_rotary_pos_emb

        def rounded_keys(*args, **kwargs):  # what the cache holds: keys after rotary, in float16
            q, k = rotary(*args, **kwargs)
            return q, k.half().float()

        monkeypatch.setattr(code, "apply_rotary_pos_emb", rounded_keys)
        for layer in model.model.layers:  # and values
            layer.self_attn.v_proj.register_forward_hook(lambda mod, inp, out: out.half().float())
        with torch.no_grad():
            if round_weights:
                for p in model.parameters():
                    p.copy_(p.half().float())
            return model(ids).logits[0, len(prompt) - 1:].numpy()

    ref, unrounded = reference(True), reference(False)
    strict = 2e-5 * np.abs(ref).max()
    np.testing.assert_allclose(got, ref, atol=5 * strict if portable_only() else strict, rtol=0)
    assert np.abs(got - unrounded).max() > 10 * strict


def test_without_the_library(quantized, tiny_checkpoint, tmp_path, monkeypatch):
    """An engine that needs the native kernels refuses to load without them, naming both fixes;
    --cpu-kernels native refuses to build; auto builds on ONNX Runtime's kernels and says so, unless
    --activations asks for what only ours do."""
    from trtllm.builder.config import ConfigError
    from trtllm.runtime.manifest import ManifestError

    _, engines = quantized
    monkeypatch.setattr(cpu_kernels, "library", lambda: None)
    with pytest.raises(ManifestError, match="scripts/setup.sh.*--cpu-kernels onnxruntime"):
        load_engine(engines["int4"])
    load_engine(engines["int4-ort"])  # MatMulNBits: needs nothing of ours
    ckpt = tiny_checkpoint("llama")
    config = dict(model=str(ckpt), quantization="int4", max_input_len=64, max_kv_cache_capacity=128, verify=False)
    with pytest.raises(ConfigError, match="--cpu-kernels native: the native CPU kernel library"):  # (exit 2)
        build(BuildConfig(output=str(tmp_path / "a"), cpu_kernels="native", **config), log=lambda m: None)
    logs = []
    out = build(BuildConfig(output=str(tmp_path / "b"), **config), log=logs.append)
    assert any("MatMulNBits" in line for line in logs)
    assert not cpu_kernels.needed_by(json.loads((out / "manifest.json").read_text())["lowerings"])
    with pytest.raises(ConfigError, match="--activations int8 needs our CPU kernels: .*scripts/setup.sh"):
        build(BuildConfig(output=str(tmp_path / "c"), activations="int8", **config), log=lambda m: None)
    with pytest.raises(ConfigError, match="--cpu-kernels must be one of"):
        BuildConfig(model="m", output="o", cpu_kernels="fast")


@pytest.mark.parametrize("activations", ["int8", "int16"])
def test_integer_activation_answers_do_not_depend_on_batching(integer_activations, activations, run_cli, tmp_path):
    """A prompt's tokens are computed in float32 and generated ones quantized, whatever a step's
    size: batch_size and a restored system prompt leave every answer as it is alone. (The kernel
    used to go by the call's row count, so a short prompt alone was quantized and in a batch not:
    5 of 6 demo answers changed with a saved system prompt.)"""
    engine = integer_activations[activations]
    system = "Answer in one short sentence, and be kind to the reader. "
    reqs = [{"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}]}
            for q in ("Hi", "Tell me about rivers", "2+2?", "Why is the sky blue at noon?", "ok")]

    def answers(batch_size, save=False, cache="none"):
        payload = {"temperature": 0, "max_generate_length": 12, "ignore_eos": True, "batch_size": batch_size,
                   "requests": [{**r, "save_system_prompt_kv_cache": save} for r in reqs]}
        result, out = run_cli(engine, payload, "--kv-cache-dir", str(tmp_path / cache), "--profile",
                              str(tmp_path / "profile.json"))
        assert result.exit_code == 0, result.output
        reused = json.loads((tmp_path / "profile.json").read_text())["prefill"]["reused_tokens"]
        return [r["output_text"] for r in out["responses"]], reused

    alone, _ = answers(1)
    assert answers(4)[0] == alone
    saved, reused = answers(1, save=True, cache="kv")  # request 0 saves, 1-4 restore the system prompt
    assert reused > 0 and saved == alone
    assert answers(4, save=True, cache="kv")[0] == alone  # a later run restores it for all five


def test_dimension_off_the_block_is_a_config_error(tiny_checkpoint, tmp_path):
    """intermediate_size 100 cannot split into blocks of 32: refused up front (exit 2), naming it."""
    import shutil

    from click.testing import CliRunner
    from safetensors.torch import load_file, save_file

    from trtllm.builder.cli import main

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama"), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["intermediate_size"] = 100
    weights = {k: (v[:100] if "gate_proj" in k or "up_proj" in k else v[:, :100] if "down_proj" in k else v)
               for k, v in load_file(ckpt / "model.safetensors").items()}
    (ckpt / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in weights.items()}, ckpt / "model.safetensors", metadata={"format": "pt"})
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(tmp_path / "e"), "--quantization", "int4"])
    assert result.exit_code == 2, result.output
    assert "intermediate_size 100, not a multiple of the quantization block (32)" in result.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_quantizing_in_slices_of_columns_gives_the_whole_weights_result(name, monkeypatch):
    """A large weight (an embedding of 128k x 4096 took 6 GiB more at once) is quantized a slice of
    output columns at a time: each column's blocks are its own, so the codes, scales and offsets
    are the whole weight's, bit for bit, whatever the slice (here 700 columns of 3,000)."""
    from trtllm.builder import quantize as q

    w = (np.random.default_rng(0).standard_normal((3000, 576)) * 0.05).astype(np.float32)
    scheme = QuantScheme.named(name)
    whole = q.quantize_columns(np.ascontiguousarray(w.T), scheme)
    monkeypatch.setattr(q, "SLICE_BYTES", 576 * 4 * 700)
    sliced = quantize(w.T, scheme)
    for a, b in zip(whole, sliced):
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b))


def test_int4_minimums_and_offsets_take_the_searched_pair_where_lo_is_not_one():
    """quantize_asymmetric needs each block's minimum and its offset (min + 8 scale) on float16's
    grid. nearest_pair keeps the minimum where that already holds (nearly every block) and searches
    only the rest: the answer must be the full search's for every block, both kinds here (blocks far
    from zero against their range need a move)."""
    from trtllm.builder import quantize as q

    rng = np.random.default_rng(3)
    near = rng.standard_normal((64, 128)) * 0.02
    off = rng.standard_normal((64, 128)) * 0.05 + rng.choice([-0.5, 0.2, 0.5], size=(1, 128))  # some move
    far = rng.standard_normal((64, 128)) * 0.001 + rng.choice([-3.0, 5.0], size=(1, 128))  # need a coarser scale
    w = np.concatenate([near, off, far], axis=1).astype(np.float32)   # [in, out]
    grouped = w.reshape(2, 32, 384)
    lo = q.half_grid(grouped.min(axis=1))
    scale = q.half_grid((grouped.max(axis=1) - grouped.min(axis=1)) / 15)
    best, found = q.nearest_pair(lo, scale, 8)
    full, full_found = q.search_pair(lo.ravel(), scale.ravel(), 8, 8)
    assert np.array_equal(found.ravel(), full_found) and np.array_equal(best.ravel(), full)
    assert (best != lo)[:, 128:256].any() and not found[:, 256:].all()  # the search moved some, found none for others
    codes, scale, offset = quantize(w, QuantScheme.named("int4"))
    minimum = offset.astype(np.float64) - 8 * scale.astype(np.float64)
    assert q.on_float16_grid(offset.astype(np.float64)).all() and q.on_float16_grid(minimum).all()


def test_int4_finds_the_grid_of_weights_quantized_before(monkeypatch):
    """Weights already on a 4-bit grid per block of 32 (GGUF's Q4_K sub-blocks: a * q - m, with a
    and m of more bits than float16 holds) whose codes do not span 0..15: quantize() finds each
    block's step (quantize.grid_steps) and holds them within a float16 rounding of it, where the
    block's minimum and maximum alone (the wrong variant) round values to another grid (blocks that
    span 0..15 excepted). Float weights (32 distinct values a block, or a pruned one's zeros) are not
    searched; a fused q|k|v whose v alone is on a grid keeps v's."""
    from trtllm.builder import quantize as q

    rng = np.random.default_rng(5)
    codes = rng.integers(0, 16, size=(256, 96))
    codes[:, :48] = np.clip(codes[:, :48], 3, 12)                         # half the blocks span 3..12
    codes[::32, 48:], codes[1::32, 48:] = 0, 15                          # the others all of 0..15
    step = (rng.random((8, 96)) * 0.01 + 0.001).astype(np.float32) * np.float32(1 + 2 ** -15)
    low = (step * rng.uniform(4, 10, size=(8, 96))).astype(np.float32)  # blocks around zero, as weights are
    w = (np.repeat(step, 32, axis=0) * codes - np.repeat(low, 32, axis=0)).astype(np.float32)  # [in, out]
    scheme = QuantScheme.named("int4")
    err = np.abs(dequantize(*quantize(w, scheme), 32) - w) / np.repeat(step, 32, axis=0)
    assert err.max() < 0.02, err.max()
    # (llama.cpp's Q3_K_M: a Q4_K v beside Q3_K q and k, one MatMul here)
    fused = np.concatenate([rng.standard_normal((256, 160)).astype(np.float32), w[:, :32]], axis=1)
    err = np.abs(dequantize(*quantize(fused, scheme), 32) - fused)[:, 160:] / np.repeat(step[:, :32], 32, axis=0)
    assert err.max() < 0.02, err.max()
    floats = rng.standard_normal((256, 96)).astype(np.float32)
    assert not q.any_few_values(floats.reshape(8, 32, 96), 15)  # (not even sampled for a grid)
    floats[rng.random(floats.shape) < 0.6] = 0  # a pruned weight: mostly zeros, no grid (searching took 4x)
    assert not q.quantized_before(floats.reshape(8, 32, 96), 15)
    monkeypatch.setattr(q, "quantized_before", lambda *args: False)
    plain = np.abs(dequantize(*quantize(w, scheme), 32) - w) / np.repeat(step, 32, axis=0)
    assert plain[:, :48].max() > 0.1 and plain[:, 48:].max() < 0.02


def test_int4_codes_pack_two_to_a_byte_and_back():
    from trtllm.builder.quantize import ONNX_DTYPE, pack_nibbles, unpack_nibbles

    codes = np.random.default_rng(0).integers(-8, 8, (7, 5)).astype(np.int8).astype(ONNX_DTYPE[4])  # odd count
    packed = pack_nibbles(codes)
    assert packed[0].nbytes == 18
    back = unpack_nibbles(packed)
    assert back.dtype == codes.dtype and back.shape == codes.shape
    assert np.array_equal(back.astype(np.int8), codes.astype(np.int8))


@pytest.mark.parametrize("kernels", ["native", "onnxruntime"])
def test_each_int4_weight_is_quantized_once_for_both_graphs(kernels, quantized, monkeypatch, tmp_path):
    """llm.onnx and its ONNX Runtime form hold the same int4 weights: the second writer takes the
    first's (codes packed two to a byte between them), and writes what quantizing again wrote, byte
    for byte. (The int8 lm_head is rounded by each: quick, and not held between them.)"""
    name = "int4"
    from trtllm.builder import weights

    ckpt, engines = quantized
    calls = []
    real = weights.quantize_rows
    monkeypatch.setattr(weights, "quantize_rows",
                        lambda w, scheme, **kw: calls.append(scheme.bits) or real(w, scheme, **kw))
    again = tmp_path / "again"
    build(BuildConfig(model=str(ckpt), output=str(again), quantization=name, max_input_len=128,
                      max_kv_cache_capacity=256, verify=False, cpu_kernels=kernels), log=lambda m: None)
    once = calls.count(4)
    calls.clear()
    quantize_weight = weights.WeightWriter.quantize_weight

    def without_handoff(self, *args, **kwargs):  # each writer quantizes for itself, as before
        self.handoff, self.hand_on = {}, None
        return quantize_weight(self, *args, **kwargs)

    monkeypatch.setattr(weights.WeightWriter, "quantize_weight", without_handoff)
    twice = tmp_path / "twice"
    build(BuildConfig(model=str(ckpt), output=str(twice), quantization=name, max_input_len=128,
                      max_kv_cache_capacity=256, verify=False, cpu_kernels=kernels), log=lambda m: None)
    assert calls.count(4) == 2 * once and once > 0
    for f in ("llm.onnx.data", "llm.ort.onnx.data", "llm.ort.onnx"):
        assert (again / f).read_bytes() == (twice / f).read_bytes(), f
