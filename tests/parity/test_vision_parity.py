"""A vision-language engine (InternVL: builder/vision.py, runtime/media.py) against transformers:
greedy tokens exact and logprobs within float32 tolerance, for prompts with images of several shapes
(one tile, several tiles and the thumbnail), two images, images beside text-only rows in one batch,
and saved KV that must not mix one image's prompt with another's. The reference is transformers'
InternVLForConditionalGeneration fed what InternVLProcessor gives it: GotOcr2ImageProcessorPil's
pixels with crop_to_patches, and each image token expanded to <img>, its tiles' tokens and </img>."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.tiny_vlm import (CASES, asking, assert_answer, assert_beams_beside_a_greedy_row,
                            assert_context_reuse_tells_images_apart, assert_damage_refused, assert_eagle_answers,
                            built, bundled_lora_engine, generated, make_vlm_checkpoint, peft_adapter)
from trtllm.runtime import images

NEW_TOKENS = 12
# (width, height); square2 is square's size with other pixels: the same token ids, another image
SIZES = {"wide.png": (200, 90), "square.png": (60, 60), "tall.png": (70, 150), "wider.png": (300, 80),
         "square2.png": (60, 60)}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    """(checkpoint dir, engine dir, images dir, transformers model, tokenizer)."""
    return built(tmp_path_factory, make_vlm_checkpoint(tmp_path_factory.mktemp("vlm-ckpt")), "vlm", SIZES)


def reference(vlm, content: list, crop_to_patches: bool = True, system: dict | None = None, model=None,
              history: list | None = None, beams: int = 0, **processor_options) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and first-step log-probabilities for one user turn (after `system`
    and the `history` of messages); `model`: another than the checkpoint's (one with a LoRA adapter)."""
    from PIL import Image
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    ckpt, _, images, base, tok = vlm
    model = base if model is None else model
    turns = [*([system] if system else []), *(history or []), {"role": "user", "content": content}]
    messages = [{**m, "content": m["content"] if isinstance(m["content"], str) else
                 [{"type": "image"} if "image" in c else c for c in m["content"]]} for m in turns]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    files = [c["image"] for m in turns if not isinstance(m["content"], str) for c in m["content"] if "image" in c]
    kwargs = {}
    if files:
        config = json.loads((ckpt / "preprocessor_config.json").read_text())
        processor = GotOcr2ImageProcessorPil(**{k: v for k, v in config.items() if k != "image_processor_type"})
        pictures = [Image.open(images / f).convert("RGB") for f in files]
        feats = processor(pictures, crop_to_patches=crop_to_patches, return_tensors="pt", **processor_options)
        parts = text.split("<IMG_CONTEXT>")  # InternVLProcessor.replace_image_token, image by image
        text = parts[0] + "".join(f"<img>{'<IMG_CONTEXT>' * 4 * n}</img>{rest}"
                                  for n, rest in zip(feats["num_patches"].tolist(), parts[1:]))
        kwargs["pixel_values"] = feats["pixel_values"]
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    return generated(model, ids, NEW_TOKENS, beams, **kwargs)


def run(vlm, run_cli, contents: list, *extra, **top):
    _, engine, images, _, _ = vlm
    payload = {"batch_size": 4, "temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
               "num_logprobs": 5, **top,
               "requests": [{"messages": [{"role": "user", "content": json.loads(json.dumps(c))}]} for c in contents]}
    for request in payload["requests"]:  # (a relative path is read from the input file's directory)
        for item in request["messages"][0]["content"]:
            if "image" in item and item["image"] in SIZES:
                item["image"] = str(images / item["image"])
    result, out = run_cli(engine, payload, *extra)
    return result, out


def test_greedy_tokens_and_logprobs_match_transformers(vlm, run_cli):
    result, out = run(vlm, run_cli, CASES)
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES, out["responses"]):
        assert_answer(response, *reference(vlm, content))


def test_a_wrong_reference_is_told_apart(vlm, run_cli):
    """The deliberately wrong variant: the processor without tiling (what reading its config file's
    crop_to_patches would give) gives other tokens, and the comparison above would fail on them."""
    result, out = run(vlm, run_cli, CASES[:1])
    assert result.exit_code == 0, result.output
    tokens, _ = reference(vlm, CASES[0], crop_to_patches=False)
    assert out["responses"][0]["output_ids"] != tokens


