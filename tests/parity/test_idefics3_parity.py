"""A vision-language engine of the Idefics3 family (Idefics3 and SmolVLM: builder/vision_idefics3.py,
runtime/images_idefics3.py) against transformers: greedy tokens exact and first-step logprobs within
float32 tolerance, for images cut into 2 x 3, 3 x 2 and 3 x 3 tiles plus the global one, two images in
one prompt, a text-only row beside them, one-tile images (--max-image-tiles 1), chunked prefill that
cuts an image, and KV kept per image. The reference is transformers' Idefics3ForConditionalGeneration
(or SmolVLM's) fed what Idefics3Processor gives it, with Idefics3ImageProcessorPil's pixels."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.tiny_idefics3 import TEMPLATE, make_idefics3_checkpoint
from tests.tiny_vlm import (CASES, asking, assert_answer, assert_beams, assert_beams_beside_a_greedy_row,
                            assert_context_reuse_tells_images_apart, assert_damage_refused, assert_eagle_answers,
                            assert_lora_matches_peft, assert_served_image_url, built, generated, run_contents)

NEW_TOKENS = 12
# (width, height); square2 is square's size with other pixels: the same token ids, another image
SIZES = {"wide.png": (200, 90), "square.png": (60, 60), "tall.png": (70, 150), "square2.png": (60, 60)}


def make(tmp_path_factory, model_type: str = "idefics3", legacy_template: bool = False, **build_options):
    """(checkpoint dir, engine dir, images dir, transformers model, tokenizer with the chat template)."""
    ckpt = make_idefics3_checkpoint(tmp_path_factory.mktemp(f"{model_type}-ckpt"), model_type=model_type,
                                    legacy_template=legacy_template)
    vlm = built(tmp_path_factory, ckpt, model_type, SIZES, **build_options)
    vlm[4].chat_template = TEMPLATE  # (what the processor would read from chat_template.json)
    return vlm


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return make(tmp_path_factory)


def reference(vlm, content: list, model=None, beams: int = 0, **processor_options) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and first-step log-probabilities for one user turn; `model`: another
    than the checkpoint's (one with a LoRA adapter)."""
    from PIL import Image
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    ckpt, _, images, base, tok = vlm
    model = base if model is None else model
    messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    files = [c["image"] for c in content if "image" in c]
    config = json.loads((ckpt / "preprocessor_config.json").read_text())
    processor = Idefics3Processor(Idefics3ImageProcessorPil(**{k: v for k, v in config.items()
                                                               if k != "image_processor_type"}), tok, image_seq_len=4)
    pictures = [Image.open(images / f).convert("RGB") for f in files] or None
    feats = processor(text=text, images=pictures, return_tensors="pt", add_special_tokens=False, **processor_options)
    ids = feats["input_ids"]
    kwargs = {k: feats[k] for k in ("pixel_values", "pixel_attention_mask") if k in feats}
    return generated(model, ids, NEW_TOKENS, beams, **kwargs)


def run(vlm, run_cli, contents: list, *extra, **top):
    return run_contents(vlm, run_cli, contents, NEW_TOKENS, *extra, **top)


def test_greedy_tokens_and_logprobs_match_transformers(vlm, run_cli):
    result, out = run(vlm, run_cli, CASES)
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES, out["responses"]):
        assert_answer(response, *reference(vlm, content))


