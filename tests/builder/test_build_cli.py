"""trtllm-build: refused options, bad --model values, the engine directory contract, the op lint."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
from trtllm.builder.cli import main  # noqa: E402
from trtllm.plugins.lint import lint_model  # noqa: E402

pytestmark = pytest.mark.hf
ARCHS = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("args, needle", [
    (["--dtype", "bfloat16", "--cpu-kernels", "onnxruntime", "--backend", "onnxruntime"],
     "--dtype bfloat16 on ONNX Runtime runs on our CPU kernels"),
    (["--dtype", "bfloat16", "--quantization", "int8"], "takes --dtype float32 or float16"),
    # (--backend auto: refused once it picked ONNX Runtime, before the checkpoint loads: a review found it after)
    (["--dtype", "bfloat16", "--cpu-kernels", "onnxruntime"], "--dtype bfloat16 on ONNX Runtime runs on our CPU kernels"),
    (["--dtype", "float16", "--quantization", "int8", "--cpu-kernels", "onnxruntime", "--backend", "onnxruntime"],
     "runs on our CPU kernels"),
    (["--quantization", "int3"], "Invalid value for '--quantization'"),
    (["--lora", "fr=/tmp/no-such-adapter"], "--lora fr: /tmp/no-such-adapter does not exist"),
    (["--lora", "broken"], "NAME=PEFT_DIR"),
    (["--lora", "a b=/tmp/x"], "the name must be letters, digits"),
    (["--lora", "a=/tmp/x", "--lora", "a=/tmp/y"], "--lora names must be distinct"),
    (["--max-lora-rank", "-1"], "--max-lora-rank must be an integer in [0, 256]"),
    (["--max-lora-rank", "0", "--lora", "a=/tmp/x"], "--max-lora-rank 0 gives the graph no LoRA inputs"),
    (["--backend", "tensorrt"], "--backend tensorrt needs TensorRT and a CUDA GPU: TensorRT is not installed"),
    (["--profile", "jetson-nano"], "--profile must be one of cpu-default, tensorrt-modern, tensorrt-legacy, jetson-orin-jp6, jetson-thor-jp7"),
    (["--profile", "tensorrt-legacy", "--quantization", "int4"], "--quantization int4 needs the modern graph"),
    # (the profile's TensorRT, not 10.3 always, and where the legacy graph came from)
    (["--profile", "jetson-thor-jp7", "--quantization", "int8"],
     "(--profile jetson-thor-jp7 builds it, for TensorRT 10.13); a quantized TensorRT engine needs TensorRT >= 10.15"),
    # (its export's check runs llm.onnx on ONNX Runtime: no bfloat16 kernels; it failed after the export)
    (["--profile", "jetson-orin-jp6", "--plan-later", "--dtype", "bfloat16"], "--plan-later --dtype bfloat16: the export"),
    (["--graph", "modern", "--profile", "tensorrt-legacy"], "needs TensorRT >= 10.15, but trt_version is 10.3"),
    (["--opt-level", "9"], "--opt-level must be an integer in [0, 5]"),
    (["--max-batch-size", "0"], "--max-batch-size must be an integer in [1, 2147483647]"),
    (["--max-batch-size", "17"], "--max-batch-size must be at most 16: trtllm-run runs at most that many rows"),
    (["--max-batch-size", "100000000000000000000"], "(TensorRT's shapes are int32), got 100000000000000000000"),
    (["--max-input-len", "9000"], "--max-input-len must be <="),
    (["--eagle", "/tmp/no-such-head", "--max-input-len", "1"], "--eagle needs --max-input-len >= 2"),
    (["--backend", "onnxruntime", "--timing-cache", "t.cache", "--opt-level", "2"],
     "--opt-level, --timing-cache: TensorRT build options, and the backend is onnxruntime"),
    (["--activations", "int8"], "--activations int8 needs --quantization int8|int4 on ONNX Runtime"),
    (["--lm-head-quantization", "int4"], "--lm-head-quantization int4 needs --quantization int8|int4"),
    (["--max-image-tokens", "0"], "--max-image-tokens must be an integer >= 1"),
    (["--activations", "int8", "--quantization", "int4", "--backend", "tensorrt"], "--backend tensorrt"),
    (["--activations", "int4"], "Invalid value for '--activations'"),
    (["--activations", "int16", "--quantization", "int4", "--cpu-kernels", "onnxruntime"], "MatMulNBits always"),
    (["--graph", "legacy", "--cpu-kernels", "native"], "--cpu-kernels native runs the modern graph"),
    (["--profile", "tensorrt-legacy", "--backend", "onnxruntime", "--cpu-kernels", "native"],
     "--cpu-kernels native runs the modern graph"),
])
def test_refused_options(tmp_path, args, needle):
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e"), *args])
    assert result.exit_code == 2
    assert needle in result.output
    assert not (tmp_path / "e").exists()


def test_a_runtime_only_install_says_which_extra_the_build_needs(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnx" else real(name, *a))
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "trtllm-build needs onnx" in result.output
    assert 'pip install "trtllm-edge[build]"' in result.output


@pytest.mark.parametrize("rank, config, needle", [
    (300, {}, "--lora big: rank 300 is above trtllm-edge's largest LoRA rank, 256"),
    # a setting the adapter's config refuses: before the export (it came after it, 18 s into an int4 build)
    (2, {"use_dora": True}, "--lora big: "),
])
def test_adapters_refused_before_the_export_by_name(tmp_path, rank, config, needle):
    from tests.runtime.test_lora import write_adapter

    write_adapter(tmp_path / "adapter", {(0, "self_attn.q_proj"): rank}, r=rank, **config)
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e"),
                                       "--lora", f"big={tmp_path / 'adapter'}"])
    assert result.exit_code == 2 and needle in result.output, result.output
    assert "use_dora" in result.output or not config


def test_missing_model(tmp_path):
    result = CliRunner().invoke(main, ["--model", str(tmp_path / "nope"), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "no such directory" in result.output
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "config.json" in result.output
    (tmp_path / "model.safetensors").write_bytes(b"")
    for model, needle in ((tmp_path / "X.GGUF", "no such GGUF file"), (tmp_path / "model.safetensors", "is a file"),
                          ("~/no-such-checkpoint-dir", "no such directory")):
        result = CliRunner().invoke(main, ["--model", str(model), "--output", str(tmp_path / "e")])
        assert result.exit_code == 2 and needle in result.output, result.output


def test_tokenizer_past_the_embedding_table_is_refused(tmp_path, tiny_checkpoint):
    from safetensors.torch import load_file, save_file

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("llama"), ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    weights = load_file(ckpt / "model.safetensors")
    rows = config["vocab_size"] = config["vocab_size"] - 20
    weights = {k: v[:rows] if k in ("model.embed_tokens.weight", "lm_head.weight") else v for k, v in weights.items()}
    (ckpt / "config.json").write_text(json.dumps(config))
    save_file(weights, ckpt / "model.safetensors", metadata={"format": "pt"})
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and f"more than the {rows} rows of its embedding table" in result.output


def test_hub_id_offline_fails_clearly(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "trtllm.builder", "--model", "someone/some-model",
                           "--output", str(tmp_path / "e")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "someone/some-model" in proc.stderr and "offline" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("arch", ARCHS)
def test_engine_directory_contract(arch, tiny_engine):
    engine = tiny_engine(arch)
    names = {p.name for p in engine.iterdir()}
    assert {"manifest.json", "llm.onnx", "llm.onnx.data", "llm.ort.onnx", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "verify.json"} <= names
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["format_version"] == 4 and manifest["backend"] == "onnxruntime"
    assert manifest["architecture"].lower().startswith(arch)
    assert manifest["limits"] == {"max_batch_size": 4, "max_input_len": 256, "max_kv_cache_capacity": 512,
                                  "max_lora_rank": 0}
    assert manifest["eos_token_ids"] and manifest["source"]["sha256"]
    assert manifest["versions"]["onnxruntime"] and manifest["build_config"]["dtype"] == "float32"
    report = json.loads((engine / "verify.json").read_text())
    assert report["max_abs_error"] < 1e-4 and report["tokens_agree"]
    # Every exported graph passes the TensorRT op lint (11.1: the modern profile's target).
    assert lint_model(str(engine / "llm.onnx")) == []


@pytest.mark.parametrize("capacity, max_input_len, positions, agreement", [
    (16, 8, 9, 16),  # the agreement text alone is 128 tokens; the prompt check 24 + 8
    (2, 2, 2, 2),
    (1, 1, 1, 1),    # one prompt token, no decode step: still checked against transformers
])
def test_small_limits_are_verified_within_them(tmp_path, tiny_checkpoint, capacity, max_input_len, positions,
                                               agreement):
    """The build's checks fit the engine's limits, however small, then the engine answers."""
    engine = tmp_path / "engine"
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(engine),
                                       "--max-kv-cache-capacity", str(capacity),
                                       "--max-input-len", str(max_input_len)])
    assert result.exit_code == 0, result.output
    report = json.loads((engine / "verify.json").read_text())
    assert report["tokens_agree"] and report["max_abs_error"] < 1e-4
    assert report["num_positions"] == positions and report["agreement_positions"] == agreement


def test_the_model_s_position_limit_lowers_the_engine_s_and_is_named(tmp_path):
    """A model of 32 positions built for 64: its engine holds 32, and a longer prompt's error says a
    rebuild cannot raise it (it told the user to rebuild with a larger --max-input-len, which is
    lowered again). A max_position_embeddings of 0 is refused by name (it named a temporary directory)."""
    import transformers

    from tests.runtime.test_run_stdout import chat
    from tests.tiny_models import make_checkpoint
    from trtllm.runtime.cli import main as run_main

    ckpt = make_checkpoint("llama", tmp_path / "m", max_positions=32)
    engine = tmp_path / "engine"
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(engine), "--max-kv-cache-capacity", "64",
                                       "--max-input-len", "64"])
    assert result.exit_code == 0 and "lowered to the model's max_position_embeddings 32" in result.output
    (tmp_path / "in.json").write_text(json.dumps({"requests": [chat(" ".join(["hello"] * 40))]}))
    result = CliRunner().invoke(run_main, [str(tmp_path / "in.json"), "--engine", str(engine), "--output",
                                           str(tmp_path / "out.json")])
    error = json.loads((tmp_path / "out.json").read_text())["responses"][0]["error"]
    assert "more than the engine's max_input_len 32 (the model's position limit: a rebuild cannot raise it); give " \
        "truncate_prompt_tokens" in error, error
    config = transformers.AutoConfig.from_pretrained(ckpt)
    config.max_position_embeddings = 0
    config.save_pretrained(ckpt)
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(tmp_path / "zero")])
    assert result.exit_code != 0 and "config.max_position_embeddings must be an integer >= 1, got 0" in result.output


def test_tensorrt_options_without_tensorrt_are_named(tmp_path, tiny_checkpoint):
    """--backend auto without TensorRT builds for ONNX Runtime and says the TensorRT flags did nothing."""
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "e"),
                                       "--timing-cache", str(tmp_path / "t.cache"), "--no-verify"])
    assert result.exit_code == 0, result.output
    assert "warning: --timing-cache ignored: TensorRT build options, and the backend is onnxruntime" in result.output
    assert not (tmp_path / "t.cache").exists()


def test_checkpoint_missing_a_weight_is_refused(tmp_path):
    """transformers would fill the missing lm_head with random values (and the build's check would
    pass against that same random model): the build names the weight and stops."""
    from safetensors.numpy import load_file, save_file

    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("llama", tmp_path / "ckpt", tie=False)
    weights = load_file(str(ckpt / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(ckpt / "model.safetensors"))
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "lacks weights the model needs: lm_head.weight" in result.output
    assert not (tmp_path / "e").exists()


def truncated_weights(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])


def invalid_config(ckpt):
    (ckpt / "config.json").write_text("{not json")


def mlp_bias(ckpt):
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file

    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "mlp_bias": True}))
    weights = load_file(str(ckpt / "model.safetensors"))
    for name in [n for n in weights if n.endswith(("gate_proj.weight", "up_proj.weight", "down_proj.weight"))]:
        weights[name.replace(".weight", ".bias")] = np.zeros(weights[name].shape[0], weights[name].dtype)
    save_file(weights, str(ckpt / "model.safetensors"))


def unknown_model_type(ckpt):
    import json

    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "model_type": "foobar"}))


@pytest.mark.parametrize("damage, needle", [(truncated_weights, "cannot be loaded: SafetensorError"),
                                            (invalid_config, "cannot be loaded"),
                                            (unknown_model_type, "cannot be loaded"),
                                            (mlp_bias, "config.mlp_bias must be false")])
def test_a_checkpoint_that_cannot_be_built_is_exit_2_naming_model(tmp_path, damage, needle):
    """A bad checkpoint is a usage error (2) with one line naming --model, not a failed build (1)
    with a library's text."""
    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("llama", tmp_path / "ckpt")
    damage(ckpt)
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and f"--model '{ckpt}'" in result.output and needle in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "e").exists()


