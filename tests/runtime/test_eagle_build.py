"""EAGLE draft heads through trtllm-build: a bfloat16 head file is widened exactly, and a bad head
(wrong architecture, shapes, values, settings) fails the build with a message naming --eagle and
writes nothing, as does a draft graph the reference head disagrees with."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from tests.eagle_drafts import random_draft
from trtllm.builder.cli import main as build_main
from trtllm.builder.config import BuildConfig, ConfigError
from trtllm.builder.export import build
from trtllm.runtime import manifest as mf

pytest.importorskip("safetensors.numpy")
pytestmark = pytest.mark.hf
LIMITS = dict(max_batch_size=4, max_input_len=96, max_kv_cache_capacity=192)


def test_a_bfloat16_head_file_builds(tiny_checkpoint, tmp_path):
    """SpecForge often saves heads in bfloat16, which numpy cannot read: they are read through torch
    and widened exactly to float32, so the engine is the one of the same head in float32."""
    import torch
    from safetensors.torch import load_file, save_file

    draft = random_draft(tiny_checkpoint("llama"), tmp_path / "draft", aux=[0, 1, 1])
    weights = load_file(str(draft / "model.safetensors"))
    rounded = {k: v.to(torch.bfloat16) for k, v in weights.items() if v.is_floating_point()}
    save_file({**weights, **rounded}, str(draft / "model.safetensors"))
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "config.json").write_text((draft / "config.json").read_text())
    save_file({**weights, **{k: v.float() for k, v in rounded.items()}}, str(twin / "model.safetensors"))
    engines = [build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / name), eagle=str(head),
                                 verify=False, **LIMITS), log=lambda m: None) for name, head in (("bf", draft), ("f32", twin))]
    assert [(e / mf.load(e).eagle["compiled"]).read_bytes() == (engines[1] / mf.load(engines[1]).eagle["compiled"]).read_bytes()
            for e in engines] == [True, True]


def edit_config(draft, **values):
    (draft / "config.json").write_text(json.dumps({**json.loads((draft / "config.json").read_text()), **values}))


def edit_weight(draft, name, change):
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(draft / "model.safetensors"))
    key = next(k for k in weights if k.removeprefix("model.") == name)
    weights[key] = change(weights[key])
    save_file(weights, str(draft / "model.safetensors"))


@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "architectures": ["LlamaForCausalLMEagle"]})),
     "only EAGLE-3 heads"),
    (lambda d: (d / "model.safetensors").unlink(), "config.json and model.safetensors"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "hidden_size": 32})),
     "hidden_size 32 differs"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 5]}})),
     "three layer indices in [0, 2)"),
    (lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                          "draft_vocab_size": 7})),
     "lm_head.weight is"),
    (lambda d: edit_config(d, num_attention_heads="4"), "config.num_attention_heads must be a positive integer"),
    (lambda d: edit_config(d, head_dim=-8), "config.head_dim must be a positive integer"),
    (lambda d: edit_config(d, rms_norm_eps="abc"), "config.rms_norm_eps must be a number"),
    (lambda d: edit_config(d, eagle_config={"eagle_aux_hidden_state_layer_ids": [True, False, 1]}),
     "three layer indices"),
    (lambda d: edit_config(d, rope_scaling={"rope_type": "bogus", "factor": 2.0}), "its RoPE settings"),
    (lambda d: edit_config(d, hidden_act="gelu"), "config.hidden_act must be 'silu' or 'swish', got 'gelu'"),
    (lambda d: edit_config(d, eagle_config={}), "EAGLE-3's default [2, L/2, L-3] for the target's 2 layers"),
    # (review 49's: a list crashed the build's reference with an AttributeError; [] took the default)
    (lambda d: edit_config(d, eagle_config=[1, 2, 3]), "config.eagle_config must be an object, got [1, 2, 3]"),
    (lambda d: edit_config(d, eagle_config={"eagle_aux_hidden_state_layer_ids": []}), "three layer indices"),
    (lambda d: edit_config(d, rope_theta=0), "config.rope_theta must be a positive finite number"),
    # a head for another vocabulary: it built, and never guessed right
    (lambda d: edit_config(d, vocab_size=32000), "config.vocab_size 32000 differs from the target's"),
    (lambda d: edit_weight(d, "t2d", lambda w: np.zeros(1000, bool)), "t2d ([1000]) is not the target ids d2t maps to"),
    (lambda d: edit_weight(d, "t2d", lambda w: ~w), "t2d ("),
    (lambda d: (d / "config.json").write_text("[1, 2]"), "config.json must hold a JSON object"),
    (lambda d: edit_weight(d, "lm_head.weight", lambda w: w * np.nan), "lm_head.weight holds NaN"),
    (lambda d: edit_weight(d, "fc.weight", lambda w: w.astype(np.int32)), "fc.weight is int32"),
    # (a review's: the loader cast it, the build's own check did not, and failed naming neither)
    (lambda d: edit_weight(d, "d2t", lambda w: w.astype(np.float32)), "d2t is float32, expected integer ids"),
    (lambda d: (d / "model.safetensors").write_bytes(b"not a safetensors file"), "cannot be read"),
    # (a review's: a head copying Phi-4-mini's partial rotary was written rotating half of each head,
    # then the build's reference, a Llama layer, failed with a raw shape error)
    (lambda d: edit_config(d, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "original_max_position_embeddings": 512,
        "short_factor": [1.0, 1.3, 2.1, 3.5], "long_factor": [1.5, 4.0, 9.0, 16.0]}),
     "rotates 8 of each head's 16 dimensions; an EAGLE-3 head is a Llama layer, which rotates whole heads"),
])
def test_bad_draft_heads_fail_the_build(tiny_checkpoint, tmp_path, change, message):
    draft = random_draft(tiny_checkpoint("llama"), tmp_path / "draft", aux=[0, 1, 1])
    change(draft)
    result = CliRunner().invoke(build_main, ["--model", str(tiny_checkpoint("llama")), "--output",
                                             str(tmp_path / "engine"), "--eagle", str(draft), "--no-verify"])
    assert result.exit_code == 2, result.output
    assert "--eagle" in result.output and message in result.output
    assert not (tmp_path / "engine").exists()


def test_a_bfloat16_head_our_kernels_cannot_take_is_refused(tiny_checkpoint, tmp_path):
    """A head whose MLP width is not a multiple of 32 cannot run on our bfloat16 kernels, and ONNX
    Runtime has none of its own: the build stops before writing anything, naming the head."""
    ckpt = tiny_checkpoint("llama")
    draft = random_draft(ckpt, tmp_path / "draft", seed=3, aux=[0, 1, 1], intermediate_size=80)
    with pytest.raises(ConfigError, match="the EAGLE head .* cannot run on them"):
        build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), eagle=str(draft), dtype="bfloat16",
                          verify=False, **LIMITS), log=lambda m: None)
    assert not (tmp_path / "e").exists()


def test_build_check_catches_a_wrong_head_graph(tiny_checkpoint, tmp_path, monkeypatch):
    """The build's check is the reference head: a draft graph that norms the hidden state with the
    embedding's weights (the wrong variant) fails the build, and leaves no engine."""
    from trtllm.builder import eagle
    from trtllm.builder.verify import VerifyError

    class Wrong(eagle.DraftWriter):
        def rms_norm(self, name, x, weight_name):
            return super().rms_norm(name, x, weight_name.replace("hidden_norm", "input_layernorm"))

    monkeypatch.setattr(eagle, "DraftWriter", Wrong)
    draft = random_draft(tiny_checkpoint("llama"), tmp_path / "draft", aux=[0, 1, 1])
    with pytest.raises(VerifyError, match="EAGLE outputs differ from the reference head"):
        build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(tmp_path / "engine"), eagle=str(draft),
                          **LIMITS), log=lambda m: None)
    assert not (tmp_path / "engine").exists()
