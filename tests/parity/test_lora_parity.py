"""LoRA engines against PEFT on transformers: every architecture, adapters of several shapes
(all projections or some, rank and alpha patterns, rsLoRA, some layers, bfloat16 files), logits
within 1e-4 and greedy tokens token-exact, alone, in mixed batches and in flight. The
deliberately wrong variant (PEFT's scale not applied) must miss the tolerance."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime import beam, lora  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

from tests.engine_helpers import run_greedy  # noqa: E402
from tests.parity.test_beam_search import hf_beams, same  # noqa: E402

pytestmark = pytest.mark.hf
# ernie4_5: an interleaved RoPE, its q and k rows reordered in the engine, and in each adapter's lora_B;
# glm: the same on half of each head, and gate|up stored whole
ARCHS = ["llama", "mistral", "ministral", "qwen2", "qwen3", "phi3", "phi4-mini", "smollm3", "gemma", "gemma2", "gemma3",
         "gemma4", "gemma4-kv", "lfm2", "granite", "olmo2", "olmo3", "exaone4", "ernie4_5", "helium", "hunyuan", "glm", "glm4",
         "granite4", "lfm3", "arcee", "apertus", "granite4-h", "bamba"]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[5, 17, 42, 99, 7], list(range(30, 52)), [3, 200, 11]]
ATOL = 1e-4


def atol(want: np.ndarray) -> float:
    """ATOL, scaled past logits of 5: float32's rounding grows with the hidden states (Gemma's scaled
    embeddings and a rank-8 adapter: max logit 16, transformers' own float32 logits 8.5e-5 from
    float64's, the engine's 1.4e-4)."""
    return ATOL * max(1.0, float(np.abs(want).max()) / 5)
MAX_RANK = 8
LORA_STD = 0.2  # every adapter changes the greedy tokens; no near-ties (top-2 gap > 1e-3) on these paths
ADAPTERS = {  # name -> LoraConfig arguments (init_lora_weights=False: B is not zero, so the delta shows)
    "all": dict(r=4, lora_alpha=8, target_modules=ALL),
    "qv-rslora": dict(r=8, lora_alpha=4, target_modules=["q_proj", "v_proj"], use_rslora=True),
    "patterns": dict(r=2, lora_alpha=16, target_modules=ALL, rank_pattern={"down_proj": 8, "q_proj": 6},
                     alpha_pattern={"o_proj": 3}),
    "layer1-mlp": dict(r=4, lora_alpha=4, target_modules=["gate_proj", "up_proj", "down_proj"], layers_to_transform=[1]),
}


# Phi-3 stores q|k|v and gate|up whole: PEFT adapts those modules
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}


# LFM2 names its attention's output and its MLP's projections so; its convolutions' in_proj joins the
# adapters on every kind of module (their out_proj is matched by the attention's name)
LFM2 = {"o_proj": "out_proj", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# LFM3 names its MLP's as LFM2 does, its attention's o_proj so; its convolutions' in_proj and out_proj and its
# attention gate g_proj join the adapters on every kind of module
LFM3 = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# Granite 4's MLP is its shared_mlp: input_linear holds gate|up, output_linear is down_proj
GRANITE4 = {"gate_proj": "input_linear", "up_proj": "input_linear", "down_proj": "output_linear"}


def for_arch(arch: str, config: dict) -> dict:
    """An ADAPTERS entry with its module names as `arch`'s checkpoint has them."""
    if arch in ("lfm2", "lfm3"):
        names, extra = (LFM2, ["in_proj"]) if arch == "lfm2" else (LFM3, ["in_proj", "out_proj", "g_proj"])
        return {k: ([names.get(m, m) for m in v] + extra * (v == ALL) if k == "target_modules" else
                    {names.get(m, m): x for m, x in v.items()} if k.endswith("_pattern") else v)
                for k, v in config.items()}
    if arch in ("granite4-h", "bamba"):  # (their Mamba layers' in_proj and out_proj join the adapters on every kind)
        config = {**config, "target_modules": config["target_modules"] + ["in_proj", "out_proj"] * (
            config["target_modules"] == ALL)}
    if arch not in ("phi3", "phi4-mini", "glm", "glm4", "granite4", "granite4-h"):
        return config
    fused = FUSED if arch.startswith("phi") else GRANITE4 if arch.startswith("granite4") else \
        {m: f for m, f in FUSED.items() if f == "gate_up_proj"}
    return {k: (list(dict.fromkeys(fused.get(m, m) for m in v)) if k == "target_modules" else
                {fused.get(m, m): x for m, x in v.items()} if k.endswith("_pattern") else v)
            for k, v in config.items()}