def test_a_base_model_without_a_chat_template_builds_and_runs(tmp_path):
    """Its tokenizer has no template, so the engine has no chat_template.jinja and the manifest does
    not list one (a listed file that is missing is refused at load); trtllm-run sends the text as it
    is, as for apply_chat_template false. The build says so (a GGUF without one built in silence;
    llama-server would use ChatML)."""
    from tests.tiny_models import make_checkpoint
    from trtllm.runtime import manifest as mf
    from trtllm.runtime.cli import main as run_main

    ckpt = make_checkpoint("llama", tmp_path / "ckpt")
    (ckpt / "chat_template.jinja").unlink()
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(tmp_path / "e"),
                                       "--max-input-len", "64", "--max-kv-cache-capacity", "128"])
    assert result.exit_code == 0, result.output
    assert "note: the checkpoint has no chat template: trtllm-run will join a request's messages" in result.output
    assert "chat_template" not in mf.load(tmp_path / "e").files and not (tmp_path / "e" / "chat_template.jinja").exists()
    (tmp_path / "in.json").write_text(json.dumps({"requests": [{"messages": [{"role": "user", "content": "hi"}]}],
                                                  "max_generate_length": 2}))
    ran = CliRunner().invoke(run_main, [str(tmp_path / "in.json"), "--engine", str(tmp_path / "e")])
    assert ran.exit_code == 0, ran.output


