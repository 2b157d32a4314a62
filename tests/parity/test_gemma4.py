"""Gemma 4 beyond the tiny-model parity suites (test_tiny_parity.py's "gemma4" and "gemma4-kv", and the
LoRA, EAGLE, legacy-graph and quantized ones): its release form (Gemma4ForConditionalGeneration) builds its
language model alone and takes whole-model adapters, the KV the engine keeps, and the formats that run on
our attention kernel (test_layer_shapes.py: beams, prompt lookup and TensorRT)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime import manifest as mf  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.kv_cache import bytes_per_token  # noqa: E402

from tests.tiny_models import make_gemma4_multimodal  # noqa: E402

pytestmark = pytest.mark.hf
LIMITS = dict(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)
PROMPT = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11, 12, 13]  # past the sliding window (8)


def test_the_release_form_builds_its_language_model_alone(tmp_path, run_cli):
    """gemma-4-E2B-it's form with an audio encoder and no vision one: the engine is its language model,
    says so, matches the whole model on text, and refuses a request with an image by name."""
    ckpt = make_gemma4_multimodal(tmp_path / "ckpt")
    said = []
    engine = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), **LIMITS), log=said.append)
    assert any("whose audio encoder is not built yet" in m and "takes text alone" in m for m in said)
    manifest = mf.load(engine)
    assert manifest.architecture == "Gemma4ForCausalLM" and not manifest.vision
    whole = transformers.Gemma4ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    generated, got = engine_logits(load_engine(engine), PROMPT, num_decode=4)
    with torch.no_grad():
        want = whole(input_ids=torch.tensor([PROMPT + generated[:-1]])).logits[0, len(PROMPT) - 1:].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    # the audio, image and video tokens are the pad token to the token tables, as to the whole model (the
    # wrong variant: the language model alone, which embeds them as themselves)
    placeholders = [whole.config.audio_token_id, whole.config.image_token_id, whole.config.video_token_id]
    prompt = PROMPT[:4] + placeholders + PROMPT[4:]
    generated, got = engine_logits(load_engine(engine), prompt, num_decode=2)
    ids = torch.tensor([prompt + generated[:-1]])
    with torch.no_grad():
        want = whole(input_ids=ids).logits[0, len(prompt) - 1:].numpy()
        alone = whole.model.language_model(input_ids=ids).last_hidden_state
        alone = whole.lm_head(alone)[0, len(prompt) - 1:]
        cap = whole.config.text_config.final_logit_softcapping
        alone = (torch.tanh(alone / cap) * cap).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert np.abs(alone - want).max() > 1e-2, np.abs(alone - want).max()
    image = {"type": "image", "image": "data:image/png;base64,iVBORw0KGgo="}
    result, out = run_cli(engine, {"max_generate_length": 4, "temperature": 0, "requests": [
        {"messages": [{"role": "user", "content": [image, {"type": "text", "text": "what is it?"}]}]},
        {"messages": [{"role": "user", "content": "hello"}]}]})
    assert "`requests[0].messages` contain image content: this engine is text-only" in out["responses"][0]["error"]
    assert out["responses"][1]["output_ids"]  # (its neighbour is answered)


def test_the_release_form_takes_adapters_of_the_whole_model(tmp_path):
    """A PEFT adapter trained on Gemma4ForConditionalGeneration names model.language_model's layers: the
    language-model engine of that checkpoint takes it, and answers as PEFT's whole model does on text."""
    import peft

    from tests.parity.test_lora_parity import ALL

    ckpt = make_gemma4_multimodal(tmp_path / "ckpt")
    engine = load_engine(build(BuildConfig(model=str(ckpt), output=str(tmp_path / "engine"), max_lora_rank=4,
                                           **LIMITS), log=lambda m: None))
    assert engine.manifest.lora["prefix"] == "model.language_model"
    torch.manual_seed(0)
    whole = transformers.Gemma4ForConditionalGeneration.from_pretrained(ckpt, dtype=torch.float32).eval()
    pm = peft.get_peft_model(whole, peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                    target_modules=r".*language_model.*\.(" + "|".join(ALL) + ")")).eval()
    assert_answers_as_peft(engine, pm, tmp_path / "adapter")


def assert_answers_as_peft(engine, pm, where) -> None:
    """PeftModel `pm`'s LoRA weights drawn at random (std 0.2) and saved to `where`: the engine with that
    adapter gives PEFT's logits, which the adapter moves (the comparison sees it)."""
    from trtllm.runtime import lora

    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.2)
    pm.save_pretrained(where)
    adapter = lora.load_adapter("a", where, engine.manifest)
    generated, got = engine_logits(engine, PROMPT, num_decode=4, lora=adapter.arrays)
    with torch.no_grad():
        want = pm(input_ids=torch.tensor([PROMPT + generated[:-1]])).logits[0, len(PROMPT) - 1:].numpy()
        with pm.disable_adapter():
            base = pm(input_ids=torch.tensor([PROMPT + generated[:-1]])).logits[0, len(PROMPT) - 1:].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4 * max(1.0, float(np.abs(want).max()) / 5), rtol=0)
    assert np.abs(want - base).max() > 0.1


