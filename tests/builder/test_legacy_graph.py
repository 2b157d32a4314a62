"""The legacy graph profile (opset 20, TensorRT 10.3) against the modern one (opset 24), through
the runtime's ONNX Runtime engine with the KV bound in place: the same greedy tokens over a batched
generation of prompts of different lengths, logits within 1e-4 (float32) / FP16_ATOL (float16),
the same KV cache contents; plus its I/O, its lint and what it refuses.

An engine directory for the legacy graph is the modern engine's with llm.onnx rewritten by
DecoderWriter(graph="legacy") and compiled for ONNX Runtime as trtllm-build compiles it.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from trtllm.builder import checkpoint as ckpt  # noqa: E402
from trtllm.builder import export  # noqa: E402
from trtllm.builder.architectures import spec_for, weights_of  # noqa: E402
from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.decoder import DecoderWriter  # noqa: E402
from trtllm.builder.quantize import QuantScheme  # noqa: E402
from trtllm.plugins.lint import lint_model  # noqa: E402
from trtllm.plugins.sample import body as sample_body  # noqa: E402
from trtllm.runtime import manifest as mf  # noqa: E402
from trtllm.runtime import sampling  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, decode_inputs, prefill_inputs, run_rows  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402

from tests.engine_helpers import resized, run_greedy, unoptimized_sessions  # noqa: E402

ARCHS = ["llama", "mistral", "ministral", "qwen2", "qwen3", "phi3", "phi4-mini", "smollm3", "gemma", "gemma2", "gemma3",
         "gemma4", "gemma4-kv", "lfm2", "granite", "olmo2", "olmo3", "exaone4", "ernie4_5", "helium", "hunyuan", "glm", "glm4",
         "granite4", "lfm3", "arcee", "apertus", "granite4-h", "bamba"]
DTYPES = ["float32", "float16"]
PROMPTS = [[5, 17, 42, 99, 7], list(range(30, 52)), [3, 200, 11], list(range(100, 140, 3))]
NUM_DECODE = 6
NUM_TOKENS = 16
# float16: two half-precision computations of the same model differ by about as much as each differs
# from float32 (measured: legacy-modern up to 0.04, modern-float32 up to 0.065, on logits up to ~8),
# so legacy must also be as accurate as modern against float32 (FP16_ERROR_RATIO).
ATOL = {"float32": 1e-4, "float16": 6e-2}
FP16_ERROR_RATIO = 1.5


def assert_logits_close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    np.testing.assert_allclose(got, want, atol=ATOL[dtype], rtol=0)


def load_parts(checkpoint: Path, num_positions: int):
    """DecoderWriter's arguments for the checkpoint: (spec, weights, cos, sin) and its keywords."""
    ck = ckpt.load(str(checkpoint))
    cos, sin = ckpt.rope_tables(ck.model, num_positions)
    spec = spec_for(ck.model)
    local = ckpt.rope_tables(ck.model, num_positions, "sliding_attention") if spec.local_rope else None
    return (spec, weights_of(ck.model, spec), cos, sin), {"local_rope": local}


def write_legacy_engine(modern: Path, checkpoint: Path, out: Path, writer=DecoderWriter) -> Path:
    """`modern`'s engine directory with llm.onnx written by `writer(graph="legacy")`."""
    shutil.copytree(modern, out)
    manifest = mf.load(out)
    args, kwargs = load_parts(checkpoint, manifest.limits.max_kv_cache_capacity)
    model = writer(*args, manifest.max_top_k, dtype=manifest.dtype, graph="legacy", verify_logits=manifest.prompt_logits,
                   **kwargs).write()
    for name in (export.ONNX_NAME, export.ORT_NAME):
        for path in (out / name, out / (name + ".data")):
            path.unlink(missing_ok=True)
    export.save(model, out, export.ONNX_NAME)
    export.compile_onnxruntime(out, log=lambda m: None)
    changes = {"lowerings": ()}
    if "graph_profile" in {f.name for f in dataclasses.fields(manifest)}:
        changes["graph_profile"] = "legacy"
    mf.save(dataclasses.replace(manifest, **changes), out)
    resized(out)
    return out


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, tmp_path_factory):
    """engines(arch, dtype) -> (modern engine dir, legacy engine dir), built once."""
    made = {}

    def get(arch: str, dtype: str) -> tuple[Path, Path]:
        if (arch, dtype) not in made:
            root = tmp_path_factory.mktemp(f"{arch}-{dtype}")
            modern = export.build(BuildConfig(model=str(tiny_checkpoint(arch)), output=str(root / "modern"),
                                              dtype=dtype, max_batch_size=4, max_input_len=64,
                                              max_kv_cache_capacity=128, verify=False), log=lambda m: None)
            made[arch, dtype] = modern, write_legacy_engine(modern, tiny_checkpoint(arch), root / "legacy")
        return made[arch, dtype]

    return get


