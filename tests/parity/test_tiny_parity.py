"""Every architecture against transformers on a tiny random checkpoint:
prefill/decode logits within 1e-4 and 32 greedy tokens token-exact, alone and in a batch."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime import sampling  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, prefill_inputs  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402

from tests.engine_helpers import run_greedy  # noqa: E402

pytestmark = pytest.mark.hf
ARCHS = ["llama", "mistral", "ministral", "qwen2", "qwen3", "phi3", "phi4-mini", "smollm3", "gemma", "gemma2", "gemma3",
         "gemma4", "gemma4-kv", "gemma4-moe", "lfm2", "lfm2_moe", "lfm3", "granite", "olmo2", "olmo3", "exaone4",
         "ernie4_5", "helium", "hunyuan", "glm", "glm4", "arcee", "apertus",
         "qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "granitemoe", "granitemoe-plain", "granite4", "granite4-moe",
         "ernie4_5_moe", "afmoe", "granite4-h", "granite4-h-moe", "bamba"]
MOE_ARCHS = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "granitemoe", "granitemoe-plain", "gemma4-moe", "lfm2_moe",
             "granite4-moe", "ernie4_5_moe", "afmoe", "granite4-h-moe")
PROMPTS = [[5, 17, 42, 99, 7], list(range(30, 52)), [3, 200, 11], list(range(100, 140, 3))]
ATOL = 1e-4


def hf_model(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch, tiny_checkpoint, tiny_engine):
    model, engine = hf_model(tiny_checkpoint(arch)), load_engine(tiny_engine(arch))
    for prompt in PROMPTS:
        generated, got = engine_logits(engine, prompt, num_decode=4)
        with torch.no_grad():
            ref = model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_match_generate(arch, tiny_checkpoint, tiny_engine):
    model, engine = hf_model(tiny_checkpoint(arch)), load_engine(tiny_engine(arch))
    expected = [hf_greedy(model, p, 32) for p in PROMPTS]
    for prompt, want in zip(PROMPTS, expected):
        assert run_greedy(engine, [prompt], 32) == [want]
    # Different lengths in one batch: each row must be exactly what it is alone.
    assert run_greedy(engine, PROMPTS, 32) == expected


def test_wrong_positions_are_caught(tiny_checkpoint, tiny_engine):
    """The deliberately wrong variant: RoPE positions doubled must fail the same tolerance.
    (A constant shift would not do: RoPE attention only sees relative positions.)"""
    model, engine = hf_model(tiny_checkpoint("llama")), load_engine(tiny_engine("llama"))
    prompt = PROMPTS[1]
    batch = sampling.make_batch([sampling.SamplingParams(temperature=0.0)], engine.manifest.model.vocab_size,
                                engine.manifest.max_top_k)
    row = RowState(prompt_ids=prompt, params=sampling.SamplingParams(temperature=0.0, max_new_tokens=1),
                   rng=np.random.default_rng(0), eos_ids=frozenset())
    inputs = prefill_inputs([row], engine.manifest.pad_token_id, batch)
    wrong = type(inputs)(input_ids=inputs.input_ids, position_ids=inputs.position_ids * 2,
                         write_index=inputs.write_index, last_index=inputs.last_index, sampling=batch)
    got = engine.step(wrong, KVCacheManager(engine.manifest.model, 1, 64).view(0, 1), want_logits=True).logits[0].copy()
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0, -1].numpy()
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


def variant(tmp_path, arch: str, edit) -> Path:
    """A tiny `arch` checkpoint with its config (and weights) changed by edit(config, state_dict)."""
    from safetensors.torch import load_file, save_file

    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint(arch, tmp_path / "ckpt", seed=3)
    config = transformers.AutoConfig.from_pretrained(ckpt)
    weights = load_file(ckpt / "model.safetensors")
    edit(config, weights)
    config.save_pretrained(ckpt)
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    return ckpt


def with_attention_bias(config, weights):
    """attention_bias on Llama and Qwen3 puts a bias on o_proj too (Qwen2's q/k/v only)."""
    config.attention_bias = True
    for key in [k for k in weights if k.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"))]:
        weights[key.replace(".weight", ".bias")] = torch.randn(weights[key].shape[0]) * 0.5


def untied_head_kept(config, weights):
    """tie_word_embeddings with its own lm_head.weight: transformers keeps the head (it warns)."""
    weights["lm_head.weight"] = torch.randn_like(weights["model.embed_tokens.weight"]) * 0.1


def dense_layer_0(config, weights):
    """decoder_sparse_step 2: layer 0 a dense MLP (intermediate_size), with weights of its own."""
    config.decoder_sparse_step = 2
    for key in [k for k in weights if k.startswith("model.layers.0.mlp.")]:
        del weights[key]
    h, inter = config.hidden_size, config.intermediate_size
    for name, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        weights[f"model.layers.0.mlp.{name}.weight"] = torch.randn(shape) * 2 / shape[1] ** 0.5


VARIANTS = {
    # Mistral with a window shorter than the prompt: the in-graph window mask matches HF
    "mistral window 8": ("mistral", lambda c, w: setattr(c, "sliding_window", 8)),
    # Mistral slides whatever Qwen's use_sliding_window says (transformers' Mistral reads
    # sliding_window alone; a Mistral config with layer_types loads as Ministral, which is refused)
    "mistral window 8, use_sliding_window false": ("mistral", lambda c, w: (
        setattr(c, "sliding_window", 8), setattr(c, "use_sliding_window", False))),
    # Qwen2 with every layer sliding (use_sliding_window, layer_types), and with the switch off
    "qwen2 window 8": ("qwen2", lambda c, w: (
        setattr(c, "sliding_window", 8), setattr(c, "use_sliding_window", True), setattr(c, "max_window_layers", 0),
        setattr(c, "layer_types", ["sliding_attention"] * c.num_hidden_layers))),
    "qwen2 window off": ("qwen2", lambda c, w: (setattr(c, "sliding_window", 8), setattr(c, "use_sliding_window", False))),
    # mixed layers (Qwen's max_window_layers): the window on some layers only
    "qwen2 window 8 on layer 1": ("qwen2", lambda c, w: (
        setattr(c, "sliding_window", 8), setattr(c, "use_sliding_window", True),
        setattr(c, "layer_types", ["full_attention", "sliding_attention"]))),
    "qwen3 window 8 on layer 0": ("qwen3", lambda c, w: (
        setattr(c, "sliding_window", 8), setattr(c, "use_sliding_window", True),
        setattr(c, "layer_types", ["sliding_attention", "full_attention"]))),
    # Gemma 3 with every layer sliding (one RoPE table, the local one), or none; with biases
    "gemma3 every layer sliding": ("gemma3", lambda c, w: setattr(c, "layer_types", ["sliding_attention"] * 2)),
    "gemma3 no sliding layer": ("gemma3", lambda c, w: setattr(c, "layer_types", ["full_attention"] * 2)),
    "gemma3 attention_bias": ("gemma3", with_attention_bias),
    # Gemma 2 with its own soft-capping constants and without either (null: transformers skips it);
    # Gemma 3 with Gemma 2's: its class caps the logits, and keeps attn_logit_softcapping unused
    "gemma2 Gemma 2's softcaps": ("gemma2", lambda c, w: (setattr(c, "attn_logit_softcapping", 50.0),
                                                       setattr(c, "final_logit_softcapping", 30.0))),
    "gemma2 no softcaps": ("gemma2", lambda c, w: (setattr(c, "attn_logit_softcapping", None),
                                                  setattr(c, "final_logit_softcapping", None))),
    "gemma3 with softcaps": ("gemma3", lambda c, w: (setattr(c, "attn_logit_softcapping", 1.5),
                                                    setattr(c, "final_logit_softcapping", 8.0))),
    # LongRoPE (its short factors: the capacity is cut to 64) on half of each head, and a window
    "phi3 longrope, partial rotary, window 8": ("phi3", lambda c, w: (
        setattr(c, "sliding_window", 8), setattr(c, "original_max_position_embeddings", 64),
        setattr(c, "rope_parameters", {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                       "short_factor": [1.0, 1.3, 2.1, 3.5], "long_factor": [1.5, 4.0, 9.0, 16.0],
                                       "original_max_position_embeddings": 64}))),
    # SmolLM3's window (use_sliding_window) goes on its NoPE layers
    "smollm3 window 8": ("smollm3", lambda c, w: (
        setattr(c, "sliding_window", 8), setattr(c, "use_sliding_window", True),
        setattr(c, "layer_types", ["full_attention", "sliding_attention"]))),
    # RoPE scaling on an HF checkpoint (original length 16 < the positions fed, up to 27); `dynamic`
    # is the default table up to max_position_embeddings (28 here: the last position fed is its
    # last), where the KV capacity stops
    "llama rope linear": ("llama", lambda c, w: setattr(c, "rope_parameters", {
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})),
    "llama rope llama3": ("llama", lambda c, w: setattr(c, "rope_parameters", {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16})),
    "llama rope yarn": ("llama", lambda c, w: setattr(c, "rope_parameters", {
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16})),
    "llama rope dynamic": ("llama", lambda c, w: (setattr(c, "max_position_embeddings", 28), setattr(
        c, "rope_parameters", {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}))),
    # LongRoPE on the full layers of a per-layer-type RoPE (the capacity cut to its original 32): a
    # bare KeyError stopped the build
    "gemma3 longrope on the full layers": ("gemma3", lambda c, w: setattr(c, "rope_parameters", {
        "full_attention": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
                           "short_factor": [1.0, 1.3, 2.1, 3.5, 4.0, 5.0, 6.0, 7.0],
                           "long_factor": [1.5, 4.0, 9.0, 16.0, 20.0, 30.0, 40.0, 50.0]},
        "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
    # Llama ignores sliding_window: an engine with a window would be wrong past it
    "llama ignores sliding_window": ("llama", lambda c, w: setattr(c, "sliding_window", 8)),
    "llama attention_bias": ("llama", with_attention_bias),
    "llama hidden_act swish (SiLU's other name)": ("llama", lambda c, w: setattr(c, "hidden_act", "swish")),
    "qwen3 attention_bias": ("qwen3", with_attention_bias),
    "llama tied, own lm_head": ("llama", untied_head_kept),
    # mixtures of experts with a window shorter than the prompt (Qwen3-MoE's on every layer where the
    # config keeps it, Mixtral's always), and Qwen3-MoE's layer 0 dense (decoder_sparse_step 2)
    "qwen3_moe window 8": ("qwen3_moe", lambda c, w: (setattr(c, "sliding_window", 8),
                                                      setattr(c, "use_sliding_window", True))),
    "mixtral window 8": ("mixtral", lambda c, w: setattr(c, "sliding_window", 8)),
    "qwen3_moe layer 0 dense": ("qwen3_moe", dense_layer_0),
    # the class comes from model_type, whatever config.architectures says
    "qwen2 labelled llama": ("qwen2", lambda c, w: setattr(c, "architectures", ["LlamaForCausalLM"])),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_config_variants_match_transformers(name, tmp_path):
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ckpt = variant(tmp_path, *VARIANTS[name])
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), max_kv_cache_capacity=128,
                            max_input_len=64, verify=False), log=lambda m: None)
    model, engine = hf_model(ckpt), load_engine(out)
    prompt = PROMPTS[1]
    generated, got = engine_logits(engine, prompt, num_decode=6)
    with torch.no_grad():
        ref = model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


# EXAONE 3.0 / 3.5's own names for Llama's modules, and for its config keys (transformers' conversion
# mapping reads them back: the model loads as LlamaForCausalLM)
EXAONE_NAMES = [("model.embed_tokens.", "transformer.wte."), ("model.layers.", "transformer.h."),
                ("model.norm.", "transformer.ln_f."), (".self_attn.o_proj.", ".attn.attention.out_proj."),
                (".self_attn.", ".attn.attention."), (".input_layernorm.", ".ln_1."),
                (".post_attention_layernorm.", ".ln_2."), (".mlp.gate_proj.", ".mlp.c_fc_0."),
                (".mlp.up_proj.", ".mlp.c_fc_1."), (".mlp.down_proj.", ".mlp.c_proj.")]
EXAONE_KEYS = {"num_hidden_layers": "num_layers", "rms_norm_eps": "layer_norm_epsilon", "hidden_act": "activation_function"}


def test_an_exaone_checkpoint_in_its_own_names_matches_transformers(tmp_path):
    """EXAONE 3.0 and 3.5 (model_type exaone: LGAI-EXAONE/EXAONE-3.5-2.4B-Instruct and the like) keep
    GPT-2-style module names (transformer.h.N.attn.attention.q_proj, ln_1, mlp.c_fc_0, ...) and config keys
    (num_layers, layer_norm_epsilon, activation_function). transformers loads them as LlamaForCausalLM, and
    the build takes that model: the engine's logits are transformers'. Its deliberately wrong variant,
    gate and up swapped in the file, is caught by the same comparison."""
    from safetensors.torch import load_file, save_file

    from tests.tiny_models import make_checkpoint
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ckpt = make_checkpoint("llama", tmp_path / "ckpt", seed=3)
    config = json.loads((ckpt / "config.json").read_text())
    config = {EXAONE_KEYS.get(k, k): v for k, v in config.items()}
    config.update(model_type="exaone", architectures=["ExaoneForCausalLM"])
    (ckpt / "config.json").write_text(json.dumps(config))
    weights = load_file(ckpt / "model.safetensors")
    for old, new in EXAONE_NAMES:
        weights = {k.replace(old, new): v for k, v in weights.items()}
    assert "transformer.h.0.attn.attention.q_proj.weight" in weights and "transformer.h.0.mlp.c_fc_1.weight" in weights
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), max_kv_cache_capacity=128,
                            max_input_len=64, verify=False), log=lambda m: None)
    assert json.loads((out / "manifest.json").read_text())["architecture"] == "LlamaForCausalLM"
    prompt = PROMPTS[1]
    generated, got = engine_logits(load_engine(out), prompt, num_decode=6)
    model = hf_model(ckpt)
    with torch.no_grad():
        ref = model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    for key in [k for k in weights if ".mlp.c_fc_0." in k]:  # (the wrong variant)
        other = key.replace("c_fc_0", "c_fc_1")
        weights[key], weights[other] = weights[other], weights[key]
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    with torch.no_grad():
        wrong = hf_model(ckpt)(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
    assert np.abs(got - wrong).max() > 1e-2


def test_longrope_with_a_short_original_length_passes_the_build_check(tmp_path):
    """The build's agreement check compares with transformers on the tokens the engine was fed: one
    more took transformers' LongRoPE past original_max_position_embeddings (64 here), to its long
    factors, and failed a correct engine (9% agreement)."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ckpt = variant(tmp_path, *VARIANTS["phi3 longrope, partial rotary, window 8"])
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), max_kv_cache_capacity=128,
                            max_input_len=64), log=lambda m: None)
    report = json.loads((out / "verify.json").read_text())
    assert report["top1_agreement"] >= report["min_agreement"] and report["tokens_agree"]


def test_a_smollm3_whose_layer_types_slide_without_use_sliding_window_is_refused(tmp_path):
    """transformers' mask slides such layers (config.sliding_window) while its attention modules hold
    no window: a review saw the engine built without one, its logits 10.9 off past the window (128,
    beyond the build check's text). Refused, naming both keys."""
    from trtllm.builder.checkpoint import CheckpointError
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ckpt = variant(tmp_path, "smollm3", lambda c, w: (
        setattr(c, "sliding_window", 128), setattr(c, "use_sliding_window", False),
        setattr(c, "layer_types", ["sliding_attention", "full_attention"])))
    with pytest.raises(CheckpointError, match="config.layer_types names sliding_attention layers while "
                                              "use_sliding_window is false"):
        build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), max_kv_cache_capacity=256,
                          max_input_len=64), log=lambda m: None)