def test_checkpoint_without_a_tokenizer_is_refused_up_front(tmp_path):
    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("llama", tmp_path / "ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (ckpt / name).unlink(missing_ok=True)
    result = CliRunner().invoke(main, ["--model", str(ckpt), "--output", str(tmp_path / "e")])
    assert result.exit_code == 2 and "has no tokenizer (tokenizer.json" in result.output, result.output


def test_a_bad_profile_value_names_the_profile(tmp_path):
    (tmp_path / "p.json").write_text('{"max_batch_size": 0}')
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e"),
                                       "--profile", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and f'"max_batch_size" comes from --profile {tmp_path / "p.json"}' in result.output
    (tmp_path / "p.json").write_text('{"backend": "tensorrt", "trt_version": "9.2"}')  # (a key with no flag)
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e"),
                                       "--profile", str(tmp_path / "p.json")])
    assert result.exit_code == 2 and f'"trt_version" comes from --profile {tmp_path / "p.json"}' in result.output
    # a profile's setting the message only quotes as context is not blamed (a review found it was)
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e"), "--activations", "int8"])
    assert result.exit_code == 2 and "--activations int8 needs --quantization" in result.output
    assert "comes from --profile" not in result.output, result.output


@pytest.mark.parametrize("text, message", [(None, "nothere.json: no such file"),
                                           ('{"dtype": "float32", "dtype": "float16"}', '"dtype" is given twice')])
