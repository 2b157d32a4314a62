"""An engine directory that no build wrote (a hand-edited manifest, a missing file, a manifest from
another build beside the graph, a damaged kernel library) is refused when it loads, with one line
that names what is wrong and the command to rebuild, not failed request by request or run with
other behaviour."""
from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from trtllm.runtime import manifest as mf
from trtllm.runtime.cli import main
from trtllm.runtime.engine import load_engine

pytest.importorskip("torch")  # the tiny engine is built with the builder
pytestmark = pytest.mark.hf


def edited(tmp_path, engine, edit):
    """A copy of `engine` with edit(manifest dict) applied to its manifest.json."""
    copy = tmp_path / "engine"
    shutil.copytree(engine, copy)
    raw = json.loads((copy / mf.MANIFEST_NAME).read_text())
    edit(raw)
    (copy / mf.MANIFEST_NAME).write_text(json.dumps(raw))
    return copy


def setter(path: str, value):
    def edit(raw):
        *parents, key = path.split(".")
        node = raw
        for p in parents:
            node = node[p]
        node[key] = value
    return edit


# the manifest's own numbers and choices (manifest.check)
MANIFEST = [("limits.max_batch_size", "abc", "limits.max_batch_size must be an integer >= 1"),
            ("limits.max_batch_size", -1, "limits.max_batch_size must be an integer >= 1"),
            ("limits.max_input_len", True, "limits.max_input_len must be an integer"),
            ("max_top_k", 0, "max_top_k must be an integer >= 1"),
            ("model.num_heads", 5, "must be a multiple of model.num_kv_heads"),
            ("model.kv_dtype", "int3", "model.kv_dtype must be one of"),
            ("dtype", "float64", "dtype must be one of"),
            ("quantization", "int2", "quantization must be one of"),
            ("graph_profile", "new", "graph_profile must be one of"),
            ("eos_token_ids", [99999], "eos_token_ids must be token ids below"),
            ("eos_token_ids", ["2"], "eos_token_ids must be token ids below"),
            ("files.compiled", "/etc/passwd", "files.compiled must name a file inside the engine directory"),
            ("files.compiled", "../llm.ort.onnx", "files.compiled must name a file inside the engine directory"),
            ("model.sliding_layers", [0, 99], "model.sliding_layers must be layer indices"),
            ("model.kv_layers", [[3, 16]], "model.kv_layers must be null or 1 to"),
            ("model.kv_layers", [[2, 16]] * 9, "model.kv_layers must be null or 1 to"),
            ("model.kv_layers", [], "model.kv_layers must be null or 1 to"),
            ("model.kv_layers", [[2, "16"]], "model.kv_layers must be null or 1 to"),
            ("sizes", {"../llm.onnx": 1}, "sizes must map files inside the engine directory"),
            ("sizes", {"llm.onnx": -1}, "sizes must map files inside the engine directory"),
            ("sizes", [], "sizes must be an object")]
# numbers the graph contradicts (backends/onnxruntime.py: graph_mismatch)
GRAPH = [("model.num_layers", 1, "layers"), ("model.head_dim", 8, "the manifest says [batch"),
         ("model.kv_dtype", "float16", "model.kv_dtype float16"), ("model.vocab_size", 100000, "model.vocab_size"),
         ("max_num_logprobs", 20, "min(max_num_logprobs, max_top_k)"), ("io.input_ids", "tokens", "no input 'tokens'")]


@pytest.mark.parametrize("path, value, message", MANIFEST + GRAPH)
def test_an_edited_manifest_is_refused_when_it_loads(tmp_path, tiny_engine, path, value, message):
    engine = edited(tmp_path, tiny_engine("llama"), setter(path, value))
    with pytest.raises(mf.ManifestError, match="rebuild it: trtllm-build") as caught:
        load_engine(engine)
    assert message in str(caught.value)


# a Gemma 4 engine's KV layers (model.kv_layers: [[2, 16], [2, 32], [2, 16]]) against its graph's
KV_LAYERS = [([[2, 16], [2, 32]], "the manifest says model.kv_layers gives 2"),
             ([[2, 16], [2, 16], [2, 16]], "past_key.1 is ['batch', 2, 'kv_capacity', 32], the manifest says [batch, 2, "
                                           "capacity, 16]"),
             (None, "the manifest says model.num_layers 5")]


@pytest.mark.parametrize("value, message", KV_LAYERS)
def test_kv_layers_the_graph_contradicts_are_refused(tmp_path, tiny_engine, value, message):
    engine = edited(tmp_path, tiny_engine("gemma4"), setter("model.kv_layers", value))
    with pytest.raises(mf.ManifestError, match="rebuild it: trtllm-build") as caught:
        load_engine(engine)
    assert message in str(caught.value)


