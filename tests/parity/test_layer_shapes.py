"""LFM2 and Gemma 4 beyond the tiny-model parity suites (test_tiny_parity.py, test_legacy_graph.py,
test_context_cache.py): what their KV of layers of their own shapes meets elsewhere in the runtime (beams,
prompt lookup, TensorRT's device cache), quantized LFM2 engines, and what LFM2 cannot be built with yet."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.config import BuildConfig, ConfigError  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.quantize import QuantScheme  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

pytestmark = pytest.mark.hf
LIMITS = dict(max_batch_size=2, max_input_len=64, max_kv_cache_capacity=128)


@pytest.mark.parametrize("arch", ["gemma4", "lfm2"])
def test_beam_search_and_prompt_lookup_answer_as_transformers(arch, tiny_checkpoint, tiny_engine, run_cli):
    """Beams copy each layer's KV in its own shape (Gemma 4: none for the sharing layers; LFM2: the
    convolutions' rows), and prompt lookup's verify steps write and roll back positions: both are
    transformers' (generate's beams; its greedy)."""
    ckpt, engine = tiny_checkpoint(arch), tiny_engine(arch)
    tok = transformers.AutoTokenizer.from_pretrained(ckpt)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    beam, lookup = "The quick brown fox jumps", "one two three one two three one two three one two"

    def prompt(text):
        return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       return_tensors="pt", return_dict=True)["input_ids"]

    with torch.no_grad():
        ids = prompt(beam)
        beams = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=3, num_return_sequences=3,
                               max_new_tokens=10, min_new_tokens=10, do_sample=False, eos_token_id=None)
        ids2 = prompt(lookup)
        greedy = model.generate(ids2, attention_mask=torch.ones_like(ids2), max_new_tokens=16, min_new_tokens=16,
                                do_sample=False, eos_token_id=None)
    _, out = run_cli(engine, {"max_generate_length": 10, "ignore_eos": True, "temperature": 0, "requests": [
        {"messages": [{"role": "user", "content": beam}], "num_beams": 3, "n": 3}]})
    assert [r["output_ids"] for r in out["responses"]] == [b[ids.shape[1]:].tolist() for b in beams]
    _, out = run_cli(engine, {"max_generate_length": 16, "ignore_eos": True, "temperature": 0, "requests": [
        {"messages": [{"role": "user", "content": lookup}]}]}, "--spec-ngram", "3")
    assert out["responses"][0]["output_ids"] == greedy[0, ids2.shape[1]:].tolist()


@pytest.mark.parametrize("arch, graph", [("gemma4", "modern"), ("gemma4", "legacy"), ("lfm2", "modern"),
                                         ("lfm2", "legacy")])
def test_tensorrt_engines_answer_as_onnx_runtime(arch, graph, tiny_checkpoint, tmp_path, run_cli):
    """TensorRT (tests/fakes: it runs the plan's llm.onnx as written, the KV in device buffers bound in
    place, each KV layer in its own shape): the same answers as the ONNX Runtime engine, with a saved
    system prompt's KV read from the device and written back (saved_form's pieces)."""
    from tests import fakes
    from tests.runtime.test_tensorrt_engine import LIMITS as TRT_LIMITS, PAYLOAD, same

    ckpt = str(tiny_checkpoint(arch))
    env = {"FAKE_TRT_VERSION": "10.3.0.30"} if graph == "legacy" else {}
    legacy = dict(graph="legacy", trt_version="10.3") if graph == "legacy" else {}
    build(BuildConfig(model=ckpt, output=str(tmp_path / "ort"), backend="onnxruntime", **TRT_LIMITS), log=lambda m: None)
    with fakes.installed(**env):
        build(BuildConfig(model=ckpt, output=str(tmp_path / "trt"), backend="tensorrt", **legacy, **TRT_LIMITS),
              log=lambda m: None)

    def answers(engine, *extra):
        result, out = run_cli(engine, {**PAYLOAD, "batch_size": 2}, *extra)
        assert result.exit_code == 0, result.output
        return out["responses"]

    want = answers(tmp_path / "ort")
    with fakes.installed(**env):
        same(answers(tmp_path / "trt"), want)
        cache = ("--kv-cache-dir", str(tmp_path / "kv"))
        same(answers(tmp_path / "trt", *cache), want)
        assert list((tmp_path / "kv").iterdir())
        same(answers(tmp_path / "trt", *cache), want)  # (restored into the device's buffers)


@pytest.mark.parametrize("name", ["int4", "int8"])
def test_quantized_lfm2_is_transformers_on_its_dequantized_weights(name, tiny_checkpoint, tmp_path):
    """Its projections (the convolutions' in and out, attention's, the MLP's w1 w3 w2) quantized as any
    model's, the convolution kernel kept in float: transformers with the dequantized weights, within 1e-4."""
    from tests.builder.test_quantized import dequantized_model

    ckpt = tiny_checkpoint("lfm2")
    engine = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization=name, verify=False,
                               **LIMITS), log=lambda m: None)
    prompt = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11, 12, 13]
    generated, got = engine_logits(load_engine(engine), prompt, num_decode=4)
    with torch.no_grad():
        ref = dequantized_model(ckpt, QuantScheme.named(name))(torch.tensor([prompt + generated[:-1]])).logits
    np.testing.assert_allclose(got, ref[0, len(prompt) - 1:].numpy(), atol=1e-4, rtol=0)


def test_an_int8_kv_cache_for_lfm2_is_refused_by_name(tiny_checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="^--kv-cache-dtype int8: Lfm2ForCausalLM has short-convolution layers"):
        build(BuildConfig(model=str(tiny_checkpoint("lfm2")), output=str(tmp_path / "e"), kv_cache_dtype="int8",
                          **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()


def test_lfm2_eagle_heads_draft_chains(tiny_checkpoint, tmp_path):
    """EAGLE-3 on LFM2 (test_eagle_parity.py: speculative greedy tokens are transformers'): chains, which
    sit in consecutive slots as the convolution reads them, never trees."""
    from tests.eagle_drafts import random_draft
    from trtllm.runtime import manifest as mf

    ckpt = tiny_checkpoint("lfm2")
    engine = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), eagle=str(random_draft(ckpt, tmp_path / "d")),
                               **LIMITS), log=lambda m: None)
    assert mf.load(engine).eagle["tree"] is False