def test_a_missing_or_ambiguous_profile_file_is_named(tmp_path, text, message):
    path = tmp_path / ("nothere.json" if text is None else "p.json")
    if text is not None:
        path.write_text(text)
    result = CliRunner().invoke(main, ["--model", str(tmp_path), "--output", str(tmp_path / "e"), "--profile", str(path)])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_check_that_fails_while_the_code_changes_says_so(tmp_path, tiny_checkpoint, monkeypatch):
    """A failed check in a build whose sources (or kernel library) were edited under it is no
    numerical fault of the engine: the message and the report say what changed."""
    from trtllm.builder import provenance, verify

    def failing(*args, **kwargs):
        error = verify.VerifyError("the engine's logits differ from transformers' by 2e-3")
        error.report = {"max_abs_error": 2e-3}
        raise error

    fingerprints = iter(["before", "after"])
    monkeypatch.setattr(provenance, "code_fingerprint", lambda: next(fingerprints))
    monkeypatch.setattr(verify, "check_engine", failing)
    result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "e")])
    assert result.exit_code == 1 and "changed during the build: run it again" in result.output, result.output
    report = json.loads((tmp_path / "e.verify-failed.json").read_text())
    assert report == {"max_abs_error": 2e-3, "code": "before", "code_changed_during_build": True}