def test_the_engine_keeps_kv_for_the_layers_that_make_it(tiny_engine):
    """gemma4: 5 layers, the last 2 reading layers 2 (sliding) and 1 (full), whose heads are twice as wide:
    3 KV layers, not 5 of one shape."""
    manifest = mf.load(tiny_engine("gemma4"))
    assert manifest.model.kv_layers == ((2, 16), (2, 32), (2, 16))
    # K and V of 2 heads a layer, float32: against 2 * 4 * (16 + 32 + 16 + 16 + 32) with every layer its own
    assert bytes_per_token(manifest.model) == 2 * 4 * (2 * 16 + 2 * 32 + 2 * 16)
    inputs = [i.name for i in load_engine(tiny_engine("gemma4")).session.get_inputs() if i.name.startswith("past_")]
    assert sorted(inputs) == sorted(f"past_{kind}.{i}" for kind in ("key", "value") for i in range(3))


@pytest.mark.parametrize("options, kv_dtype, row", [(dict(dtype="bfloat16"), "bfloat16", 0),
                                                     (dict(kv_cache_dtype="int8"), "int8", 4)])
def test_bfloat16_and_int8_kv_engines_run_our_attention_and_pass_the_build_check(options, kv_dtype, row,
                                                                                tiny_checkpoint, tmp_path):
    """Gemma's own type, and an int8 cache (each row its values and a float32 scale), on our attention
    kernel: the build's check against transformers (its top-1 floor for the format) passes, and each KV
    layer keeps its own row width."""
    engine = build(BuildConfig(model=str(tiny_checkpoint("gemma4")), output=str(tmp_path / "e"), **LIMITS, **options),
                   log=lambda m: None)
    manifest = mf.load(engine)
    assert manifest.model.kv_dtype == kv_dtype and "trtllm.cpu::Attention" in manifest.lowerings
    assert manifest.model.kv_shapes() == [(2, 16 + row), (2, 32 + row), (2, 16 + row)]


def test_eagle_heads_draft_trees_on_our_kernels_and_chains_without(tmp_path):
    """An EAGLE-3 head on Gemma 4 (test_eagle_parity.py and test_eagle_tree.py: its greedy tokens are
    transformers'): trees on our attention kernel, which takes a tree mask; chains without it, where the
    head's own graph runs ONNX Runtime's GroupQueryAttention, which takes none."""
    from tests.eagle_drafts import random_draft
    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("gemma4", tmp_path / "ckpt")
    draft = random_draft(ckpt, tmp_path / "d")
    for kernels, tree in (("auto", True), ("onnxruntime", False)):
        engine = build(BuildConfig(model=str(ckpt), output=str(tmp_path / kernels), eagle=str(draft), cpu_kernels=kernels,
                                   **LIMITS), log=lambda m: None)
        assert mf.load(engine).eagle["tree"] is tree, kernels


@pytest.mark.parametrize("kernels, graph", [("auto", "modern"), ("onnxruntime", "modern"), ("auto", "legacy")])
def test_the_sharing_layers_compute_each_rows_last_token_alone(kernels, graph, tiny_checkpoint, tmp_path, monkeypatch):
    """Past the first KV-sharing layer the graph keeps each row's last token (or every token where the
    step asks for verify_index' logits: test_prompt_logprobs.py, prompt lookup in test_layer_shapes.py), as
    transformers slices by logits_to_keep, on our attention kernel and in llm.onnx's standard ops (masks,
    and the legacy graph's RoPE rows, made again for the kept rows; `kernels` onnxruntime, or the legacy
    graph: the compiled form is those ops too): the build's check against transformers passes, and llm.onnx
    gives transformers' logits. The wrong variant, keeping each row's first token, fails the check."""
    import onnx

    from trtllm.builder.per_layer import PerLayerWriter
    from trtllm.builder.verify import VerifyError

    legacy = dict(graph="legacy", trt_version="10.3") if graph == "legacy" else {}
    engine = build(BuildConfig(model=str(tiny_checkpoint("gemma4")), output=str(tmp_path / "engine"),
                               cpu_kernels=kernels, **legacy, **LIMITS), log=lambda m: None)
    for name in ("llm.ort.onnx", "llm.onnx"):
        graph = onnx.load(str(engine / name), load_external_data=False)
        assert any(n.name == "/model/shared_rows/h" and n.op_type == "GatherElements" for n in graph.graph.node)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("gemma4"), dtype=torch.float32).eval()
    generated, got = engine_logits(load_engine(engine, graph="onnx"), PROMPT, num_decode=4)
    with torch.no_grad():
        want = model(torch.tensor([PROMPT + generated[:-1]])).logits[0, len(PROMPT) - 1:].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    right = PerLayerWriter.shared_rows

    def first_rows(self, h, position_ids, write_index, last_index):
        zero = self.g.op("Mul", "/wrong/zero", [last_index, self.g.const(0)])
        return right(self, h, position_ids, write_index, zero)

    monkeypatch.setattr(PerLayerWriter, "shared_rows", first_rows)
    with pytest.raises(VerifyError, match="differ from transformers"):
        build(BuildConfig(model=str(tiny_checkpoint("gemma4")), output=str(tmp_path / "wrong"), cpu_kernels=kernels,
                          **legacy, **LIMITS), log=lambda m: None)
