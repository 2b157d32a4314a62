"""A Gemma 3 vision-language engine (builder/vision_gemma3.py) against transformers: greedy tokens exact and
first-step logprobs within float32 tolerance, for one image, two images in one prompt and a text-only row
beside them, with an image's tokens seeing each other both ways in the prompt (the graph's image_ahead, on
our attention kernel and on the standard-op graphs), chunked prefill that would cut an image, KV kept per
image, LoRA, EAGLE-3, beam search, TensorRT (the stand-ins) and trtllm-serve. The reference is
transformers' Gemma3ForConditionalGeneration fed what Gemma3Processor gives it (token_type_ids included),
with Gemma3ImageProcessorPil's pixels."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.tiny_gemma3 import IMAGE_SIZE, TEMPLATE, TOKENS, make_gemma3_checkpoint
from tests.tiny_vlm import (CASES, asking, assert_answer, assert_beams, assert_beams_beside_a_greedy_row,
                            assert_context_reuse_tells_images_apart, assert_damage_refused, assert_eagle_answers,
                            assert_lora_matches_peft, assert_served_image_url, built, generated, run_contents)

NEW_TOKENS = 12
# (width, height): resized to one 32 x 32 tile whatever their size; square2 is square's size with other pixels
SIZES = {"wide.png": (90, 40), "square.png": (40, 40), "tall.png": (30, 70), "square2.png": (40, 40)}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    ckpt = make_gemma3_checkpoint(tmp_path_factory.mktemp("gemma3-ckpt"))
    return built(tmp_path_factory, ckpt, "gemma3", SIZES)


def processor(tok):
    from transformers import Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok.chat_template = TEMPLATE
    pixels = Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, resample=2,
                                     image_mean=[0.5] * 3, image_std=[0.5] * 3)
    return Gemma3Processor(pixels, tok, image_seq_length=TOKENS)


def reference(vlm, content: list, model=None, beams: int = 0, both_ways: bool = True,
              **processor_options) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and first-step log-probabilities for one user turn; `model`: another
    than the checkpoint's (one with a LoRA adapter); `both_ways` False leaves out token_type_ids, which
    make an image's tokens see each other both ways (the deliberately wrong variant); `processor_options`
    for Gemma3Processor (pan-and-scan's)."""
    from PIL import Image

    _, _, images, base, tok = vlm
    messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=TEMPLATE)
    pictures = [Image.open(images / c["image"]).convert("RGB") for c in content if "image" in c] or None
    feats = processor(tok)(text=text, images=pictures, return_tensors="pt", add_special_tokens=False,
                           **processor_options)
    kwargs = {k: feats[k] for k in ("pixel_values", "token_type_ids") if k in feats
              and (both_ways or k != "token_type_ids")}
    return generated(base if model is None else model, feats["input_ids"], NEW_TOKENS, beams, **kwargs)


def run(vlm, run_cli, contents: list, *extra, engine=None, **top):
    return run_contents(vlm, run_cli, contents, NEW_TOKENS, *extra, engine=engine, **top)


def test_greedy_tokens_and_logprobs_match_transformers(vlm, run_cli):
    """On our kernels the images are encoded by vision.ort.onnx (its attention trtllm.cpu::SegmentAttention,
    a tile a segment), checked at the build against transformers' embeddings as vision.onnx is."""
    from trtllm.plugins import cpu as cpu_kernels

    result, out = run(vlm, run_cli, CASES)
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES, out["responses"]):
        assert_answer(response, *reference(vlm, content))
    if cpu_kernels.library() is not None:
        manifest = json.loads((vlm[1] / "manifest.json").read_text())
        assert manifest["vision"]["compiled"] == manifest["files"]["vision_compiled"] == "vision.ort.onnx"
        checks = json.loads((vlm[1] / "verify.json").read_text())["vision"]
        assert checks["compiled_max_abs_error"] < 1e-4 and checks["max_abs_error"] < 1e-4


