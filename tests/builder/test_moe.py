"""Mixtures of experts (builder/moe.py) beyond the parity suite (tests/parity/test_tiny_parity.py):
16-bit engines, the TensorRT targets (the stand-in runs llm.onnx, whose experts are standard ops),
what the build refuses, and the spec read from each config."""
from __future__ import annotations

import contextlib
import json

import numpy as np
import onnx
import pytest
import torch

from tests import fakes
from tests.parity.test_tiny_parity import hf_model, variant
from tests.tiny_models import make_checkpoint
from trtllm.builder.checkpoint import CheckpointError
from trtllm.builder.config import BuildConfig, ConfigError
from trtllm.builder.export import build
from trtllm.builder.verify import engine_logits
from trtllm.runtime.engine import load_engine

pytestmark = pytest.mark.hf
LIMITS = dict(max_input_len=64, max_kv_cache_capacity=128, max_batch_size=3)
PROMPT = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11]


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    return make_checkpoint("qwen3_moe", tmp_path_factory.mktemp("qwen3-moe"))


def reference_logits(ckpt, generated: list[int]) -> np.ndarray:
    model = hf_model(ckpt)
    with torch.no_grad():
        return model(torch.tensor([PROMPT + generated[:-1]])).logits[0, len(PROMPT) - 1:].numpy()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_engines_pass_the_build_check(dtype, qwen3_moe, tmp_path):
    """On our kernels (float32 arithmetic on 16-bit weights): the experts on trtllm.cpu::MoE, held in
    the engine's type (ONNX Runtime's MoE node would take them in float32: twice the bytes), within the
    build's check against transformers (its greedy tokens and top-1 agreement floor)."""
    from trtllm.plugins import cpu

    out = build(BuildConfig(model=str(qwen3_moe), output=str(tmp_path / "e"), dtype=dtype, **LIMITS),
                log=lambda m: None)
    report = json.loads((out / "verify.json").read_text())
    assert report["tokens_agree"] and report["top1_agreement"] >= report["min_agreement"]
    assert cpu.MOE_LOWERING in json.loads((out / "manifest.json").read_text())["lowerings"]
    graph = onnx.load(out / "llm.ort.onnx", load_external_data=False).graph
    held = {t.name: t.data_type for t in graph.initializer}
    experts = [n for n in graph.node if (n.domain, n.op_type) == (cpu.DOMAIN, cpu.MOE)]
    assert experts and all(held[w] == getattr(onnx.TensorProto, dtype.upper()) for n in experts for w in n.input[2:4])


def test_without_our_kernels_onnx_runtime_moe_node_runs_the_experts(qwen3_moe, tmp_path):
    """--cpu-kernels onnxruntime: com.microsoft MoE takes the experts (float32), and matches transformers."""
    out = build(BuildConfig(model=str(qwen3_moe), output=str(tmp_path / "e"), cpu_kernels="onnxruntime", **LIMITS),
                log=lambda m: None)
    assert json.loads((out / "manifest.json").read_text())["lowerings"] == ["MoE"]
    generated, got = engine_logits(load_engine(out), PROMPT, num_decode=4)
    np.testing.assert_allclose(got, reference_logits(qwen3_moe, generated), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["qwen3_moe", "gemma4-moe", "lfm2_moe"])
@pytest.mark.parametrize("options, env", [({}, {}), ({"graph": "legacy", "trt_version": "10.3"},
                                                   {"FAKE_TRT_VERSION": "10.3.0.30"})])
def test_the_tensorrt_graph_matches_transformers(options, env, arch, qwen3_moe, tiny_checkpoint, tmp_path):
    """llm.onnx, what TensorRT parses (modern and legacy profiles, each linted for its version by the
    build): every expert on every token in standard ops, the chosen ones weighted (Gemma 4's experts beside
    its MLP, LFM2-MoE's sigmoid routing); the stand-in runs it."""
    ckpt = qwen3_moe if arch == "qwen3_moe" else tiny_checkpoint(arch)
    with fakes.installed(**env):
        out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), backend="tensorrt", **options,
                                **LIMITS), log=lambda m: None)
        generated, got = engine_logits(load_engine(out), PROMPT, num_decode=4)
    ops = {n.op_type for n in onnx.load(out / "llm.onnx", load_external_data=False).graph.node}
    assert {"TopK", "ScatterElements"} <= ops and "MoE" not in ops
    np.testing.assert_allclose(got, reference_logits(ckpt, generated), atol=1e-4, rtol=0)


