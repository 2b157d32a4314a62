"""Qwen-VL engines beyond ONNX Runtime's float32 ones (tests/parity/test_qwen_vl_parity.py has those):
beam search with images, TensorRT engines (the stand-ins, tests/fakes) and AWQ / GPTQ releases, each
against transformers, with that module's checkpoints and reference."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.parity.test_qwen_vl_parity import CASES, NEW_TOKENS, check, make, placed, reference, run
from tests.tiny_vlm import assert_answer, assert_beams_beside_a_greedy_row


@pytest.fixture(scope="module")
def qvl(tmp_path_factory):
    return make(tmp_path_factory, "qwen2_5_vl")


@pytest.fixture(scope="module")
def q3(tmp_path_factory):
    return make(tmp_path_factory, "qwen3_vl")


def test_beam_search_with_images_is_transformers(qvl, run_cli):
    """num_beams with images (Qwen's multimodal RoPE: the beams' shift past the images): each returned beam's tokens and score are
    transformers' beam search's, beside a greedy row of the same batch."""
    assert_beams_beside_a_greedy_row(qvl[1], qvl[2], run_cli, lambda content, **kw: reference(qvl, content, **kw),
                                     CASES[1], CASES[0], NEW_TOKENS)


def test_tensorrt_engines_answer_with_images_as_transformers(qvl, q3, tmp_path_factory, run_cli):
    """--backend tensorrt (the stand-ins, tests/fakes) on Qwen2.5-VL (windowed layers: window_rows and
    window_slots in vision.plan's profile) and Qwen3-VL (its position grid's taps, DeepStack rows on
    image_embeds): llm.plan takes the M-RoPE inputs, vision.plan an image's patches whole (checked at
    the build against transformers' embeddings), and the answers with images are transformers'."""
    from tests import fakes
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    for model in (qvl, q3):
        root = tmp_path_factory.mktemp("qwen-trt")
        with fakes.installed():
            engine = build(BuildConfig(model=str(model[0]), output=str(root / "engine"), backend="tensorrt",
                                       max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512),
                           log=lambda m: None)
            assert json.loads((engine / "verify.json").read_text())["vision_plan"]["max_abs_error"] < 1e-4
            result, out = run((model[0], engine, *model[2:]), run_cli, CASES)
        assert result.exit_code == 0, result.output
        check(model, CASES, out)


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_a_pre_quantized_language_model_is_transformers_on_its_weights(method, qvl, tmp_path, run_cli):
    """AWQ and GPTQ releases of vision-language models (Qwen2.5-VL-*-AWQ) pack the language model's
    projections under the file's older names (model.layers...; the vision tower stays float): each is
    read back exactly into transformers 5's model.language_model, and the engine answers with images
    as transformers fed those float weights (a float checkpoint of them, which transformers loads
    itself); --quantization int4 keeps their grid."""
    import shutil

    import torch
    import transformers
    from safetensors.numpy import load_file, save_file

    from tests.prequantized_files import write_prequantized
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    weights = write_prequantized(qvl[0], tmp_path / "packed", method, sym=method == "gptq", skip=("visual.",))
    assert weights and all(name.startswith("model.layers.") for name in weights)
    theirs = shutil.copytree(qvl[0], tmp_path / "reference")
    save_file({**load_file(qvl[0] / "model.safetensors"), **{k: np.ascontiguousarray(w) for k, w in weights.items()}},
              theirs / "model.safetensors", metadata={"format": "pt"})
    model = transformers.AutoModelForImageTextToText.from_pretrained(theirs, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    limits = dict(max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512)
    engine = build(BuildConfig(model=str(tmp_path / "packed"), output=str(tmp_path / "float"), **limits),
                   log=lambda m: None)
    result, out = run((qvl[0], engine, *qvl[2:]), run_cli, CASES[:2])
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:2], out["responses"]):
        assert_answer(response, *reference(qvl, content, model=model))
    said = []
    build(BuildConfig(model=str(tmp_path / "packed"), output=str(tmp_path / "int4"), quantization="int4", **limits),
          log=said.append)
    assert any(f"int4 keeps its codes and scales for {len(weights)} of {len(weights)}" in m for m in said), said


def test_lora_on_qwen3_vl_moe_matches_peft(tmp_path_factory, run_cli):
    """LoRA adapters of Qwen3-VL-MoE's language model, the routed experts included (PEFT's
    target_parameters), bundled and given at run time, with images, as PEFT."""
    import copy

    import peft
    import torch

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    qm = make(tmp_path_factory, "qwen3_vl_moe")
    root, models = tmp_path_factory.mktemp("qwen3_vl_moe-lora"), {}
    for seed, (name, experts) in enumerate((("bundled", True), ("given", False)), 1):
        torch.manual_seed(seed)
        config = peft.LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                 target_modules=r".*language_model.*\.(q_proj|v_proj|o_proj)",
                                 target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"] * experts)
        models[name] = peft.get_peft_model(copy.deepcopy(qm[3]), config).eval()
        models[name].save_pretrained(root / name)
    engine = build(BuildConfig(model=str(qm[0]), output=str(root / "engine"), max_batch_size=4, max_input_len=256,
                               max_kv_cache_capacity=512, max_lora_rank=16, lora=[("bundled", str(root / "bundled"))]),
                   log=lambda m: None)
    names = ["bundled", "given", None]
    result, out = run_cli(engine, {
        "temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS, "batch_size": 4,
        "available_lora_weights": {"given": str(root / "given")},
        "requests": [{"messages": [{"role": "user", "content": placed(qm, CASES[0])}],
                      **({"lora_name": name} if name else {})} for name in names]})
    assert result.exit_code == 0, result.output
    for name, response in zip(names, out["responses"]):
        assert response["output_ids"] == reference(qm, CASES[0], model=models.get(name))[0], name
    assert out["responses"][0]["output_ids"] != out["responses"][2]["output_ids"]  # (the adapter changes it)
