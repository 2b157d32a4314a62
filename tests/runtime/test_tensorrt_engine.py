"""The TensorRT engine (runtime/backends/tensorrt.py) against tests/fakes: refusals, device KV, profile
switching, and the same outputs as the ONNX Runtime engine built from the same checkpoint."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from tests import fakes
from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build
from trtllm.runtime.manifest import ManifestError

LIMITS = dict(max_batch_size=3, max_input_len=96, max_kv_cache_capacity=160)
PAYLOAD = {
    "batch_size": 3, "max_generate_length": 10, "temperature": 0,
    "requests": [
        {"messages": [{"role": "user", "content": "hello there"}]},
        {"messages": [{"role": "user", "content": "a longer prompt with more words in it"}],
         "temperature": 0.8, "seed": 3, "top_p": 0.9, "num_logprobs": 3},
        {"messages": [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "x"}],
         "top_k": 5, "temperature": 1.0, "seed": 7, "n": 2, "save_system_prompt_kv_cache": True},
        {"messages": [{"role": "user", "content": "a fourth request joins in flight"}], "repetition_penalty": 1.3,
         "num_logprobs": 2},
    ],
}


@pytest.fixture(scope="module")
def engines(tiny_checkpoint, tmp_path_factory):
    """ONNX Runtime engine, TensorRT engines with the modern graph and the legacy graph (fake TRT 10.3)."""
    root, ckpt = tmp_path_factory.mktemp("trt"), str(tiny_checkpoint("qwen2"))
    build(BuildConfig(model=ckpt, output=str(root / "ort"), backend="onnxruntime", **LIMITS), log=lambda m: None)
    with fakes.installed():
        build(BuildConfig(model=ckpt, output=str(root / "modern"), backend="tensorrt", **LIMITS), log=lambda m: None)
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        build(BuildConfig(model=ckpt, output=str(root / "legacy"), backend="tensorrt", graph="legacy",
                          trt_version="10.3", **LIMITS), log=lambda m: None)
    return root


def outputs(run_cli, engine, *extra):
    result, out = run_cli(engine, PAYLOAD, *extra)
    assert result.exit_code == 0, result.output
    return out["responses"]


def same(a, b):
    """Token-exact text and finish reasons; logprobs within fp32 tolerance (the graphs differ:
    ONNX Runtime runs its lowered form, the fake TensorRT the canonical llm.onnx)."""
    assert [(r["output_text"], r["finish_reason"], r["batch_idx"]) for r in a] == \
           [(r["output_text"], r["finish_reason"], r["batch_idx"]) for r in b]
    for x, y in zip(a, b):
        for px, py in zip(x.get("logprobs") or [], y.get("logprobs") or []):
            assert [t["token_id"] for t in px] == [t["token_id"] for t in py]
            xs, ys = [t["logprob"] for t in px], [t["logprob"] for t in py]
            assert [v is None for v in xs] == [v is None for v in ys]  # -inf (a guide's mask) is null
            np.testing.assert_allclose([v for v in xs if v is not None], [v for v in ys if v is not None], atol=1e-4)


@pytest.mark.parametrize("graph", ["modern", "legacy"])
def test_same_outputs_as_onnxruntime(engines, run_cli, tmp_path, graph):
    env = {"FAKE_TRT_VERSION": "10.3.0.30"} if graph == "legacy" else {}
    want = outputs(run_cli, engines / "ort")
    with fakes.installed(**env):
        same(outputs(run_cli, engines / graph), want)
        # saved system-prompt KV: written from device memory, then restored into it
        cache = ["--kv-cache-dir", str(tmp_path / "kv")]
        same(outputs(run_cli, engines / graph, *cache), want)
        assert list((tmp_path / "kv").iterdir())
        same(outputs(run_cli, engines / graph, *cache), want)


def test_a_kv_update_that_is_not_copied_back_is_caught(engines, run_cli, monkeypatch):
    """The deliberately wrong variant: the legacy graph's present_* never reaches the cache."""
    from trtllm.runtime.backends import tensorrt as backend

    want = outputs(run_cli, engines / "ort")
    real = backend.TensorRTEngine.bind_kv
    monkeypatch.setattr(backend.TensorRTEngine, "bind_kv", lambda self, kv: (real(self, kv), [])[1])
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):
        with pytest.raises(AssertionError):
            same(outputs(run_cli, engines / "legacy"), want)


