"""LoRA on mixtures of experts against PEFT on transformers: adapters on the attention, a dense
layer's MLP (Qwen2-MoE's mlp_only_layers), the shared expert and its gate (Qwen2-MoE; Granite MoE's
shared_mlp, gate|up whole) and the routed experts (PEFT's target_parameters on transformers 5's
stacked experts; and the per-expert form PEFT gave transformers 4's, against the merged weights), in
both graphs (the ONNX Runtime form on our MoE kernel, llm.onnx with every expert), logits within 1e-4
and greedy tokens token-exact, alone and in a mixed batch in flight; int4 experts with an adapter
against PEFT on the dequantized weights. What has no LoRA inputs (the router; the experts where ONNX
Runtime's MoE node runs them) is refused by name. The deliberately wrong variant (the shared expert's
gate and up deltas swapped) must miss PEFT."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from safetensors.numpy import load_file, save_file  # noqa: E402

from tests.engine_helpers import run_greedy, unoptimized_sessions  # noqa: E402
from tests.parity.test_lora_parity import MAX_RANK, PROMPTS, atol, make_adapter, peft_greedy, peft_logits  # noqa: E402
from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime import lora  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

pytestmark = pytest.mark.hf
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
# what an adapter may adapt besides the attention and the experts, by class: Qwen2-MoE's dense layer 1
# (gate_proj, up_proj, down_proj), its shared expert (the same names under mlp.shared_expert) and that
# expert's gate; Granite MoE's shared_mlp (named in full); Gemma 4's dense MLP beside its experts, and its
# router (a Linear)
BESIDES = {"qwen3_moe": [], "olmoe": [], "mixtral": [],
           "qwen2_moe": ["gate_proj", "up_proj", "down_proj", "shared_expert_gate"],
           "granitemoe": ["shared_mlp.input_linear", "shared_mlp.output_linear"],
           "granite4-moe": ["shared_mlp.input_linear", "shared_mlp.output_linear"],
           # (granite-4.0-h-tiny's form: its Mamba layers' projections too)
           "granite4-h-moe": ["shared_mlp.input_linear", "shared_mlp.output_linear", "mamba.in_proj", "mamba.out_proj"],
           "ernie4_5_moe": ["gate_proj", "up_proj", "down_proj"],  # (its dense layer 0, and its shared_experts)
           "afmoe": ["gate_proj", "up_proj", "down_proj"],  # (... and its attention's gate_proj)
           "gemma4-moe": ["gate_proj", "up_proj", "down_proj", "router.proj"],
           "lfm2_moe": ["feed_forward.w1", "feed_forward.w3", "feed_forward.w2", "conv.in_proj", "conv.out_proj"]}
ARCHS = list(BESIDES)
LIMITS = dict(max_batch_size=4, max_input_len=128, max_kv_cache_capacity=256, max_lora_rank=MAX_RANK)


def expert_parameters(arch: str) -> list[str]:
    """transformers 5's stacked experts' parameters, as PEFT's target_parameters names them."""
    # (Gemma 4's: the layer's own; LFM2-MoE's under feed_forward)
    holder = {"granitemoe": "block_sparse_moe.", "granite4-moe": "block_sparse_moe.",
              "granite4-h-moe": "block_sparse_moe.", "gemma4-moe": "",
              "lfm2_moe": "feed_forward."}.get(arch, "mlp.")
    return [f"{holder}experts.gate_up_proj", f"{holder}experts.down_proj"]


def adapters_for(arch: str) -> dict[str, dict]:
    """LoraConfig arguments: the attention alone (rsLoRA), PEFT's all-linear, everything the class lets
    LoRA adapt but its experts, and the experts (with q and v; PEFT's patterns name the experts'
    parameters)."""
    made = {"attention": dict(r=8, lora_alpha=4, target_modules=ATTENTION, use_rslora=True),
            # PEFT's all-linear: on Qwen3-MoE, OLMoE and Mixtral the attention, the router's weight and the
            # experts' parameters (target_parameters); on Qwen2-MoE the shared expert and its gate too
            "all-linear": dict(r=4, lora_alpha=8, target_modules="all-linear"),
            "experts": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                            target_parameters=expert_parameters(arch), rank_pattern={"gate_up_proj": 2},
                            alpha_pattern={"down_proj": 32})}
    if BESIDES[arch]:
        made["all"] = dict(r=4, lora_alpha=8, target_modules=ATTENTION + BESIDES[arch], rank_pattern={"o_proj": 6})
    return made


