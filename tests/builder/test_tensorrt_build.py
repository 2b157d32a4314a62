"""trtllm-build's TensorRT path: profiles, build profiles from configs/, backend choice, and the build
itself against tests/fakes/tensorrt (TensorRT's API contract, executed through ONNX Runtime)."""
from __future__ import annotations

import json
import re

import onnx
import pytest
from click.testing import CliRunner

from tests import fakes
from trtllm.builder import tensorrt as trt_build
from trtllm.builder.cli import main as build_main
from trtllm.builder.config import PROFILES, BuildConfig, ConfigError, profile_defaults
from trtllm.builder.export import build
from trtllm.runtime.manifest import GraphIO, Limits, ModelShape, load

LIMITS = dict(max_batch_size=4, max_input_len=128, max_kv_cache_capacity=256)
SHAPE = ModelShape(vocab_size=400, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16)


def build_trt(ckpt, out, env=None, **options):
    logs: list[str] = []
    with fakes.installed(**(env or {})):
        config = BuildConfig(model=str(ckpt), output=str(out), backend="tensorrt", **{**LIMITS, **options})
        build(config, log=logs.append)
    return logs


def test_profiles_come_from_the_limits():
    io = GraphIO()
    prefill, decode = trt_build.optimization_profiles(Limits(**LIMITS), SHAPE, io)
    assert (prefill.name, decode.name) == ("prefill", "decode")
    assert prefill.shapes[io.input_ids] == ((1, 1), (4, 64), (4, 128))
    assert decode.shapes[io.input_ids] == ((1, 1), (4, 1), (4, 1))
    for p in (prefill, decode):
        lo, opt, hi = p.shapes[io.past_key.format(i=1)]
        assert lo == (1, 2, 256, 16) and opt == hi == (4, 2, 256, 16)  # static capacity, batch 1..4
        assert p.shapes[io.logit_bias] == ((1, 400), (4, 400), (4, 400))


def test_static_axes_come_from_the_profiles():
    """The KV capacity (symbolic in the ONNX) becomes static in the network; batch and sequence,
    which the profiles vary, stay dynamic; an axis already static is left alone."""
    io = GraphIO()
    profiles = trt_build.optimization_profiles(Limits(**LIMITS), SHAPE, io)
    kv = io.past_key.format(i=0)
    assert trt_build.static_shape((-1, 2, -1, 16), kv, profiles) == (-1, 2, 256, 16)
    assert trt_build.static_shape((-1, -1), io.input_ids, profiles) == (-1, -1)
    assert trt_build.static_shape((-1, 400), io.logit_bias, profiles) == (-1, 400)
    one = trt_build.optimization_profiles(Limits(1, 1, 8), SHAPE, io)  # batch 1, one token: all static
    assert trt_build.static_shape((-1, -1), io.input_ids, one) == (1, 1)


# (a LoRA mixture of experts: its MLP sites on some layers only, the profiles' LoRA inputs as its graph's)
@pytest.mark.parametrize("arch, graph, rank", [("qwen3", "modern", 0), ("qwen3", "legacy", 0), ("qwen2_moe", "modern", 4)])
def test_profiles_cover_every_graph_input(tiny_checkpoint, tmp_path, arch, graph, rank):
    build(BuildConfig(model=str(tiny_checkpoint(arch)), output=str(tmp_path / "e"), backend="onnxruntime",
                      graph=graph, trt_version="10.3" if graph == "legacy" else "11.1", verify=False,
                      max_lora_rank=rank, **LIMITS), log=lambda m: None)
    m = load(tmp_path / "e")
    inputs = {i.name for i in onnx.load(str(tmp_path / "e" / "llm.onnx"), load_external_data=False).graph.input}
    # (an ONNX Runtime build's graph takes verify_index for prompt_logprobs and verify_uniform for prompt
    # lookup's sampled rows; a TensorRT build's does not)
    assert m.prompt_logits and m.verify_sampler and {m.io.verify_index, m.io.verify_uniform} <= inputs
    for p in trt_build.optimization_profiles(m.limits, m.model, m.io, m.lora):
        assert set(p.shapes) == inputs - {m.io.verify_index, m.io.verify_uniform}
    assert m.graph_profile == graph and any(".shared_expert." in n for n in inputs) == bool(rank)