@pytest.mark.parametrize("graph, wrong", [("modern", "copy"), ("legacy", "in_place")])
def test_the_plan_decides_the_kv_binding(engines, run_cli, tmp_path, graph, wrong):
    """A manifest whose kv_update disagrees with its plan (as TensorRT reports it through
    get_aliased_input_tensor) still runs right: the plan decides how present_* is bound."""
    import shutil

    engine = tmp_path / graph
    shutil.copytree(engines / graph, engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    manifest["tensorrt"]["kv_update"] = wrong
    (engine / "manifest.json").write_text(json.dumps(manifest))
    env = {"FAKE_TRT_VERSION": "10.3.0.30"} if graph == "legacy" else {}
    want = outputs(run_cli, engines / "ort")
    with fakes.installed(**env):
        same(outputs(run_cli, engine), want)


@pytest.mark.parametrize("graph", ["modern", "legacy"])
def test_without_the_alias_query_the_manifest_decides(engines, run_cli, monkeypatch, graph):
    """A TensorRT whose engine cannot report aliases (no get_aliased_input_tensor): the manifest's
    kv_update says how present_* is bound."""
    env = {"FAKE_TRT_VERSION": "10.3.0.30"} if graph == "legacy" else {}
    want = outputs(run_cli, engines / "ort")
    with fakes.installed(**env):
        import tensorrt

        monkeypatch.delattr(tensorrt.ICudaEngine, "get_aliased_input_tensor")
        same(outputs(run_cli, engines / graph), want)


def test_the_profile_counts_the_legacy_graphs_kv_copy(engines, run_cli, tmp_path):
    profiles = {}
    for graph in ("modern", "legacy"):
        with fakes.installed(**({"FAKE_TRT_VERSION": "10.3.0.30"} if graph == "legacy" else {})):
            outputs(run_cli, engines / graph, "--profile", str(tmp_path / f"{graph}.json"))
        profiles[graph] = json.loads((tmp_path / f"{graph}.json").read_text())["kv_cache"]
    assert "present_copy_bytes" not in profiles["modern"]
    assert 0 < profiles["legacy"]["present_copy_bytes"] <= profiles["legacy"]["allocated_bytes"]


@pytest.mark.parametrize("integrated", ["0", "1"])
def test_the_profile_has_edge_llms_device_memory_keys(engines, run_cli, tmp_path, integrated):
    """--profile on TensorRT writes Edge-LLM's peak_gpu_memory_bytes/_mb, or on an integrated GPU
    (Jetson) peak_unified_memory_bytes/_mb: the device memory in use, at least the KV cache's."""
    with fakes.installed(FAKE_GPU_INTEGRATED=integrated):
        outputs(run_cli, engines / "modern", "--profile", str(tmp_path / "p.json"))
    profile = json.loads((tmp_path / "p.json").read_text())
    key, other = ("peak_unified_memory", "peak_gpu_memory")[::1 if integrated == "1" else -1]
    assert f"{other}_bytes" not in profile
    assert profile[f"{key}_bytes"] >= profile["kv_cache"]["allocated_bytes"] > 0
    assert profile[f"{key}_mb"] == profile[f"{key}_bytes"] / 2**20


def test_profiles_switch_between_prefill_and_decode(engines):
    from trtllm.runtime import sampling
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, run_rows

    with fakes.installed():
        engine = load_engine(engines / "modern")
        switches = []
        real = engine.context.set_optimization_profile_async
        engine.context.set_optimization_profile_async = lambda i, s: switches.append(i) or real(i, s)
        params = sampling.SamplingParams(temperature=0.0, max_new_tokens=4)
        rows = [RowState(prompt_ids=[5, 6, 7, 8], params=params, rng=np.random.default_rng(0), eos_ids=frozenset())]
        run_rows(engine, rows)
        assert switches == [0, 1] and len(rows[0].output_ids) == 4
        engine.close()


def test_a_freed_slot_does_not_keep_its_last_requests_logit_bias(engines):
    """A request admitted into a freed slot is prefilled alone (its sampler rows go to device row
    0); the device row of its own slot must not keep the previous request's [B, V] rows."""
    from trtllm.runtime import sampling
    from trtllm.runtime.generate import RowState, run_rows

    def row(prompt, n, **kw):
        params = sampling.SamplingParams(temperature=0.0, max_new_tokens=n, **kw)
        return RowState(prompt_ids=prompt, params=params, rng=np.random.default_rng(0), eos_ids=frozenset())

    def batched_and_alone(engine):
        rows = [row([10, 11, 12], 12), row([20, 21], 1, logit_bias={5: 100.0}), row([30, 31, 32], 6)]
        run_rows(engine, rows, 2)  # the third takes the second's slot when it is done
        alone = row([30, 31, 32], 6)
        run_rows(engine, [alone], 1)
        return rows[2].output_ids, alone.output_ids

    from trtllm.runtime.engine import load_engine

    ort = load_engine(engines / "ort")
    want, want_alone = batched_and_alone(ort)
    ort.close()
    assert want == want_alone and 5 not in want
    with fakes.installed():
        engine = load_engine(engines / "modern")
        assert batched_and_alone(engine) == (want, want)
        engine.close()


def test_shape_outside_the_profile_names_the_limits(engines):
    from trtllm.runtime import sampling
    from trtllm.runtime.engine import StepInputs, load_engine

    with fakes.installed():
        engine = load_engine(engines / "modern")
        m = engine.manifest
        kv = engine.make_kv_cache(m.model, 4, 160)
        batch = sampling.empty_batch(4, m.model.vocab_size, 1, m.max_top_k)
        ids = np.ones((4, 2), np.int64)  # batch 4 > max_batch_size 3
        step = StepInputs(ids, np.tile(np.arange(2), (4, 1)), np.zeros(4, np.int64), np.ones(4, np.int64), batch)
        with pytest.raises(RuntimeError, match=r"rejected shape \(4, 2\) for input_ids .* \(1, 1\) to \(3, 96\)"):
            engine.step(step, kv.view(0, 4))
        engine.close()


def test_device_kv_read_write_round_trip(engines):
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.kv_cache import KVCacheManager

    with fakes.installed():
        engine = load_engine(engines / "modern")
        m = engine.manifest
        kv = engine.make_kv_cache(m.model, 2, 16)   # capacity is the plan's static one, not 16
        assert kv.capacity == 160 and kv.nbytes == 2 * 2 * m.model.num_layers * m.model.num_kv_heads * 160 * \
            m.model.head_dim * 4
        data = np.random.default_rng(0).standard_normal((2 * m.model.num_layers, m.model.num_kv_heads, 7,
                                                         m.model.head_dim)).astype(np.float32)
        kv.write(1, data)
        np.testing.assert_array_equal(kv.read(1, 7), data)
        assert not kv.read(0, 7).any()  # the other slot is untouched
        # a token tree's accepted branch: position 5's K and V into position 1, every layer and head,
        # as the host cache moves it
        host = KVCacheManager(m.model, 2, 7)
        host.write(1, data)
        kv.move_position(1, 5, 1)
        host.move_position(1, 5, 1)
        moved = kv.read(1, 7)
        np.testing.assert_array_equal(moved, host.read(1, 7))
        np.testing.assert_array_equal(moved[:, :, 1], data[:, :, 5])
        np.testing.assert_array_equal(np.delete(moved, 1, axis=2), np.delete(data, 1, axis=2))
        assert not kv.read(0, 7).any()
        kv.grow(160)  # at its capacity already: nothing to do
        kv.limit = 320
        with pytest.raises(RuntimeError, match="cannot grow past the plan's capacity 160"):
            kv.grow(320)  # the scheduler never asks (its limit is the plan's), and device buffers cannot
        engine.close()


def test_refused_without_tensorrt(engines, run_cli):
    result, out = run_cli(engines / "modern", PAYLOAD)
    assert result.exit_code == 2 and out is None
    line = result.output.strip().splitlines()[-1]
    assert "is a TensorRT engine, but TensorRT does not import here" in line
    # the command to run again: the checkpoint and the options the manifest records, for ONNX Runtime
    model = json.loads((engines / "modern" / "manifest.json").read_text())["source"]["model"]
    assert f"trtllm-build --model {model} --output {engines / 'modern'}" in line and "--backend onnxruntime" in line
    assert "--max-kv-cache-capacity 160" in line


@pytest.mark.parametrize("env, message", [
    ({"FAKE_TRT_VERSION": "10.16.1.2"}, "was built with TensorRT 10.16.0.1, this machine has 10.16.1.2"),
    ({"FAKE_GPU_NAME": "Orin", "FAKE_GPU_CC": "8.7"}, r"was built for Fake H200 \(compute capability 9.0\), "
                                                      r"this machine has Orin \(8.7\)"),
])
def test_plan_from_another_tensorrt_or_gpu_is_refused(engines, env, message):
    from trtllm.runtime.engine import load_engine

    with fakes.installed(**env):
        with pytest.raises(ManifestError, match=message) as err:
            load_engine(engines / "modern")
    # the engine's own build command, on TensorRT, with its limits: a plain rebuild would differ
    assert " --backend tensorrt --max-batch-size " in str(err.value)
    assert str(err.value).count(" (on this machine), or only its plan: python -m trtllm.builder.plan ") == 1


def test_no_execution_context_is_one_message_at_load(engines):
    """TensorRT returns no context where it cannot make one (device memory): the load says so, not
    every request with an AttributeError."""
    from trtllm.runtime.engine import load_engine

    with fakes.installed(FAKE_TRT_NO_CONTEXT="1"):
        with pytest.raises(ManifestError, match=r"could not create an execution context .* device memory.* "
                                                 r"--max-kv-cache-capacity.*rebuild it: trtllm-build --model "):
            load_engine(engines / "modern")


def test_runtime_modules_do_not_import_tensorrt(engines):
    import subprocess
    import sys

    code = ("import sys; import trtllm.runtime.backends.tensorrt, trtllm.runtime.engine, trtllm.runtime.cli; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'cuda'))))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(fakes.FAKES)})
    assert json.loads(out.stdout) == []


def test_plan_with_the_sampling_plugin_needs_it_registered(engines, tmp_path):
    import shutil

    from trtllm.runtime import manifest as mf
    from trtllm.runtime.engine import load_engine

    engine = tmp_path / "engine"
    shutil.copytree(engines / "modern", engine)
    m = mf.load(engine)
    mf.save(dataclasses.replace(m, tensorrt={**m.tensorrt, "plugins": ["trtllm::Sample"]}), engine)
    with fakes.installed():
        with pytest.raises(ManifestError, match="runs its sampler as a TensorRT plugin: .*without --sampling-plugin"):
            load_engine(engine)


def test_a_sampling_plugin_plan_feeds_the_plugin_int32_seen(engines, tiny_checkpoint, tmp_path, run_cli, monkeypatch):
    """TensorRT plugins take no BOOL tensor, so a --sampling-plugin plan's graph casts `seen` to int32
    before each trtllm::Sample node (the network's input stays BOOL). The fake has no tensorrt.plugin
    and runs the op's ONNX body, which takes either: the answers are the ONNX Runtime engine's."""
    import onnx

    from trtllm.builder import tensorrt as trt_build
    from trtllm.plugins.sample import schema, trt_plugin
    from trtllm.runtime import manifest as mf

    monkeypatch.setattr(trt_plugin, "register", lambda: None)  # (the fake TensorRT has no tensorrt.plugin)
    with fakes.installed():
        engine = build(BuildConfig(model=str(tiny_checkpoint("qwen2")), output=str(tmp_path / "plugin"),
                                   backend="tensorrt", sampling_plugin=True, **LIMITS), log=lambda m: None)
        assert mf.load(engine).tensorrt["plugins"] == [trt_plugin.PLUGIN_ID]
        profiles = [trt_build.Profile(p["name"], {k: tuple(map(tuple, v)) for k, v in p["shapes"].items()})
                    for p in mf.load(engine).tensorrt["profiles"]]
        model = onnx.load_from_string(trt_build.pinned_model(engine / "llm.onnx", profiles, sample_plugin=True))
        made = {o: n for n in model.graph.node for o in n.output}
        samples = [n for n in model.graph.node if n.op_type == schema.OP and n.domain == schema.DOMAIN]
        assert samples and all(made[n.input[3]].op_type == "Cast" and made[n.input[3]].input[0] == "seen"
                               and made[n.input[3]].attribute[0].i == onnx.TensorProto.INT32 for n in samples)
        assert next(i for i in model.graph.input if i.name == "seen").type.tensor_type.elem_type == onnx.TensorProto.BOOL
        same(outputs(run_cli, engine), outputs(run_cli, engines / "ort"))


def test_decode_uploads_only_the_vocabulary_rows_that_changed(engines):
    """The [B, V] sampler inputs go to the device when a row is admitted or penalised, not every step."""
    from trtllm.runtime import sampling
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, run_rows

    with fakes.installed():
        from cuda.bindings import runtime as cudart

        engine = load_engine(engines / "modern")
        vocab = engine.manifest.model.vocab_size
        uploads: list[int] = []
        real = cudart.cudaMemcpyAsync

        def counting(dst, src, nbytes, kind, stream):
            if kind == cudart.cudaMemcpyKind.cudaMemcpyHostToDevice:
                uploads.append(nbytes)
            return real(dst, src, nbytes, kind, stream)

        cudart.cudaMemcpyAsync = counting
        steps = []
        real_step = engine.step
        engine.step = lambda *a, **k: (steps.append(len(uploads)), real_step(*a, **k))[1]
        plain = sampling.SamplingParams(temperature=0.0, max_new_tokens=6)
        penalised = sampling.SamplingParams(temperature=0.0, max_new_tokens=6, repetition_penalty=1.3)
        rows = [RowState(prompt_ids=[5 + k, 6, 7, 8], params=p, rng=np.random.default_rng(0), eos_ids=frozenset())
                for k, p in enumerate((plain, plain, penalised))]  # other prompts: one prefill step, none shared
        run_rows(engine, rows)
        steps.append(len(uploads))
        per_step = [sum(uploads[a:b]) for a, b in zip(steps, steps[1:])]
        vocab_bytes = vocab * (4 + 4 + 1)                       # logit_bias, penalty_bias, seen: one row
        assert per_step[0] >= 3 * vocab_bytes                    # the prefill takes every row
        assert all(vocab_bytes <= n < 2 * vocab_bytes for n in per_step[1:])  # then only the penalised row
        engine.close()


@pytest.mark.parametrize("graph", ["modern", "legacy"])
def test_a_chunked_prompt_on_tensorrt_answers_as_on_onnxruntime(engines, run_cli, graph):
    """A long prompt that joins in flight, prefilled in chunks of 16 between decode steps (its
    device KV slot parked in them): the answers of the ONNX Runtime engine, which prefills it whole."""
    long = {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(12))}],
            "temperature": 0.9, "seed": 2, "num_logprobs": 2}
    payload = {**PAYLOAD, "batch_size": 2, "max_generate_length": 12,
               "requests": [{"messages": [{"role": "user", "content": "hi"}], "max_generate_length": 1},
                            {"messages": [{"role": "user", "content": "keep going"}]}, long]}
    result, want = run_cli(engines / "ort", payload, "--prefill-chunk", "0")
    assert result.exit_code == 0, result.output
    env = {"FAKE_TRT_VERSION": "10.3.0.30"} if graph == "legacy" else {}
    runs = {}
    for chunk in ("16", "0"):
        with fakes.installed(**env):
            result, got = run_cli(engines / graph, payload, "--prefill-chunk", chunk, "--profile",
                                  str(engines / f"chunk-{graph}.json"))
        assert result.exit_code == 0, result.output
        same(got["responses"], want["responses"])
        runs[chunk] = json.loads((engines / f"chunk-{graph}.json").read_text())["prefill"]["total_runs"]
    assert runs["16"] >= runs["0"] + 2  # the long prompt took three or more steps, not one