def batch_logits(engine, prompts: list[list[int]], forced: np.ndarray | None = None):
    """Prefill the prompts as one right-padded batch, then decode NUM_DECODE steps feeding `forced`
    [steps, B] (else the engine's greedy tokens). Returns (logits [steps, B, V], tokens [steps, B],
    the KV buffers)."""
    m = engine.manifest
    params = sampling.SamplingParams(temperature=0.0, max_new_tokens=NUM_DECODE + 1)
    rows = [RowState(prompt_ids=p, params=params, rng=np.random.default_rng(0), eos_ids=frozenset()) for p in prompts]
    batch = sampling.make_batch([params] * len(rows), m.model.vocab_size, m.max_top_k)
    kv = KVCacheManager(m.model, len(rows), max(map(len, prompts)) + NUM_DECODE + 1)
    inputs, logits, tokens = prefill_inputs(rows, m.pad_token_id, batch), [], []
    for step in range(NUM_DECODE + 1):
        out = engine.step(inputs, kv.view(0, len(rows)), want_logits=True)
        logits.append(out.logits.copy())  # (valid until the engine's next step)
        tokens.append(out.token_ids)
        for b, row in enumerate(rows):
            row.output_ids.append(int(forced[step, b] if forced is not None else out.token_ids[b]))
        inputs = decode_inputs(rows, m.pad_token_id, batch)
    return np.stack(logits), np.stack(tokens), kv.buffers


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_and_kv_match_modern(arch, dtype, engines):
    """Teacher-forced on the modern graph's tokens, so every step compares the same inputs; the
    legacy graph as written (what TensorRT parses) and as compiled for ONNX Runtime."""
    modern_dir, legacy_dir = engines(arch, dtype)
    want, tokens, want_kv = batch_logits(load_engine(modern_dir, graph="onnx"), PROMPTS)
    if dtype == "float16":
        exact, _, _ = batch_logits(load_engine(engines(arch, "float32")[0], graph="onnx"), PROMPTS, forced=tokens)
    with unoptimized_sessions():
        raw = load_engine(legacy_dir, graph="onnx")
    for engine in (raw, load_engine(legacy_dir)):
        got, _, got_kv = batch_logits(engine, PROMPTS, forced=tokens)
        if dtype == "float16":
            error, modern_error = np.abs(got - exact).max(), np.abs(want - exact).max()
            assert error <= FP16_ERROR_RATIO * modern_error, (error, modern_error)
            # each is up to its error from float32, so up to both apart (Gemma 1's large activations,
            # with no norm on the attention and MLP outputs: modern 0.08 from float32 here)
            np.testing.assert_allclose(got, want, atol=max(ATOL[dtype], error + modern_error), rtol=0)
        else:
            assert_logits_close(got, want, dtype)
        # The KV is written in place (present_* bound to past_*'s buffer): the KV manager's own
        # buffers hold the modern graph's rows (its untouched zeros included), and were written.
        for g, w in zip(got_kv, want_kv):
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), atol=ATOL[dtype], rtol=0)
        assert all(np.count_nonzero(g) for g in got_kv)


# Not tiny Gemma 1 in float16: its two float16 graphs are 0.08 apart (each as far from float32: the
# logits test above), which flips a near-tie in its third prompt's answer; bfloat16 is Gemma's type. Nor
# tiny Arcee's: the legacy graph computes in float16 (the modern one's kernels in float32), and its ReLU
# squared doubles each activation's rounding error: a near-tie in its fourth prompt's answer flips
@pytest.mark.parametrize("arch, dtype", [(a, d) for a in ARCHS for d in DTYPES
                                         if (a, d) not in (("gemma", "float16"), ("arcee", "float16"))])