def test_the_kv_capacity_is_static_when_the_parser_imports_the_graph(tiny_checkpoint, tmp_path):
    """TensorScatter becomes IKVCacheUpdateLayer, whose cache input needs a static sequence axis when
    the parser imports the node (the stand-in refuses it otherwise): the graph is parsed with the
    axes the profiles fix written in (pinned_model), the weights read from their files. The wrong
    variant, the graph parsed as written (the capacity symbolic), is refused."""
    out = tmp_path / "e"
    build(BuildConfig(model=str(tiny_checkpoint("qwen3")), output=str(out), backend="onnxruntime", verify=False,
                      **LIMITS), log=lambda m: None)
    m = load(out)
    profiles = trt_build.optimization_profiles(m.limits, m.model, m.io)
    pinned = onnx.load_from_string(trt_build.pinned_model(out / "llm.onnx", profiles))
    kv = next(i for i in pinned.graph.input if i.name == m.io.past_key.format(i=0))
    assert [d.dim_value if d.HasField("dim_value") else -1 for d in kv.type.tensor_type.shape.dim] == \
        [-1, m.model.num_kv_heads, LIMITS["max_kv_cache_capacity"], m.model.head_dim]
    with fakes.installed():
        import tensorrt as trt

        network = trt.Builder(trt.Logger()).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, trt.Logger())
        assert parser.parse(trt_build.pinned_model(out / "llm.onnx", profiles), str(out / "llm.onnx"))
        assert not parser.parse_from_file(str(out / "llm.onnx"))
        assert "must have a static sequence axis" in parser.get_error(0).desc()


@pytest.mark.parametrize("name", PROFILES)
def test_shipped_profiles_are_valid_configs(name):
    values = {k: v for k, v in profile_defaults(name).items() if k != "description"}
    config = BuildConfig(model="m", output="o", profile=name, **values)
    assert config.graph in ("modern", "legacy")
    if name.startswith("jetson-"):  # JetPack 6 (TensorRT 10.3) and 7.0/7.1 (10.13) cannot parse the modern graph
        assert config.backend == "tensorrt" and config.graph == "legacy"


def test_profile_options_are_checked(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"backend": "tensorrt", "max_batchsize": 2}))
    with pytest.raises(ConfigError, match=r"unknown keys \['max_batchsize'\]"):
        profile_defaults(str(bad))
    with pytest.raises(ConfigError, match="--profile must be one of"):
        profile_defaults("jetson-nano")
    for content, needle in [("5", "must be a JSON object"), ('["dtype"]', "must be a JSON object"),
                            ('{"max_batch_size": true}', '"max_batch_size" must be an integer, got true'),
                            ('{"max_batch_size": "8"}', '"max_batch_size" must be an integer, got "8"'),
                            ('{"dtype": 16}', '"dtype" must be a string'),
                            ('{"workspace_gib": "1"}', '"workspace_gib" must be a number')]:
        bad.write_text(content)
        with pytest.raises(ConfigError, match=f"--profile {bad}: .*" + re.escape(needle)):
            profile_defaults(str(bad))
    bad.write_bytes(b'{"dtype": "\xff"}')
    with pytest.raises(ConfigError, match="cannot be read as UTF-8"):
        profile_defaults(str(bad))
    bad.write_text('{"workspace_gib": 1.5, "max_batch_size": 2}')
    assert profile_defaults(str(bad)) == {"workspace_gib": 1.5, "max_batch_size": 2}
    with pytest.raises(ConfigError, match="modern graph .* needs TensorRT >= 10.15"):
        BuildConfig(model="m", output="o", graph="modern", trt_version="10.3")
    with pytest.raises(ConfigError, match="--quantization int4 needs the modern graph"):
        BuildConfig(model="m", output="o", graph="legacy", trt_version="10.3", quantization="int4")
    for version in ("abc", "9.0", "10.15.1.junk", "10"):  # refused up front, on either graph
        with pytest.raises(ConfigError, match="trt_version must be MAJOR.MINOR"):
            BuildConfig(model="m", output="o", graph="legacy", trt_version=version)
    assert BuildConfig(model="m", output="o", graph="legacy", trt_version="10.3.0").trt_version == "10.3.0"
    with pytest.raises(ConfigError, match="--workspace-gib must be > 0"):
        BuildConfig(model="m", output="o", workspace_gib=float("nan"))