def test_guided_requests_on_tensorrt_answer_as_on_onnxruntime(engines, run_cli):
    """guided_decoding's mask rides on the logit_bias rows, which the TensorRT engine uploads when a
    row's version changes: every step of a guided row, next to an unguided one."""
    payload = {**PAYLOAD, "batch_size": 3, "temperature": 0, "max_generate_length": 16, "requests": [
        {"messages": [{"role": "user", "content": "a list"}], "guided_decoding": {"regex": "[a-e]{2,4}(, [a-e]{2,4})*\\."}},
        {"messages": [{"role": "user", "content": "pick"}], "guided_decoding": {"choice": ["yes", "no", "maybe"]},
         "temperature": 1.0, "seed": 4, "num_logprobs": 2},
        {"messages": [{"role": "user", "content": "free text"}]}]}
    result, want = run_cli(engines / "ort", payload)
    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"[a-e]{2,4}(, [a-e]{2,4})*\.?", want["responses"][0]["output_text"])
    with fakes.installed():
        result, got = run_cli(engines / "modern", payload)
    assert result.exit_code == 0, result.output
    same(got["responses"], want["responses"])


def test_a_refused_profile_switch_is_an_error(engines, monkeypatch):
    """TensorRT's binding raises "Error in set optimization profile async." where the switch is
    refused (its C++ call says false; a review found the Python binding never returns False): the
    step fails there, naming the profile, not later at a shape that profile does not take."""
    from trtllm.runtime.backends import tensorrt as backend
    from trtllm.runtime.engine import load_engine

    def refused(self, index, stream):
        raise RuntimeError("Error in set optimization profile async.")

    with fakes.installed():
        engine = load_engine(engines / "modern")
        monkeypatch.setattr(type(engine.context), "set_optimization_profile_async", refused)
        want = backend.PREFILL if engine.profile != backend.PREFILL else backend.DECODE
        with pytest.raises(RuntimeError, match=f"refused to switch the execution context to optimization profile {want} "
                                               r"\((prefill|decode)\): Error in set optimization profile async"):
            engine.set_profile(2 if want == backend.PREFILL else 1)


