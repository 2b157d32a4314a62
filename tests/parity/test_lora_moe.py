"""LoRA on mixtures of experts against PEFT on transformers: adapters on the attention, a dense
layer's MLP (Qwen2-MoE's mlp_only_layers), the shared expert and its gate (Qwen2-MoE; Granite MoE's
shared_mlp, gate|up whole), in both graphs (the ONNX Runtime form on our MoE kernel, llm.onnx with
every expert), logits within 1e-4 and greedy tokens token-exact, alone and in a mixed batch in
flight; int4 experts with an adapter against PEFT on the dequantized weights. What has no LoRA inputs
(the routed experts and the router) is refused by name. The deliberately wrong variant (the shared
expert's gate and up deltas swapped) must miss PEFT."""
from __future__ import annotations

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
# what an adapter may adapt besides the attention, by class: Qwen2-MoE's dense layer 1 (gate_proj,
# up_proj, down_proj), its shared expert (the same names under mlp.shared_expert) and that expert's
# gate; Granite MoE's shared_mlp (its experts are block_sparse_moe.input_linear / output_linear:
# named in full, so that PEFT leaves those alone)
BESIDES = {"qwen3_moe": [], "olmoe": [], "mixtral": [],
           "qwen2_moe": ["gate_proj", "up_proj", "down_proj", "shared_expert_gate"],
           "granitemoe": ["shared_mlp.input_linear", "shared_mlp.output_linear"]}
ARCHS = list(BESIDES)
LIMITS = dict(max_batch_size=4, max_input_len=128, max_kv_cache_capacity=256, max_lora_rank=MAX_RANK)


def adapters_for(arch: str) -> dict[str, dict]:
    """LoraConfig arguments: the attention alone (rsLoRA), and everything the class lets LoRA adapt."""
    made = {"attention": dict(r=8, lora_alpha=4, target_modules=ATTENTION, use_rslora=True)}
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
    """Qwen2-MoE's adapter reaches each of its sites (a dense layer's MLP, the shared expert, its gate):
    zeroing one site's lora_b moves the logits. Rows with different adapters (and none) in flight, 2
    slots, compute what each computes alone."""
    out, made = moe_lora("qwen2_moe")
    engine = load_engine(out)
    pm, path = made["all"]
    adapter = lora.load_adapter("all", path, engine.manifest)
    generated, full = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    for module, layer in (("mlp.gate_proj", 1), ("mlp.down_proj", 1), ("mlp.shared_expert.up_proj", 0),
                          ("mlp.shared_expert.down_proj", 0), ("mlp.shared_expert_gate", 0)):
        b = engine.manifest.io.lora_b.format(i=layer, module=module)
        cut = {**adapter.arrays, b: np.zeros_like(adapter.arrays[b])}
        assert np.abs(engine_logits(engine, PROMPTS[1], num_decode=4, lora=cut)[1] - full).max() > 1e-2, module
    other = lora.load_adapter("attention", made["attention"][1], engine.manifest)
    prompts, picks = PROMPTS + PROMPTS[:2], [adapter, None, other, other, adapter]
    alone = [run_greedy(engine, [p], 12, [a])[0] for p, a in zip(prompts, picks)]
    assert run_greedy(engine, prompts, 12, picks, num_slots=2) == alone


def test_swapped_shared_expert_deltas_are_caught(moe_lora):
    """The deliberately wrong variant: the shared expert's gate and up lora_b exchanged must miss PEFT."""
    out, made = moe_lora("qwen2_moe")
    engine = load_engine(out)
    pm, path = made["all"]
    arrays = dict(lora.load_adapter("all", path, engine.manifest).arrays)
    gate, up = (engine.manifest.io.lora_b.format(i=0, module=f"mlp.shared_expert.{m}") for m in ("gate_proj", "up_proj"))
    arrays[gate], arrays[up] = arrays[up], arrays[gate]
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=arrays)
    assert np.abs(got - peft_logits(pm, PROMPTS[1], generated)).max() > 100 * atol(got)


