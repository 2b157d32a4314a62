"""Qwen2.5-VL, Qwen2-VL, Qwen3-VL and Qwen3-VL-MoE engines (builder/vision_qwen.py, runtime/images_qwen.py,
the decoder's multimodal RoPE and DeepStack) against transformers: greedy tokens exact and logprobs within float32 tolerance, for
prompts with images of several sizes (each resized to its own grid), two images, images beside
text-only rows in one batch (each row's own RoPE shift in the shared decode steps), prompts prefilled
in chunks that cut an image, prompt lookup's verify steps and KV restored from an earlier request. The
reference is transformers' model fed what Qwen2_5_VLProcessor gives it: Qwen2VLImageProcessorPil's
pixels and grids, each <|image_pad|> repeated once per merged patch, and the image tokens marked in
mm_token_type_ids (which its 3-D positions are computed from)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.tiny_qwen_vl import make_qwen_vl_checkpoint
from tests.tiny_vlm import (asking, assert_answer, assert_context_reuse_tells_images_apart, beam_answers, built,
                            bundled_lora_engine, peft_adapter)

NEW_TOKENS = 12
# (width, height); square2 is square's size with other pixels: the same token ids, another image
SIZES = {"wide.png": (200, 90), "square.png": (60, 60), "tall.png": (70, 150), "big.png": (400, 300),
         "square2.png": (60, 60)}


def make(tmp_path_factory, kind: str):
    """(checkpoint dir, engine dir, images dir, transformers model, tokenizer)."""
    return built(tmp_path_factory, make_qwen_vl_checkpoint(tmp_path_factory.mktemp(f"{kind}-ckpt"), kind=kind), kind,
                 SIZES)


@pytest.fixture(scope="module")
def qvl(tmp_path_factory):
    return make(tmp_path_factory, "qwen2_5_vl")


def reference(qvl, content: list, history: list | None = None, flat_positions: bool = False,
              model=None, no_deepstack: bool = False, beams: int = 0,
              **processor_options) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and first-step log-probabilities for one user turn after `history`;
    `flat_positions`: the deliberately wrong variant, every token at its slot on all three axes (no
    token marked an image's in mm_token_type_ids); `no_deepstack`: another (Qwen3-VL), the encoder's
    extra rows never added; `model`: another (a LoRA adapter's)."""
    import torch
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ckpt, _, images, base, tok = qvl
    model = base if model is None else model
    turns = [*(history or []), {"role": "user", "content": content}]
    messages = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                 [{"type": "image"} if "image" in c else c for c in m["content"]]} for m in turns]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    files = [c["image"] for m in turns if not isinstance(m["content"], str) for c in m["content"] if "image" in c]
    kwargs = {}
    if files:
        config = json.loads((ckpt / "preprocessor_config.json").read_text())
        processor = Qwen2VLImageProcessorPil(**{k: v for k, v in config.items()
                                                if k not in ("image_processor_type", "processor_class")})
        feats = processor([Image.open(images / f).convert("RGB") for f in files], return_tensors="pt",
                          **processor_options)
        parts = text.split("<|image_pad|>")  # Qwen2_5_VLProcessor's expansion, image by image
        text = parts[0] + "".join("<|image_pad|>" * (int(grid.prod()) // 4) + rest
                                  for grid, rest in zip(feats["image_grid_thw"], parts[1:]))
        kwargs = {"pixel_values": feats["pixel_values"], "image_grid_thw": feats["image_grid_thw"]}
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    if files:  # (flat_positions: no token marked an image's, so all take text positions)
        kwargs["mm_token_type_ids"] = (ids == model.config.image_token_id).int() * (not flat_positions)
    # (transformers keeps a prompt's RoPE shift on the model for the steps after it: none from another call)
    inner = (model.get_base_model() if hasattr(model, "get_base_model") else model).model
    text_model = inner.language_model
    if no_deepstack:
        text_model._deepstack_process = lambda hidden, mask, embeds: hidden
    if beams:  # (then transformers' beam search's hypotheses: tiny_vlm.beam_answers)
        inner.rope_deltas = None
        return beam_answers(model, ids, NEW_TOKENS, beams, **kwargs)
    with torch.no_grad():
        inner.rope_deltas = None
        first = torch.log_softmax(model(input_ids=ids, **kwargs).logits[0, -1], -1).numpy()
        inner.rope_deltas = None
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, **kwargs)
    text_model.__dict__.pop("_deepstack_process", None)
    return out[0, ids.shape[1]:].tolist(), first


