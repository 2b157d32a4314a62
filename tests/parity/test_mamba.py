"""Granite 4.0's hybrid form (Mamba-2 layers beside attention: builder/mamba.py) as the runtime schedules
it: each row's recurrent state is its own alone, whatever its neighbours do. In flight with chunked
prefill (a parked row's pad in a decode step must leave its state alone: last_index -1), with a slot
taken again (zeros where write_index is 0), with the same prompt twice (no KV copied from a neighbour,
whose state is past the copy); on our MambaScan kernel and in standard ops; quantized; the features
that keep KV by position left aside, not run wrong. The wrong variant (parked rows' pads taken into
their state) must miss. The logits, greedy tokens, beams and LoRA against transformers and PEFT:
test_tiny_parity.py, test_beam_search.py, test_lora_parity.py."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.config import BuildConfig, ConfigError  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.model_limits import refuse_for_mamba  # noqa: E402
from trtllm.builder.quantize import QuantScheme  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.plugins.lint import lint_model  # noqa: E402
from trtllm.runtime import generate, sampling  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, run_rows  # noqa: E402

pytestmark = pytest.mark.hf
PROMPTS = [[5, 17, 42, 99, 7], list(range(30, 52)), [3, 200, 11], list(range(100, 140, 3))]
NEW = 24


@pytest.fixture(scope="module")
def hybrid(tiny_checkpoint, tiny_engine):
    """(checkpoint, engine, transformers' greedy answers to PROMPTS)."""
    ckpt, engine = tiny_checkpoint("granite4-h"), load_engine(tiny_engine("granite4-h"))
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    answers = []
    with torch.no_grad():
        for p in PROMPTS:
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.int64),
                                 max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, eos_token_id=None)
            answers.append(out[0, len(p):].tolist())
    return ckpt, engine, answers


def greedy(engine, prompts, slots: int, chunk: int = 0) -> list[list[int]]:
    params = sampling.SamplingParams(temperature=0.0, max_new_tokens=NEW)
    rows = [RowState(prompt_ids=p, params=params, rng=np.random.default_rng(0), eos_ids=frozenset()) for p in prompts]
    run_rows(engine, rows, slots, prefill_chunk=chunk)
    return [r.output_ids for r in rows]


@pytest.mark.parametrize("slots, chunk", [(2, 4), (3, 3), (1, 0), (4, 5)])
@pytest.mark.parametrize("graph", ["compiled", "onnx"])
def test_in_flight_with_chunked_prompts_each_row_is_alone(hybrid, tiny_engine, slots, chunk, graph):
    """On our MambaScan kernel (the compiled form) and in standard ops (llm.onnx, as without the kernels)."""
    _, engine, answers = hybrid
    if graph == "onnx":
        engine = load_engine(tiny_engine("granite4-h"), graph="onnx")
    assert greedy(engine, PROMPTS, slots, chunk) == answers


def test_prompts_go_in_steps_of_at_most_recurrent_chunk(hybrid, monkeypatch):
    """The scan's step costs tokens x tokens a head: prompts are cut (here at 4 tokens) with nothing else
    running too, in beam search as well, and the answers stay transformers'."""
    from tests.parity.test_beam_search import hf_beams, same
    from trtllm.runtime import beam

    ckpt, engine, answers = hybrid
    widths, real = [], engine.step
    monkeypatch.setattr(engine, "step", lambda inputs, *a, **k: widths.append(inputs.input_ids.shape[1]) or
                        real(inputs, *a, **k))
    monkeypatch.setattr(generate, "RECURRENT_CHUNK", 4)
    monkeypatch.setattr(beam, "RECURRENT_CHUNK", 4)
    assert greedy(engine, PROMPTS, 4) == answers
    # (22- and 14-token prompts: 4 pieces a step; a last piece of one token joins the one before)
    assert max(widths) <= 5 and sum(w > 1 for w in widths) >= 8
    widths.clear()
    p = beam.BeamParams(3, 8, frozenset())
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    assert same(beam.run(engine, PROMPTS[1], p), hf_beams(model, PROMPTS[1], p))
    assert max(widths) <= 5 and len(widths) > 8


def test_the_same_prompt_twice_computes_both(hybrid):
    """Rows admitted together with one prompt: each computes its own (a neighbour's KV copied in would
    come with a state past what was copied)."""
    _, engine, answers = hybrid
    assert greedy(engine, [PROMPTS[1], PROMPTS[1], PROMPTS[0]], 3) == [answers[1], answers[1], answers[0]]


def test_wrong_variant_parked_pads_taken_into_the_state_miss(hybrid, monkeypatch):
    """A parked row's pad (a decode step while its prompt waits for its next chunk) fed as a token:
    its state then holds a token its prompt does not, and its answer is not transformers'."""
    _, engine, answers = hybrid
    real = generate.decode_inputs
    monkeypatch.setattr(generate, "decode_inputs", lambda *args: real(*args[:4], False))
    assert greedy(engine, PROMPTS, 3, 3) != answers