def test_kv_is_never_shared_across_images(vlm, run_cli, tmp_path):
    """Two images of one size give the same token ids: rows of one batch sharing a prompt (n samples,
    a common prompt) and --context-reuse must tell them apart by their pixels; the same image again
    reuses its KV, with the same tokens."""
    one, other = reference(vlm, asking("square.png"))[0], reference(vlm, asking("square2.png"))[0]
    assert one != other  # (else sharing one's KV with the other would go unseen)
    result, out = run(vlm, run_cli, [asking("square.png"), asking("square2.png"), asking("square.png")])
    assert result.exit_code == 0, result.output  # one batch: the third copies the first's KV
    assert [r["output_ids"] for r in out["responses"]] == [one, other, one]
    assert_context_reuse_tells_images_apart(lambda *a, **k: run(vlm, run_cli, *a, **k), one, other, 4, tmp_path)
    result, out = run(vlm, run_cli, [asking("square2.png")], n=2)  # two samples: one prompt, its KV copied
    assert [c["output_ids"] for c in out["responses"]] == [other, other]


def test_a_later_image_keeps_the_kv_before_it(vlm, run_cli, tmp_path):
    """A conversation's second turn with a new image reuses the first turn's KV, up to that image:
    an image's tokens are keyed by its own bytes, not the prompt's whole set of images."""
    _, engine, images_dir, _, _ = vlm
    first = [{"type": "image", "image": "square.png"}, {"type": "text", "text": "What is in this picture?"}]
    history = [{"role": "user", "content": first}, {"role": "assistant", "content": "ok"}]
    later = [{"type": "image", "image": "square2.png"}, {"type": "text", "text": "And this one?"}]

    def placed(content):
        return [{**c, "image": str(images_dir / c["image"])} if "image" in c else c for c in content]

    profile = tmp_path / "profile.json"
    result, out = run_cli(engine, {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "batch_size": 1, "requests": [
                                       {"messages": [{"role": "user", "content": placed(first)}]},
                                       {"messages": [{"role": "user", "content": placed(first)},
                                                     history[1], {"role": "user", "content": placed(later)}]}]},
                          "--context-reuse", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    assert out["responses"][1]["output_ids"] == reference(vlm, later, history=history)[0]
    assert json.loads(profile.read_text())["prefill"]["reused_tokens"] >= 16


def test_a_saved_system_prompt_serves_every_image(vlm, run_cli, tmp_path):
    """A system prompt's saved KV holds no image: a request with another image reuses it."""
    system = {"role": "system", "content": "You are a careful describer of pictures, brief and exact."}
    store = tmp_path / "kv"
    for image in ("square.png", "square2.png"):
        _, engine, images_dir, model, tok = vlm
        profile = tmp_path / f"{image}.json"
        result, out = run_cli(engine, {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                       "requests": [{"save_system_prompt_kv_cache": True, "messages": [
                                           system, {"role": "user", "content": [
                                               {"type": "image", "image": str(images_dir / image)},
                                               {"type": "text", "text": "What is in this picture?"}]}]}]},
                              "--kv-cache-dir", str(store), "--profile", str(profile))
        assert result.exit_code == 0, result.output
        assert out["responses"][0]["output_ids"] == reference(vlm, asking(image), system=system)[0]
    assert json.loads(profile.read_text())["prefill"]["reused_tokens"] > 0  # (the second image's run)


def test_prompt_lookup_and_chunked_prefill_keep_the_images(vlm, run_cli, tmp_path):
    """--spec-ngram's verify steps, and a prompt prefilled in chunks of 16 while another row decodes
    (its image's 20 tokens, from position 4, cut across chunks), give transformers' tokens."""
    want = reference(vlm, asking("wider.png"))[0]
    result, out = run(vlm, run_cli, [asking("wider.png")], "--spec-ngram", "3")
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["output_ids"] == want
    _, engine, images_dir, _, _ = vlm
    profile = tmp_path / "profile.json"
    result, out = run_cli(engine, {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "batch_size": 2, "requests": [  # (the second ends first: the third takes its slot)
                                       {"messages": [{"role": "user", "content": "The quick brown fox"}]},
                                       {"messages": [{"role": "user", "content": "Paris"}], "max_generate_length": 2},
                                       {"messages": [{"role": "user", "content": asking(str(images_dir / "wider.png"))}]}]},
                          "--prefill-chunk", "16", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    assert out["responses"][2]["output_ids"] == want
    assert json.loads(profile.read_text())["prefill"]["total_runs"] >= 3  # (one step, then the third's chunks)


def test_bad_images_fail_their_request_alone(vlm, run_cli, tmp_path):
    (tmp_path / "notes.txt").write_text("not an image")
    contents = [
        [{"type": "image", "image": "missing.png"}],
        [{"type": "image", "image": str(tmp_path / "notes.txt")}],
        [{"type": "image", "image": "square.png", "do_resize": False}],
        [{"type": "audio", "audio": "a.wav"}],
        [{"type": "text", "text": "a literal <IMG_CONTEXT> token"}],
        CASES[2],
        [{"type": "image", "image": "here.png"}],  # (beside the input file: tmp_path)
    ]
    (tmp_path / "here.png").write_bytes((vlm[2] / "square.png").read_bytes())
    result, out = run(vlm, run_cli, contents)
    errors = [r.get("error") for r in out["responses"]]
    assert "requests[0].messages[0].content[0].image" in errors[0] and "no such file" in errors[0]
    assert "requests[1].messages[0].content[0].image" in errors[1] and "notes.txt" in errors[1]
    assert "requests[2].messages[0].content[0].do_resize" in errors[2]
    assert "audio" in errors[3] and "images only" in errors[3]
    assert "'<IMG_CONTEXT>'" in errors[4] and "requests[4].messages" in errors[4]
    assert errors[5] is None and out["responses"][5]["output_ids"] == reference(vlm, CASES[2])[0]
    assert errors[6] is None and out["responses"][6]["output_ids"] == reference(vlm, [{"image": "square.png"}])[0]
    assert result.exit_code != 0


def test_truncation_and_token_ids_cannot_cut_or_fake_images(vlm, run_cli):
    _, engine, images, _, tok = vlm
    context = tok.convert_tokens_to_ids("<IMG_CONTEXT>")
    payload = {"temperature": 0.0, "max_generate_length": 2, "requests": [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": str(images / "wide.png")},
                                                   {"type": "text", "text": "hi"}]}], "truncate_prompt_tokens": 6},
        {"prompt_token_ids": [1, context, 2]},
        {"messages": [{"role": "user", "content": [{"type": "image", "image": str(images / "wider.png")}] * 12}]},
    ]}
    result, out = run_cli(engine, payload)
    errors = [r.get("error") for r in out["responses"]]
    assert "requests[0].truncate_prompt_tokens" in errors[0] and "images" in errors[0]
    assert "requests[1].prompt_token_ids[1]" in errors[1] and "image token" in errors[1]
    assert "240 of them its images'" in errors[2] and "max_input_len 256" in errors[2]  # (12 x 5 tiles x 4)
    assert "--max-image-tiles" in errors[2] and "truncate_prompt_tokens" not in errors[2]