def test_quantization_with_a_float16_profile_keeps_float16(tmp_path):
    """docs/tensorrt.md: --quantization with the modern profile (float16) builds int4 weights with
    float16 activations and KV cache (W4A16); with bfloat16, which does not hold its float16 scales
    exactly, it is refused."""
    from trtllm.builder.cli import resolve

    values = resolve({"quantization": "int4", "dtype": None}, "tensorrt-modern")
    assert values["dtype"] == "float16" and values["backend"] == "tensorrt"
    BuildConfig(model="m", output="o", **values)  # valid
    with pytest.raises(ConfigError, match="takes --dtype float32 or float16"):
        BuildConfig(model="m", output="o", **resolve({"quantization": "int4", "dtype": "bfloat16"}, "tensorrt-modern"))


def test_cli_flags_win_over_the_profile(tiny_checkpoint, tmp_path):
    out = tmp_path / "e"
    result = CliRunner().invoke(build_main, ["--model", str(tiny_checkpoint("llama")), "--output", str(out),
                                             "--profile", "tensorrt-legacy", "--backend", "onnxruntime",
                                             "--dtype", "float32", "--max-input-len", "64", "--no-verify"])
    assert result.exit_code == 0, result.output
    m = load(out)
    assert (m.backend, m.dtype, m.graph_profile, m.limits.max_input_len) == ("onnxruntime", "float32", "legacy", 64)
    assert m.limits.max_batch_size == profile_defaults("tensorrt-legacy")["max_batch_size"]
    assert m.build_config["profile"] == "tensorrt-legacy"


def test_backend_tensorrt_without_tensorrt_is_one_clear_line(tiny_checkpoint, tmp_path):
    result = CliRunner().invoke(build_main, ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "e"),
                                             "--backend", "tensorrt"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines[-1].startswith("error: --backend tensorrt needs TensorRT and a CUDA GPU: TensorRT is not installed")
    assert "--backend onnxruntime" in lines[-1]
    assert list(tmp_path.iterdir()) == []  # no engine, partial or not


def test_backend_auto_says_what_it_picked(tiny_checkpoint, tmp_path):
    logs: list[str] = []
    build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "a"), verify=False, **LIMITS),
          log=logs.append)
    assert "backend auto: onnxruntime (TensorRT is not installed)" in logs
    assert load(tmp_path / "a").backend == "onnxruntime"
    with fakes.installed():
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "b"), verify=False, **LIMITS),
              log=logs.append)
    assert "backend auto: tensorrt (TensorRT 10.16.0.1 on Fake H200 (sm_90))" in logs
    assert load(tmp_path / "b").backend == "tensorrt"


@pytest.mark.parametrize("option", [{"cpu_kernels": "native"}, {"activations": "int8", "quantization": "int4"}])
def test_cpu_only_options_are_refused_when_auto_picks_tensorrt(tiny_checkpoint, tmp_path, option):
    """They did nothing (--cpu-kernels native) or failed after the model was loaded (--activations)."""
    with fakes.installed(), pytest.raises(ConfigError, match="is for ONNX Runtime's CPU kernels, and --backend "
                                                             "auto picked TensorRT"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), verify=False,
                          **option, **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()


def test_build_writes_plan_and_manifest(tiny_checkpoint, tmp_path):
    cache = tmp_path / "cache" / "timing.bin"
    logs = build_trt(tiny_checkpoint("llama"), tmp_path / "e", timing_cache=str(cache), opt_level=2)
    m = load(tmp_path / "e")
    assert m.backend == "tensorrt" and m.files["plan"] == "llm.plan" and "compiled" not in m.files
    assert (tmp_path / "e" / "llm.plan").is_file() and (tmp_path / "e" / "llm.onnx").is_file()
    assert not (tmp_path / "e" / "llm.ort.onnx").exists()
    t = m.tensorrt
    assert t["version"] == "10.16.0.1" and t["gpu"] == {"name": "Fake H200", "compute_capability": "9.0"}
    assert t["graph"] == "modern" and t["kv_update"] == "in_place"
    assert [p["name"] for p in t["profiles"]] == ["prefill", "decode"]
    assert cache.is_file()  # written for the next build
    assert any("optimization level 2" in line for line in logs)
    assert json.loads((tmp_path / "e" / "verify.json").read_text())["tokens_agree"]