def test_greedy_tokens_match_modern(arch, dtype, engines):
    modern_dir, legacy_dir = engines(arch, dtype)
    want = run_greedy(load_engine(modern_dir), PROMPTS, NUM_TOKENS)
    assert run_greedy(load_engine(legacy_dir), PROMPTS, NUM_TOKENS) == want
    assert [run_greedy(load_engine(legacy_dir), [p], NUM_TOKENS)[0] for p in PROMPTS[:2]] == want[:2]


def test_sliding_window_matches_modern(tmp_path):
    """Mistral with a window (8) shorter than the prompts: the tiny checkpoints' 4096 never bites."""
    import transformers

    from tests.tiny_models import make_checkpoint

    checkpoint = make_checkpoint("mistral", tmp_path / "ckpt", seed=3)
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    config.sliding_window = 8
    config.save_pretrained(checkpoint)
    modern = export.build(BuildConfig(model=str(checkpoint), output=str(tmp_path / "modern"), max_batch_size=4,
                                      max_input_len=64, max_kv_cache_capacity=128, verify=False), log=lambda m: None)
    assert mf.load(modern).model.sliding_window == 8
    legacy = write_legacy_engine(modern, checkpoint, tmp_path / "legacy")
    want, tokens, _ = batch_logits(load_engine(modern, graph="onnx"), PROMPTS)
    got, _, _ = batch_logits(load_engine(legacy), PROMPTS, forced=tokens)
    assert_logits_close(got, want, "float32")
    assert run_greedy(load_engine(legacy), PROMPTS, NUM_TOKENS) == run_greedy(load_engine(modern), PROMPTS, NUM_TOKENS)


class MaskOffByOne(DecoderWriter):
    """The deliberately wrong variant: query s of row b also sees slot write_index[b] + s + 1."""

    def masks(self, input_ids: str, write_index: str, *rest) -> dict:
        shifted = self.g.op("Add", "/model/mask/wrong_shift", [write_index, self.g.const(1)])
        return super().masks(input_ids, shifted, *rest)


def test_wrong_mask_is_caught(engines, tiny_checkpoint, tmp_path):
    modern_dir, _ = engines("llama", "float32")
    wrong = write_legacy_engine(modern_dir, tiny_checkpoint("llama"), tmp_path / "wrong", writer=MaskOffByOne)
    want, tokens, _ = batch_logits(load_engine(modern_dir, graph="onnx"), PROMPTS)
    got, _, _ = batch_logits(load_engine(wrong, graph="onnx"), PROMPTS, forced=tokens)
    with pytest.raises(AssertionError):
        assert_logits_close(got, want, "float32")


@pytest.fixture(scope="module")
def graphs(tiny_checkpoint):
    """graphs(arch, dtype, profile) -> the ModelProto (no engine)."""
    made, parts = {}, {}

    def get(arch: str, dtype: str, graph: str):
        if arch not in parts:
            parts[arch] = load_parts(tiny_checkpoint(arch), 128)
        if (arch, dtype, graph) not in made:
            args, kwargs = parts[arch]
            made[arch, dtype, graph] = DecoderWriter(*args, 64, dtype=dtype, graph=graph, **kwargs).write()
        return made[arch, dtype, graph]

    return get


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_lint_legacy_for_trt_10_3_and_modern_for_10_15(arch, dtype, graphs):
    legacy, modern = graphs(arch, dtype, "legacy"), graphs(arch, dtype, "modern")
    assert lint_model(legacy, "10.3") == []
    newer = {"opset", "Attention", "TensorScatter", "RotaryEmbedding", "RMSNormalization"}
    if arch == "gemma2":  # soft-capped scores: TensorRT's Attention has no softcap, so MatMul and Softmax
        newer.remove("Attention")
    if arch == "granite4-h":  # (no RoPE on its attention layer, as granite-4.0-h's)
        newer.remove("RotaryEmbedding")
    assert {issue.op for issue in lint_model(modern, "10.3")} == newer
    assert lint_model(modern, "10.15") == [] and lint_model(modern, "11.1") == []