def test_a_class_without_a_graph_is_refused(tmp_path):
    from trtllm.builder.architectures import spec_for

    model = transformers.AutoModelForCausalLM.from_config(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2))
    with pytest.raises(ValueError, match="loads as GPT2LMHeadModel"):
        spec_for(model)


@pytest.mark.parametrize("arch, lowered", [("llama", True), ("qwen2", True), ("mistral", True), ("qwen3", True),
                                          ("phi3", True), ("phi4-mini", True), ("smollm3", True), ("gemma2", True),
                                          ("gemma3", True), ("gemma", True), ("ministral", True), ("olmo3", True),
                                          ("exaone4", True), ("ernie4_5", True), ("helium", True), ("hunyuan", True),
                                          ("glm", True), ("glm4", True),
                                          ("granite", True), ("olmo2", True), ("qwen3_moe", True),
                                          ("qwen2_moe", True), ("olmoe", True), ("mixtral", True),
                                          ("granitemoe", True), ("granitemoe-plain", True), ("granite4", True),
                                          ("granite4-moe", True), ("granite4-h", True), ("granite4-h-moe", True),
                                          ("bamba", True)])
def test_onnxruntime_lowering_matches_the_canonical_graph(arch, lowered, tiny_engine):
    """The compiled ONNX Runtime form may use GroupQueryAttention (one fused kernel) where it is
    proven equal: its logits match the canonical standard-op graph's (and, above, transformers')."""
    import json

    import onnx

    from trtllm.plugins import cpu

    engine_dir = tiny_engine(arch)
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    # the attention kernel and the sampler are ours (plugins/cpu) where the library is built, as
    # scripts/setup.sh does
    # (OLMo 2, 3 and EXAONE 4 norm before their residual adds, not after: nothing to fuse)
    skip = lowered and arch not in ("olmo2", "olmo3", "exaone4")
    moe = arch in MOE_ARCHS  # (its experts on our MoE kernel: the chosen ones only)
    mamba = arch.startswith("granite4-h") or arch == "bamba"  # (its Mamba layers' convolution and scan: MambaScan)
    assert manifest["lowerings"] == ([cpu.ATTENTION_LOWERING, *["SkipSimplifiedLayerNormalization"] * skip,
                                      *[cpu.MOE_LOWERING] * moe, cpu.SAMPLE_LOWERING,
                                      *[cpu.MAMBA_LOWERING] * mamba] if lowered else [])
    ops = {(n.domain, n.op_type) for n in onnx.load(engine_dir / "llm.ort.onnx", load_external_data=False).graph.node}
    assert ((cpu.DOMAIN, cpu.MOE) in ops) == moe and ((cpu.DOMAIN, cpu.MAMBA) in ops) == mamba
    assert ((cpu.DOMAIN, cpu.ATTENTION) in ops) == lowered == ((cpu.DOMAIN, cpu.SAMPLE) in ops)
    assert (("com.microsoft", "SkipSimplifiedLayerNormalization") in ops) == skip
    assert "GroupQueryAttention" not in {n.op_type for n in onnx.load(engine_dir / "llm.onnx",
                                                                     load_external_data=False).graph.node}
    for prompt in PROMPTS:
        _, compiled = engine_logits(load_engine(engine_dir, graph="compiled"), prompt, num_decode=6)
        _, canonical = engine_logits(load_engine(engine_dir, graph="onnx"), prompt, num_decode=6)
        np.testing.assert_allclose(compiled, canonical, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["smollm3", "phi4-mini", "gemma2"])