def test_a_helium_whose_heads_do_not_span_the_hidden_size_is_refused():
    """transformers' HeliumAttention projects o_proj hidden_size x hidden_size, so heads x head_dim must
    be hidden_size (transformers loads such a checkpoint and fails running it); refused by name, not
    built to fail in its MatMul."""
    from transformers import HeliumConfig

    from trtllm.builder.architectures import helium
    from trtllm.builder.checkpoint import Unsupported

    config = HeliumConfig(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    with pytest.raises(Unsupported, match=r"HeliumForCausalLM needs num_attention_heads x head_dim = hidden_size .*"
                                          r"got 4 x 32 != 64"):
        helium.spec_from_config(config)
    assert helium.spec_from_config(HeliumConfig(**{**config.to_dict(), "head_dim": 16})).head_dim == 16


def test_a_granite_4_hybrid_s_mamba_layers_are_read_and_one_without_attention_is_refused():
    """granite-4.0-h-* put Mamba-2 layers between the attention ones (config.layer_types "mamba", which
    transformers reads as linear_attention): the spec names them and their shape (builder/mamba.py); a
    config without an attention layer is refused, and so is a time step limit."""
    from transformers import GraniteMoeHybridConfig

    from trtllm.builder.architectures import granitemoehybrid
    from trtllm.builder.checkpoint import Unsupported
    from trtllm.builder.mamba import Mamba

    config = dict(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, num_local_experts=0, shared_intermediate_size=96, mamba_n_heads=4,
                  mamba_d_state=16, mamba_n_groups=2)
    hybrid = ["mamba", "attention", "mamba"]
    spec = granitemoehybrid.spec_from_config(GraniteMoeHybridConfig(**config, layer_types=hybrid))
    assert spec.mamba_layers == (0, 2) and spec.mamba == Mamba(4, 32, 16, 2, 4)
    assert spec.kv_layers() == ((2, 16),) and spec.state_shapes() == ((3, 128 + 64), (2, 2, 32, 16)) * 2
    with pytest.raises(Unsupported, match="every layer is a Mamba-2 layer"):
        granitemoehybrid.spec_from_config(GraniteMoeHybridConfig(**config, layer_types=["mamba"] * 3))
    with pytest.raises(Unsupported, match=r"time_step_limit \[0.0, 100.0\]"):
        granitemoehybrid.spec_from_config(GraniteMoeHybridConfig(**config, layer_types=hybrid,
                                                                 time_step_limit=(0.0, 100.0)))
    spec = granitemoehybrid.spec_from_config(GraniteMoeHybridConfig(**config, layer_types=["attention"] * 3))
    assert (spec.intermediate_size, spec.moe, spec.nope_layers, spec.mamba_layers) == (96, None, (0, 1, 2), ())


def test_bamba_s_layers_are_read_and_one_without_attention_is_refused():
    """Bamba's attention layers are config.attn_layer_indices; RoPE on half of each head (its class's
    fixed partial_rotary_factor); without an attention layer, or with MLP biases, it is refused."""
    from transformers import BambaConfig

    from trtllm.builder.architectures import bamba
    from trtllm.builder.checkpoint import Unsupported

    config = dict(vocab_size=400, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, mamba_n_heads=4, mamba_d_state=16, mamba_n_groups=2)
    spec = bamba.spec_from_config(BambaConfig(**config, attn_layer_indices=[1, 3]))
    assert (spec.mamba_layers, spec.rotary_dim, spec.kv_layers()) == ((0, 2), 8, ((2, 16), (2, 16)))
    with pytest.raises(Unsupported, match="every layer is a Mamba-2 layer"):
        bamba.spec_from_config(BambaConfig(**config, attn_layer_indices=[]))
    with pytest.raises(Unsupported, match="mlp_bias"):
        bamba.spec_from_config(BambaConfig(**config, attn_layer_indices=[1], mlp_bias=True))


@pytest.mark.parametrize("arch, change, match", [
    ("llama", {"model_type": "gpt2"}, "loads as GPT2LMHeadModel"),
    ("granite4", {"layer_types": ["mamba", "mamba"]}, r"every layer is a Mamba-2 layer")])
def test_a_config_without_a_graph_is_refused_before_the_weights_load(arch, change, match, tiny_checkpoint, tmp_path,
                                                                     monkeypatch):
    """A class without a graph, or a config its graph does not take, is refused from config.json (exit 2),
    before transformers loads the weights (minutes, or more memory than the machine has, for a large one)."""
    import json
    import shutil

    import transformers

    from trtllm.builder import checkpoint

    ckpt = shutil.copytree(tiny_checkpoint(arch), tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, **change}))

    def loaded(*args, **kwargs):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.load(str(ckpt))