def test_an_image_seen_causally_is_told_apart(vlm, run_cli):
    """The deliberately wrong variant: transformers without token_type_ids (an image's tokens seen
    causally, as a text's) gives other log-probabilities, which the comparison above fails on."""
    result, out = run(vlm, run_cli, CASES[:2])
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:2], out["responses"]):
        with pytest.raises(AssertionError):
            assert_answer(response, *reference(vlm, content, both_ways=False))


def test_the_prompt_holds_the_processors_ids(vlm):
    """The prompt's ids are the processor's (its "\\n\\n" around each image's tokens tokenized with the
    text beside them), and its image tokens are where the processor's token_type_ids say."""
    from PIL import Image

    from trtllm.runtime import manifest as mf
    from trtllm.runtime import media
    from trtllm.runtime.input_format import parse_input

    _, engine, images, _, tok = vlm
    section = mf.load(engine).vision
    for content in CASES[:2]:
        req = parse_input({"requests": [{"messages": [{"role": "user", "content": content}]}]}).requests[0]
        messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, chat_template=TEMPLATE)
        ids = tok(media.expanded_text(text, section), add_special_tokens=False)["input_ids"]
        placed, prompt_images = media.place(ids, req, 0, section, media_dir=images)
        pictures = [Image.open(images / c["image"]).convert("RGB") for c in content if "image" in c]
        want = processor(tok)(text=text, images=pictures, add_special_tokens=False)
        assert placed == list(want["input_ids"][0])
        assert prompt_images.positions.tolist() == np.flatnonzero(np.array(want["token_type_ids"][0])).tolist()
        assert prompt_images.ahead(0, len(placed)).tolist() == list(range(TOKENS - 1, -1, -1)) * len(pictures)


