"""A Gemma 4 vision-language engine (builder/vision_gemma4.py) against transformers: greedy tokens exact and
first-step logprobs within float32 tolerance, for one image, two images in one prompt and a text-only row
beside them (on gemma-4-26B-A4B's form too, its experts beside each MLP); each image resized to its own token budget; its tokens seen both ways on the sliding layers
where the config says so ("vision"), causally where it does not; the image tokens' per-layer embeddings
the pad token's. The reference is transformers' Gemma4ForConditionalGeneration fed what Gemma4Processor
gives it: its prompt expansion (each image token the start token, one token per 2 x 2 patches and the end
token) and mm_token_type_ids, written out here (the processor itself needs torchvision for its video
side), with Gemma4ImageProcessorPil's pixels."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.tiny_gemma4 import IMAGE_TOKENS, PATCH, POOL, SOFT_TOKENS, TEMPLATE, make_gemma4_vl_checkpoint
from tests.tiny_vlm import (CASES, assert_answer, assert_beams_beside_a_greedy_row, assert_damage_refused,
                            assert_eagle_answers, assert_lora_matches_peft, assert_served_image_url, built, generated,
                            run_contents)

pytestmark = pytest.mark.hf
NEW_TOKENS = 10
# (width, height): each resized to at most 70 tokens of 2 x 2 patches of 4 px; square2 is square's size
SIZES = {"wide.png": (90, 40), "square.png": (40, 40), "tall.png": (30, 70), "square2.png": (40, 40)}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    ckpt = make_gemma4_vl_checkpoint(tmp_path_factory.mktemp("gemma4-ckpt"))
    return built(tmp_path_factory, ckpt, "gemma4", SIZES)


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    """The same model with use_bidirectional_attention None (the smaller models' configs): images causal."""
    ckpt = make_gemma4_vl_checkpoint(tmp_path_factory.mktemp("gemma4-causal-ckpt"), both_ways=False)
    return built(tmp_path_factory, ckpt, "gemma4-causal", SIZES)


@pytest.fixture(scope="module")
def experts(tmp_path_factory):
    """gemma-4-26B-A4B's form: the language model's layers each with a mixture of experts beside the MLP."""
    ckpt = make_gemma4_vl_checkpoint(tmp_path_factory.mktemp("gemma4-moe-ckpt"), text="gemma4-moe")
    return built(tmp_path_factory, ckpt, "gemma4-moe", SIZES)


def image_processor(budget: int = SOFT_TOKENS):
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    return Gemma4ImageProcessorPil(patch_size=PATCH, pooling_kernel_size=POOL, max_soft_tokens=budget)


def processed(vlm, content: list, budget: int = SOFT_TOKENS) -> tuple:
    """(input_ids, the model's image inputs) as Gemma4Processor makes them for one user turn (`budget`: its
    max_soft_tokens)."""
    from PIL import Image

    _, _, images, _, tok = vlm
    messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=TEMPLATE)
    pictures = [Image.open(images / c["image"]).convert("RGB") for c in content if "image" in c]
    inputs = {}
    if pictures:
        pixels = image_processor(budget)(pictures, return_tensors="pt")
        pieces = text.split(IMAGE_TOKENS["image_token"])  # (Gemma4Processor.replace_image_token)
        text = pieces[0] + "".join(IMAGE_TOKENS["boi_token"] + IMAGE_TOKENS["image_token"] * n + IMAGE_TOKENS["eoi_token"]
                                   + piece for n, piece in zip(pixels["num_soft_tokens_per_image"], pieces[1:]))
        inputs = {"pixel_values": pixels["pixel_values"], "image_position_ids": pixels["image_position_ids"]}
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return ids, inputs


def reference(vlm, content: list, both_ways: bool = True, beams: int = 0, model=None, budget: int = SOFT_TOKENS) -> tuple:
    """transformers' greedy tokens and first-step log-probabilities (`model`: another than the checkpoint's,
    one with a LoRA adapter); `both_ways` False leaves out mm_token_type_ids, which make an image's tokens
    see each other both ways (the wrong variant)."""
    ids, inputs = processed(vlm, content, budget)
    if both_ways and inputs:
        inputs["mm_token_type_ids"] = (ids == vlm[4].convert_tokens_to_ids(IMAGE_TOKENS["image_token"])).long()
    return generated(vlm[3] if model is None else model, ids, NEW_TOKENS, beams, **inputs)