CASES = [
    asking("wide.png"),
    [{"type": "text", "text": "Compare"}, {"type": "image", "image": "square.png"},
     {"type": "image", "image": "tall.png"}, {"type": "text", "text": "and say which is taller."}],
    [{"type": "text", "text": "The quick brown fox"}],
    asking("big.png"),  # (past max_pixels: resized down to its limit)
]


def placed(qvl, content: list) -> list:
    return [{**c, "image": str(qvl[2] / c["image"])} if c.get("image") in SIZES else c for c in content]


def run(qvl, run_cli, contents: list, *extra, **top):
    payload = {"batch_size": 4, "temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
               "num_logprobs": 5, **top,
               "requests": [{"messages": [{"role": "user", "content": placed(qvl, c)}]} for c in contents]}
    return run_cli(qvl[1], payload, *extra)


def check(qvl, contents, out, **options):
    for content, response in zip(contents, out["responses"]):
        assert_answer(response, *reference(qvl, content, **options))


def test_greedy_tokens_and_logprobs_match_transformers(qvl, run_cli):
    result, out = run(qvl, run_cli, CASES)
    assert result.exit_code == 0, result.output
    check(qvl, CASES, out)


def test_a_wrong_reference_is_told_apart(qvl, run_cli):
    """The deliberately wrong variant: transformers with every token's three positions its slot (what
    an engine without multimodal RoPE would compute) gives other tokens."""
    result, out = run(qvl, run_cli, CASES[:1])
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["output_ids"] != reference(qvl, CASES[0], flat_positions=True)[0]


def test_qwen2_vl_matches_transformers(tmp_path_factory, run_cli):
    """Qwen2-VL: LayerNorm blocks with a QuickGELU MLP, every layer attending to the whole image."""
    q2 = make(tmp_path_factory, "qwen2_vl")
    result, out = run(q2, run_cli, CASES[:2])
    assert result.exit_code == 0, result.output
    check(q2, CASES[:2], out)
    assert json.loads((q2[1] / "manifest.json").read_text())["vision"]["window_size"] is None


@pytest.fixture(scope="module")
def q3(tmp_path_factory):
    return make(tmp_path_factory, "qwen3_vl")


