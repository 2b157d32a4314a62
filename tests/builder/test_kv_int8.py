"""--kv-cache-dtype int8: the KV cache as int8 rows with a float32 scale each (plugins/cpu attention,
tests/plugins/test_cpu_attention.py checks the kernel against its reference). Here: what the build
writes, that an engine with it stays within an int8 cache's error of transformers and gives its
greedy tokens, and that every runtime path that copies KV rows (beams, saved prefixes, in-flight
slots) runs on it; and the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.config import BuildConfig, ConfigError  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime import beam  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.manifest import ManifestError  # noqa: E402

from tests.engine_helpers import run_greedy  # noqa: E402

pytestmark = pytest.mark.hf
PROMPTS = [[5, 17, 42, 99, 7], list(range(30, 52)), [3, 200, 11], list(range(100, 140, 3))]


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, tmp_path_factory):
    """arch -> (checkpoint, engine dir with an int8 KV cache, the same engine with its float32 one)."""
    made = {}

    def get(arch: str):
        if arch not in made:
            root = tmp_path_factory.mktemp(f"kv8-{arch}")
            ckpt = tiny_checkpoint(arch)
            dirs = [build(BuildConfig(model=str(ckpt), output=str(root / name), max_batch_size=4, max_input_len=128,
                                      max_kv_cache_capacity=256, verify=False, kv_cache_dtype=kv), log=lambda m: None)
                    for name, kv in (("int8", "int8"), ("float32", "auto"))]
            made[arch] = (ckpt, *dirs)
        return made[arch]

    return get


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.int64),
                             max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def test_the_build_writes_an_int8_cache_of_rows_and_scales(engines):
    import onnx

    _, engine_dir, _ = engines("llama")
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    assert manifest["model"]["kv_dtype"] == "int8" and manifest["build_config"]["kv_cache_dtype"] == "int8"
    graph = onnx.load(engine_dir / "llm.ort.onnx", load_external_data=False).graph
    past = next(i for i in graph.input if i.name == "past_key.0").type.tensor_type
    assert past.elem_type == onnx.TensorProto.INT8
    assert past.shape.dim[3].dim_value == manifest["model"]["head_dim"] + 4  # the values, then a float32 scale
    with pytest.raises(ManifestError, match="only its compiled form reads"):
        load_engine(engine_dir, graph="onnx")


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma2"])
def test_logits_and_tokens_stay_within_the_caches_error(arch, engines):
    """Each key and value is within 1/254 of its row's largest: logits within 6% of transformers'
    largest logit here (measured 0.8-3.9% on these random models, whose sharp attention magnifies a
    key's error; 1.8% on the demo model; the float32-cache engine: within 1e-4). The kernel itself is checked exactly against its
    reference, and without its scales must miss it (tests/plugins/test_cpu_attention.py)."""
    ckpt, kv8, f32 = engines(arch)
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    engine, exact = load_engine(kv8), load_engine(f32)
    for prompt in PROMPTS:
        generated, got = engine_logits(engine, prompt, num_decode=4)
        with torch.no_grad():
            ref = model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
        assert np.abs(got - ref).max() < 0.06 * np.abs(ref).max()
        # (the int8 engine's tokens fed to it, one after each step)
        assert np.abs(engine_logits(exact, prompt, num_decode=4, forced=generated)[1] - ref).max() < 1e-4
    # fed transformers' greedy answers, the engine's top-1 is transformers' at >= 90% of the positions
    # (as the build's check measures a lossy format; measured 96-100% here)
    agree = []
    for prompt in PROMPTS:
        want = hf_greedy(model, prompt, 24)
        chosen, _ = engine_logits(engine, prompt, num_decode=23, forced=want)
        agree += [a == b for a, b in zip(chosen, want)]
    assert np.mean(agree) >= 0.9, np.mean(agree)
    # and its own greedy answers are the same alone, in one batch and in flight (2 slots)
    alone = [run_greedy(engine, [p], 24)[0] for p in PROMPTS]
    assert run_greedy(engine, PROMPTS, 24) == alone == run_greedy(engine, PROMPTS, 24, num_slots=2)


def test_beams_copy_int8_rows_and_their_scales(engines):
    """Beam search moves beams between slots by copying KV rows: with an int8 cache the scales must
    travel with the values. Each hypothesis' score (length_penalty 0: its summed log-probabilities)
    is what one sequence fed those tokens gets, no row copied."""
    _, kv8, _ = engines("llama")
    engine = load_engine(kv8)
    found = beam.run(engine, PROMPTS[1], beam.BeamParams(3, 12, frozenset(), length_penalty=0.0))
    for h in found:
        _, logits = engine_logits(engine, PROMPTS[1], num_decode=len(h.tokens) - 1, forced=list(h.tokens))
        logits = logits.astype(np.float64)
        logprobs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        assert h.score == pytest.approx(float(logprobs[np.arange(len(h.tokens)), h.tokens].sum()), abs=1e-3)


def test_a_saved_system_prompt_restores_int8_rows(engines, run_cli, tmp_path):
    _, kv8, _ = engines("llama")
    system = {"role": "system", "content": "You are a tiny test model. " * 4}
    payload = {"temperature": 0, "max_generate_length": 12, "requests": [
        {"messages": [system, {"role": "user", "content": q}], "save_system_prompt_kv_cache": True}
        for q in ("The quick brown fox", "What is the capital of France?")]}
    store = ("--kv-cache-dir", str(tmp_path / "kv"))
    result, first = run_cli(kv8, payload, *store)
    assert result.exit_code == 0, result.output
    result, again = run_cli(kv8, payload, *store, "--profile", str(tmp_path / "p.json"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p.json").read_text())["prefill"]["reused_tokens"] > 0
    assert [r["output_ids"] for r in again["responses"]] == [r["output_ids"] for r in first["responses"]]


def test_a_float16_model_takes_an_int8_cache_too(tiny_checkpoint, tmp_path):
    """A 16-bit model's form runs our attention (float32 arithmetic, 16-bit weights): its cache may
    be int8 as well, within the cache's error of the same engine with its float16 cache."""
    dirs = [build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / kv), dtype="float16",
                              max_input_len=64, max_kv_cache_capacity=128, verify=False, kv_cache_dtype=kv),
                  log=lambda m: None) for kv in ("int8", "auto")]
    assert json.loads((dirs[0] / "manifest.json").read_text())["model"]["kv_dtype"] == "int8"
    generated, got = engine_logits(load_engine(dirs[0]), PROMPTS[1], num_decode=4)
    _, want = engine_logits(load_engine(dirs[1]), PROMPTS[1], num_decode=4, forced=generated)
    assert 0 < np.abs(got - want).max() < 0.06 * np.abs(want).max()


@pytest.mark.parametrize("options, needle", [
    (dict(backend="tensorrt"), "--backend tensorrt"),
    (dict(graph="legacy"), "--graph legacy"),
    (dict(cpu_kernels="onnxruntime"), "--cpu-kernels onnxruntime"),
])
def test_what_cannot_read_an_int8_cache_is_refused(options, needle):
    with pytest.raises(ConfigError, match=f"--kv-cache-dtype int8 is read by our CPU attention kernel alone.*{needle}"):
        BuildConfig(model="m", output="o", kv_cache_dtype="int8", **options)


def test_a_tensorrt_manifest_with_an_int8_cache_is_refused(engines, tmp_path):
    import shutil

    _, kv8, _ = engines("llama")
    edited = shutil.copytree(kv8, tmp_path / "e")
    manifest = json.loads((edited / "manifest.json").read_text())
    manifest["backend"] = "tensorrt"
    (edited / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match="model.kv_dtype int8 is for ONNX Runtime engines"):
        load_engine(edited)
