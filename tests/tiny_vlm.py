"""A tiny random InternVL checkpoint (InternViT + pixel shuffle + MLP projector on a Qwen2 model) with the
tiny models' BPE tokenizer, InternVL's image tokens and a chat template that writes one per image, made
in the test run with transformers: nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_models import make_tokenizer, named_special_tokens, randomized, saved

IMAGE_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>", "context_image_token": "<IMG_CONTEXT>",
                "video_token": "<video>"}
# InternVL's own template's shape: an image item is its context token and a newline
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for item in message['content'] %}{% if item['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
IMAGE_SIZE = 56  # 4 x 4 patches of 14, 4 image tokens a tile after the pixel shuffle


def make_vlm_checkpoint(out_dir: Path, seed: int = 0, max_patches: int = 4, qk_norm: bool = False,
                        norm_type: str = "layer_norm") -> Path:
    import torch
    import transformers
    out_dir = Path(out_dir)
    tok = make_tokenizer(out_dir)
    tok.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS.values())})
    tok.chat_template = TEMPLATE
    ids = {k: tok.convert_tokens_to_ids(v) for k, v in IMAGE_TOKENS.items()}
    text = transformers.Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, rope_theta=10000.0)
    vision = transformers.InternVLVisionConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=IMAGE_SIZE,
        patch_size=14, use_qk_norm=qk_norm, norm_type=norm_type, attention_bias=True)
    config = transformers.InternVLConfig(vision_config=vision.to_dict(), text_config=text.to_dict(),
                                         image_token_id=ids["context_image_token"], image_seq_length=4,
                                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.InternVLForConditionalGeneration(config).eval()
    randomized(model, ("norm.weight", "layernorm_before.weight", "layernorm_after.weight"))
    saved(model, tok, out_dir)
    named_special_tokens(out_dir, IMAGE_TOKENS)
    (out_dir / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "GotOcr2ImageProcessor", "crop_to_patches": True, "min_patches": 1,
        "max_patches": max_patches, "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "resample": 3,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "do_convert_rgb": True}, indent=2))
    (out_dir / "processor_config.json").write_text(json.dumps({"processor_class": "InternVLProcessor",
                                                               "image_seq_length": 4}, indent=2))
    return out_dir


CASES = [
    [{"type": "image", "image": "wide.png"}, {"type": "text", "text": "What is in this picture?"}],
    [{"type": "text", "text": "Compare"}, {"type": "image", "image": "square.png"},
     {"type": "image", "image": "tall.png"}],
    [{"type": "text", "text": "The quick brown fox"}],
    [{"type": "image", "image": "square.png"}, {"type": "text", "text": "What is in this picture?"}],
]


def built(tmp_path_factory, ckpt: Path, name: str, sizes: dict, **build_options) -> tuple:
    """(checkpoint dir, engine dir, images dir, transformers model, tokenizer) of a vision-language
    suite: the engine built from `ckpt` (4 rows, 256 prompt tokens, 512 KV positions, and
    `build_options`), random images of `sizes` ({file: (width, height)}), and transformers' model of
    the checkpoint, which ignores EOS (our rows run their whole length)."""
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    engine = tmp_path_factory.mktemp(f"{name}-engine") / "engine"
    build(BuildConfig(model=str(ckpt), output=str(engine), max_batch_size=4, max_input_len=256,
                      max_kv_cache_capacity=512, **build_options), log=lambda m: None)
    images = tmp_path_factory.mktemp(f"{name}-images")
    rng = np.random.default_rng(3)
    for file, (w, h) in sizes.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images / file)
    model = transformers.AutoModelForImageTextToText.from_pretrained(ckpt, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return ckpt, engine, images, model, transformers.AutoTokenizer.from_pretrained(ckpt)


def run_contents(vlm, run_cli, contents: list, new_tokens: int, *extra, engine=None, **top):
    """trtllm-run on one user turn a request (each content's images from the suite's images dir), greedy,
    `new_tokens` each with EOS ignored, 5 logprobs a step, 4 rows at once (`top`: other top-level keys);
    `engine`: another than the suite's."""
    _, built_engine, images, _, _ = vlm
    payload = {"batch_size": 4, "temperature": 0.0, "ignore_eos": True, "max_generate_length": new_tokens,
               "num_logprobs": 5, **top,
               "requests": [{"messages": [{"role": "user", "content": [
                   {**c, "image": str(images / c["image"])} if "image" in c else c for c in content]}]}
                   for content in contents]}
    return run_cli(engine or built_engine, payload, *extra)


def peft_adapter(vlm, path, seed: int, target_modules, alone: bool = False) -> object:
    """A random PEFT adapter of the whole model (its B not zero; `alone`: of its language model as a
    model of its own), saved to `path`; the PEFT model."""
    import copy

    import peft
    import torch

    from trtllm.builder.vision import language_model

    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=target_modules, init_lora_weights=False)
    whole = copy.deepcopy(vlm[3])
    model = peft.get_peft_model(language_model(whole) if alone else whole, config).eval()
    model.save_pretrained(path)
    return model