def test_the_pixels_are_the_image_processors():
    """runtime/images.py on Gemma 3's settings gives Gemma3ImageProcessorPil's pixel_values (RGB, RGBA
    over white, and sizes up and down)."""
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from trtllm.builder.vision_gemma3 import DEFAULTS
    from trtllm.runtime import images

    config = {"size": {"height": 48, "width": 48}, "resample": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    pre = images.preprocess_config(config, defaults=DEFAULTS)
    rng = np.random.default_rng(0)
    for mode, (w, h) in (("RGB", (90, 40)), ("RGBA", (20, 33)), ("RGB", (48, 48))):
        image = Image.fromarray(rng.integers(0, 256, (h, w, len(mode)), dtype=np.uint8), mode)
        want = Gemma3ImageProcessorPil(**config)(image.convert("RGB") if mode == "RGB" else image,
                                                 return_tensors="np")["pixel_values"]
        np.testing.assert_allclose(images.pixel_values(image, pre), want, atol=1e-6)


@pytest.mark.parametrize("options", [{"cpu_kernels": "onnxruntime"}, {"graph": "legacy", "trt_version": "10.3"}])
def test_the_standard_op_graphs_see_images_both_ways(vlm, run_cli, tmp_path, options):
    """The engines without our attention kernel (ONNX's Attention with the mask; the legacy graph's
    attention as MatMul and Softmax, linted for TensorRT 10.3, vision.onnx too) take image_ahead into
    their mask: transformers' tokens and logprobs."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    engine = build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), max_batch_size=4,
                               max_input_len=256, max_kv_cache_capacity=512, **options), log=lambda m: None)
    result, out = run(vlm, run_cli, CASES[:3], engine=engine)
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:3], out["responses"]):
        assert_answer(response, *reference(vlm, content))


def test_chunked_prefill_never_cuts_an_image_and_kv_is_kept_per_image(vlm, run_cli, tmp_path):
    """A prompt prefilled in chunks of 16 while a short one generates (batch_size 2): an image's 16
    tokens, seen both ways, start past the first chunk's start, so that chunk ends before them and the
    next takes them whole; the answers are transformers'. Two images of one size (the same ids) never
    share KV, the same image again does (--context-reuse)."""
    one, other = reference(vlm, asking("square.png"))[0], reference(vlm, asking("square2.png"))[0]
    assert one != other  # (else sharing one's KV with the other would go unseen)
    for content in (asking("square.png"), CASES[1]):
        profile = tmp_path / "profile.json"
        result, out = run(vlm, run_cli, [CASES[2], content], "--prefill-chunk", "16", "--profile", str(profile),
                          batch_size=2)
        assert result.exit_code == 0, result.output
        assert out["responses"][1]["output_ids"] == reference(vlm, content)[0]
        assert json.loads(profile.read_text())["prefill"]["total_runs"] >= 3  # (the short one's, then chunks)
    assert_context_reuse_tells_images_apart(lambda *a, **k: run(vlm, run_cli, *a, **k), one, other, TOKENS, tmp_path)


def test_a_chunk_end_moves_off_an_image():
    """PromptImages.stop: an end inside an image moves before it, or past it where the image starts at
    the chunk's start (or before: KV restored into it), or too few tokens after it for a step of its own."""
    from trtllm.runtime.media import PromptImages
    from trtllm.runtime.step_inputs import chunk_stop

    p = PromptImages(np.r_[np.arange(5, 9), np.arange(12, 16)], [b"a", b"b"], [], None, counts=[4, 4],
                     bidirectional=True)
    assert [p.stop(0, e) for e in (3, 5, 6, 9, 13)] == [3, 5, 5, 9, 12]
    assert [p.stop(5, 7), p.stop(6, 7), p.stop(12, 14)] == [9, 9, 16]
    assert [p.stop(4, 6, 2), p.stop(3, 6, 2)] == [9, 5]  # (no step of fewer than `least` tokens before an image)
    assert chunk_stop(30, 4, 2, p) == 9
    assert chunk_stop(30, 0, 6, p) == 5 and chunk_stop(30, 5, 2, p) == 9 and chunk_stop(17, 12, 2, p) == 17
    assert p.ahead(5, 9).tolist() == [3, 2, 1, 0] and p.ahead(6, 16).tolist() == [2, 1, 0, 3, 2, 1, 0]
    with pytest.raises(ValueError, match="cut an image"):
        p.ahead(0, 7)
    causal = PromptImages(p.positions, [b"a", b"b"], [], None, counts=[4, 4])
    assert causal.stop(0, 6) == 6 and causal.ahead(0, 20) is None


def test_image_tokens_without_their_look_ahead_are_refused(vlm):
    """A step of image tokens with no image_ahead would see them causally: the engine's feeds refuse it
    rather than answer wrong."""
    from trtllm.runtime import manifest as mf
    from trtllm.runtime.engine import StepInputs, vision_feeds

    m = mf.load(vlm[1])
    zeros = lambda shape, dtype: np.zeros(shape, dtype)  # noqa: E731
    step = dict(input_ids=np.zeros((1, 16), np.int64), position_ids=np.arange(16)[None], sampling=None,
                write_index=np.zeros(1, np.int64), last_index=np.array([15]), image_embeds=np.zeros((16, 64), np.float32),
                image_index=np.stack([np.zeros(16, np.int64), np.arange(16)], axis=1))
    with pytest.raises(ValueError, match="needs image_ahead"):
        vision_feeds(m, StepInputs(**step), 1, zeros)
    ahead = np.arange(15, -1, -1)
    assert vision_feeds(m, StepInputs(**step, image_ahead=ahead), 1, zeros)[m.io.image_ahead] is ahead
    assert vision_feeds(m, StepInputs(**{**step, "image_embeds": None, "image_index": None}), 1,
                        zeros)[m.io.image_ahead].shape == (0,)


@pytest.mark.parametrize("damage, named", [
    (lambda v: v.pop("bidirectional"), "vision lacks bidirectional"),
    (lambda v: v.update(bidirectional=False), "vision.bidirectional must be true on gemma3"),
    (lambda v: v.update(start_token=""), "vision.start_token and end_token must be the text"),
    (lambda v: v["preprocess"].update(crop_to_patches=True), "preprocess.crop_to_patches false on gemma3"),
])
def test_a_damaged_vision_section_is_refused_by_name(vlm, tmp_path, damage, named):
    assert_damage_refused(vlm[1], tmp_path, damage, named)


def test_an_image_token_written_in_the_text_is_refused(vlm, run_cli):
    """A prompt whose text writes the image tokens itself: that request fails naming its messages; its
    neighbour is answered."""
    result, out = run(vlm, run_cli, [[{"type": "text", "text": "see <start_of_image> here"}], CASES[2]])
    assert result.exit_code == 1 and "1 of 2 requests failed" in result.output, result.output
    assert out["responses"][0]["finish_reason"] == "error"
    assert "0 image item(s)" in out["responses"][0]["error"] and "requests[0].messages" in out["responses"][0]["error"]
    assert out["responses"][1]["output_ids"] == reference(vlm, CASES[2])[0]


def test_lora_adapters_on_the_language_model_match_peft(vlm, run_cli, tmp_path):
    """A PEFT adapter of the language model as PEFT names it in the whole model (model.language_model),
    bundled (the build checks it against PEFT's merge) and given at run time, with images, beside a row
    with no adapter."""
    targets = r".*language_model.*\.(q_proj|v_proj|o_proj|gate_proj|down_proj)"
    assert_lora_matches_peft(vlm, run_cli, tmp_path, lambda content, **kw: reference(vlm, content, **kw), targets,
                             NEW_TOKENS)


def test_an_eagle_head_speculates_over_prompts_with_images(vlm, run_cli, tmp_path):
    """An EAGLE-3 head on a Gemma 3 engine: greedy answers stay transformers'."""
    assert_eagle_answers(vlm, run_cli, tmp_path, lambda content: reference(vlm, content), NEW_TOKENS)


def test_beam_search_with_images_is_transformers(vlm, run_cli):
    """num_beams with images seen both ways: each returned beam's tokens and score are transformers' beam
    search's, beside a greedy row of the same batch."""
    assert_beams_beside_a_greedy_row(vlm[1], vlm[2], run_cli, lambda content, **kw: reference(vlm, content, **kw),
                                     CASES[1], CASES[0], NEW_TOKENS)


def test_beam_search_scores_its_prompt_in_chunks_off_the_images(vlm, run_cli):
    """prompt_logprobs with beams: the prompt is computed in scoring chunks, which end off the images;
    the beams are still transformers'."""
    requests = [{"messages": [{"role": "user", "content": [{**c, "image": str(vlm[2] / c["image"])} if "image" in c
                                                           else c for c in CASES[1]]}],
                 "num_beams": 2, "n": 2, "prompt_logprobs": 1}]
    result, out = run_cli(vlm[1], {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "requests": requests})
    assert result.exit_code == 0, result.output
    assert_beams(out["responses"][:2], reference(vlm, CASES[1], beams=2))


def test_a_tensorrt_engine_answers_with_images_as_transformers(vlm, run_cli, tmp_path):
    """--backend tensorrt (the stand-ins, tests/fakes): llm.plan takes the image embeddings and their
    look-ahead, vision.plan encodes the images (checked at the build against transformers' embeddings),
    and the engine answers as transformers."""
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


def test_served_image_url_parts_match_transformers(vlm, tmp_path):
    """trtllm-serve: an image_url part (a data: URL) on a Gemma 3 engine answers as transformers."""
    assert_served_image_url(vlm, tmp_path, lambda content: reference(vlm, content), NEW_TOKENS)


PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_max_num_crops": 2, "pan_and_scan_min_crop_size": 16,
                "pan_and_scan_min_ratio_to_activate": 1.2}