@pytest.fixture(scope="module")
def moe_lora(tiny_checkpoint, tmp_path_factory):
    """moe_lora(arch) -> (engine dir, {name: (PeftModel, adapter dir)})."""
    made = {}

    def get(arch: str):
        if arch not in made:
            root, ckpt = tmp_path_factory.mktemp(f"{arch}-moe-lora"), tiny_checkpoint(arch)
            out = build(BuildConfig(model=str(ckpt), output=str(root / "engine"), **LIMITS), log=lambda m: None)
            made[arch] = out, {name: (make_adapter(ckpt, root / name, seed, **cfg), root / name)
                               for seed, (name, cfg) in enumerate(adapters_for(arch).items())}
        return made[arch]

    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_adapters_on_a_mixture_of_experts_match_peft(arch, moe_lora):
    out, made = moe_lora(arch)
    from trtllm.plugins import cpu

    assert cpu.MOE_LOWERING in json.loads((out / "manifest.json").read_text())["lowerings"]
    for graph in ("compiled", "onnx"):
        with unoptimized_sessions():
            engine = load_engine(out, graph=graph)
        for name, (pm, path) in made.items():
            adapter = lora.load_adapter(name, path, engine.manifest)
            for prompt in PROMPTS:
                generated, got = engine_logits(engine, prompt, num_decode=4, lora=adapter.arrays)
                want = peft_logits(pm, prompt, generated)
                np.testing.assert_allclose(got, want, atol=atol(want), rtol=0, err_msg=f"{graph} {name}")
            if graph == "onnx":
                continue
            want = [peft_greedy(pm, p, 16) for p in PROMPTS]
            assert run_greedy(engine, PROMPTS, 16, [adapter] * len(PROMPTS)) == want, name
            with pm.disable_adapter():
                assert [peft_greedy(pm, p, 16) for p in PROMPTS] != want, f"{name} does not change the tokens"


def test_every_site_is_used_and_mixed_rows_compute_what_each_does_alone(moe_lora):
    """Qwen2-MoE's adapters reach each of its sites (a dense layer's MLP, the shared expert, its gate,
    the routed experts' gate, up and down): zeroing one site's lora_b moves the logits. Rows with
    different adapters (and none) in flight, 2 slots, compute what each computes alone (our MoE kernel
    then takes an adapter per row)."""
    out, made = moe_lora("qwen2_moe")
    engine = load_engine(out)
    pm, path = made["all"]
    adapter = lora.load_adapter("all", path, engine.manifest)
    generated, full = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    on_experts = lora.load_adapter("experts", made["experts"][1], engine.manifest)
    experts_full = engine_logits(engine, PROMPTS[1], num_decode=4, lora=on_experts.arrays)[1]
    for module, layer, used, logits in (
            ("mlp.gate_proj", 1, adapter, full), ("mlp.down_proj", 1, adapter, full),
            ("mlp.shared_expert.up_proj", 0, adapter, full), ("mlp.shared_expert.down_proj", 0, adapter, full),
            ("mlp.shared_expert_gate", 0, adapter, full), ("mlp.experts.gate_proj", 0, on_experts, experts_full),
            ("mlp.experts.up_proj", 0, on_experts, experts_full),
            ("mlp.experts.down_proj", 0, on_experts, experts_full)):
        b = engine.manifest.io.lora_b.format(i=layer, module=module)
        cut = {**used.arrays, b: np.zeros_like(used.arrays[b])}
        assert np.abs(engine_logits(engine, PROMPTS[1], num_decode=4, lora=cut)[1] - logits).max() > 1e-2, module
    other = lora.load_adapter("attention", made["attention"][1], engine.manifest)
    prompts, picks = PROMPTS + PROMPTS[:2], [adapter, on_experts, other, None, on_experts]
    alone = [run_greedy(engine, [p], 12, [a])[0] for p, a in zip(prompts, picks)]
    assert run_greedy(engine, prompts, 12, picks, num_slots=2) == alone