EAGLE = {"draft_step": 2, "top_k": 4, "draft_top_k": 1, "aux_layers": [0], "tree": False}


def both(*edits):
    def edit(raw):
        for e in edits:
            e(raw)
    return edit


# the LoRA and EAGLE sections (manifest.check_lora, check_eagle), and the graph's inputs they make
# the runtime feed (engine.optional_inputs_mismatch): an unfed input failed every request
SECTIONS = [
    (setter("limits.max_input_len", 100000), "limits.max_input_len (100000) must be at most limits.max_kv_cache_capacity"),
    (setter("limits.max_lora_rank", 4), "limits.max_lora_rank is 4 and the lora section is empty"),
    (setter("lora", {"sites": {}, "adapters": {}}), "limits.max_lora_rank is 0 and the lora section is present"),
    (both(setter("limits.max_lora_rank", 4), setter("lora", {"sites": {}, "adapters": {"x": "../x"}})),
     "lora.adapters.x must name a file inside the engine directory"),
    (both(setter("limits.max_lora_rank", 4), setter("lora", {"adapters": {}, "sites": {
        "o": {"in": 32, "modules": [["self_attn.o_proj", 0, 32]]}}})),
     "the graph's LoRA inputs are not those of the manifest's lora.sites"),
    (both(setter("limits.max_lora_rank", 4), setter("lora", {"adapters": {}, "sites": {"o": {"in": 32}}})),
     'lora.sites.o must be {"in": width, "modules": [[module, start, stop], ...]}'),
    (both(setter("limits.max_lora_rank", 4), setter("lora", {"adapters": {}, "sites": {
        "o": {"in": 32, "modules": [["self_attn.o_proj", 5, 2]]}}})), "lora.sites.o must be"),
    (both(setter("limits.max_lora_rank", 4), setter("lora", {"adapters": {}, "sites": {
        "o": {"in": 32, "modules": [["self_attn.o_proj", 0, 32]], "layers": [0, 99]}}})),
     "lora.sites.o.layers must be a list of layer indices below 2, got [0, 99]"),
    (setter("eagle", {**EAGLE, "draft_step": -5}), "eagle.draft_step must be an integer in [1, any], got -5"),
    (setter("eagle", {**EAGLE, "draft_top_k": 9}), "eagle.draft_top_k must be an integer in [1, 4], got 9"),
    (setter("eagle", {**EAGLE, "tree": "yes"}), "eagle.tree must be true or false"),
    (setter("eagle", {**EAGLE, "aux_layers": [-1]}), "eagle.aux_layers must be layer indices below 2"),
    (setter("eagle", {**EAGLE, "tree": True}),
     "the graph has no input 'tree_mask', which the manifest's eagle.tree calls for"),
    (both(setter("prompt_logits", False), setter("verify_sampler", False)),
     "the graph has an input 'verify_index', which the manifest's eagle section or prompt_logits does not call for"),
    (setter("prompt_logits", False), "verify_sampler needs prompt_logits"),
    (setter("prompt_logits", 1), "prompt_logits must be true or false, got 1"),
    (setter("verify_sampler", False),
     "the graph has an input 'verify_uniform', which the manifest's verify_sampler or eagle.verify does not call for"),
    (setter("verify_sampler", "yes"), "verify_sampler must be true or false, got 'yes'"),
    (setter("eagle", []), "eagle must be an object, got list"),
]


@pytest.mark.parametrize("edit, message", SECTIONS)
def test_an_edited_lora_or_eagle_section_is_refused_when_it_loads(tmp_path, tiny_engine, edit, message):
    engine = edited(tmp_path, tiny_engine("llama"), edit)
    with pytest.raises(mf.ManifestError, match="rebuild it: trtllm-build") as caught:
        load_engine(engine)
    assert message in str(caught.value)


def test_an_onnxruntime_engine_without_onnxruntime_says_so(tiny_engine, monkeypatch):
    """Python 3.10 (JetPack 6) installs the runtime without onnxruntime, which has no release there
    that reads our graphs: an ONNX Runtime engine is refused in one line, not a raw ImportError."""
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # (import onnxruntime: ModuleNotFoundError)
    monkeypatch.delitem(sys.modules, "trtllm.runtime.backends.onnxruntime", raising=False)
    with pytest.raises(mf.ManifestError, match="is an ONNX Runtime engine, but onnxruntime is not installed here"):
        load_engine(tiny_engine("llama"))


def test_the_engine_as_built_loads(tiny_engine):
    """The wrong variant's other side: every check passes on what trtllm-build writes."""
    load_engine(tiny_engine("llama")).close()