def make_adapter(ckpt, out_dir, seed: int, bfloat16: bool = False, std: float = LORA_STD,
                 **config) -> "peft.PeftModel":
    """A PEFT adapter with random (large enough to matter) weights, saved to out_dir; returns the
    PeftModel, whose weights equal the saved ones (rounded first when saved as bfloat16)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    pm = peft.get_peft_model(model, peft.LoraConfig(init_lora_weights=False, **config)).eval()
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.normal_(0, std)
                if bfloat16:
                    p.copy_(p.bfloat16().float())
    pm.save_pretrained(out_dir)
    if bfloat16:  # the same (rounded) values, stored as bfloat16
        from safetensors.torch import load_file, save_file

        path = out_dir / "adapter_model.safetensors"
        save_file({k: v.bfloat16() for k, v in load_file(path).items()}, path)
    return pm


@pytest.fixture(scope="module")
def lora_engine(tiny_checkpoint, tmp_path_factory):
    built = {}

    def get(arch: str):
        if arch not in built:
            out = tmp_path_factory.mktemp(f"{arch}-lora") / "engine"
            build(BuildConfig(model=str(tiny_checkpoint(arch)), output=str(out), max_batch_size=4,
                              max_input_len=128, max_kv_cache_capacity=256, max_lora_rank=MAX_RANK), log=lambda m: None)
            built[arch] = load_engine(out)
        return built[arch]

    return get


@pytest.fixture(scope="module")
def adapters(tiny_checkpoint, tmp_path_factory):
    """adapters(arch) -> {name: (PeftModel, adapter dir)}."""
    made = {}

    def get(arch: str):
        if arch not in made:
            root, ckpt = tmp_path_factory.mktemp(f"{arch}-adapters"), tiny_checkpoint(arch)
            made[arch] = {name: (make_adapter(ckpt, root / name, seed, **for_arch(arch, cfg)), root / name)
                          for seed, (name, cfg) in enumerate(ADAPTERS.items())}
        return made[arch]

    return get


def peft_logits(pm, prompt: list[int], generated: list[int]) -> np.ndarray:
    with torch.no_grad():
        return pm(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()


def peft_greedy(pm, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = pm.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                          max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_tokens_match_peft(arch, lora_engine, adapters):
    engine = lora_engine(arch)
    for name, (pm, path) in adapters(arch).items():
        adapter = lora.load_adapter(name, path, engine.manifest)
        moved = 0.0
        for prompt in PROMPTS:
            generated, got = engine_logits(engine, prompt, num_decode=4, lora=adapter.arrays)
            want = peft_logits(pm, prompt, generated)
            np.testing.assert_allclose(got, want, atol=atol(want), rtol=0, err_msg=name)
            with pm.disable_adapter():
                moved = max(moved, float(np.abs(want - peft_logits(pm, prompt, generated)).max()))
        want = [peft_greedy(pm, p, 16) for p in PROMPTS]
        assert run_greedy(engine, PROMPTS, 16, [adapter] * len(PROMPTS)) == want, name
        with pm.disable_adapter():
            base = [peft_greedy(pm, p, 16) for p in PROMPTS]
        # the adapter changes the greedy tokens, so that the comparison sees it; where the tiny model
        # writes one token whatever it is given (gemma2's, soft-capped, and layer1-mlp), its logits move
        assert base != want or (arch == "gemma2" and moved > 1.0), f"{name} does not change the tokens ({moved=})"


@pytest.mark.parametrize("arch", ["ernie4_5", "glm", "llama", "granite4-h"])
def test_the_build_checks_reference_without_peft_is_peft(arch, lora_engine, adapters, tiny_checkpoint):
    """Without PEFT, a bundled adapter's build check merges the engine's reading of it into transformers
    (verify.merged_model): that model's logits are PEFT's, where the engine holds q and k rows in another
    order too (an interleaved RoPE: ERNIE 4.5, GLM; the merge puts them back). Merged weights sum in
    another order than PEFT's x W + (x A) B: within 1e-3 of the largest logit (q and k rows left in the
    engine's order were off by more than 1)."""
    from trtllm.builder.verify import merged_model

    engine = lora_engine(arch)
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint(arch), dtype=torch.float32).eval()
    for name, (pm, path) in adapters(arch).items():
        merged = merged_model(base, lora.load_adapter(name, path, engine.manifest), engine.manifest)
        ids = torch.tensor([PROMPTS[1]])
        with torch.no_grad():
            want, got = pm(ids).logits.numpy(), merged(ids).logits.numpy()
        np.testing.assert_allclose(got, want, atol=1e-3 * np.abs(want).max(), rtol=0, err_msg=name)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "granite4-h"])