@pytest.mark.parametrize("stale", [b"fake-timing-cache 10.3.0.26",  # what another TensorRT wrote
                                   b"\x00 not a timing cache"])    # unreadable: create_timing_cache gives None
def test_unusable_timing_cache_is_replaced(tiny_checkpoint, tmp_path, stale):
    cache = tmp_path / "timing.bin"
    cache.write_bytes(stale)
    logs = build_trt(tiny_checkpoint("llama"), tmp_path / "e", timing_cache=str(cache))
    assert any("from another TensorRT version or GPU; starting a new one" in line for line in logs)
    assert cache.read_bytes() == b"fake-timing-cache 10.16.0.1"


def test_a_timing_cache_path_is_checked_before_the_build_and_its_save_costs_no_engine(tiny_checkpoint, tmp_path):
    """A directory is refused before any work (a Jetson's build takes minutes); a cache that cannot
    be saved after the build (a read-only place) is a note: the engine stands."""
    with pytest.raises(ConfigError, match="--timing-cache .* is a directory"):
        BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), backend="tensorrt",
                    timing_cache=str(tmp_path))
    blocked = tmp_path / "file"
    blocked.write_text("")
    logs = build_trt(tiny_checkpoint("llama"), tmp_path / "e", timing_cache=str(blocked / "timing.bin"))
    assert any("the timing cache could not be saved to" in line for line in logs)
    assert load(tmp_path / "e").tensorrt["version"] == "10.16.0.1"


def test_modern_graph_is_refused_by_an_old_tensorrt(tiny_checkpoint, tmp_path):
    with pytest.raises(trt_build.TensorRTUnavailable, match="TensorRT 10.3 cannot parse the modern graph"):
        build_trt(tiny_checkpoint("llama"), tmp_path / "e", env={"FAKE_TRT_VERSION": "10.3.0.30"})


def test_auto_refuses_the_modern_graph_on_an_old_tensorrt_before_the_export(tiny_checkpoint, tmp_path):
    """--backend auto on a JetPack 6 Orin (TensorRT 10.3) picks TensorRT: the modern graph is refused up
    front, naming what to do (it was exported whole, then failed a 17-issue lint)."""
    logs: list[str] = []
    with fakes.installed(FAKE_TRT_VERSION="10.3.0.30"), pytest.raises(
            trt_build.TensorRTUnavailable, match="TensorRT 10.3 cannot parse the modern graph .*--backend auto picked "
                                                 "it: use --profile tensorrt-legacy .*, the legacy graph, or "
                                                 "--backend onnxruntime"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), **LIMITS), log=logs.append)
    assert not any("loading" in line for line in logs) and not (tmp_path / "e").exists()


def test_a_batch_of_one_builds_and_answers(tiny_checkpoint, tmp_path, run_cli):
    """max_batch_size 1 pins the batch axis: write_index and the others become int64 [1] inputs,
    execution tensors still (nothing computes a shape from them; the stand-in took them for shape
    tensors by their type and refused the build). The answers are the ONNX Runtime engine's."""
    payload = {"temperature": 0, "max_generate_length": 6, "requests": [
        {"messages": [{"role": "user", "content": "Hello"}]}, {"messages": [{"role": "user", "content": "Paris"}]}]}
    ort = build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "ort"), backend="onnxruntime",
                            **{**LIMITS, "max_batch_size": 1}), log=lambda m: None)
    build_trt(tiny_checkpoint("llama"), tmp_path / "trt", max_batch_size=1)
    want = [r["output_ids"] for r in run_cli(ort, payload)[1]["responses"]]
    with fakes.installed():
        result, out = run_cli(tmp_path / "trt", payload)
    assert result.exit_code == 0, result.output
    assert [r["output_ids"] for r in out["responses"]] == want


def test_float32_plans_are_built_without_tf32(tiny_checkpoint, tmp_path, monkeypatch):
    """TensorRT enables TF32 by default, strongly typed networks too: the build clears it (the
    stand-in refuses a config with it, as it cannot compute TF32)."""
    seen = []
    with fakes.installed():
        import tensorrt as trt

        build_serialized = trt.Builder.build_serialized_network
        monkeypatch.setattr(trt.Builder, "build_serialized_network", lambda self, network, config: seen.append(
            set(config.flags)) or build_serialized(self, network, config))
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "e"), backend="tensorrt",
                          verify=False, **LIMITS), log=lambda m: None)
        assert seen and all(trt.BuilderFlag.TF32 not in flags for flags in seen)