def test_an_engine_copied_in_part_is_refused_by_the_file_and_checksums_find_it(tmp_path, tiny_engine):
    """An interrupted copy (llm.onnx.data cut short) is one line naming the file and both sizes, where
    ONNX Runtime would fail on it deep in loading; sha256sum -c on the build's checksums.sha256 (every
    file, the manifest too) passes on the engine as built and names the damaged file. An edited chat
    template (a text file a user may change) loads."""
    import subprocess

    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine("llama"), engine)
    manifest = json.loads((engine / mf.MANIFEST_NAME).read_text())
    assert manifest["sizes"]["llm.onnx.data"] == (engine / "llm.onnx.data").stat().st_size
    assert set(manifest["sizes"]) == {"llm.onnx", "llm.onnx.data", "llm.ort.onnx", "llm.ort.onnx.data"}
    listed = [line.split("  ", 1)[1] for line in (engine / "checksums.sha256").read_text().splitlines()]
    assert {"manifest.json", "verify.json", "tokenizer.json", "llm.onnx.data"} <= set(listed)
    check = ["sha256sum", "-c", "--quiet", "checksums.sha256"]
    assert subprocess.run(check, cwd=engine, capture_output=True).returncode == 0
    with open(engine / "chat_template.jinja", "a") as f:
        f.write("{# edited #}")
    load_engine(engine).close()
    size = (engine / "llm.onnx.data").stat().st_size
    with open(engine / "llm.onnx.data", "r+b") as f:
        f.truncate(size - 4096)
    (tmp_path / "in.json").write_text(json.dumps({"requests": [{"messages": [{"role": "user", "content": "a"}]}]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine)])
    assert result.exit_code == 2
    assert f"llm.onnx.data is {size - 4096:,} bytes, and the build wrote {size:,} bytes" in result.output
    assert "interrupted copy" in result.output
    damaged = subprocess.run(check, cwd=engine, capture_output=True, text=True)
    assert damaged.returncode == 1 and "llm.onnx.data: FAILED" in damaged.stdout


def test_a_missing_chat_template_is_refused_not_skipped(tmp_path, tiny_engine):
    """Before, a run went on without it: the prompts lost their chat format and the answers changed."""
    engine = edited(tmp_path, tiny_engine("llama"), lambda raw: None)
    (engine / "chat_template.jinja").unlink()
    (tmp_path / "in.json").write_text(json.dumps({"requests": [{"messages": [{"role": "user", "content": "a"}]}]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine)])
    assert result.exit_code == 2 and "files.chat_template: chat_template.jinja is missing" in result.output


def test_a_damaged_kernel_library_is_one_line(tmp_path, tiny_engine, monkeypatch):
    from trtllm.plugins import cpu

    engine = tiny_engine("llama")
    assert cpu.needed_by(mf.load(engine).lowerings)
    damaged = tmp_path / "libtrtllm_cpu.so"
    damaged.write_bytes(b"\x7fELF not really")
    monkeypatch.setattr(cpu, "library", lambda: damaged)
    with pytest.raises(mf.ManifestError, match="cannot be loaded .*python -m trtllm.plugins.cpu.build --force"):
        load_engine(engine)


def test_the_tokenizer_and_template_are_read_by_the_manifest_s_names(tmp_path, tiny_engine):
    """files.tokenizer and files.chat_template name what is read; the usual names hold the wrong
    variant (another template), which a run that read them by fixed name would use."""
    def rename(raw):
        raw["files"]["tokenizer"], raw["files"]["chat_template"] = "tok.json", "chat.jinja"
    engine = edited(tmp_path, tiny_engine("llama"), rename)
    (engine / "tokenizer.json").rename(engine / "tok.json")
    (engine / "chat_template.jinja").rename(engine / "chat.jinja")
    (engine / "chat_template.jinja").write_text("WRONG {{ messages[0]['content'] }}")
    (tmp_path / "in.json").write_text(json.dumps({"requests": [{"messages": [{"role": "user", "content": "a"}],
                                                                "max_generate_length": 2, "temperature": 0}]}))
    result = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(engine), "--output",
                                       str(tmp_path / "out.json"), "--kv-cache-dir", str(tmp_path / "kv")])
    assert result.exit_code == 0, result.output
    original = CliRunner().invoke(main, [str(tmp_path / "in.json"), "--engine", str(tiny_engine("llama")),
                                         "--output", str(tmp_path / "ref.json"), "--kv-cache-dir", str(tmp_path / "kv")])
    assert original.exit_code == 0, original.output
    ours, ref = (json.loads((tmp_path / f).read_text())["responses"][0] for f in ("out.json", "ref.json"))
    assert ours["formatted_complete_request"] == ref["formatted_complete_request"] and "WRONG" not in ref[
        "formatted_complete_request"]
    assert ours["output_text"] == ref["output_text"]