def test_mixed_adapters_in_one_batch_and_in_flight(arch, lora_engine, adapters):
    """Rows with different adapters (and none) in one step compute what each computes alone, in one
    static batch and in flight (2 slots, so adapters change under running rows)."""
    engine, made = lora_engine(arch), adapters(arch)
    loaded = [lora.load_adapter(n, path, engine.manifest) for n, (_, path) in made.items()]
    prompts = PROMPTS + PROMPTS[:2]
    picks = [loaded[0], None, loaded[1], loaded[3], loaded[2]]
    alone = [run_greedy(engine, [p], 12, [a])[0] for p, a in zip(prompts, picks)]
    assert run_greedy(engine, prompts[:4], 12, picks[:4]) == alone[:4]
    assert run_greedy(engine, prompts, 12, picks, num_slots=2) == alone
    with torch.no_grad(), made["all"][0].disable_adapter():
        assert alone[1] == peft_greedy(made["all"][0], prompts[1], 12)


def test_beam_searches_with_adapters_are_peft_beam_searches(lora_engine, adapters):
    """Beam searches (runtime/beam.py) on a LoRA engine, each with its adapter (or none), side by
    side in one step: every hypothesis and score is PEFT's generate(num_beams=B)."""
    engine, made = lora_engine("llama"), adapters("llama")
    loaded = {n: lora.load_adapter(n, path, engine.manifest) for n, (_, path) in made.items()}
    jobs = [(PROMPTS[0], beam.BeamParams(2, 10, frozenset(), adapter=loaded["all"])),
            (PROMPTS[1], beam.BeamParams(2, 10, frozenset(), length_penalty=0.5, adapter=loaded["qv-rslora"])),
            (PROMPTS[2], beam.BeamParams(3, 8, frozenset()))]
    together = beam.run_many(engine, jobs)
    assert [base for _, base in together[:2]] == [0, 2]  # (the first two in one step)
    for (found, _), (prompt, p), pm in zip(together, jobs, [made["all"][0], made["qv-rslora"][0], None]):
        if pm is None:
            with torch.no_grad(), made["all"][0].disable_adapter():
                assert same(found, hf_beams(made["all"][0], prompt, p))
        else:
            assert same(found, hf_beams(pm, prompt, p))
            with torch.no_grad(), pm.disable_adapter():
                assert not same(found, hf_beams(pm, prompt, p)), "the adapter does not change the beams"