@pytest.mark.parametrize("arch", ["qwen3_moe", "granitemoe", "granite4-moe", "gemma4-moe", "lfm2_moe"])
def test_the_router_and_the_experts_are_adapted(arch, moe_lora, tiny_checkpoint, tmp_path):
    """PEFT's all-linear on Qwen3-MoE adapts the router (target_parameters: its weight) and every expert;
    Granite MoE's router (block_sparse_moe.router, which all-linear leaves) and LFM2-MoE's
    (feed_forward.gate, a parameter) named by target_parameters; Gemma 4's router.proj (a Linear, in "all")
    and its experts (target_parameters, "experts"): PEFT's logits, and zeroing the router's (or an expert
    projection's) lora_b moves them."""
    out, made = moe_lora(arch)
    engine = load_engine(out)
    if arch in ("granitemoe", "granite4-moe", "lfm2_moe"):
        router_weight = "feed_forward.gate.weight" if arch == "lfm2_moe" else "block_sparse_moe.router.weight"
        pm = make_adapter(tiny_checkpoint(arch), tmp_path / "router", 3, r=4, lora_alpha=8, target_modules=["q_proj"],
                          target_parameters=[router_weight])
        path = tmp_path / "router"
    router = engine.manifest.lora["sites"]["router"]["modules"][0][0]
    experts = ["mlp.experts.gate_proj", "mlp.experts.down_proj"]
    cases = {"qwen3_moe": [("all-linear", [router, *experts])], "granitemoe": [(None, [router])],
             "granite4-moe": [(None, [router])],
             "gemma4-moe": [("all", [router]), ("experts", experts)],
             "lfm2_moe": [(None, [router]), ("experts", experts)]}[arch]
    for name, modules in cases:
        if name is not None:
            pm, path = made[name]
        layer = engine.manifest.lora["sites"]["router"].get("layers", [0])[0]  # (LFM2-MoE's first is dense)
        adapter = lora.load_adapter("a", path, engine.manifest)
        generated, full = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
        want = peft_logits(pm, PROMPTS[1], generated)
        np.testing.assert_allclose(full, want, atol=atol(want), rtol=0)
        for module in modules:
            b = engine.manifest.io.lora_b.format(i=layer, module=module)
            assert adapter.arrays[b].shape[-2] > 0, module  # (its rank)
            cut = {**adapter.arrays, b: np.zeros_like(adapter.arrays[b])}
            assert np.abs(engine_logits(engine, PROMPTS[1], num_decode=4, lora=cut)[1] - full).max() > 1e-3, module


def test_swapped_shared_expert_deltas_are_caught(moe_lora):
    """The deliberately wrong variant: the shared expert's gate and up lora_b exchanged must miss PEFT."""
    out, made = moe_lora("qwen2_moe")
    engine = load_engine(out)
    pm, path = made["all"]
    arrays = dict(lora.load_adapter("all", path, engine.manifest).arrays)
    gate, up = (engine.manifest.io.lora_b.format(i=0, module=f"mlp.shared_expert.{m}")
                for m in ("gate_proj", "up_proj"))
    arrays[gate], arrays[up] = arrays[up], arrays[gate]
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=arrays)
    assert np.abs(got - peft_logits(pm, PROMPTS[1], generated)).max() > 100 * atol(got)