@pytest.mark.parametrize("options, message", [
    ({"quantization": "int8", "cpu_kernels": "onnxruntime"},
     r"--quantization int8: Qwen3MoeForCausalLM is a mixture of experts \(4 experts, 2 a token\), whose int8 experts "
     r"run on our CPU kernels only .*, and --cpu-kernels onnxruntime asks for ONNX Runtime's own; use --quantization int4"),
    ({"quantization": "int4", "dtype": "float16", "cpu_kernels": "onnxruntime"},
     r"--quantization int4 --dtype float16 .* use --dtype float32"),
    ({"quantization": "int8", "backend": "tensorrt"}, r"--quantization int8 --backend tensorrt: .* quantized experts "
                                                      r"are built for ONNX Runtime only for now"),
])
def test_what_is_not_built_yet_is_refused_by_name(options, message, qwen3_moe, tmp_path):
    trt = fakes.installed() if options.get("backend") == "tensorrt" else contextlib.nullcontext()  # (the stand-in)
    with trt, pytest.raises(ConfigError, match=message):
        build(BuildConfig(model=str(qwen3_moe), output=str(tmp_path / "e"), **options, **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("options, message", [
    ({"quantization": "int4", "dtype": "float16"}, r"--quantization int4 --dtype float16: .* whose int4 experts run "
                                                   r"on ONNX Runtime's QMoE without our CPU kernels \(the native CPU "
                                                   r"kernel library .*\), with --dtype float32 only"),
    ({"quantization": "int8"}, r"--quantization int8: .* whose int8 experts run on our CPU kernels only .*, and the "
                               r"native CPU kernel library"),
])
def test_without_our_library_what_only_it_runs_is_refused(options, message, qwen3_moe, tmp_path, monkeypatch):
    """No kernel library (no g++): int4 experts go to ONNX Runtime's QMoE, in float32 engines only,
    and int8 ones are refused, each saying why and what to do."""
    from trtllm.plugins import cpu

    monkeypatch.setattr(cpu, "library", lambda: None)
    with pytest.raises(ConfigError, match=message):
        build(BuildConfig(model=str(qwen3_moe), output=str(tmp_path / "e"), **options, **LIMITS), log=lambda m: None)


@pytest.mark.parametrize("activations, exact", [("int16", 1), ("float32", 0)])
def test_integer_activation_engines_ask_for_exact_expert_rows(activations, exact, qwen3_moe, tmp_path):
    """With --activations int16|int8 the other projections compute generated rows the same in any
    batch, so the experts' node is asked to as well (exact_rows: tests/plugins/test_cpu_moe.py shows
    it holds); float32-activation engines are exact for prompts only, and their experts' decode
    rows go by count (faster batched decode)."""
    from onnx import helper

    from trtllm.plugins import cpu

    out = build(BuildConfig(model=str(qwen3_moe), output=str(tmp_path / "e"), quantization="int4",
                            activations=activations, verify=False, **LIMITS), log=lambda m: None)
    nodes = [n for n in onnx.load(out / "llm.ort.onnx", load_external_data=False).graph.node if n.op_type == cpu.MOE_QUANT]
    assert nodes and all({a.name: helper.get_attribute_value(a) for a in n.attribute}["exact_rows"] == exact
                         for n in nodes)


def test_the_int4_expert_quantizer():
    """By row and block of 32: within half a step of the weights, zero held exactly, codes and zero
    points in [0, 15] two to a byte; llm.onnx's form (s c + o, c = q - 8) is the same weights."""
    from trtllm.builder.moe_quant import BLOCK, dequantized, handed_on, nibbles, quantize_experts, taken

    w = np.random.default_rng(0).standard_normal((3, 8, 96)).astype(np.float32)
    w[0, 0, :BLOCK] = np.abs(w[0, 0, :BLOCK]) + 1  # positive weights: the block's range still holds 0
    w[0, 1, :BLOCK] = -np.abs(w[0, 1, :BLOCK]) - 1  # negative ones: zero point 15
    w[0, 2, :BLOCK] = 0.0  # all zeros: codes at the zero point, any scale
    experts = quantize_experts(w)
    step = np.repeat(experts.scale, BLOCK, axis=-1)
    assert np.all(np.abs(dequantized(experts) - w) <= 0.5 * step + 1e-6)
    assert experts.q.max() <= 15 and experts.zero.max() <= 15
    assert (experts.zero[0, 0, 0], experts.zero[0, 1, 0]) == (0, 15) and not dequantized(experts)[0, 2, :BLOCK].any()
    back = taken(handed_on(experts))  # the build's first writer to its second, codes two to a byte
    assert all(np.array_equal(a, b) for a, b in zip((back.q, back.scale, back.zero), (experts.q, experts.scale,
                                                                                       experts.zero)))
    codes, scale, offset = experts.canonical()
    canonical = (codes.astype(np.float32).reshape(3, 96 // BLOCK, BLOCK, 8) * scale.reshape(3, -1, 1, 8)
                 + offset.reshape(3, -1, 1, 8)).reshape(3, 96, 8).transpose(0, 2, 1)
    np.testing.assert_allclose(canonical, dequantized(experts), atol=1e-6, rtol=0)
    packed = nibbles(experts.zero)  # 3 blocks: padded to 4 nibbles
    assert packed.shape == (3, 8, 2) and np.array_equal(packed[..., 0] & 15, experts.zero[..., 0])
    assert np.array_equal(packed[..., 1] >> 4, np.zeros((3, 8), np.uint8))


def dense_experts(experts: np.ndarray, scheme) -> np.ndarray:
    """Each expert [N, K] quantized and dequantized as the model's other projections."""
    from tests.builder.test_quantized import dequantized_weight

    return np.stack([dequantized_weight(w, scheme) for w in experts])


@pytest.mark.parametrize("arch", ["qwen3_moe", "olmoe", "qwen2_moe", "granitemoe", "granitemoe-plain", "mixtral",
                                  "gemma4-moe", "lfm2_moe", "granite4-moe", "ernie4_5_moe", "afmoe"])
@pytest.mark.parametrize("quantization, kernel", [("int4", True), ("int8", True), ("int4", False)])
def test_quantized_experts_compute_their_dequantized_weights(arch, quantization, kernel, tiny_checkpoint, tmp_path,
                                                              monkeypatch):
    """--quantization int4|int8: the ONNX Runtime form, on our MoEBlockQuant (experts quantized as the
    other projections), or without it (`kernel` False: a build without our MoE kernel) on QMoE (int4
    by row with zero points, moe_quant.py; Gemma 4's GELU experts and LFM2-MoE's: standard ops, no ONNX
    Runtime node routes them), and llm.onnx (DequantizeLinear, as TensorRT parses it)
    all compute transformers with every weight replaced by its dequantized value, at float32
    tolerance; normalized top-k weights or not (QMoE is given the softmax for those), shared experts
    gated or not, a dense layer. Random tiny weights are too fragile for the build's agreement
    check: built with verify off, checked here."""
    from tests.builder.test_quantized import dequantized_model
    from tests.engine_helpers import unoptimized_sessions
    from trtllm.builder import decoder, export
    from trtllm.builder.moe_quant import dequantized, quantize_experts
    from trtllm.builder.quantize import QuantScheme
    from trtllm.plugins import cpu

    if not kernel:
        for module in (decoder, export):
            monkeypatch.setattr(module, "moe_kernel_takes", lambda spec, quant: False)
    ckpt, scheme = tiny_checkpoint(arch), QuantScheme.named(quantization)
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization=quantization, verify=False,
                            **LIMITS), log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text())
    # (Gemma 4's GELU experts, LFM2-MoE's sigmoid routing and ERNIE 4.5's selection bias have no ONNX Runtime
    # node: without our kernel, standard ops run them)
    standard = arch in ("gemma4-moe", "lfm2_moe", "ernie4_5_moe", "afmoe")
    node = cpu.MOE_QUANT_LOWERING if kernel else "standard ops" if standard else "QMoE"
    assert node.split("::")[-1] in manifest["quantization_scheme"]["experts"]
    assert (node in manifest["lowerings"]) == (node != "standard ops")
    assert "router" in manifest["quantization_scheme"]["not_quantized"]
    float_experts = dequantized_model(ckpt, scheme)  # the wrong variant: experts left float
    model = dequantized_model(ckpt, scheme)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                w = p.numpy().copy()
                p.copy_(torch.from_numpy(dense_experts(w, scheme) if kernel else dequantized(quantize_experts(w))))
    for graph in ("compiled", "onnx"):
        with unoptimized_sessions():
            engine = load_engine(out, graph=graph)
        generated, got = engine_logits(engine, PROMPT, num_decode=4)
        with torch.no_grad():
            ids = torch.tensor([PROMPT + generated[:-1]])
            ref = model(ids).logits[0, len(PROMPT) - 1:].numpy()
            wrong = float_experts(ids).logits[0, len(PROMPT) - 1:].numpy()
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
        assert np.abs(got - wrong).max() > 3e-4, np.abs(got - wrong).max()


def test_int4_needs_expert_widths_in_whole_blocks():
    """Each expert's input widths (hidden size for gate|up, its own width for down) split into blocks of 32."""
    import dataclasses

    from trtllm.builder.decoder_spec import DecoderSpec
    from trtllm.builder.model_limits import check_blocks
    from trtllm.builder.moe import MoE
    from trtllm.builder.quantize import QuantScheme

    spec = DecoderSpec(architecture="Qwen3MoeForCausalLM", vocab_size=64, hidden_size=64, intermediate_size=80,
                       num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6,
                       moe=MoE(num_experts=4, top_k=2, expert_size=48, normalize=True))
    with pytest.raises(ConfigError, match=r"the experts' intermediate size 48, not a multiple of the quantization "
                                          r"block \(32\)"):
        check_blocks(spec, QuantScheme.named("int4"), "the model")
    # intermediate_size (80) is no MLP's width without a dense layer: not asked for
    check_blocks(dataclasses.replace(spec, moe=MoE(num_experts=4, top_k=2, expert_size=64, normalize=True)),
                 QuantScheme.named("int4"), "the model")


def edited(tmp_path, arch: str, **changes):
    """A tiny `arch` checkpoint with these config keys set."""
    return variant(tmp_path, arch, lambda config, weights: [setattr(config, k, v) for k, v in changes.items()])


@pytest.mark.parametrize("arch, changes, message", [
    ("olmoe", {"clip_qkv": 8.0}, r"config.clip_qkv must be null"),
    ("qwen3_moe", {"num_experts_per_tok": 5}, r"config.num_experts_per_tok \(5\) must be at most config.num_experts"),
])
def test_configs_the_graph_would_route_wrong_are_refused(arch, changes, message, tmp_path):
    with pytest.raises(CheckpointError, match=message):
        build(BuildConfig(model=str(edited(tmp_path, arch, **changes)), output=str(tmp_path / "e"), **LIMITS),
              log=lambda m: None)


@pytest.mark.parametrize("arch, method", [("qwen3_moe", "gptq"), ("qwen2_moe", "awq"), ("mixtral", "gptq")])
def test_a_pre_quantized_mixture_of_experts_is_transformers_on_its_weights(arch, method, tmp_path, monkeypatch):
    """GPTQ/AWQ pack each expert's projections on their own (one Linear each; Mixtral's w1, w2, w3 under
    block_sparse_moe), where transformers 5 holds them stacked: each is read back and stacked as
    transformers stacks a float checkpoint's, and the engine computes transformers fed those float
    weights as a float checkpoint of per-expert weights (transformers stacks them itself), at float32
    tolerance. The wrong variant, up before gate in the stack, must miss it."""
    import shutil

    from safetensors.numpy import load_file, save_file

    from tests.prequantized_files import write_prequantized
    from trtllm.builder import prequantized

    src = make_checkpoint(arch, tmp_path / "float")
    reference = write_prequantized(src, tmp_path / "packed", method, sym=method == "gptq")  # {weight: its float}
    assert sum(".experts.0." in name for name in reference) % 3 == 0 < len(reference)  # (every expert packed)
    assert not any(name.endswith((".gate_up_proj", ".experts.down_proj")) for name in load_file(tmp_path / "packed" /
                                                                                              "model.safetensors"))
    theirs = shutil.copytree(src, tmp_path / "reference")
    tensors = load_file(src / "model.safetensors")
    save_file({**tensors, **{k: np.ascontiguousarray(w) for k, w in reference.items()}}, theirs / "model.safetensors",
              metadata={"format": "pt"})  # (safetensors writes an array's buffer as it lies: C order needed)

    def engine_against_reference(name: str) -> tuple[np.ndarray, np.ndarray]:
        out = build(BuildConfig(model=str(tmp_path / "packed"), output=str(tmp_path / name), **LIMITS),
                    log=lambda m: None)
        generated, got = engine_logits(load_engine(out), PROMPT, num_decode=4)
        return got, reference_logits(theirs, generated)

    np.testing.assert_allclose(*engine_against_reference("e"), atol=1e-4, rtol=0)
    swapped = {"gate_up_proj": (("up_proj", "gate_proj"), ("w3", "w1")), "down_proj": (("down_proj",), ("w2",))}
    monkeypatch.setattr(prequantized, "EXPERT_PARTS", swapped)
    assert not np.allclose(*engine_against_reference("wrong"), atol=1e-2)


def test_keys_only_qwen_reads_change_nothing_elsewhere(tmp_path):
    """mlp_only_layers and decoder_sparse_step are Qwen's: Mixtral's class ignores them, and so does
    its spec (they crashed the build), as it does router_jitter_noise (training only)."""
    from trtllm.builder import checkpoint as ckpt
    from trtllm.builder.architectures import spec_for

    ckpt_dir = edited(tmp_path, "mixtral", mlp_only_layers=[0], decoder_sparse_step=2, router_jitter_noise=0.1)
    assert spec_for(ckpt.load(str(ckpt_dir)).model).moe.dense_layers == ()


def test_each_config_gives_its_routing(tiny_checkpoint):
    """What each class does, as the spec says it: Qwen's norm_topk_prob, Mixtral's and Granite's
    softmax over the top-k (normalized), Qwen2-MoE's gated shared expert and dense layer."""
    from trtllm.builder import checkpoint as ckpt
    from trtllm.builder.architectures import spec_for

    def moe(arch):
        return spec_for(ckpt.load(str(tiny_checkpoint(arch))).model).moe
    assert (moe("qwen3_moe").normalize, moe("olmoe").normalize, moe("mixtral").normalize) == (True, False, True)
    qwen2 = moe("qwen2_moe")
    assert (qwen2.shared_size, qwen2.shared_gate, qwen2.dense_layers, qwen2.normalize) == (64, True, (1,), False)
    granite = moe("granitemoe")
    assert (granite.shared_size, granite.shared_gate, granite.normalize, granite.expert_size) == (64, False, True, 128)


@pytest.mark.parametrize("options", [dict(cpu_kernels="onnxruntime"), dict(dtype="bfloat16"), dict(dtype="float16")])
def test_lfm2_moe_s_routing_runs_without_our_kernels_and_in_16_bits(options, tiny_checkpoint, tmp_path):
    """LFM2-MoE's routing (sigmoid scores, the expert bias choosing, a routed scale: test_tiny_parity.py's
    "lfm2_moe" on our kernel) has no ONNX Runtime node: without our kernels its experts are llm.onnx's
    standard ops; 16-bit engines hold them on our MoE kernel. The build's check passes each."""
    from trtllm.plugins import cpu

    engine = build(BuildConfig(model=str(tiny_checkpoint("lfm2_moe")), output=str(tmp_path / "e"), **options,
                               **LIMITS), log=lambda m: None)
    lowerings = json.loads((engine / "manifest.json").read_text())["lowerings"]
    ops = {n.op_type for n in onnx.load(str(engine / "llm.ort.onnx"), load_external_data=False).graph.node}
    if "cpu_kernels" in options:
        assert not {"MoE", "QMoE", cpu.MOE} & ops and {"Sigmoid", "TopK", "GatherElements"} <= ops
        assert not {"MoE", "QMoE", cpu.MOE_LOWERING} & set(lowerings)
    elif cpu.library() is not None:
        assert cpu.MOE_LOWERING in lowerings