def test_no_adapter_is_the_base_model(lora_engine, tiny_engine):
    """A LoRA engine without an adapter (rank 0 everywhere) is the plain engine."""
    plain, with_inputs = load_engine(tiny_engine("qwen2")), lora_engine("qwen2")
    for prompt in PROMPTS:
        ids, base = engine_logits(plain, prompt, num_decode=4)
        ids2, got = engine_logits(with_inputs, prompt, num_decode=4)
        assert ids == ids2
        np.testing.assert_allclose(got, base, atol=1e-5, rtol=0)


def test_bfloat16_adapter_file(tiny_checkpoint, lora_engine, tmp_path):
    """A bfloat16 adapter file (numpy has no bfloat16: runtime/lora.py widens it) gives PEFT's
    logits with the same (bfloat16-valued) weights."""
    pm = make_adapter(tiny_checkpoint("llama"), tmp_path / "bf16", 7, bfloat16=True, **ADAPTERS["all"])
    engine = lora_engine("llama")
    adapter = lora.load_adapter("bf16", tmp_path / "bf16", engine.manifest)
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    np.testing.assert_allclose(got, peft_logits(pm, PROMPTS[1], generated), atol=ATOL, rtol=0)


def test_adapter_rows_kept_in_checkpoint_order_are_caught(lora_engine, adapters, monkeypatch):
    """The deliberately wrong variant: an interleaved-RoPE engine whose adapters' q and k lora_B rows
    are left in the checkpoint's order (the engine's weights are reordered) must miss PEFT."""
    engine = lora_engine("ernie4_5")
    assert engine.manifest.lora["interleaved_rope"] == engine.manifest.model.head_dim
    pm, path = adapters("ernie4_5")["all"]
    monkeypatch.setattr(lora, "rope_pair_order", lambda width, head_dim, rotary: np.arange(width))
    adapter = lora.load_adapter("all", path, engine.manifest)
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    assert np.abs(got - peft_logits(pm, PROMPTS[1], generated)).max() > 100 * ATOL


def test_unscaled_adapter_is_caught(lora_engine, adapters, monkeypatch):
    """The deliberately wrong variant: PEFT's alpha / r left out of lora_b must miss the tolerance."""
    engine = lora_engine("llama")
    pm, path = adapters("llama")["all"]
    monkeypatch.setattr(lora, "module_scale", lambda *args: 1.0)
    adapter = lora.load_adapter("all", path, engine.manifest)
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    assert np.abs(got - peft_logits(pm, PROMPTS[1], generated)).max() > 100 * ATOL


@pytest.mark.parametrize("scheme", ["int4", "int8"])
def test_quantized_engine_adds_the_adapter_to_its_dequantized_weights(scheme, tiny_checkpoint, adapters, tmp_path):
    """On our quantized kernels (the SwiGLU kernel gives way to gate|up + delta + activation), a LoRA
    engine is PEFT on transformers with the dequantized weights, at float32 tolerance."""
    from tests.builder.test_quantized import dequantized_model
    from trtllm.builder.quantize import QuantScheme

    ckpt = tiny_checkpoint("qwen2")
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "q"), quantization=scheme, max_input_len=128,
                            max_kv_cache_capacity=256, max_lora_rank=MAX_RANK, verify=False), log=lambda m: None)
    engine = load_engine(out)
    assert "trtllm.cpu::MatMulBlockQuant" in engine.manifest.lowerings
    _, path = adapters("qwen2")["patterns"]
    pm = peft.PeftModel.from_pretrained(dequantized_model(ckpt, QuantScheme.named(scheme)), path).eval()
    adapter = lora.load_adapter("patterns", path, engine.manifest)
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    ref = peft_logits(pm, PROMPTS[1], generated)
    # float32 rounding relative to the logits, as for float16 weights (tests/builder/test_quantized.py):
    # this strong adapter makes them large (7), and the kernels sum in another order than PEFT's
    np.testing.assert_allclose(got, ref, atol=2e-5 * np.abs(ref).max(), rtol=0)