def run(vlm, run_cli, contents: list, *extra, engine=None, **top):
    return run_contents(vlm, run_cli, contents, NEW_TOKENS, *extra, engine=engine, **top)


def test_greedy_tokens_and_logprobs_match_transformers(vlm, run_cli):
    """On our kernels the images are encoded by vision.ort.onnx (its attention trtllm.cpu::SegmentAttention),
    checked at the build against transformers' embeddings as vision.onnx is."""
    from trtllm.plugins import cpu as cpu_kernels

    result, out = run(vlm, run_cli, CASES)
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES, out["responses"]):
        assert_answer(response, *reference(vlm, content))
    manifest = json.loads((vlm[1] / "manifest.json").read_text())
    assert manifest["vision"]["bidirectional"] is True and manifest["vision"]["max_patches"] == SOFT_TOKENS * POOL ** 2
    checks = json.loads((vlm[1] / "verify.json").read_text())["vision"]
    assert checks["max_abs_error"] < 1e-4
    if cpu_kernels.library() is not None:
        assert manifest["vision"]["compiled"] == "vision.ort.onnx" and checks["compiled_max_abs_error"] < 1e-4


def test_an_image_seen_causally_is_told_apart(vlm, run_cli):
    """The deliberately wrong variant: transformers without mm_token_type_ids (an image's tokens seen
    causally on every layer) gives other log-probabilities, which the comparison above fails on."""
    result, out = run(vlm, run_cli, CASES[:2])
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:2], out["responses"]):
        with pytest.raises(AssertionError):
            assert_answer(response, *reference(vlm, content, both_ways=False))


def test_a_causal_config_sees_images_causally(causal, run_cli):
    """use_bidirectional_attention None: the engine's image tokens are causal (no image_ahead), as
    transformers' mask then is."""
    manifest = json.loads((causal[1] / "manifest.json").read_text())
    assert manifest["vision"]["bidirectional"] is False
    result, out = run(causal, run_cli, CASES[:3])
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:3], out["responses"]):
        assert_answer(response, *reference(causal, content, both_ways=False))


def test_a_mixture_of_experts_language_model_answers_images_as_transformers(experts, run_cli):
    """26B-A4B's form (builder/moe.py, beside_dense): images, two in a prompt and a text row beside them, on
    our MoE kernel, as transformers answers them."""
    from trtllm.plugins import cpu as cpu_kernels

    if cpu_kernels.library() is not None:
        assert cpu_kernels.MOE_LOWERING in json.loads((experts[1] / "manifest.json").read_text())["lowerings"]
    result, out = run(experts, run_cli, CASES[:3])
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:3], out["responses"]):
        assert_answer(response, *reference(experts, content))


def test_the_prompt_holds_the_processors_ids(vlm):
    """The prompt's ids are the processor's expansion, and its image tokens where mm_token_type_ids says;
    an image's look-ahead runs to its last token."""
    from trtllm.runtime import manifest as mf
    from trtllm.runtime import media
    from trtllm.runtime.input_format import parse_input

    _, engine, images, _, tok = vlm
    section = mf.load(engine).vision
    for content in CASES[:2]:
        req = parse_input({"requests": [{"messages": [{"role": "user", "content": content}]}]}).requests[0]
        messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=TEMPLATE)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        placed, prompt_images = media.place(ids, req, 0, section, media_dir=images)
        want, _ = processed(vlm, content)
        assert placed == want[0].tolist()
        image_id = tok.convert_tokens_to_ids(IMAGE_TOKENS["image_token"])
        assert prompt_images.positions.tolist() == np.flatnonzero(want[0].numpy() == image_id).tolist()
        counts = [hi - lo for lo, hi in prompt_images.runs]
        assert prompt_images.ahead(0, len(placed)).tolist() == [k for n in counts for k in range(n - 1, -1, -1)]