def test_the_manifest_and_graph(hybrid, tiny_engine):
    """KV for the attention layer alone, two state buffers per Mamba layer; the graph lints for TensorRT.
    Each past_state has one reader in both graphs (ONNX Runtime's compiled one too): present_state is the
    same buffer, written by a node that only a reader it descends from is sure to follow (a second
    reader of the SSM state, the output's, ran after the write: every decoded token off by up to 0.7)."""
    import onnx

    _, engine, _ = hybrid
    model = engine.manifest.model
    assert model.kv_layers == ((2, 16),)
    assert model.state_shapes == ((3, 128 + 2 * 2 * 16), (2, 4, 16, 16)) * 2
    assert lint_model(str(tiny_engine("granite4-h") / "llm.onnx")) == []
    for graph in ("llm.onnx", "llm.ort.onnx"):
        nodes = onnx.load(tiny_engine("granite4-h") / graph, load_external_data=False).graph.node
        readers = {f"past_state.{i}": sum(f"past_state.{i}" in n.input for n in nodes) for i in range(4)}
        assert set(readers.values()) == {1}, (graph, readers)


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_quantized_on_our_kernels_is_transformers_on_dequantized_weights(name, tiny_checkpoint, tmp_path):
    from tests.builder.test_quantized import dequantized_model

    ckpt = tiny_checkpoint("granite4-h")
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization=name, max_input_len=64,
                            max_kv_cache_capacity=128, verify=False), log=lambda m: None)
    prompt = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11, 12, 13]
    generated, got = engine_logits(load_engine(out), prompt, num_decode=4)
    with torch.no_grad():
        ref = dequantized_model(ckpt, QuantScheme.named(name))(torch.tensor([prompt + generated[:-1]])).logits
    np.testing.assert_allclose(got, ref[0, len(prompt) - 1:].numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("option, backend, words", [
    (dict(eagle="/draft"), "onnxruntime", "--eagle"),
    ({}, "tensorrt", "--backend tensorrt")])
def test_what_mamba_layers_are_not_built_with_is_refused(option, backend, words, hybrid):
    spec = type("Spec", (), {"architecture": "GraniteMoeHybridForCausalLM", "mamba_layers": (0, 2), "num_layers": 3})
    with pytest.raises(ConfigError, match=words):
        refuse_for_mamba(BuildConfig(model="m", output="o", **option), spec, backend)


def test_saved_prompts_context_reuse_and_guesses_are_left_aside(hybrid, tiny_engine, run_cli, tmp_path):
    """trtllm-run with a system prompt to save, --context-reuse and --spec-ngram: the same answers as
    without, nothing saved or reused (a state is not per position), and one warning for the guesses."""
    engine = tiny_engine("granite4-h")
    requests = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
                 "save_system_prompt_kv_cache": True} for text in ("hello there", "hello there", "more words")]
    payload = {"batch_size": 2, "temperature": 0, "max_generate_length": 8, "requests": requests}
    plain, body = run_cli(engine, payload)
    assert plain.exit_code == 0, plain.output
    profile, cache = tmp_path / "profile.json", tmp_path / "kv"
    for _ in range(2):
        result, again = run_cli(engine, payload, "--kv-cache-dir", str(cache), "--context-reuse", "--spec-ngram", "3",
                                "--profile", str(profile))
        assert result.exit_code == 0, result.output
        assert [r["output_text"] for r in again["responses"]] == [r["output_text"] for r in body["responses"]]
        assert json.loads(profile.read_text())["prefill"]["reused_tokens"] == 0
        assert "no system prompt's KV is saved or reused, nor --context-reuse's" in result.output
        assert "recurrent (Mamba) layers' state cannot be rolled back" in result.output
    assert not list(cache.rglob("*.kv"))  # (prefix_cache.py: an entry is <key>.kv)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_engines_pass_the_build_check(dtype, tiny_checkpoint, tmp_path):
    """Against transformers in that type (the build's check: its top-1 floor), the states float32."""
    out = build(BuildConfig(model=str(tiny_checkpoint("granite4-h")), output=str(tmp_path / "e"), dtype=dtype,
                            max_input_len=64, max_kv_cache_capacity=128), log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == dtype and manifest["model"]["state_shapes"] == [[3, 192], [2, 4, 16, 16]] * 2


def test_the_kv_manager_keeps_states_per_slot_and_refuses_copies_by_position(hybrid):
    """Zeroed, moved with their slot, copied with a beam's, their bytes counted; `read` and `write`
    (copies by position) refused."""
    from trtllm.runtime.kv_cache import KVCacheManager, bytes_for

    _, engine, _ = hybrid
    model = engine.manifest.model
    kv = KVCacheManager(model, 3, 64)
    assert [s.shape for s in kv.states] == [(3, *shape) for shape in model.state_shapes]
    assert len(kv.view(0, 2)) == 2 * len(model.kv_layers) + len(model.state_shapes)
    for s in kv.states:
        s[1] = 7.0
    owner = object()
    assert kv.acquire(owner, 8) == 0 and kv.acquire(object(), 8) == 1
    kv.release(0)
    kv.move(1, 0, 8)
    assert all((s[0] == 7.0).all() for s in kv.states)
    kv.copy_positions(np.array([2]), np.array([0]), 0, 8)
    assert all((s[2] == 7.0).all() for s in kv.states)
    kv.clear(0, 3)
    assert all(not s.any() for s in kv.states)
    assert kv.nbytes == bytes_for(model, 3, 64)
    with pytest.raises(RuntimeError, match="state per sequence"):
        kv.read(0, 4)