@pytest.mark.parametrize("dtype, kernels, inputs, tol", [("float16", "native", np.float16, 3e-2),
                                                       ("float16", "onnxruntime", np.float16, 3e-2),
                                                       ("bfloat16", "auto", np.float32, 6e-2)])
def test_16_bit_engines_take_adapters(dtype, kernels, inputs, tol, tiny_checkpoint, adapters, tmp_path):
    """--dtype float16: the adapter in float16 (the engine's dtype; our kernels' form casts it to its
    float32 activations); --dtype bfloat16 (our kernels): in float32 (numpy has no bfloat16). Within
    the dtype's tolerance of PEFT in float32, the same greedy tokens; the adapter left out (the
    wrong variant) misses it."""
    out = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "h"), dtype=dtype,
                            max_input_len=128, max_kv_cache_capacity=256, max_lora_rank=MAX_RANK, cpu_kernels=kernels,
                            verify=dtype == "float16"), log=lambda m: None)
    engine = load_engine(out)
    pm, path = adapters("llama")["all"]
    adapter = lora.load_adapter("all", path, engine.manifest)
    assert all(a.dtype == inputs for a in adapter.arrays.values())
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    ref = peft_logits(pm, PROMPTS[1], generated)
    np.testing.assert_allclose(got, ref, atol=tol * np.abs(ref).max(), rtol=0)
    assert list(ref.argmax(-1)) == generated
    plain = engine_logits(engine, PROMPTS[1], num_decode=4)[1]
    assert np.abs(plain - ref).max() > tol * np.abs(ref).max()


@pytest.mark.slow
def test_demo_model_with_a_bundled_adapter_matches_peft(demo_model, tmp_path, run_cli):
    """SmolLM2 with a rank-16 adapter on every projection, bundled at build (so the build checks it),
    through trtllm-run: 64 greedy tokens of PEFT's text, in one batch with and without the adapter."""
    from tests.parity.test_demo_model import CONVERSATIONS

    # a trained model: a small adapter already changes its answers
    pm = make_adapter(demo_model, tmp_path / "style", 0, std=0.02, r=16, lora_alpha=32, target_modules=ALL)
    out = build(BuildConfig(model=str(demo_model), output=str(tmp_path / "engine"), max_batch_size=4,
                            max_input_len=256, max_kv_cache_capacity=512, lora=(("style", str(tmp_path / "style")),)),
                log=lambda m: None)
    tok = transformers.AutoTokenizer.from_pretrained(demo_model)
    eos = pm.generation_config.eos_token_id

    def answer(conv, adapter: bool) -> str:
        ids = tok(tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False), add_special_tokens=False,
                  return_tensors="pt").input_ids
        with torch.no_grad():
            if adapter:
                gen = pm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=64, do_sample=False)
            else:
                with pm.disable_adapter():
                    gen = pm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=64,
                                      do_sample=False)
        gen = gen[0, ids.shape[1]:].tolist()
        return tok.decode(gen[:-1] if gen[-1] == eos else gen, skip_special_tokens=True)

    picks = [(CONVERSATIONS[1], True), (CONVERSATIONS[2], True), (CONVERSATIONS[2], False), (CONVERSATIONS[4], True)]
    want = [answer(conv, adapter) for conv, adapter in picks]
    assert want[1] != want[2]  # the adapter changes the answer
    result, got = run_cli(out, {"batch_size": 4, "temperature": 0, "max_generate_length": 64, "requests": [
        {"messages": conv, **({"lora_name": "style"} if adapter else {})} for conv, adapter in picks]})
    assert result.exit_code == 0, result.output
    assert [r["output_text"] for r in got["responses"]] == want