def test_pan_and_scan_crops_and_pixels_are_the_processors():
    """runtime/images_gemma3.py's crops (how many, where, and their pixels) are Gemma3ImageProcessorPil's
    with do_pan_and_scan: wide and tall images, a ratio under the threshold, crops that would be narrower
    than the minimum, sides that do not divide evenly (the last crop stops at the edge)."""
    from PIL import Image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from trtllm.builder.vision_gemma3 import DEFAULTS
    from trtllm.runtime import images, images_gemma3

    config = {"size": {"height": 32, "width": 32}, "resample": 2, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    pre = {**images.preprocess_config(config, defaults=DEFAULTS),
           "pan_and_scan": {"min_crop_size": 20, "max_num_crops": 3, "min_ratio_to_activate": 1.2}}
    rng = np.random.default_rng(1)
    counts = []
    for w, h in ((301, 100), (100, 250), (110, 100), (100, 15), (37, 200), (120, 39)):
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        want = Gemma3ImageProcessorPil(**config)(image, return_tensors="np", do_pan_and_scan=True,
                                                 pan_and_scan_min_crop_size=20, pan_and_scan_max_num_crops=3,
                                                 pan_and_scan_min_ratio_to_activate=1.2)
        got = images_gemma3.pixel_values(image, pre)
        assert len(got) == images_gemma3.tile_count(w, h, pre) == 1 + int(want["num_crops"][0]), (w, h)
        np.testing.assert_allclose(got, want["pixel_values"], atol=1e-6)
        counts.append(len(got) - 1)
    assert counts == [3, 3, 0, 0, 3, 3]  # (none under the ratio, nor where a crop's short side is under 20)


@pytest.fixture(scope="module")
def pan(vlm, tmp_path_factory):
    """The suite's checkpoint built with --max-image-tiles 3: pan-and-scan on, at most 2 crops an image."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    engine = build(BuildConfig(model=str(vlm[0]), output=str(tmp_path_factory.mktemp("gemma3-pan") / "engine"),
                               max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512, max_image_tiles=3),
                   log=lambda m: None)
    return (vlm[0], engine, *vlm[2:])


def test_pan_and_scan_answers_as_transformers(pan, run_cli):
    """--max-image-tiles 3 turns pan-and-scan on (2 crops at most): a wide and a tall image each give two
    crops, each 16 tokens seen both ways, in the processor's words, and a square one none; greedy tokens
    and logprobs are transformers' with do_pan_and_scan, and the prompt ids the processor's."""
    from PIL import Image

    from trtllm.runtime import manifest as mf
    from trtllm.runtime import media
    from trtllm.runtime.input_format import parse_input

    section = mf.load(pan[1]).vision
    assert section["preprocess"]["pan_and_scan"] == {"min_crop_size": 16, "max_num_crops": 2,
                                                     "min_ratio_to_activate": 1.2}
    result, out = run(pan, run_cli, CASES[:3])
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:3], out["responses"]):
        assert_answer(response, *reference(pan, content, **PAN_AND_SCAN))
    content = CASES[1]  # (square and tall: 1 + 3 images' tokens)
    req = parse_input({"requests": [{"messages": [{"role": "user", "content": content}]}]}).requests[0]
    tok, images = pan[4], pan[2]
    text = tok.apply_chat_template([{"role": "user", "content": [{"type": "image"} if "image" in c else c
                                                                  for c in content]}],
                                   tokenize=False, add_generation_prompt=True, chat_template=TEMPLATE)
    crops = media.crop_counts(req, 0, section, images)
    ids = tok(media.expanded_text(text, section, crops), add_special_tokens=False)["input_ids"]
    placed, prompt_images = media.place(ids, req, 0, section, media_dir=images)
    pictures = [Image.open(images / c["image"]).convert("RGB") for c in content if "image" in c]
    want = processor(tok)(text=text, images=pictures, add_special_tokens=False, **PAN_AND_SCAN)
    assert crops == [0, 2] and placed == list(want["input_ids"][0])
    assert prompt_images.positions.tolist() == np.flatnonzero(np.array(want["token_type_ids"][0])).tolist()
    assert prompt_images.ahead(0, len(placed)).tolist() == list(range(TOKENS - 1, -1, -1)) * 4


def test_without_pan_and_scan_the_crops_are_missed(pan, run_cli):
    """The deliberately wrong variant: transformers without pan-and-scan answers a wide image otherwise."""
    result, out = run(pan, run_cli, CASES[:1])
    assert result.exit_code == 0, result.output
    with pytest.raises(AssertionError):
        assert_answer(out["responses"][0], *reference(pan, CASES[0]))