def test_int4_experts_with_an_adapter_compute_peft_on_the_dequantized_weights(tiny_checkpoint, moe_lora, tmp_path):
    """--quantization int4 (MoEBlockQuant experts) with LoRA: PEFT on transformers whose projections
    and experts are their dequantized values, at float32 tolerance relative to the logits."""
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
    path = moe_lora("qwen2_moe")[1]["all"][1]
    pm = peft.PeftModel.from_pretrained(model, path).eval()
    adapter = lora.load_adapter("all", path, engine.manifest)
    generated, got = engine_logits(engine, PROMPTS[1], num_decode=4, lora=adapter.arrays)
    ref = peft_logits(pm, PROMPTS[1], generated)
    np.testing.assert_allclose(got, ref, atol=2e-5 * np.abs(ref).max(), rtol=0)


def edited_adapter(src, dst, rename: dict[str, str]) -> None:
    """A copy of a saved adapter whose tensors' names have `rename`'s parts replaced."""
    dst.mkdir()
    (dst / lora.CONFIG_NAME).write_bytes((src / lora.CONFIG_NAME).read_bytes())
    tensors = load_file(src / lora.WEIGHTS_NAME)
    for old, new in rename.items():
        tensors = {k.replace(old, new): v for k, v in tensors.items()}
    save_file(tensors, dst / lora.WEIGHTS_NAME)


def test_what_has_no_lora_inputs_is_refused_by_name(moe_lora, tiny_checkpoint, tmp_path):
    """An adapter on the routed experts (PEFT's all-linear on Qwen3-MoE adapts their parameters), one
    naming an expert or the router as a module, and a dense layer's module on a sparse layer: each
    fails to load with a message that says what and where, and a build bundling it fails the same."""
    out, made = moe_lora("qwen2_moe")
    engine = load_engine(out)
    make_adapter(tiny_checkpoint("qwen3_moe"), tmp_path / "all-linear", 0, r=2, target_modules="all-linear")
    with pytest.raises(lora.AdapterError, match=r"target_parameters = .*the routed experts"):
        lora.load_adapter("x", tmp_path / "all-linear", load_engine(moe_lora("qwen3_moe")[0]).manifest)
    src = made["all"][1]
    cases = {"expert": ({"mlp.shared_expert.gate_proj": "mlp.experts.0.gate_proj"},
                        r"tensor .*layers\.0\.mlp\.experts\.0\.gate_proj\.lora_A.* routed experts or router; LoRA on "
                        r"those is not supported \(an adapter may adapt self_attn\.q_proj, .*mlp\.shared_expert_gate, "
                        r"mlp\.gate_proj, mlp\.up_proj, mlp\.down_proj\)"),
             "router": ({"mlp.shared_expert_gate": "mlp.gate"}, "routed experts or router"),
             "sparse": ({"layers.1.mlp.down_proj": "layers.0.mlp.down_proj"},
                        r"is for layer 0, which has no mlp\.down_proj \(the layers with one: \[1\]\)")}
    for name, (rename, message) in cases.items():
        edited_adapter(src, tmp_path / name, rename)
        with pytest.raises(lora.AdapterError, match=message):
            lora.load_adapter(name, tmp_path / name, engine.manifest)
    from trtllm.builder.config import ConfigError

    with pytest.raises(ConfigError, match=r"--lora sparse: .*which has no mlp\.down_proj"):
        build(BuildConfig(model=str(tiny_checkpoint("qwen2_moe")), output=str(tmp_path / "b"), verify=False,
                          lora=(("sparse", str(tmp_path / "sparse")),), **{**LIMITS, "max_lora_rank": 0}),
              log=lambda m: None)


def test_the_manifest_lists_each_site_with_its_layers(moe_lora):
    """lora.sites: the attention on every layer; Qwen2-MoE's dense MLP on layer 1 only, its shared
    expert and gate on layer 0; Granite MoE's shared_mlp modules whole ([gate|up] one module)."""
    sites = json.loads((moe_lora("qwen2_moe")[0] / "manifest.json").read_text())["lora"]["sites"]
    assert {k: v.get("layers") for k, v in sites.items()} == {
        "qkv": None, "o": None, "gate_up": [1], "down": [1], "shared_gate_up": [0], "shared_down": [0],
        "shared_expert_gate": [0]}
    sites = json.loads((moe_lora("granitemoe")[0] / "manifest.json").read_text())["lora"]["sites"]
    assert sites["shared_gate_up"]["modules"] == [["shared_mlp.input_linear", 0, 128]]
    assert sites["shared_down"]["modules"] == [["shared_mlp.output_linear", 0, 64]] and "gate_up" not in sites


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