def test_int4_experts_with_an_adapter_compute_peft_on_the_dequantized_weights(tiny_checkpoint, moe_lora, tmp_path):
    """--quantization int4 (MoEBlockQuant experts) with LoRA, on the other projections and on the
    experts: PEFT on transformers whose projections and experts are their dequantized values, at
    float32 tolerance relative to the logits."""
    from tests.builder.test_moe import dense_experts
    from tests.builder.test_quantized import dequantized_model
    from trtllm.builder.quantize import QuantScheme
    from trtllm.plugins import cpu

    ckpt, scheme = tiny_checkpoint("qwen2_moe"), QuantScheme.named("int4")
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "q"), quantization="int4", verify=False, **LIMITS),
                log=lambda m: None)
    engine = load_engine(out)
    assert cpu.MOE_QUANT_LOWERING in engine.manifest.lowerings
    model = dequantized_model(ckpt, scheme)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(torch.from_numpy(dense_experts(p.numpy().copy(), scheme)))
    for name in ("all", "experts"):  # (the experts' adapter: on MoEBlockQuant)
        path = moe_lora("qwen2_moe")[1][name][1]
        pm = peft.PeftModel.from_pretrained(copy.deepcopy(model), path).eval()
        adapter = lora.load_adapter(name, path, engine.manifest)
        generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
        ref = peft_logits(pm, PROMPTS[1], generated)
        np.testing.assert_allclose(got, ref, atol=2e-5 * np.abs(ref).max(), rtol=0, err_msg=name)


def edited_adapter(src, dst, rename: dict[str, str]) -> None:
    """A copy of a saved adapter whose tensors' names have `rename`'s parts replaced."""
    dst.mkdir()
    (dst / lora.CONFIG_NAME).write_bytes((src / lora.CONFIG_NAME).read_bytes())
    tensors = load_file(src / lora.WEIGHTS_NAME)
    for old, new in rename.items():
        tensors = {k.replace(old, new): v for k, v in tensors.items()}
    save_file(tensors, dst / lora.WEIGHTS_NAME)


def test_what_has_no_lora_inputs_is_refused_by_name(moe_lora, tiny_checkpoint, tmp_path):
    """A dense layer's module on a sparse layer, the experts on a dense layer or under the engine's own
    names, and the experts where ONNX Runtime's MoE node runs them: each fails to load with a message
    that says what and where, and a build bundling one fails the same. The router's adapter still
    applies where that node runs the experts."""
    out, made = moe_lora("qwen2_moe")
    engine = load_engine(out)
    src = made["all"][1]
    cases = {"sparse": ({"layers.1.mlp.down_proj": "layers.0.mlp.down_proj"},
                        r"is for layer 0, which has no mlp\.down_proj \(the layers with one: \[1\]\)")}
    for name, (rename, message) in cases.items():
        edited_adapter(src, tmp_path / name, rename)
        with pytest.raises(lora.AdapterError, match=message):
            lora.load_adapter(name, tmp_path / name, engine.manifest)
    src = made["experts"][1]  # (PEFT's stacked form: mlp.experts.base_layer is gate|up, mlp.experts down)
    cases = {"dense": ({"layers.0.mlp.experts": "layers.1.mlp.experts"},
                       r"layers\.1\.mlp\.experts.* adapts a mixture of experts' routed experts; LoRA on it is not "
                       r"supported here; layer 1 has no experts"),
             "ours": ({"mlp.experts.base_layer": "mlp.experts.gate_proj"},
                      r"layers\.0\.mlp\.experts\.gate_proj\.lora_A.* is in neither of PEFT's forms")}
    for name, (rename, message) in cases.items():
        edited_adapter(src, tmp_path / name, rename)
        with pytest.raises(lora.AdapterError, match=message):
            lora.load_adapter(name, tmp_path / name, engine.manifest)
    from trtllm.builder.config import ConfigError

    with pytest.raises(ConfigError, match=r"--lora sparse: .*which has no mlp\.down_proj"):
        build(BuildConfig(model=str(tiny_checkpoint("qwen2_moe")), output=str(tmp_path / "b"), verify=False,
                          lora=(("sparse", str(tmp_path / "sparse")),), **{**LIMITS, "max_lora_rank": 0}),
              log=lambda m: None)
    ort = build(BuildConfig(model=str(tiny_checkpoint("qwen2_moe")), output=str(tmp_path / "ort"), verify=False,
                            cpu_kernels="onnxruntime", **LIMITS), log=lambda m: None)
    m = load_engine(ort).manifest
    assert "MoE" in m.lowerings and "experts_gate_up" not in m.lora["sites"]
    with pytest.raises(lora.AdapterError, match=r"adapts a mixture of experts' routed experts; LoRA on it is not "
                                                r"supported here; this engine has no LoRA inputs on its experts: ONNX "
                                                r"Runtime's MoE node runs them"):
        lora.load_adapter("experts", made["experts"][1], m)
    # (the router's logits are the node's input: its adapter still applies there, as PEFT's)
    pm = make_adapter(tiny_checkpoint("qwen2_moe"), tmp_path / "router", 4, r=4, lora_alpha=8,
                      target_modules=["q_proj"], target_parameters=["mlp.gate.weight"])
    engine = load_engine(ort)
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4,
                                   lora=lora.load_adapter("router", tmp_path / "router", engine.manifest).arrays)
    want = peft_logits(pm, PROMPTS[1], generated)
    np.testing.assert_allclose(got, want, atol=atol(want), rtol=0)