@pytest.mark.parametrize("arch", ARCHS)
def test_legacy_graph_has_the_modern_io_at_opset_20(arch, graphs):
    legacy, modern = graphs(arch, "float16", "legacy"), graphs(arch, "float16", "modern")
    onnx.checker.check_model(legacy, full_check=True)
    assert [(o.domain, o.version) for o in legacy.opset_import if o.domain == ""] == [("", 20)]
    assert [(o.domain, o.version) for f in legacy.functions for o in f.opset_import] == [("", 20)]
    assert legacy.ir_version == 9
    assert list(legacy.graph.input) == list(modern.graph.input)
    assert list(legacy.graph.output) == list(modern.graph.output)
    ops = {n.op_type for n in legacy.graph.node}
    assert "ScatterND" in ops and not ops & {"Attention", "TensorScatter", "RotaryEmbedding", "RMSNormalization"}


def test_legacy_refuses_what_opset_20_cannot_express(tiny_checkpoint):
    parts, _ = load_parts(tiny_checkpoint("llama"), 64)
    for name in ("int8", "int4"):
        with pytest.raises(ValueError, match=r"quant .*opset 21"):
            DecoderWriter(*parts, 64, quant=QuantScheme.named(name), graph="legacy")
    with pytest.raises(ValueError, match="ort_attention"):
        DecoderWriter(*parts, 64, ort_attention=True, graph="legacy")
    with pytest.raises(ValueError, match="graph must be one of"):
        DecoderWriter(*parts, 64, graph="jetpack")


@pytest.mark.slow
@pytest.mark.hf
def test_demo_model_legacy_tokens_match_modern(demo_model, tmp_path):
    """SmolLM2-135M (30 layers): batched greedy answers to chat prompts, legacy == modern."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(demo_model)
    texts = [tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
             for text in ("What is the capital of France?", "Write a short poem about the sea.",
                          "Explain in two sentences what a CPU does.")]
    prompts = [tok(text, add_special_tokens=False).input_ids for text in texts]
    modern = export.build(BuildConfig(model=str(demo_model), output=str(tmp_path / "modern"), max_input_len=128,
                                      max_kv_cache_capacity=256, verify=False), log=lambda m: None)
    legacy = write_legacy_engine(modern, demo_model, tmp_path / "legacy")
    want, tokens, _ = batch_logits(load_engine(modern, graph="onnx"), prompts)
    got, _, _ = batch_logits(load_engine(legacy), prompts, forced=tokens)
    np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)  # measured 5e-5 on logits up to 33
    assert run_greedy(load_engine(legacy), prompts, 32) == run_greedy(load_engine(modern), prompts, 32)


def test_an_onnxruntime_engine_of_the_canonical_graph_draws_the_least_likely_tokens(tiny_checkpoint, tmp_path):
    """An ONNX Runtime engine compiled from the canonical graph (here --graph legacy: no ONNX Runtime
    form is written) samples with the float64 draw too: with biases putting every token but one at
    exp(-17) of it, a uniform in the tail draws a tail token where the exact CDF says (a review's:
    it drew the top one, its body summing in float32). The canonical llm.onnx, TensorRT's, keeps
    float32 (no float64 in TensorRT)."""
    from trtllm.builder.verify import engine_logits

    engine_dir = export.build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), graph="legacy",
                                          trt_version="10.3", backend="onnxruntime", max_input_len=32,
                                          max_kv_cache_capacity=64, verify=False), log=lambda m: None)
    engine, prompt = load_engine(engine_dir), [5, 17, 42, 99, 7]
    x = engine_logits(engine, prompt, 0)[1][0].astype(np.float64)
    top = int(np.argmax(x))
    bias = {i: float(-17.0 - (x[i] - x[top])) for i in range(len(x)) if i != top}
    w = np.exp(np.float32(-17.0))
    tail = (len(x) - 1) * w / (1 + (len(x) - 1) * w)
    seed = next(s for s in range(10**7) if 1 - 0.8 * tail < np.random.default_rng(s).random(dtype=np.float32)
                < 1 - 0.2 * tail)  # (a uniform well inside the tail: not a token within rounding of a boundary)
    params = sampling.SamplingParams(temperature=1.0, top_k=0, top_p=1.0, logit_bias=bias, max_new_tokens=1)
    row = RowState(prompt_ids=prompt, params=params, rng=np.random.default_rng(seed), eos_ids=frozenset())
    run_rows(engine, [row], 1)
    assert row.output_ids[0] != top
    import onnx

    model = onnx.load(str(engine_dir / "llm.onnx"), load_external_data=False)
    bodies = [f for f in model.functions if f.name == sample_body.OP]
    assert bodies and not any(sample_body.has_float64_draw(f) for f in bodies)