def test_the_pixels_are_the_image_processors():
    """runtime/images_gemma4.py gives Gemma4ImageProcessorPil's patches (without its padding), their
    positions and its token counts: RGB and RGBA, sizes up and down, and extreme aspect ratios."""
    from PIL import Image

    from trtllm.runtime import images_gemma4

    rng = np.random.default_rng(0)
    for config in ({}, {"patch_size": PATCH, "pooling_kernel_size": POOL, "max_soft_tokens": SOFT_TOKENS}):
        pre = images_gemma4.preprocess_config(config)
        for mode, (w, h) in (("RGB", (90, 40)), ("RGBA", (20, 33)), ("RGB", (480, 480)), ("RGB", (1000, 30)),
                             ("RGB", (37, 700)), ("RGB", (3000, 2000))):
            image = Image.fromarray(rng.integers(0, 256, (h, w, len(mode)), dtype=np.uint8), mode)
            from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

            want = Gemma4ImageProcessorPil(**config)(image, return_tensors="np")
            pixels, positions = images_gemma4.pixel_values(image, pre)
            tokens = int(want["num_soft_tokens_per_image"][0])
            assert images_gemma4.token_count(w, h, pre) == tokens == len(pixels) // pre["pooling_kernel_size"] ** 2
            np.testing.assert_array_equal(pixels, want["pixel_values"][0][:len(pixels)])
            np.testing.assert_array_equal(positions, want["image_position_ids"][0][:len(pixels)])
            assert (want["image_position_ids"][0][len(pixels):] == -1).all()  # (the rest is its padding)


@pytest.mark.parametrize("options", [{"cpu_kernels": "onnxruntime"}, {"graph": "legacy", "trt_version": "10.3"}])
def test_the_standard_op_graphs_see_images_as_transformers(vlm, run_cli, tmp_path, options):
    """The engines without our attention kernel (ONNX's Attention with the mask; the legacy graph's
    attention as MatMul and Softmax, linted for TensorRT 10.3, vision.onnx too) take image_ahead on their
    sliding layers' masks alone: transformers' tokens and logprobs."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    engine = build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), max_batch_size=4,
                               max_input_len=256, max_kv_cache_capacity=512, **options), log=lambda m: None)
    result, out = run(vlm, run_cli, CASES[:3], engine=engine)
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:3], out["responses"]):
        assert_answer(response, *reference(vlm, content))


def test_chunked_prefill_never_cuts_an_image(vlm, run_cli, tmp_path):
    """A prompt prefilled in chunks of 16 while a short one generates: an image's tokens, seen both ways,
    are computed in one step; the answers are transformers'."""
    profile = tmp_path / "profile.json"
    result, out = run(vlm, run_cli, [CASES[2], CASES[1]], "--prefill-chunk", "16", "--profile", str(profile),
                      batch_size=2)
    assert result.exit_code == 0, result.output
    assert out["responses"][1]["output_ids"] == reference(vlm, CASES[1])[0]
    assert json.loads(profile.read_text())["prefill"]["total_runs"] >= 3


@pytest.mark.parametrize("damage, named", [
    (lambda v: v.pop("max_patches"), "vision lacks max_patches"),
    (lambda v: v.update(bidirectional=None), "vision.bidirectional must be true or false on gemma4"),
    (lambda v: v["preprocess"].update(max_soft_tokens=100), "max_soft_tokens one of"),
])
def test_a_damaged_vision_section_is_refused_by_name(vlm, tmp_path, damage, named):
    assert_damage_refused(vlm[1], tmp_path, damage, named)


def test_a_tensorrt_engine_answers_with_images_as_transformers(vlm, run_cli, tmp_path):
    """--backend tensorrt (the stand-ins, tests/fakes): vision.plan's profile takes an image's patches up
    to max_patches, and the engine answers as transformers."""
    from tests import fakes
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    with fakes.installed():
        engine = build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), backend="tensorrt",
                                   max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
        assert json.loads((engine / "verify.json").read_text())["vision_plan"]["max_abs_error"] < 1e-4
        result, out = run(vlm, run_cli, CASES, engine=engine)
        assert result.exit_code == 0, result.output
        for content, response in zip(CASES, out["responses"]):
            assert_answer(response, *reference(vlm, content))