def test_the_rebuild_command_is_the_engine_s_own(tmp_path):
    """The command a refusal names is the checkpoint and options the manifest records, those its
    profile sets left out: an int4 engine rebuilt as the hint said (`--model <checkpoint>`) was
    float32, and dropped its adapters and head. Unreadable, the checkpoint is the user's to name."""
    from trtllm.runtime.manifest import build_command, rebuild_hint

    config = {"profile": "cpu-default", "backend": "auto", "dtype": "float32", "quantization": "int4",
              "max_batch_size": 8, "max_input_len": 1024, "max_kv_cache_capacity": 4096, "activations": "int8",
              "eagle": "/heads/my head", "lora": [["math", "/a/math"]], "verify": True, "plan_later": False}
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"model": "/m/smol"}, "build_config": config}))
    assert build_command(tmp_path) == (f"trtllm-build --model /m/smol --output {tmp_path} --quantization int4 "
                                       "--activations int8 --max-input-len 1024 --eagle '/heads/my head' "
                                       "--lora math=/a/math")
    legacy = {**config, "profile": "tensorrt-legacy", "backend": "tensorrt", "dtype": "float16", "graph": "legacy",
              "max_batch_size": 4, "max_input_len": 1024, "max_kv_cache_capacity": 2048, "workspace_gib": 1,
              "opt_level": 3, "quantization": "none", "activations": "float32", "eagle": None, "lora": []}
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"model": "/m/smol"}, "build_config": legacy}))
    assert build_command(tmp_path) == f"trtllm-build --model /m/smol --output {tmp_path} --profile tensorrt-legacy"
    assert rebuild_hint(tmp_path, "onnxruntime").endswith("--profile tensorrt-legacy --backend onnxruntime")
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"model": "/m/smol"},
                                                        "build_config": {**legacy, "profile": "jetson-orin-jp6"}}))
    assert build_command(tmp_path) == f"trtllm-build --model /m/smol --output {tmp_path} --profile jetson-orin-jp6"
    # a rebuild for ONNX Runtime takes no TensorRT option, and no rebuild is only an export
    trt = {**legacy, "sampling_plugin": True, "plan_later": True, "opt_level": 5}
    (tmp_path / "manifest.json").write_text(json.dumps({"source": {"model": "/m/smol"}, "build_config": trt}))
    assert build_command(tmp_path, "onnxruntime") == (f"trtllm-build --model /m/smol --output {tmp_path} "
                                                      "--profile tensorrt-legacy --backend onnxruntime")
    assert build_command(tmp_path) == (f"trtllm-build --model /m/smol --output {tmp_path} --profile tensorrt-legacy "
                                       "--opt-level 5 --sampling-plugin")
    (tmp_path / "manifest.json").write_text("{")
    assert build_command(tmp_path) == f"trtllm-build --model <checkpoint> --output {tmp_path}"
    # a build's staging copy, a plan step's: the command names the engine's own directory
    assert build_command(tmp_path / ".engine.partial-x1y2") == f"trtllm-build --model <checkpoint> --output {tmp_path / 'engine'}"
    assert rebuild_hint(tmp_path / ".plan.partial-abc", "tensorrt").endswith(f"python -m trtllm.builder.plan {tmp_path}")


@pytest.mark.parametrize("built", [
    dict(dtype="bfloat16"), dict(kv_cache_dtype="int8"), dict(quantization="int4", activations="int8"),
    dict(quantization="int4", dtype="float16"), dict(quantization="int8", activations="int16", kv_cache_dtype="int8"),
])
def test_the_rebuild_without_our_kernels_is_one_the_builder_takes(built, tmp_path):
    """An engine on our CPU kernels, loaded where the library is missing, names the options that
    build it on ONNX Runtime's own: each of them the builder accepts (--cpu-kernels onnxruntime
    alone it refused for an int8 KV cache, integer activations, quantized float16)."""
    from types import SimpleNamespace

    from trtllm.builder.config import BuildConfig
    from trtllm.runtime.backends.onnxruntime import without_our_kernels

    config = BuildConfig(model=str(tmp_path), output=str(tmp_path / "e"), **built)  # (what was built)
    manifest = SimpleNamespace(dtype=config.dtype, quantization=config.quantization, build_config=config.to_json(),
                               model=SimpleNamespace(kv_dtype="int8" if config.kv_cache_dtype == "int8" else config.dtype))
    words = without_our_kernels(manifest).split()
    assert words[-2:] == ["--cpu-kernels", "onnxruntime"]
    options = {**built, **{k[2:].replace("-", "_"): v for k, v in zip(words[::2], words[1::2])}}
    BuildConfig(model=str(tmp_path), output=str(tmp_path / "e"), **options)  # not refused