def bundled_lora_engine(vlm, tmp_path: Path) -> Path:
    """trtllm-build (its CLI) of the suite's checkpoint with the adapter at tmp_path / "bundled" bundled:
    the build checks it against PEFT's own merge, and says so."""
    from click.testing import CliRunner

    from trtllm.builder.cli import main as build_main

    engine = tmp_path / "engine"
    result = CliRunner().invoke(build_main, ["--model", str(vlm[0]), "--output", str(engine), "--max-batch-size", "4",
                                             "--max-input-len", "256", "--max-kv-cache-capacity", "512",
                                             "--lora", f"bundled={tmp_path / 'bundled'}"])
    assert result.exit_code == 0, result.output
    assert "verified adapter bundled" in result.output
    return engine


def asking(image: str, text: str = "What is in this picture?") -> list:
    """A user turn's content: the image, then the question."""
    return [{"type": "image", "image": image}, {"type": "text", "text": text}]


def assert_context_reuse_tells_images_apart(run, one: list[int], other: list[int], tokens_each: int | None,
                                            tmp_path: Path) -> None:
    """--context-reuse, one row at a time, on square.png, square2.png (its size: the same token ids,
    other pixels) and square.png again: the answers are transformers' `one`, `other`, `one` (the
    second never takes the first's KV; the third does), and the profile counts 3 images of
    `tokens_each` image tokens (None: not counted). `run(contents, *extra, **top)`: the suite's trtllm-run."""
    profile = tmp_path / "profile.json"
    result, out = run([asking("square.png"), asking("square2.png"), asking("square.png")],
                      "--context-reuse", "--profile", str(profile), batch_size=1)
    assert result.exit_code == 0, result.output
    assert [r["output_ids"] for r in out["responses"]] == [one, other, one]
    prof = json.loads(profile.read_text())
    assert prof["prefill"]["reused_tokens"] > 0  # the third took the first's
    assert prof["multimodal"]["total_images"] == 3
    assert tokens_each is None or prof["multimodal"]["total_image_tokens"] == 3 * tokens_each
    assert "vision_encoder" in [s["stage_id"] for s in prof["stages"]]


def greedy(model, ids, new_tokens: int, **inputs) -> tuple[list[int], object]:
    """transformers' greedy tokens after `ids` and the first step's log-probabilities (numpy, over the
    vocabulary), with the image inputs its processor gave."""
    import torch

    with torch.no_grad():
        first = torch.log_softmax(model(input_ids=ids, **inputs).logits[0, -1], -1).numpy()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             do_sample=False, **inputs)
    return out[0, ids.shape[1]:].tolist(), first


def beam_answers(model, ids, new_tokens: int, num_beams: int, **inputs) -> list[tuple[list[int], float]]:
    """transformers' beam search after `ids` (no EOS: every beam runs new_tokens): each returned
    hypothesis' tokens and score, best first."""
    import torch

    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             do_sample=False, num_beams=num_beams, num_return_sequences=num_beams,
                             eos_token_id=None, return_dict_in_generate=True, output_scores=True, **inputs)
    return [(seq, float(score)) for seq, score in zip(out.sequences[:, ids.shape[1]:].tolist(),
                                                      out.sequences_scores.tolist())]


def generated(model, ids, new_tokens: int, beams: int = 0, **inputs):
    """greedy()'s answer, or with `beams` beam_answers()'."""
    return beam_answers(model, ids, new_tokens, beams, **inputs) if beams else greedy(model, ids, new_tokens, **inputs)


def assert_beams(responses: list, answers: list) -> None:
    """trtllm-run's responses of one request's beams against beam_answers: tokens exact, scores within
    float32 rounding."""
    import numpy as np

    assert [r["output_ids"] for r in responses] == [tokens for tokens, _ in answers]
    np.testing.assert_allclose([r["beam_score"] for r in responses], [s for _, s in answers], atol=1e-4)


def assert_beams_beside_a_greedy_row(engine, images_dir: Path, run_cli, reference, beamed: list, greedy: list,
                                     new_tokens: int) -> None:
    """num_beams 3 (n 3) on content `beamed`, beside a greedy row of `greedy` in the same batch: each
    returned beam's tokens and score are transformers' beam search's (`reference(content, beams=3)`),
    the greedy row transformers' greedy tokens (`reference(content)`)."""
    requests = [{"messages": [{"role": "user", "content": [{**c, "image": str(images_dir / c["image"])} if "image" in c
                                                           else c for c in content]}], **extra}
                for content, extra in ((beamed, {"num_beams": 3, "n": 3}), (greedy, {}))]
    result, out = run_cli(engine, {"temperature": 0.0, "ignore_eos": True, "max_generate_length": new_tokens,
                                   "requests": requests})
    assert result.exit_code == 0, result.output
    assert_beams(out["responses"][:3], reference(beamed, beams=3))
    assert out["responses"][3]["output_ids"] == reference(greedy)[0]