@pytest.mark.parametrize("wrong", ["unclipped", "axes_swapped"])
def test_a_wrong_vision_graph_is_told_apart(vlm, tmp_path, wrong):
    """The vision graph's deliberately wrong variants fail its check against transformers: its linears
    unclipped (the checkpoint clips the MLP's gate), or the 2-D RoPE's axes swapped (y on each head's first
    half)."""
    import dataclasses

    import onnx

    from trtllm.builder import vision_gemma4
    from trtllm.builder.verify_logits import VerifyError

    whole = vlm[3]
    spec = vision_gemma4.spec_of(whole.config)
    writer = vision_gemma4.Gemma4Writer(dataclasses.replace(spec, clipped=False) if wrong == "unclipped" else spec,
                                        vision_gemma4.weights_of(whole))
    if wrong == "axes_swapped":
        tables = writer.rope_tables
        writer.rope_tables = lambda positions: tables(writer.g.op("Gather", "/wrong/yx", [positions, writer.g.const([1, 0])],
                                                                  axis=1))
    onnx.save(writer.write(), str(tmp_path / "vision.onnx"))
    with pytest.raises(VerifyError, match="image embeddings differ from transformers'"):
        vision_gemma4.verify(tmp_path / "vision.onnx", whole, spec)


def test_lora_adapters_on_the_language_model_match_peft(vlm, run_cli, tmp_path):
    """A PEFT adapter of the language model as PEFT names it in the whole model (model.language_model),
    bundled and given at run time, with images, beside a row with no adapter."""
    targets = r".*language_model.*\.(q_proj|v_proj|o_proj|gate_proj|down_proj)"
    assert_lora_matches_peft(vlm, run_cli, tmp_path, lambda content, **kw: reference(vlm, content, **kw), targets,
                             NEW_TOKENS)


def test_an_eagle_head_speculates_over_prompts_with_images(vlm, run_cli, tmp_path):
    """An EAGLE-3 head on a Gemma 4 engine with images: greedy answers stay transformers'."""
    assert_eagle_answers(vlm, run_cli, tmp_path, lambda content: reference(vlm, content), NEW_TOKENS)


def test_beam_search_with_images_is_transformers(vlm, run_cli):
    """num_beams with images: each returned beam's tokens and score are transformers' beam search's,
    beside a greedy row of the same batch."""
    assert_beams_beside_a_greedy_row(vlm[1], vlm[2], run_cli, lambda content, **kw: reference(vlm, content, **kw),
                                     CASES[1], CASES[0], NEW_TOKENS)


def test_served_image_url_parts_match_transformers(vlm, tmp_path):
    """trtllm-serve: an image_url part (a data: URL) on a Gemma 4 engine answers as transformers."""
    assert_served_image_url(vlm, tmp_path, lambda content: reference(vlm, content), NEW_TOKENS)


def test_max_image_tokens_sets_the_budget(vlm, run_cli, tmp_path):
    """--max-image-tokens 140: each image resized to at most 140 tokens (the processor's max_soft_tokens=140
    in transformers), more than the checkpoint's 70: the answers are transformers' with that budget."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    engine = build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), max_batch_size=4, max_input_len=256,
                               max_kv_cache_capacity=512, max_image_tokens=140), log=lambda m: None)
    section = json.loads((engine / "manifest.json").read_text())["vision"]
    assert section["preprocess"]["max_soft_tokens"] == 140 and section["max_patches"] == 140 * POOL ** 2
    result, out = run(vlm, run_cli, CASES[:1], engine=engine)
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["prompt_tokens"] > processed(vlm, CASES[0])[0].shape[1]  # (more image tokens)
    assert_answer(out["responses"][0], *reference(vlm, CASES[0], budget=140))


@pytest.mark.parametrize("option, named", [
    ({"max_image_tokens": 100}, "--max-image-tokens must be one of 70, 140, 280, 560, 1120"),
    ({"max_image_tiles": 2}, "--max-image-tiles is not for .* resized to a token budget; use --max-image-tokens"),
    ({"max_image_pixels": 10000}, "--max-image-pixels is not for .* use --max-image-tokens"),
])
def test_image_options_gemma4_does_not_take_are_refused_by_name(vlm, tmp_path, option, named):
    from trtllm.builder.config import BuildConfig, ConfigError
    from trtllm.builder.export import build

    with pytest.raises(ConfigError, match=named):
        build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), max_batch_size=4, max_input_len=256,
                          max_kv_cache_capacity=512, **option), log=lambda m: None)