def test_legacy_build_for_tensorrt_10_3(tiny_checkpoint, tmp_path):
    build_trt(tiny_checkpoint("mistral"), tmp_path / "e", env={"FAKE_TRT_VERSION": "10.3.0.30"},
              graph="legacy", trt_version="10.3")
    t = load(tmp_path / "e").tensorrt
    assert (t["version"], t["graph"], t["kv_update"], t["lint_version"]) == ("10.3.0.30", "legacy", "copy", "10.3")


def test_kv_capacity_keeps_every_slot_256_byte_aligned():
    from types import SimpleNamespace

    def shape(heads, dim, layers=None):
        return SimpleNamespace(num_kv_heads=heads, head_dim=dim, kv_layers=lambda: layers)

    demo = shape(3, 64)                                          # 384 bytes per position in float16
    assert trt_build.aligned_capacity(2048, demo, "float16") == 2048
    assert trt_build.aligned_capacity(2047, demo, "float16", log=lambda m: None) == 2046
    odd = shape(1, 6)                                            # 12 bytes per position in float16
    assert trt_build.aligned_capacity(100, odd, "float16", log=lambda m: None) == 64
    with pytest.raises(ValueError, match="below the 64 positions"):
        trt_build.aligned_capacity(63, odd, "float16")
    # layers of their own shapes (Gemma 4): every layer's slot aligned, its 12-byte rows too (16 alone: 96)
    assert trt_build.aligned_capacity(100, shape(2, 4, ((2, 4), (1, 6))), "float16", log=lambda m: None) == 64
    assert trt_build.aligned_capacity(100, shape(2, 4), "float16", log=lambda m: None) == 96


def test_sampling_plugin_needs_tensorrt_plugin_support(tiny_checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="--sampling-plugin needs --backend tensorrt"):
        BuildConfig(model="m", output="o", backend="onnxruntime", sampling_plugin=True)
    # a profile for a TensorRT before tensorrt.plugin: refused up front (the export went through and
    # only the plan step on the device failed)
    with pytest.raises(ConfigError, match="--sampling-plugin needs TensorRT >= 10.6 .* trt_version is 10.3"):
        BuildConfig(model="m", output="o", backend="tensorrt", graph="legacy", trt_version="10.3", sampling_plugin=True)
    BuildConfig(model="m", output="o", backend="tensorrt", graph="legacy", trt_version="10.13", sampling_plugin=True)
    # the stand-in TensorRT has no tensorrt.plugin (as TensorRT < 10.6): the build says so and writes nothing
    with pytest.raises(ImportError, match=r"needs tensorrt >= 10.6 with tensorrt.plugin"):
        build_trt(tiny_checkpoint("llama"), tmp_path / "e", sampling_plugin=True)
    assert not (tmp_path / "e").exists()


def test_shipped_tensorrt_profiles_lint_and_agree(tiny_checkpoint, tmp_path):
    """configs/tensorrt-modern.json, tensorrt-legacy.json and jetson-thor-jp7.json (the legacy graph
    for TensorRT 10.13), exported (ONNX Runtime backend here): each graph passes the op lint for its
    profile's TensorRT and gives the others' greedy tokens."""
    from tests.engine_helpers import run_greedy
    from trtllm.plugins.lint import lint_model
    from trtllm.runtime.engine import load_engine

    tokens = {}
    for name in ("tensorrt-modern", "tensorrt-legacy", "jetson-thor-jp7"):
        out = tmp_path / name
        result = CliRunner().invoke(build_main, ["--model", str(tiny_checkpoint("qwen2")), "--output", str(out),
                                                 "--profile", name, "--backend", "onnxruntime", "--dtype", "float32",
                                                 "--max-input-len", "64", "--max-kv-cache-capacity", "128"])
        assert result.exit_code == 0, result.output
        trt_version = profile_defaults(name)["trt_version"]
        assert lint_model(out / "llm.onnx", trt_version) == []
        assert (lint_model(out / "llm.onnx", "10.3") == []) == (name != "tensorrt-modern")
        tokens[name] = run_greedy(load_engine(out, graph="onnx"), [[5, 17, 42, 99, 7], [3, 8, 1]], 12)
    assert tokens["tensorrt-modern"] == tokens["tensorrt-legacy"] == tokens["jetson-thor-jp7"]