def per_expert_adapter(ckpt, out_dir, arch: str, experts: list[int], seed: int):
    """A transformers 4-style PEFT adapter on some experts of every sparse layer (a Linear each: Qwen's
    mlp.experts.{e}.gate_proj, Mixtral's block_sparse_moe.experts.{e}.w1 ...), rank 4, alpha 8, and
    transformers with it merged into the stacked experts: W_e += (alpha / r) B_e A_e."""
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    rng, tensors, scale = np.random.default_rng(seed), {}, 2.0
    mixtral = arch == "mixtral"
    names = {"gate": "w1", "up": "w3", "down": "w2"} if mixtral else {k: f"{k}_proj" for k in ("gate", "up", "down")}
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            holder = layer.mlp
            if not hasattr(holder, "experts") or not hasattr(holder.experts, "gate_up_proj"):
                continue  # (a dense layer)
            gate_up, down = holder.experts.gate_up_proj, holder.experts.down_proj
            h, w = gate_up.shape[2], gate_up.shape[1] // 2
            for e in experts:
                for kind, n_in, n_out in (("gate", h, w), ("up", h, w), ("down", w, h)):
                    a, b = (rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((4, n_in), (n_out, 4)))
                    key = (f"base_model.model.model.layers.{i}.{'block_sparse_moe' if mixtral else 'mlp'}.experts.{e}."
                           f"{names[kind]}")
                    tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = a, b
                    delta = torch.from_numpy(scale * (b @ a))
                    if kind == "down":
                        down[e] += delta
                    else:
                        gate_up[e, slice(0, w) if kind == "gate" else slice(w, 2 * w)] += delta
    out_dir.mkdir()
    save_file(tensors, str(out_dir / lora.WEIGHTS_NAME))
    (out_dir / lora.CONFIG_NAME).write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
                                                        "target_modules": list(names.values())}))
    return model


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_a_per_expert_adapter_is_its_merged_weights(arch, moe_lora, tiny_checkpoint, tmp_path):
    """transformers 4's form (a PEFT pair per expert; Mixtral's w1/w3/w2), on two of the four experts:
    both graphs compute transformers with the deltas merged into those experts' weights."""
    out, _ = moe_lora(arch)
    merged = per_expert_adapter(tiny_checkpoint(arch), tmp_path / "a", arch, [0, 2], 5)
    for graph in ("compiled", "onnx"):
        with unoptimized_sessions():
            engine = load_engine(out, graph=graph)
        adapter = lora.load_adapter("a", tmp_path / "a", engine.manifest)
        assert adapter.arrays[engine.manifest.io.lora_a.format(i=0, module="mlp.experts.gate_proj")].shape == (
            1, 4, 64, 4)
        for prompt in PROMPTS:
            generated, got = engine_logits(engine, prompt, num_decode=4, lora=adapter.arrays)
            want = peft_logits(merged, prompt, generated)
            np.testing.assert_allclose(got, want, atol=atol(want), rtol=0, err_msg=graph)
    plain = engine_logits(engine, PROMPTS[1], num_decode=4)
    assert np.abs(plain[1] - peft_logits(merged, PROMPTS[1], plain[0])).max() > 1e-2