def test_qwen3_vl_matches_transformers(q3, run_cli, tmp_path):
    """Qwen3-VL: its M-RoPE sections interleaved (t, h, w, t, ...), a learned position grid resampled to
    each image, and the encoder's extra rows (deepstack) added to the image tokens after the language
    model's first layers: one batch as above, a prompt prefilled in chunks that cut its images (each
    chunk's deepstack rows with its image tokens), and the wrong variant told apart."""
    result, out = run(q3, run_cli, CASES)
    assert result.exit_code == 0, result.output
    check(q3, CASES, out)
    manifest = json.loads((q3[1] / "manifest.json").read_text())["vision"]
    assert manifest["deepstack_layers"] == 2 and manifest["mrope_interleaved"] is True
    assert out["responses"][1]["output_ids"] != reference(q3, CASES[1], flat_positions=True)[0]
    # (without the DeepStack rows: another first step, beyond the tolerance check() holds ours to)
    without = reference(q3, CASES[3], no_deepstack=True)[1]
    top = out["responses"][3]["logprobs"][0]
    assert max(abs(e["logprob"] - without[e["token_id"]]) for e in top) > 1e-2, [(e["logprob"], without[e["token_id"]]) for e in top]
    profile = tmp_path / "profile.json"  # (the big image's 54 tokens, from position 4, cut by chunks of 16)
    result, out = run_cli(q3[1], {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                  "batch_size": 2, "requests": [
                                      {"messages": [{"role": "user", "content": "The quick brown fox"}]},
                                      {"messages": [{"role": "user", "content": placed(q3, CASES[3])}]}]},
                          "--prefill-chunk", "16", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    assert out["responses"][1]["output_ids"] == reference(q3, CASES[3])[0]
    assert json.loads(profile.read_text())["prefill"]["total_runs"] >= 5


def test_qwen3_vl_moe_matches_transformers(tmp_path_factory, run_cli):
    """Qwen3-VL-MoE: Qwen3-VL's encoder on a mixture-of-experts Qwen3 (its router always renormalizes
    the chosen experts' weights), on our MoE kernel."""
    qm = make(tmp_path_factory, "qwen3_vl_moe")
    result, out = run(qm, run_cli, CASES[:3])
    assert result.exit_code == 0, result.output
    check(qm, CASES[:3], out)
    manifest = json.loads((qm[1] / "manifest.json").read_text())
    assert manifest["vision"]["architecture"] == "qwen3_vl" and manifest["architecture"] == "Qwen3MoeForCausalLM"


def test_chunked_prefill_and_prompt_lookup_keep_the_positions(qvl, run_cli, tmp_path):
    """A prompt prefilled in chunks of 16 while another row decodes (its image's tokens and the text
    after them cut across chunks: each chunk's tokens take their own three positions), and
    --spec-ngram's verify steps (several tokens a row at its RoPE shift), give transformers' tokens."""
    want = reference(qvl, CASES[1])[0]
    profile = tmp_path / "profile.json"
    result, out = run_cli(qvl[1], {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "batch_size": 2, "requests": [  # (the second ends first: the third takes its slot)
                                       {"messages": [{"role": "user", "content": "The quick brown fox"}]},
                                       {"messages": [{"role": "user", "content": "Paris"}], "max_generate_length": 2},
                                       {"messages": [{"role": "user", "content": placed(qvl, CASES[1])}]}]},
                          "--prefill-chunk", "16", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    assert out["responses"][2]["output_ids"] == want
    assert json.loads(profile.read_text())["prefill"]["total_runs"] >= 3
    result, out = run(qvl, run_cli, [CASES[1]], "--spec-ngram", "3")
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["output_ids"] == want


@pytest.mark.parametrize("kind", ["qvl", "q3"])
def test_kv_is_never_shared_across_images_and_is_reused_for_the_same(request, run_cli, tmp_path, kind):
    """Two images of one size give the same token ids and positions: rows sharing a prompt and
    --context-reuse tell them apart by their pixels; the same image again reuses its KV (the text
    after it at its shifted positions), with the same tokens."""
    qvl = request.getfixturevalue(kind)
    one, other = reference(qvl, asking("square.png"))[0], reference(qvl, asking("square2.png"))[0]
    assert one != other
    assert_context_reuse_tells_images_apart(lambda *a, **k: run(qvl, run_cli, *a, **k), one, other, None, tmp_path)
    contents = [asking("square.png"), asking("square2.png"), asking("square.png")]
    result, out = run(qvl, run_cli, contents, batch_size=3)  # (one batch: the third copies the first's KV)
    assert [r["output_ids"] for r in out["responses"]] == [one, other, one]
    result, out = run(qvl, run_cli, [asking("square2.png")], n=2)  # (two samples: one prompt, its KV copied)
    assert [c["output_ids"] for c in out["responses"]] == [other, other]


def test_a_conversation_keeps_its_image_positions(qvl, run_cli):
    """A second turn after an image: its text, and the answer, sit past the image's shifted positions."""
    history = [{"role": "user", "content": asking("tall.png")}, {"role": "assistant", "content": "a tall one"}]
    later = [{"type": "text", "text": "And its colour?"}]
    result, out = run_cli(qvl[1], {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "requests": [{"messages": [{"role": "user", "content": placed(qvl, history[0]["content"])},
                                                              history[1], {"role": "user", "content": later}]}]})
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["output_ids"] == reference(qvl, later, history=history)[0]


def test_max_image_pixels_is_the_processors_max_pixels(qvl, run_cli, tmp_path):
    """--max-image-pixels: what transformers gives with max_pixels lowered (the big image: fewer tokens);
    --max-image-tiles (InternVL's knob) and --max-image-tokens (Gemma 4's) are refused here by name."""
    from click.testing import CliRunner

    from trtllm.builder.cli import main as build_main

    engine = tmp_path / "engine"
    args = ["--model", str(qvl[0]), "--output", str(engine), "--max-input-len", "256", "--max-kv-cache-capacity", "512"]
    for other in ("tiles", "tokens"):  # (InternVL's and Gemma 4's)
        result = CliRunner().invoke(build_main, [*args, f"--max-image-{other}", "140"])
        assert result.exit_code == 2 and f"--max-image-{other} is not for" in result.output
        assert "use --max-image-pixels" in result.output
    result = CliRunner().invoke(build_main, [*args, "--max-image-pixels", str(28 * 28 * 65)])
    assert result.exit_code == 2 and "above the processor's max_pixels 50176: it only lowers it" in result.output
    result = CliRunner().invoke(build_main, [*args, "--max-image-pixels", str(28 * 28 * 16)])
    assert result.exit_code == 0, result.output
    assert json.loads((engine / "manifest.json").read_text())["vision"]["preprocess"]["max_pixels"] == 28 * 28 * 16
    result, out = run_cli(engine, {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "requests": [{"messages": [{"role": "user", "content": placed(qvl, CASES[3])}]}]})
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["output_ids"] == reference(qvl, CASES[3], size={"longest_edge": 28 * 28 * 16,
                                                                                   "shortest_edge": 56 * 56})[0]
    assert out["responses"][0]["output_ids"] != reference(qvl, CASES[3])[0]


def test_bad_images_and_too_long_prompts_fail_their_request_alone(qvl, run_cli, tmp_path):
    from PIL import Image

    (tmp_path / "notes.txt").write_text("not an image")
    Image.new("RGB", (1000, 4)).save(tmp_path / "thin.png")
    contents = [
        [{"type": "image", "image": str(tmp_path / "notes.txt")}],
        [{"type": "image", "image": str(tmp_path / "thin.png")}],
        [{"type": "image", "image": "square.png", "do_resize": False}],
        [{"type": "text", "text": "a literal <|image_pad|> token"}],
        [{"type": "image", "image": "big.png"}] * 5,  # (5 x 54 tokens: past max_input_len 256)
        CASES[2],
    ]
    result, out = run(qvl, run_cli, contents)
    errors = [r.get("error") for r in out["responses"]]
    assert "requests[0].messages[0].content[0].image" in errors[0] and "notes.txt" in errors[0]
    assert "requests[1].messages[0].content[0].image`: image aspect ratio must be at most 200:1" in errors[1]
    assert "requests[2].messages[0].content[0].do_resize" in errors[2]
    assert "'<|image_pad|>'" in errors[3]
    assert "270 of them its images'" in errors[4] and "--max-image-pixels" in errors[4]
    assert errors[5] is None and out["responses"][5]["output_ids"] == reference(qvl, CASES[2])[0]
    assert result.exit_code != 0


@pytest.mark.parametrize("without", ["library", "fast_path"])
def test_the_encoder_runs_vision_onnx_where_our_kernel_is_missing_or_slow(qvl, monkeypatch, without):
    """vision.ort.onnx runs where our kernel library is built and its AVX2 path runs here; without the
    library, or on a CPU without AVX2 (its portable path is slower than ONNX Runtime's Attention),
    the same engine runs vision.onnx, to the same embeddings."""
    from trtllm.runtime import media
    from trtllm.runtime.manifest import load

    manifest, png = load(qvl[1]), (qvl[2] / "wide.png").read_bytes()
    fast = media.ImageEncoder(qvl[1], manifest)
    ours = fast(png)
    assert fast.graph == "vision.ort.onnx"
    if without == "library":
        monkeypatch.setattr(media.cpu_kernels, "library", lambda: None)
    else:
        monkeypatch.setattr(media.cpu_kernels, "segment_attention_fast", lambda: False)
    plain = media.ImageEncoder(qvl[1], manifest)
    theirs = plain(png)
    assert plain.graph == "vision.onnx"
    assert ours.shape == theirs.shape and np.abs(ours - theirs).max() < 1e-4


def test_build_records_the_vision_section_and_a_damaged_one_is_refused(qvl, tmp_path):
    import shutil

    from trtllm.runtime.manifest import ManifestError, load

    manifest = json.loads((qvl[1] / "manifest.json").read_text())
    vision = manifest["vision"]
    assert vision["architecture"] == "qwen2_5_vl" and vision["mrope_section"] == [2, 3, 3]
    assert vision["window_size"] == 56 and vision["preprocess"]["merge_size"] == 2
    checked = json.loads((qvl[1] / "verify.json").read_text())["vision"]
    assert checked["max_abs_error"] < 1e-3 and checked["compiled_max_abs_error"] < 1e-3
    # ONNX Runtime's form on our kernels reads vision.onnx's weights: the engine holds them once
    assert vision["compiled"] == manifest["files"]["vision_compiled"] == "vision.ort.onnx"
    assert vision["lowerings"] == ["trtllm.cpu::SegmentAttention"]
    assert not (qvl[1] / "vision.ort.onnx.data").exists()
    assert (qvl[1] / "vision.ort.onnx").stat().st_size < (qvl[1] / "vision.onnx.data").stat().st_size / 4
    for damage, named in ((lambda v: v.update(mrope_section=[2, 3, 4]), "vision.mrope_section"),
                          (lambda v: v["preprocess"].pop("merge_size"), "vision.preprocess"),
                          (lambda v: v.update(architecture="llava"), "vision.architecture"),
                          (lambda v: v.update(window_size=None), "vision.window_size must be an integer"),
                          (lambda v: v.update(window_size=14), "vision.window_size must be an integer >= "),
                          (lambda v: v["preprocess"].update(image_std=[0.5, 0, 0.5]), "no std 0"),
                          (lambda v: v.update(deepstack_layers=2), "vision.deepstack_layers must be an integer in "
                                                                   r"\[0, 0\] on qwen2_5_vl"),
                          (lambda v: v.update(mrope_interleaved=True), "vision.mrope_interleaved must be false"),
                          (lambda v: v.update(num_grid_per_side=4), "vision.num_grid_per_side"),
                          (lambda v: v.pop("deepstack_layers"), "vision lacks deepstack_layers"),
                          (lambda v: v.update(compiled="llm.ort.onnx"), "vision.compiled 'llm.ort.onnx' must be "
                                                                        "files.vision_compiled 'vision.ort.onnx'"),
                          (lambda v: v.update(lowerings=[]), r"with lowerings \['trtllm.cpu::SegmentAttention'\], got \[\]")):
        engine = tmp_path / "engine"
        shutil.rmtree(engine, ignore_errors=True)
        shutil.copytree(qvl[1], engine)
        broken = json.loads((engine / "manifest.json").read_text())
        damage(broken["vision"])
        (engine / "manifest.json").write_text(json.dumps(broken))
        with pytest.raises(ManifestError, match=named):
            load(engine)


def test_an_eagle_head_and_an_old_tensorrt_profile_are_refused_by_name(qvl, tmp_path):
    from tests.eagle_drafts import random_draft
    from trtllm.builder.config import BuildConfig, ConfigError
    from trtllm.builder.export import build

    draft = random_draft(qvl[0], tmp_path / "draft", seed=3, aux=[0, 1, 1])
    with pytest.raises(ConfigError, match="EAGLE-3 heads .*multimodal"):
        build(BuildConfig(model=str(qvl[0]), output=str(tmp_path / "engine"), eagle=str(draft),
                          max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    with pytest.raises(ConfigError, match=r"a TensorRT 10.3 profile \(its vision graph needs TensorRT >= 10.15"):
        build(BuildConfig(model=str(qvl[0]), output=str(tmp_path / "engine"), graph="legacy", trt_version="10.3",
                          max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    assert not (tmp_path / "engine").exists()


@pytest.mark.parametrize("kind", ["qvl", "q3"])
@pytest.mark.parametrize("option", [["--graph", "legacy"], ["--cpu-kernels", "onnxruntime"]])
def test_other_graph_forms_match_transformers(request, run_cli, tmp_path, option, kind):
    """The legacy graph (opset 20: RoPE by Gather and Mul) and ONNX Runtime's own kernels (standard
    attention: GroupQueryAttention is not given the step's RoPE rows) take the same positions (and
    Qwen3-VL's deepstack rows)."""
    from click.testing import CliRunner

    from trtllm.builder.cli import main as build_main

    qvl = request.getfixturevalue(kind)

    engine = tmp_path / "engine"
    result = CliRunner().invoke(build_main, ["--model", str(qvl[0]), "--output", str(engine), "--max-batch-size", "4",
                                             "--max-input-len", "256", "--max-kv-cache-capacity", "512", *option])
    assert result.exit_code == 0, result.output
    # ONNX Runtime's own kernels: the canonical vision.onnx runs (ONNX's Attention), not our kernel's form
    assert (engine / "vision.ort.onnx").exists() == (option[0] != "--cpu-kernels")
    result, out = run_cli(engine, {"batch_size": 4, "temperature": 0.0, "ignore_eos": True, "num_logprobs": 5,
                                   "max_generate_length": NEW_TOKENS, "requests": [
                                       {"messages": [{"role": "user", "content": placed(qvl, c)}]} for c in CASES[:3]]})
    assert result.exit_code == 0, result.output
    check(qvl, CASES[:3], out)


@pytest.mark.parametrize("kind, option", [("qvl", ["--dtype", "float16"]), ("qvl", ["--quantization", "int8"]),
                                          ("q3", ["--dtype", "float16"]),
                                          ("q3", ["--dtype", "float16", "--cpu-kernels", "onnxruntime"])])
def test_lossy_engines_answer_images(request, run_cli, tmp_path, kind, option):
    """float16 and int8 language models with images (the encoder stays float32; the image rows cast to
    float16 where the graph computes in it: ONNX Runtime's own kernels): each request's first token is
    transformers' (later ones may part, as on any lossy engine)."""
    from click.testing import CliRunner

    from trtllm.builder.cli import main as build_main

    qvl = request.getfixturevalue(kind)

    engine = tmp_path / "engine"
    result = CliRunner().invoke(build_main, ["--model", str(qvl[0]), "--output", str(engine), "--max-batch-size", "4",
                                             "--max-input-len", "256", "--max-kv-cache-capacity", "512", *option])
    assert result.exit_code == 0, result.output
    result, out = run_cli(engine, {"batch_size": 4, "temperature": 0.0, "ignore_eos": True,
                                   "max_generate_length": NEW_TOKENS, "requests": [
                                       {"messages": [{"role": "user", "content": placed(qvl, c)}]} for c in CASES[:3]]})
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES[:3], out["responses"]):
        assert len(response["output_ids"]) == NEW_TOKENS
        assert response["output_ids"][0] == reference(qvl, content)[0][0]


def test_lora_adapters_on_the_language_model_match_peft(qvl, run_cli, tmp_path):
    """A PEFT adapter of the language model (its modules under model.language_model), bundled (the
    build checks it against PEFT's merge) and given at run time, with images, beside a row with none;
    one that adapts the vision tower (its MLP has gate_proj too) is refused by name."""
    language = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    bundled = peft_adapter(qvl, tmp_path / "bundled", 1, language)
    given = peft_adapter(qvl, tmp_path / "given", 2, language)
    peft_adapter(qvl, tmp_path / "vision", 3, ["gate_proj"])
    engine = bundled_lora_engine(qvl, tmp_path)
    contents, names = [CASES[0], CASES[1], CASES[0], CASES[0]], ["bundled", "given", None, "vision"]
    payload = {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS, "batch_size": 4,
               "available_lora_weights": {name: str(tmp_path / name) for name in ("given", "vision")},
               "requests": [{"messages": [{"role": "user", "content": placed(qvl, content)}],
                             **({"lora_name": name} if name else {})} for content, name in zip(contents, names)]}
    result, out = run_cli(engine, payload)
    responses = out["responses"]
    for content, model, response in zip(contents, (bundled, given, None), responses):
        assert response["output_ids"] == reference(qvl, content, model=model)[0]
    assert responses[0]["output_ids"] != reference(qvl, CASES[0])[0]  # (the adapter changes the answer)
    assert "adapts the vision encoder" in responses[3]["error"]


def test_served_images_match_transformers_and_one_too_long_is_not_encoded(qvl, tmp_path, monkeypatch):
    """trtllm-serve: an image_url part as a data: URL gives transformers' answer (encoded in the request's
    own thread, ahead); on an engine whose max_input_len its tokens pass, it is refused unencoded."""
    import base64
    import http.client
    import threading

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime import media, server

    encoded = []
    encode = media.ImageEncoder.encode
    monkeypatch.setattr(media.ImageEncoder, "encode", lambda self, source: encoded.append(
        threading.current_thread().name) or encode(self, source))
    short = build(BuildConfig(model=str(qvl[0]), output=str(tmp_path / "short"), max_input_len=48,
                              max_kv_cache_capacity=128), log=lambda m: None)

    def post(engine, png: bytes) -> tuple[int, dict]:
        httpd = server.build(engine, "127.0.0.1", 0, None, {}, {}, 2, 1, tmp_path / "kv", 1 << 30, True, None)
        httpd.quiet = True
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        try:
            url = "data:image/png;base64," + base64.b64encode(png).decode()
            c = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=120)
            c.request("POST", "/v1/chat/completions", json.dumps({
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": "What is in this picture?"}]}],
                "temperature": 0, "ignore_eos": True, "max_tokens": NEW_TOKENS}))
            r = c.getresponse()
            return r.status, json.loads(r.read())
        finally:
            httpd.shutdown()
            server.stop(httpd)

    status, body = post(qvl[1], (qvl[2] / "wide.png").read_bytes())
    assert status == 200, body
    tokens, _ = reference(qvl, CASES[0])
    assert body["choices"][0]["message"]["content"] == qvl[4].decode(tokens, skip_special_tokens=True)
    assert encoded and "trtllm-serve generation" not in encoded  # (ahead, in the request's thread)
    encoded.clear()
    status, body = post(short, (qvl[2] / "big.png").read_bytes())  # (54 tokens: past max_input_len 48)
    assert status == 400 and "more than the engine's max_input_len 48" in body["error"]["message"], body
    assert encoded == []