def test_heads_that_do_not_group_over_the_kv_heads_are_refused(tmp_path):
    """4 attention heads over 3 key/value heads: transformers loads it and fails running it; the
    build refuses it by name with exit 2 (it failed in the verification's kernel, exit 1, or built
    an engine the runtime refused, with --no-verify), leaving no engine."""
    import torch
    import transformers

    from tests.tiny_models import make_tokenizer

    tok = make_tokenizer(tmp_path / "ck")
    config = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=3, head_dim=16,
                                      eos_token_id=tok.eos_token_id)
    transformers.LlamaForCausalLM(config).to(torch.float32).save_pretrained(tmp_path / "ck")
    tok.save_pretrained(tmp_path / "ck")
    for extra in ([], ["--cpu-kernels", "onnxruntime", "--no-verify"]):
        result = CliRunner().invoke(main, ["--model", str(tmp_path / "ck"), "--output", str(tmp_path / "e"), *extra])
        assert result.exit_code == 2, result.output
        assert "num_attention_heads (4) must be a multiple of num_key_value_heads (3)" in result.output
        assert not (tmp_path / "e").exists()


def test_tensors_the_model_drops_are_named_in_a_warning(tiny_checkpoint, tmp_path):
    """A checkpoint with weights its config has no place for (a layer past num_hidden_layers, an MLP
    bias where the config has none): transformers drops them with a log line, and the engine, which
    is that model, is built; the build says which it left out."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    ck = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint("llama"), ck)
    weights = load_file(str(ck / "model.safetensors"))
    weights["model.layers.2.mlp.down_proj.weight"] = weights["model.layers.0.mlp.down_proj.weight"]
    weights["model.layers.0.mlp.down_proj.bias"] = np.zeros(64, np.float32)
    save_file(weights, str(ck / "model.safetensors"), metadata={"format": "pt"})
    result = CliRunner().invoke(main, ["--model", str(ck), "--output", str(tmp_path / "e"), "--no-verify"])
    assert result.exit_code == 0, result.output
    assert ("holds tensors its config gives the model no place for, which transformers drops and so does the "
            "engine: model.layers.0.mlp.down_proj.bias, model.layers.2.mlp.down_proj.weight") in result.output


def test_image_options_on_a_text_model_are_refused_by_name(tmp_path, tiny_checkpoint):
    for option in ("--max-image-tiles", "--max-image-pixels", "--max-image-tokens"):
        result = CliRunner().invoke(main, ["--model", str(tiny_checkpoint("llama")), "--output", str(tmp_path / "e"),
                                           option, "70"])
        assert result.exit_code == 2 and f"{option} is for vision-language models" in result.output, result.output