def test_the_manifest_lists_each_site_with_its_layers(moe_lora):
    """lora.sites: the attention on every layer; Qwen2-MoE's dense MLP on layer 1 only, its shared
    expert, that expert's gate and the routed experts (4 adapters a module) on layer 0; Granite MoE's
    shared_mlp modules whole ([gate|up] one module), and its router under its own name."""
    sites = json.loads((moe_lora("qwen2_moe")[0] / "manifest.json").read_text())["lora"]["sites"]
    assert {k: v.get("layers") for k, v in sites.items()} == {
        "qkv": None, "o": None, "gate_up": [1], "down": [1], "shared_gate_up": [0], "shared_down": [0],
        "shared_expert_gate": [0], "router": [0], "experts_gate_up": [0], "experts_down": [0]}
    assert sites["router"]["modules"] == [["mlp.gate", 0, 4]]
    assert sites["experts_gate_up"]["experts"] == 4 and sites["experts_gate_up"]["modules"] == [
        ["mlp.experts.gate_proj", 0, 32], ["mlp.experts.up_proj", 32, 64]]
    sites = json.loads((moe_lora("granitemoe")[0] / "manifest.json").read_text())["lora"]["sites"]
    assert sites["shared_gate_up"]["modules"] == [["shared_mlp.input_linear", 0, 128]]
    assert sites["shared_down"]["modules"] == [["shared_mlp.output_linear", 0, 64]] and "gate_up" not in sites
    assert sites["router"]["modules"] == [["block_sparse_moe.router", 0, 4]]


def test_trtllm_run_answers_with_a_bundled_adapter_as_peft(moe_lora, tiny_checkpoint, tmp_path, run_cli):
    """trtllm-build --lora bundles a Qwen2-MoE adapter (the build checks it); trtllm-run answers requests
    with it and without it in one batch with PEFT's greedy tokens, each."""
    ckpt = tiny_checkpoint("qwen2_moe")
    pm, path = moe_lora("qwen2_moe")[1]["all"]
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), lora=(("all", str(path)),),
                            **{**LIMITS, "max_lora_rank": 0}), log=lambda m: None)
    texts = ["the quick brown fox", "hello there"]
    requests = [{"messages": [{"role": "user", "content": t}], **({"lora_name": "all"} if adapter else {})}
                for t in texts for adapter in (True, False)]
    result, got = run_cli(out, {"temperature": 0, "max_generate_length": 10, "batch_size": 4,
                                "apply_chat_template": False, "ignore_eos": True, "requests": requests})
    assert result.exit_code == 0, result.output
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    want = []
    for t in texts:
        ids = tok(t).input_ids
        with_adapter = peft_greedy(pm, ids, 10)
        with pm.disable_adapter():
            want += [with_adapter, peft_greedy(pm, ids, 10)]
    assert [r["output_ids"] for r in got["responses"]] == want
    assert want[0] != want[1]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_build_checks_reference_without_peft_is_peft(arch, moe_lora, tiny_checkpoint):
    """Without PEFT, a bundled adapter's build check merges the engine's reading of it into transformers
    (verify.merged_model; the experts' rows of their stacked parameters: verify.expert_parameter):
    that model's logits are PEFT's, for the all-linear and the experts' adapters."""
    from trtllm.builder.verify import merged_model

    out, made = moe_lora(arch)
    engine = load_engine(out)
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint(arch), dtype=torch.float32).eval()
    for name in ("all-linear", "experts"):
        pm, path = made[name]
        merged = merged_model(base, lora.load_adapter(name, path, engine.manifest), engine.manifest)
        ids = torch.tensor([PROMPTS[1]])
        with torch.no_grad():
            want, got = pm(ids).logits.numpy(), merged(ids).logits.numpy()
            moved = float(np.abs(base(ids).logits.numpy() - want).max())
        np.testing.assert_allclose(got, want, atol=atol(want), rtol=0, err_msg=name)
        assert moved > 1e-2, name  # (the adapter moves them: the comparison sees it)