def test_a_failed_row_is_cleared_on_the_device_and_its_slot_reused(engines):
    """A row that fails (its bans leave no token) has its slot's KV zeroed (kv_cache.py clear: it may
    be NaN) on the device: the host version assigned into device buffers and took the run down. The
    next request in that slot answers as on the ONNX Runtime engine."""
    from trtllm.runtime import sampling
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, Timing, run_rows

    stuck = sampling.SamplingParams(temperature=0, max_new_tokens=6, allowed_token_ids=frozenset({77}),
                                    bad_words=((77, 77),))
    free = sampling.SamplingParams(temperature=0, max_new_tokens=6)

    def answers(engine_dir):
        rows = [RowState(prompt_ids=[5, 6, 7 + i], params=p, rng=np.random.default_rng(0), eos_ids=frozenset())
                for i, p in enumerate([stuck, free, stuck, free])]
        run_rows(load_engine(engine_dir), rows, 1, Timing())
        return [(r.output_ids, r.finish_reason) for r in rows]

    want = answers(engines / "ort")
    with fakes.installed():
        assert answers(engines / "modern") == want
    assert [f for _, f in want] == ["error", "max-length", "error", "max-length"]


def test_beam_search_runs_on_tensorrt(engines, run_cli, tiny_checkpoint, monkeypatch):
    """Beam search on a TensorRT engine: the beams' KV is reordered on the device (DeviceKVCache
    copy_positions: each slot's positions from the beam it extends, through a scratch buffer, as
    slots trade places). The hypotheses and scores are the ONNX Runtime engine's, and transformers'
    (tests/parity/test_beam_search.py); several searches share steps, shaped ones (logit_bias,
    bad_words) too. The wrong variant, beams that keep their own slot's KV, differs."""
    import torch
    import transformers

    from tests.parity.test_beam_search import hf_beams, same
    from trtllm.runtime import beam
    from trtllm.runtime.backends.tensorrt import DeviceKVCache
    from trtllm.runtime.engine import load_engine

    prompts = [[5, 17, 42, 99, 7], list(range(30, 52))]
    jobs = [(prompts[0], beam.BeamParams(3, 10, frozenset())), (prompts[1], beam.BeamParams(2, 10, frozenset(),
                                                                                          length_penalty=0.5)),
            (prompts[0], beam.BeamParams(3, 10, frozenset(), logit_bias=((77, 2.0),), bad_words=((5, 9),)))]
    want = beam.run_many(load_engine(engines / "ort"), jobs)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_checkpoint("qwen2"), dtype=torch.float32).eval()
    assert all(same(found, hf_beams(model, prompt, p)) for (found, _), (prompt, p) in zip(want, jobs))
    with fakes.installed():
        engine = load_engine(engines / "modern")
        got = beam.run_many(engine, jobs)
        assert [[(h.tokens, round(h.score, 4)) for h in f] for f, _ in got] == \
               [[(h.tokens, round(h.score, 4)) for h in f] for f, _ in want]
        _, out = run_cli(engines / "modern", {"max_generate_length": 8, "temperature": 0, "requests": [
            {"messages": [{"role": "user", "content": "hello there"}], "num_beams": 3, "n": 2, "num_logprobs": 2}]})
        _, ort = run_cli(engines / "ort", {"max_generate_length": 8, "temperature": 0, "requests": [
            {"messages": [{"role": "user", "content": "hello there"}], "num_beams": 3, "n": 2, "num_logprobs": 2}]})
        assert "error" not in out["responses"][0], out["responses"][0].get("error")
        same_answers = [(r["output_ids"], r["finish_reason"]) for r in out["responses"]]
        assert same_answers == [(r["output_ids"], r["finish_reason"]) for r in ort["responses"]]
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"):  # the legacy graph: KV written out of place, copied back
        legacy = beam.run_many(load_engine(engines / "legacy"), jobs)
        assert [[h.tokens for h in f] for f, _ in legacy] == [[h.tokens for h in f] for f, _ in want]
    with fakes.installed():
        engine = load_engine(engines / "modern")
        monkeypatch.setattr(DeviceKVCache, "copy_positions", lambda self, dst, src, start, stop: None)
        assert [[h.tokens for h in f] for f, _ in beam.run_many(engine, jobs)] != [[h.tokens for h in f] for f, _ in want]


def test_a_tensorrt_engine_missing_its_plan_names_the_tensorrt_build(engines, tmp_path):
    """The manifest's checks of a TensorRT engine say to rebuild it with --backend tensorrt: the plain
    command, on a machine without a GPU, would build an ONNX Runtime engine in its place."""
    import shutil

    from trtllm.runtime.engine import load_engine

    engine = tmp_path / "engine"
    shutil.copytree(engines / "modern", engine)
    (engine / "llm.plan").unlink()
    with fakes.installed(), pytest.raises(ManifestError, match=r"llm\.plan is missing; rebuild it: trtllm-build "
                                                               r".* --backend tensorrt .*\(on this machine\)"):
        load_engine(engine)