def assert_eagle_answers(vlm, run_cli, tmp_path: Path, reference, new_tokens: int) -> None:
    """An EAGLE-3 head (a random one) on the checkpoint `vlm[0]`: it drafts from the model's hidden
    states (image-aware) and the token table's rows (an image token's own); the greedy answers to
    CASES, in one batch, stay transformers' (`reference(content)`), and the head drafted."""
    from tests.eagle_drafts import random_draft
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    draft = random_draft(vlm[0], tmp_path / "draft", seed=3, aux=[0, 1, 1])
    engine = build(BuildConfig(model=str(vlm[0]), output=str(tmp_path / "engine"), eagle=str(draft),
                               max_batch_size=4, max_input_len=256, max_kv_cache_capacity=512), log=lambda m: None)
    profile = tmp_path / "profile.json"
    result, out = run_cli(engine, {"temperature": 0.0, "ignore_eos": True, "max_generate_length": new_tokens,
                                   "batch_size": 4, "requests": [{"messages": [{"role": "user", "content": [
                                       {**c, "image": str(vlm[2] / c["image"])} if "image" in c else c
                                       for c in content]}]} for content in CASES]}, "--profile", str(profile))
    assert result.exit_code == 0, result.output
    for content, response in zip(CASES, out["responses"]):
        assert response["output_ids"] == reference(content)[0]
    assert json.loads(profile.read_text())["eagle_generation"]["total_runs"] > 0


def assert_damage_refused(engine_dir: Path, tmp_path: Path, damage, named: str) -> None:
    """A copy of the engine whose manifest's vision section `damage(section)` changed is refused at load,
    with a message matching `named`."""
    import shutil

    import pytest

    from trtllm.runtime.manifest import ManifestError, load

    engine = tmp_path / "engine"
    shutil.copytree(engine_dir, engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    damage(manifest["vision"])
    (engine / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=named):
        load(engine)


def assert_answer(response: dict, tokens: list[int], first) -> None:
    """An engine's response against transformers' greedy tokens and first-step log-probabilities
    (a numpy array over the vocabulary): the tokens exact, the top logprobs within 1e-4."""
    import numpy as np

    assert response["output_ids"] == tokens
    top = response["logprobs"][0]
    ids = [e["token_id"] for e in top]
    assert ids[0] == int(np.argmax(first))
    np.testing.assert_allclose([e["logprob"] for e in top], first[ids], atol=1e-4)


def assert_lora_matches_peft(vlm, run_cli, tmp_path: Path, reference, targets: str, new_tokens: int) -> None:
    """PEFT adapters of the language model (`targets`: the modules' pattern, as PEFT names them in the
    whole model), one bundled (the build checks it against PEFT's merge) and one given at run time, with
    images, beside a row with no adapter: each row's greedy tokens are transformers' with its adapter
    (`reference(content, model=...)`), and the adapter changes them."""
    models = {None: None, **{name: peft_adapter(vlm, tmp_path / name, seed, targets)
                             for seed, name in enumerate(("bundled", "given"), 1)}}
    engine = bundled_lora_engine(vlm, tmp_path)
    names = ["bundled", "given", None]
    result, out = run_cli(engine, {
        "temperature": 0.0, "ignore_eos": True, "max_generate_length": new_tokens, "batch_size": 4,
        "available_lora_weights": {"given": str(tmp_path / "given")},
        "requests": [{"messages": [{"role": "user", "content": [
            {**c, "image": str(vlm[2] / c["image"])} if "image" in c else c for c in CASES[0]]}],
            **({"lora_name": name} if name else {})} for name in names]})
    assert result.exit_code == 0, result.output
    for name, response in zip(names, out["responses"]):
        assert response["output_ids"] == reference(CASES[0], model=models[name])[0], name
    assert out["responses"][0]["output_ids"] != out["responses"][2]["output_ids"]  # (the adapter changes it)


def assert_served_image_url(vlm, tmp_path: Path, reference, new_tokens: int) -> None:
    """trtllm-serve on the engine `vlm[1]`: an image_url part (a data: URL) and a question answer as
    transformers (`reference(content)`: tokens and first-step log-probabilities)."""
    import base64
    import http.client
    import threading

    from trtllm.runtime import server

    httpd = server.build(vlm[1], "127.0.0.1", 0, None, {}, {}, 2, 1, tmp_path / "kv", 1 << 30, True, None)
    httpd.quiet = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = "data:image/png;base64," + base64.b64encode((vlm[2] / "wide.png").read_bytes()).decode()
        c = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1], timeout=120)
        c.request("POST", "/v1/chat/completions", json.dumps({
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                      {"type": "text", "text": "What is in this picture?"}]}],
            "temperature": 0, "ignore_eos": True, "max_tokens": new_tokens, "logprobs": True}))
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200, body
        tokens, first = reference(CASES[0])
        assert body["choices"][0]["message"]["content"] == vlm[4].decode(tokens, skip_special_tokens=True)
        assert abs(body["choices"][0]["logprobs"]["content"][0]["logprob"] - first[tokens[0]]) < 1e-4
    finally:
        httpd.shutdown()
        server.stop(httpd)