def test_the_prompt_holds_the_processors_ids(vlm):
    """The ids an image stands for are the processor's, tile tags and newlines included (each grid)."""
    from PIL import Image
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from trtllm.runtime import manifest as mf
    from trtllm.runtime import media
    from trtllm.runtime.input_format import parse_input

    _, engine, images, _, tok = vlm
    section = mf.load(engine).vision
    processor = Idefics3Processor(Idefics3ImageProcessorPil(size={"longest_edge": 96},
                                                            max_image_size={"longest_edge": 32}), tok, image_seq_len=4)
    for content in CASES[:2]:
        req = parse_input({"requests": [{"messages": [{"role": "user", "content": content}]}]}).requests[0]
        messages = [{"role": "user", "content": [{"type": "image"} if "image" in c else c for c in content]}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        placed, prompt_images = media.place(tok(text, add_special_tokens=False)["input_ids"], req, 0, section,
                                            media_dir=images)
        pictures = [Image.open(images / c["image"]).convert("RGB") for c in content if "image" in c]
        want = list(processor(text=text, images=pictures, add_special_tokens=False)["input_ids"][0])
        assert placed == want
        assert prompt_images.positions.tolist() == [i for i, t in enumerate(want) if t == section["image_token_id"]]


def test_a_wrong_reference_is_told_apart(vlm, run_cli):
    """The deliberately wrong variant: the processor without splitting (one tile an image) gives other
    tokens, and the comparison above would fail on them."""
    result, out = run(vlm, run_cli, CASES[:1])
    assert result.exit_code == 0, result.output
    tokens, _ = reference(vlm, CASES[0], do_image_splitting=False)
    assert out["responses"][0]["output_ids"] != tokens


def test_chunked_prefill_and_kv_kept_per_image(vlm, run_cli, tmp_path):
    """A prompt prefilled in chunks of 16 (its image's 40 tokens parted by tile tags, cut across chunks)
    gives transformers' tokens; two images of one size (the same ids) never share KV, the same image
    again does (--context-reuse)."""
    one, other = reference(vlm, asking("square.png"))[0], reference(vlm, asking("square2.png"))[0]
    assert one != other  # (else sharing one's KV with the other would go unseen)
    result, out = run(vlm, run_cli, [asking("square.png")], "--prefill-chunk", "16")
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["output_ids"] == one
    assert_context_reuse_tells_images_apart(lambda *a, **k: run(vlm, run_cli, *a, **k), one, other, 40, tmp_path)


def test_one_tile_images_and_smolvlm(tmp_path_factory, run_cli):
    """--max-image-tiles 1 lowers the longest edge to one tile (the processor's one-tile layout: no row
    tags), on a SmolVLM checkpoint (SmolVLMForConditionalGeneration: the same encoder and prompts)
    whose chat template is in chat_template.json alone."""
    vlm = make(tmp_path_factory, "smolvlm", legacy_template=True, max_image_tiles=1)
    assert not (vlm[0] / "chat_template.jinja").exists()
    manifest = json.loads((vlm[1] / "manifest.json").read_text())
    assert manifest["vision"]["preprocess"]["longest_edge"] == 32
    assert manifest["lora"] == {} and manifest["vision"]["architecture"] == "idefics3"
    result, out = run(vlm, run_cli, CASES[:2])
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:2], out["responses"]):
        assert_answer(response, *reference(vlm, content, size={"longest_edge": 32}))


@pytest.mark.parametrize("damage, named", [
    (lambda v: v.pop("row_col_ids"), "vision lacks row_col_ids"),
    (lambda v: v["row_col_ids"].pop(), "row_col_ids \\(3 x 3 at least\\)"),
    (lambda v: v.update(break_ids=[10 ** 6]), "token ids below the vocabulary size"),
    (lambda v: v["preprocess"].update(tile=64), "vision.image_size \\[tile, tile\\]"),
])
def test_a_damaged_vision_section_is_refused_by_name(vlm, tmp_path, damage, named):
    assert_damage_refused(vlm[1], tmp_path, damage, named)


def test_lora_adapters_on_the_language_model_match_peft(vlm, run_cli, tmp_path):
    """A PEFT adapter of the language model as PEFT names it in the whole model (model.text_model),
    bundled (the build checks it against PEFT's merge) and given at run time, with images, beside a
    row with no adapter."""
    targets = r".*text_model.*\.(q_proj|v_proj|o_proj|gate_proj|down_proj)"
    assert_lora_matches_peft(vlm, run_cli, tmp_path, lambda content, **kw: reference(vlm, content, **kw), targets,
                             NEW_TOKENS)


def test_an_eagle_head_speculates_over_prompts_with_images(vlm, run_cli, tmp_path):
    """An EAGLE-3 head on an Idefics3 engine (its prompts' image tokens parted by tile tags): greedy
    answers stay transformers'."""
    assert_eagle_answers(vlm, run_cli, tmp_path, lambda content: reference(vlm, content), NEW_TOKENS)