def test_text_engine_refuses_images(tiny_engine, run_cli):
    result, out = run_cli(tiny_engine("qwen2"), {"requests": [
        {"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}]}]}]})
    assert "text-only" in out["responses"][0]["error"]


def test_build_records_and_checks_the_vision_graph(vlm):
    _, engine, _, _, _ = vlm
    manifest = json.loads((engine / "manifest.json").read_text())
    vision = manifest["vision"]
    assert manifest["files"]["vision"] == vision["graph"] == "vision.onnx"
    assert vision["tokens_per_tile"] == 4 and vision["preprocess"]["crop_to_patches"] is True
    report = json.loads((engine / "verify.json").read_text())
    assert report["vision"]["max_abs_error"] < 1e-4


def test_served_image_url_parts_match_transformers(vlm, tmp_path, monkeypatch):
    """trtllm-serve takes OpenAI's image_url parts as data: URLs, and opens no file for a client; an
    image is encoded in its request's thread, not on the generation loop (the other streams go on)."""
    import base64
    import http.client
    import threading

    from trtllm.runtime import media, server

    threads = []
    encode = media.ImageEncoder.encode
    monkeypatch.setattr(media.ImageEncoder, "encode",
                        lambda self, source: threads.append(threading.current_thread().name) or encode(self, source))

    _, engine, images, _, _ = vlm
    httpd = server.build(engine, "127.0.0.1", 0, None, {}, {}, 2, 1, tmp_path / "kv", 1 << 30, True, None)
    httpd.quiet = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def post(content) -> tuple[int, dict]:
        c = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=120)
        c.request("POST", "/v1/chat/completions", json.dumps({
            "messages": [{"role": "user", "content": content}], "temperature": 0, "ignore_eos": True,
            "max_tokens": NEW_TOKENS, "logprobs": True}))
        r = c.getresponse()
        return r.status, json.loads(r.read())

    try:
        url = "data:image/png;base64," + base64.b64encode((images / "wide.png").read_bytes()).decode()
        status, body = post([{"type": "image_url", "image_url": {"url": url}},
                             {"type": "text", "text": "What is in this picture?"}])
        assert status == 200, body
        tokens, first = reference(vlm, CASES[0])
        assert threads and "trtllm-serve generation" not in threads  # (encoded once, ahead)
        assert body["choices"][0]["message"]["content"] == vlm[4].decode(tokens, skip_special_tokens=True)
        assert abs(body["choices"][0]["logprobs"]["content"][0]["logprob"] - first[tokens[0]]) < 1e-4
        for content, named in (([{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
                                "messages[0].content[0].image_url"),
                               ([{"type": "image", "image": str(images / "wide.png")}],
                                "messages[0].content[0].image")):
            status, body = post(content)
            assert status == 400 and named in body["error"]["message"], body
    finally:
        httpd.shutdown()
        server.stop(httpd)


def test_profile_after_a_warm_up_counts_the_run_alone(vlm, run_cli, tmp_path):
    profile = tmp_path / "profile.json"
    result, out = run(vlm, run_cli, CASES[:1], "--warmup", "2", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    prof = json.loads(profile.read_text())
    runs = {s["stage_id"]: s["total_runs"] for s in prof["stages"]}
    assert runs["vision_encoder"] == prof["multimodal"]["total_runs"] == prof["multimodal"]["total_images"] == 1


def test_max_image_tiles_is_the_processors_max_patches(vlm, run_cli, tmp_path):
    """--max-image-tiles 2: what transformers gives with max_patches=2 (the wider image: 2 tiles and the
    thumbnail, where 4 allow a 4 x 1 grid)."""
    from click.testing import CliRunner

    from trtllm.builder.cli import main as build_main

    ckpt, _, images_dir, _, _ = vlm
    engine = tmp_path / "engine"
    result = CliRunner().invoke(build_main, ["--model", str(ckpt), "--output", str(engine), "--max-batch-size", "1",
                                             "--max-input-len", "128", "--max-kv-cache-capacity", "256",
                                             "--max-image-tiles", "2"])
    assert result.exit_code == 0, result.output
    pre = json.loads((engine / "manifest.json").read_text())["vision"]["preprocess"]
    assert pre["max_patches"] == 2
    assert images.tile_count(*SIZES["wider.png"], pre) == 3
    assert images.tile_count(*SIZES["wider.png"], {**pre, "max_patches": 4}) == 5
    content = [{"type": "image", "image": "wider.png"}, {"type": "text", "text": "What is in this picture?"}]
    result, out = run_cli(engine, {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS,
                                   "requests": [{"messages": [{"role": "user", "content": [
                                       {"type": "image", "image": str(images_dir / "wider.png")},
                                       {"type": "text", "text": "What is in this picture?"}]}]}]})
    assert result.exit_code == 0, result.output
    assert out["responses"][0]["output_ids"] == reference(vlm, content, max_patches=2)[0]
    assert out["responses"][0]["output_ids"] != reference(vlm, content)[0]


@pytest.mark.parametrize("damage, named", [
    (lambda v: v.update(image_token_id=10**6), "vision.image_token_id"),
    (lambda v: v.update(hidden_size=7), "vision.hidden_size"),
    (lambda v: v["preprocess"].pop("image_std"), "vision.preprocess"),
    (lambda v: v.pop("tokens_per_tile"), "vision lacks tokens_per_tile"),
])
def test_a_damaged_vision_section_is_refused_by_name(vlm, tmp_path, damage, named):
    assert_damage_refused(vlm[1], tmp_path, damage, named)


def test_lora_adapters_on_the_language_model_match_peft(vlm, run_cli, tmp_path):
    """A PEFT adapter of InternVL's language model (as PEFT names it in the whole model: its modules
    under model.language_model), bundled (the build checks it against PEFT's merge) and given at run
    time, with images, beside rows with no adapter; one that adapts the vision encoder is refused."""
    language = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
    bundled = peft_adapter(vlm, tmp_path / "bundled", 1, language)
    given = peft_adapter(vlm, tmp_path / "given", 2, language)
    peft_adapter(vlm, tmp_path / "vision", 3, ["q_proj", "v_proj"])  # (the encoder's attention has them too)
    peft_adapter(vlm, tmp_path / "alone", 4, ["q_proj"], alone=True)
    engine = bundled_lora_engine(vlm, tmp_path)
    _, _, images_dir, _, _ = vlm
    contents = [CASES[0], CASES[0], CASES[1], CASES[2], CASES[0], CASES[0]]
    names = ["bundled", "given", None, "given", "vision", "alone"]
    payload = {"temperature": 0.0, "ignore_eos": True, "max_generate_length": NEW_TOKENS, "batch_size": 4,
               "available_lora_weights": {name: str(tmp_path / name) for name in ("given", "vision", "alone")},
               "requests": [{"messages": [{"role": "user", "content": [
                   {**c, "image": str(images_dir / c["image"])} if "image" in c else c for c in content]}],
                   **({"lora_name": name} if name else {})} for content, name in zip(contents, names)]}
    result, out = run_cli(engine, payload)
    responses = out["responses"]
    models = {"bundled": bundled, "given": given, None: None}
    for content, name, response in zip(contents[:4], names, responses):
        assert response["output_ids"] == reference(vlm, content, model=models[name])[0], name
    assert responses[0]["output_ids"] != reference(vlm, CASES[0])[0]  # (the adapter changes the answer)
    assert "adapts the vision encoder" in responses[4]["error"]
    assert "base_model.model.model.language_model.layers" in responses[5]["error"]


def test_trtllm_chat_gives_a_turn_an_image(vlm, monkeypatch):
    """/image PATH: the next turn comes with it, as trtllm-run's image item; the turns after keep it."""
    from click.testing import CliRunner

    from trtllm.runtime import chat

    _, engine, images_dir, _, tok = vlm
    monkeypatch.chdir(images_dir)  # (its paths are the user's, from where the chat runs)
    result = CliRunner().invoke(chat.main, ["--engine", str(engine), "--set", "temperature=0", "--set",
                                            "ignore_eos=true", "--set", f"max_generate_length={NEW_TOKENS}"],
                                input="/image wide.png\nWhat is in this picture?\nAnd then?\n/image\n"
                                      "/image missing.png\n")
    assert result.exit_code == 0, result.output
    answer = tok.decode(reference(vlm, CASES[0])[0], skip_special_tokens=True)
    assert "(the next message comes with wide.png)" in result.output and answer in result.output
    history = [{"role": "user", "content": CASES[0]}, {"role": "assistant", "content": answer}]
    then = tok.decode(reference(vlm, [{"type": "text", "text": "And then?"}], history=history)[0],
                      skip_special_tokens=True)
    assert then in result.output  # (the second turn: the image still in the conversation)
    assert "error: /image PATH" in result.output
    assert "error: /image missing.png: cannot be read" in result.output


def test_an_eagle_head_speculates_over_prompts_with_images(vlm, run_cli, tmp_path):
    """An EAGLE-3 head on a vision-language engine: it drafts from the model's hidden states (image-
    aware) and the token table's rows (an image token's own); greedy answers stay transformers'."""
    assert_eagle_answers(vlm, run_cli, tmp_path, lambda content: reference(vlm, content), NEW_TOKENS)


def test_beam_search_with_images_is_transformers(vlm, run_cli):
    """num_beams with images (InternVL's tiles): each returned beam's tokens and score are
    transformers' beam search's, beside a greedy row of the same batch."""
    assert_beams_beside_a_greedy_row(vlm[1], vlm[2], run_cli, lambda content, **kw: reference(vlm, content, **kw),
                                     CASES[1], CASES[0], NEW_TOKENS)


@pytest.mark.parametrize("graph, version, lint", [("modern", "10.16.0.1", "10.16"), ("legacy", "10.3.0.30", "10.3")])
def test_a_tensorrt_engine_answers_with_images_as_transformers(vlm, run_cli, tmp_path, graph, version, lint):
    """--backend tensorrt (the stand-ins, tests/fakes), the modern profile and the legacy one (TensorRT
    10.3, JetPack 6: vision.onnx at opset 20): llm.plan takes the image embeddings and vision.plan
    encodes the tiles (4 at a time, its profile's most), as transformers."""
    import onnx

    from tests import fakes
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    with fakes.installed(FAKE_TRT_VERSION=version):
        engine = build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), backend="tensorrt",
                                   graph=graph, trt_version=lint, max_batch_size=4,
                                   max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
        manifest = json.loads((engine / "manifest.json").read_text())
        assert manifest["files"]["vision_plan"] == "vision.plan"
        assert manifest["vision"]["profiles"][0]["shapes"]["pixel_values"][2] == [4, 3, 56, 56]
        opset = onnx.load(str(engine / "vision.onnx"), load_external_data=False).opset_import[0].version
        assert opset == {"modern": 24, "legacy": 20}[graph]
        result, out = run((vlm[0], engine, *vlm[2:]), run_cli, CASES)
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES, out["responses"]):
        assert_answer(response, *reference(vlm, content))