def test_onnxruntime_kernels_keep_what_groupqueryattention_cannot_do(arch, tiny_checkpoint, tmp_path):
    """--cpu-kernels onnxruntime: GroupQueryAttention rotates every layer (SmolLM3 has NoPE layers),
    takes partial rotary tables only a multiple of 8 wide (the tiny Phi-4-mini's is 4) and is not
    proven with Gemma 2's soft-capped scores: the standard-op attention stays, and the engine matches
    transformers. (It used to lower: SmolLM3 was 7.2 off, and the Phi-4-mini engine failed at its
    first step.)"""
    import json

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ckpt = tiny_checkpoint(arch)
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), max_batch_size=4, max_input_len=128,
                            max_kv_cache_capacity=256, cpu_kernels="onnxruntime"), log=lambda m: None)
    assert json.loads((out / "manifest.json").read_text())["lowerings"] == []
    model, engine = hf_model(ckpt), load_engine(out)
    for prompt in PROMPTS[:2]:
        generated, got = engine_logits(engine, prompt, num_decode=4)
        with torch.no_grad():
            ref = model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_onnxruntime_attention_kernel_matches_too(arch, tiny_checkpoint, tmp_path):
    """--cpu-kernels onnxruntime keeps ONNX Runtime's GroupQueryAttention (the form before
    plugins/cpu's attention): its logits match the canonical graph's as well."""
    import json

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    out = build(BuildConfig(model=str(tiny_checkpoint(arch)), output=str(tmp_path / "e"), max_batch_size=4,
                            max_input_len=256, max_kv_cache_capacity=512, cpu_kernels="onnxruntime"),
                log=lambda m: None)
    assert json.loads((out / "manifest.json").read_text())["lowerings"] == [
        "GroupQueryAttention", "SkipSimplifiedLayerNormalization"]
    for prompt in PROMPTS[:2]:
        _, compiled = engine_logits(load_engine(out, graph="compiled"), prompt, num_decode=6)
        _, canonical = engine_logits(load_engine(out, graph="onnx"), prompt, num_decode=6)
        np.testing.assert_allclose(compiled, canonical, atol=ATOL, rtol=0)


def test_the_manifest_records_which_layers_slide(tiny_engine):
    from trtllm.runtime import manifest as mf

    shape = mf.load(tiny_engine("gemma3")).model
    assert shape.sliding_window == 8 and shape.sliding_layers == (0,)  # a tuple again, as written
    hash(shape)
    assert mf.load(tiny_engine("mistral")).model.sliding_layers is None  # every layer