def test_beam_search_with_images_is_transformers(vlm, run_cli):
    """num_beams with images (Idefics3's tiles parted by their tags): each returned beam's tokens and score are
    transformers' beam search's, beside a greedy row of the same batch."""
    assert_beams_beside_a_greedy_row(vlm[1], vlm[2], run_cli, lambda content, **kw: reference(vlm, content, **kw),
                                     CASES[1], CASES[0], NEW_TOKENS)


def test_beam_search_keeps_kv_per_image(vlm, run_cli):
    """--context-reuse with beams: a search about one image never starts from the KV of another image
    of the same size (the same ids), and its beams are still transformers'."""
    requests = [{"messages": [{"role": "user", "content": [{**c, "image": str(vlm[2] / c["image"])} if "image" in c
                                                           else c for c in asking(image)]}], "num_beams": 2, "n": 2}
                for image in ("square.png", "square2.png", "square.png")]
    result, out = run_cli(vlm[1], {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "batch_size": 2, "requests": requests}, "--context-reuse")
    assert result.exit_code == 0, result.output
    for k, image in enumerate(("square.png", "square2.png", "square.png")):
        assert_beams(out["responses"][2 * k:2 * k + 2], reference(vlm, asking(image), beams=2))


def test_a_tensorrt_engine_answers_with_images_as_transformers(vlm, run_cli, tmp_path):
    """--backend tensorrt (the stand-ins, tests/fakes): llm.plan takes the image embeddings, vision.plan
    encodes the tiles (checked at the build against transformers' embeddings); exported with
    --plan-later, the plan step builds both plans on the device and checks them against the export's
    reference, and the engine answers as transformers."""
    from tests import fakes
    from trtllm.builder import plan
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    options = dict(model=str(vlm[0]), backend="tensorrt", max_batch_size=4, max_input_len=256,
                   max_kv_cache_capacity=512)
    later = build(BuildConfig(output=str(tmp_path / "later"), plan_later=True, **options), log=lambda m: None)
    assert not (later / "vision.plan").exists() and (later / "vision_reference.npz").is_file()
    with fakes.installed():
        whole = build(BuildConfig(output=str(tmp_path / "whole"), **options), log=lambda m: None)
        checks = json.loads((whole / "verify.json").read_text())
        assert checks["vision_plan"]["max_abs_error"] < 1e-4
        assert plan.main([str(later)]) == 0
        assert json.loads((later / "verify.json").read_text())["plan"]["vision_plan"]["max_abs_error"] < 1e-4
        assert "vision.plan" in (later / "checksums.sha256").read_text()
        for engine in (whole, later):
            result, out = run(vlm[:1] + (engine,) + vlm[2:], run_cli, CASES)
            assert result.exit_code == 0, result.output
            for content, response in zip(CASES, out["responses"]):
                assert_answer(response, *reference(vlm, content))


def test_a_vision_plan_off_from_transformers_fails_the_build(vlm, tmp_path, monkeypatch):
    """The TensorRT check's wrong variant: a vision plan whose embeddings are 1e-3 off (of values about
    1) fails the build, and no engine is written."""
    from tests import fakes
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.builder.verify_logits import VerifyError
    from trtllm.runtime.backends import tensorrt_vision as tensorrt

    real = tensorrt.TensorRTVision.__call__
    monkeypatch.setattr(tensorrt.TensorRTVision, "__call__", lambda self, feeds: real(self, feeds) + 1e-3)
    with fakes.installed(), pytest.raises(VerifyError, match="the vision plan's image embeddings differ"):
        build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), backend="tensorrt", max_batch_size=4,
                          max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    assert not (tmp_path / "engine").exists()


def test_served_image_url_parts_match_transformers(vlm, tmp_path):
    """trtllm-serve: an image_url part (a data: URL) on an Idefics3 engine answers as transformers."""
    assert_served_image_url(vlm, tmp_path, lambda content: reference(vlm, content), NEW_TOKENS)
