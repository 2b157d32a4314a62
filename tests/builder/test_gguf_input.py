"""--model FILE.gguf: what transformers' GGUF loader would silently get wrong is refused, and a
plain file loads the same model as its checkpoint."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from trtllm.builder import checkpoint  # noqa: E402
from trtllm.builder import gguf as gguf_loader  # noqa: E402

from tests.gguf_files import (llama3_checkpoint, llama3_rope_factors, LLAMA3_ROPE, write_llama_gguf,  # noqa: E402
                              write_moe_gguf)

pytestmark = pytest.mark.hf


def test_a_gguf_loads_as_its_checkpoint(untied_llama, tmp_path):
    import transformers

    loaded = checkpoint.load(str(write_llama_gguf(untied_llama, tmp_path / "tiny.gguf"))).model
    source = transformers.AutoModelForCausalLM.from_pretrained(untied_llama, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7, 30, 31]])
    with torch.no_grad():
        np.testing.assert_allclose(loaded(ids).logits.numpy(), source(ids).logits.numpy(), atol=1e-4, rtol=0)


def test_a_missing_tensor_is_refused(untied_llama, tmp_path):
    # transformers fills it with random values; the build would then check against that same model
    path = write_llama_gguf(untied_llama, tmp_path / "partial.gguf", drop=("blk.1.attn_v.weight",))
    with pytest.raises(checkpoint.CheckpointError, match="lacks weights the model needs: "
                                                         "model.layers.1.self_attn.v_proj.weight"):
        checkpoint.load(str(path))


@pytest.mark.parametrize("fields, extra, match", [
    ({"llama.rope.scaling.factor": 4.0}, {}, r"RoPE scaling \(llama.rope.scaling.factor = 4.0\)"),  # linear, no type
    ({"llama.rope.scale_linear": 4.0}, {}, r"RoPE scaling \(llama.rope.scale_linear = 4.0\)"),      # the old key
    ({}, {"blk.0.attn_q.bias": np.ones(64, np.float32)}, "tensors blk.0.attn_q.bias"),  # llama.cpp adds them
    ({"split.count": 3}, {}, "part of a split GGUF"),
])
def test_what_the_loader_would_drop_is_refused(untied_llama, tmp_path, fields, extra, match):
    path = write_llama_gguf(untied_llama, tmp_path / "x.gguf", fields=fields, extra_tensors=extra)
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.load(str(path))


def test_a_scaling_factor_of_one_is_plain_rope(untied_llama, tmp_path):
    path = write_llama_gguf(untied_llama, tmp_path / "one.gguf", fields={"llama.rope.scaling.factor": 1.0})
    loaded = checkpoint.load(str(path))
    assert loaded.source["kind"] == "gguf"
    assert loaded.model.config.rope_parameters.get("rope_type", "default") == "default"
    plain = checkpoint.load(str(write_llama_gguf(untied_llama, tmp_path / "plain.gguf")))
    assert torch.equal(loaded.model.model.rotary_emb.inv_freq, plain.model.model.rotary_emb.inv_freq)


def test_a_qwen2_gguf_loads_as_its_checkpoint(tmp_path):
    """Qwen2 (q/k/v biases, NeoX RoPE: rows as they are), tied: the logits of its checkpoint."""
    import transformers

    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("qwen2", tmp_path / "src")
    loaded = checkpoint.load(str(write_llama_gguf(ckpt, tmp_path / "q.gguf", arch="qwen2"))).model
    source = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7, 30, 31]])
    with torch.no_grad():
        np.testing.assert_allclose(loaded(ids).logits.numpy(), source(ids).logits.numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("scaling", ["rope_freqs", "rope_freqs_qwen2", "linear"])
def test_rope_scaling_the_loader_drops_is_refused(untied_llama, tmp_path, scaling):
    if scaling.startswith("rope_freqs"):  # frequency factors that are not Llama 3's; or in a qwen2 GGUF
        qwen = scaling.endswith("qwen2")
        factors = llama3_rope_factors(16, LLAMA3_ROPE) if qwen else np.full(8, 2.0, np.float32)
        path = write_llama_gguf(untied_llama, tmp_path / "l3.gguf", extra_tensors={"rope_freqs.weight": factors},
                                arch="qwen2" if qwen else "llama")
        match = "rope_freqs.weight tensor in a qwen2 GGUF" if qwen else "8 factors are not Llama 3's RoPE scaling"
    else:
        path = write_llama_gguf(untied_llama, tmp_path / "linear.gguf", rope_scaling=("linear", 4.0))
        match = "RoPE scaling 'linear'"
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.load(str(path))


@pytest.fixture(scope="module")
def llama3(untied_llama, tmp_path_factory):
    """The tiny Llama with Llama 3's RoPE scaling, and its GGUF as llama.cpp's converter writes it
    (the scaling as rope_freqs.weight, which transformers' GGUF loader drops)."""
    out = tmp_path_factory.mktemp("llama3")
    ckpt = llama3_checkpoint(untied_llama, out / "ckpt")
    return ckpt, write_llama_gguf(ckpt, out / "llama3.gguf",
                                  extra_tensors={"rope_freqs.weight": llama3_rope_factors(16, LLAMA3_ROPE)})


def logits_gap(ckpt, gguf, positions: int) -> float:
    """The largest difference of the model loaded from the GGUF from the checkpoint's, in the logits
    of a random prompt of that many positions."""
    import transformers

    source = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.randint(3, 300, (1, positions), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return float((checkpoint.load(str(gguf)).model(ids).logits - source(ids).logits).abs().max())


def test_a_llama3_gguf_gets_its_rope_scaling_back(llama3, monkeypatch):
    """Llama 3.1/3.2 GGUFs: the loaded model is the checkpoint's (transformers' llama3 RoPE from the
    factors recognised), 300 positions deep where the scaling moves every logit. The wrong variant,
    transformers' GGUF model as it loads (plain RoPE), is far off."""
    ckpt, gguf = llama3
    assert checkpoint.load(str(gguf)).model.config.rope_parameters == {**LLAMA3_ROPE, "rope_theta": 500000.0}
    assert logits_gap(ckpt, gguf, 300) <= 1e-4
    monkeypatch.setattr(gguf_loader, "llama3_rope", lambda model, factors, arg: None)
    assert logits_gap(ckpt, gguf, 300) > 0.1


def engine_answers_as(ckpt, gguf, out, prompt_len: int, new: int = 16) -> bool:
    """Whether the engine built from the GGUF gives transformers' greedy tokens on the checkpoint
    for a random prompt of prompt_len tokens (the build's own check compares it with the loaded
    model too)."""
    import transformers

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, Timing, run_rows
    from trtllm.runtime.sampling import SamplingParams

    build(BuildConfig(model=str(gguf), output=str(out), max_batch_size=1, max_input_len=prompt_len + 40,
                      max_kv_cache_capacity=prompt_len + 120), log=lambda m: None)
    prompt = torch.randint(3, 300, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    row = RowState(prompt_ids=prompt[0].tolist(), params=SamplingParams(temperature=0, max_new_tokens=new),
                   rng=np.random.default_rng(0), eos_ids=frozenset())
    run_rows(load_engine(out), [row], None, Timing())
    source = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        want = source.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, eos_token_id=None)
    return row.output_ids == want[0, prompt_len:].tolist()


def test_a_llama3_gguf_engine_answers_as_its_checkpoint(llama3, tmp_path):
    """A long prompt's: the scaling moves every logit there."""
    assert engine_answers_as(*llama3, tmp_path / "engine", 280)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    """A tiny Phi-3 with a sliding window of 8 (Phi-3-mini-4k's is 2047), and its GGUF."""
    import json

    from tests.tiny_models import make_checkpoint

    out = tmp_path_factory.mktemp("phi3")
    ckpt = make_checkpoint("phi3", out / "ckpt", tie=False)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "sliding_window": 8}))
    return ckpt, write_llama_gguf(ckpt, out / "phi3.gguf", arch="phi3")


def test_a_phi3_gguf_loads_as_its_checkpoint_with_its_window(phi3, monkeypatch):
    """transformers' GGUF loader drops the sliding window; it is given back, and the logits are the
    checkpoint's. The wrong variant, the window dropped, is far off 100 positions deep."""
    ckpt, gguf = phi3
    assert checkpoint.load(str(gguf)).model.config.sliding_window == 8
    assert logits_gap(ckpt, gguf, 100) <= 1e-4
    monkeypatch.setattr(gguf_loader, "phi3_keys", lambda model, keys: None)
    assert logits_gap(ckpt, gguf, 100) > 0.1


def test_a_phi3_gguf_engine_answers_as_its_checkpoint(phi3, tmp_path):
    assert engine_answers_as(*phi3, tmp_path / "engine", 60)


@pytest.fixture(scope="module")
def phi4_mini(tmp_path_factory):
    """A tiny Phi-4-mini (LongRoPE up to 256 positions of 512, on half of each head), and its GGUF."""
    from tests.tiny_models import make_checkpoint

    out = tmp_path_factory.mktemp("phi4-mini")
    ckpt = make_checkpoint("phi4-mini", out / "ckpt", tie=False)
    return ckpt, write_llama_gguf(ckpt, out / "phi4-mini.gguf", arch="phi3")


def test_a_longrope_phi3_gguf_gets_its_rope_back(phi4_mini, monkeypatch):
    """Phi-3.5-mini's and Phi-4-mini's LongRoPE (factors as tensors transformers' loader does not map,
    the original context and attention factor as keys) and Phi-4-mini's partial rotary, which the
    loader drops, given back: the logits are the checkpoint's 200 positions deep. The wrong
    variants, each dropped as the loader drops it, are far off."""
    ckpt, gguf = phi4_mini
    params = checkpoint.load(str(gguf)).model.config.rope_parameters
    assert params["rope_type"] == "longrope" and params["partial_rotary_factor"] == 0.5
    assert params["original_max_position_embeddings"] == 256
    np.testing.assert_array_equal(np.float32(params["short_factor"]), np.float32([1.0, 1.3, 2.1, 3.5]))
    assert logits_gap(ckpt, gguf, 200) <= 1e-4
    assert logits_gap(ckpt, gguf, 300) <= 1e-4  # (past 256 transformers takes the long factors)
    monkeypatch.setattr(gguf_loader, "phi3_longrope", lambda *args: None)
    assert logits_gap(ckpt, gguf, 200) > 0.1


def test_a_partial_rotary_phi3_gguf_gets_it_back(phi3, tmp_path, monkeypatch):
    """Phi-4-mini rotates 96 of each head's 128 dimensions (rope.dimension_count), which transformers'
    loader drops (it would rotate all): given back, the logits are the checkpoint's; the wrong
    variant, every dimension rotated, is far off."""
    import json
    import shutil

    ckpt = shutil.copytree(phi3[0], tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "partial_rotary_factor": 0.5}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    gguf = write_llama_gguf(ckpt, tmp_path / "partial.gguf", arch="phi3")
    assert checkpoint.load(str(gguf)).model.config.rope_parameters["partial_rotary_factor"] == 0.5
    assert logits_gap(ckpt, gguf, 100) <= 1e-4
    check_gguf = gguf_loader.check_gguf

    def full_rotary(path):
        keys = check_gguf(path)
        keys.rope_dims = None
        return keys

    monkeypatch.setattr(gguf_loader, "check_gguf", full_rotary)
    assert logits_gap(ckpt, gguf, 100) > 0.1


@pytest.mark.parametrize("written, used", [(1.3, 1.3), (0, 1.0)])
def test_a_longrope_gguf_attention_factor_is_read_as_llama_cpp_reads_it(phi4_mini, tmp_path, written, used):
    """The GGUF's rope.scaling.attn_factor is the one used (llama.cpp's reading), and 1 without the key
    (transformers' own rule, 1.0607 here, would hide a factor dropped: the converter writes that one)."""
    path = write_llama_gguf(phi4_mini[0], tmp_path / "attn.gguf", arch="phi3", attn_factor=written)
    model = checkpoint.load(str(path)).model
    assert model.model.rotary_emb.attention_scaling == pytest.approx(used, rel=1e-6)


def test_a_longrope_phi3_gguf_engine_answers_as_its_checkpoint(phi4_mini, tmp_path):
    assert engine_answers_as(*phi4_mini, tmp_path / "engine", 100)


@pytest.mark.parametrize("what", ["one_tensor", "length", "no_context"])
def test_a_phi3_gguf_with_broken_longrope_is_refused(phi3, phi4_mini, tmp_path, what):
    """LongRoPE factors without their pair, of another length than the rotary frequencies, or without
    the original context (which the short factors hold)."""
    if what == "one_tensor":
        path = write_llama_gguf(phi4_mini[0], tmp_path / "one.gguf", arch="phi3", drop=("rope_factors_short.weight",))
        match = "rope_factors_long.weight without its pair"
    elif what == "length":
        path = write_llama_gguf(phi3[0], tmp_path / "length.gguf", arch="phi3", extra_tensors={
            "rope_factors_long.weight": np.full(3, 2.0, np.float32), "rope_factors_short.weight": np.ones(3, np.float32)})
        match = "3 LongRoPE long factors, not one per rotary frequency \\(8\\)"
    else:
        path = write_llama_gguf(phi4_mini[0], tmp_path / "context.gguf", arch="phi3", original_context=False)
        match = "without phi3.rope.scaling.original_context_length"
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.load(str(path))


def test_a_gemma_gguf_without_a_window_is_refused(tmp_path):
    """llama.cpp's Gemma 3 without a sliding window (every layer global) is no model transformers'
    GGUF loader makes: it would slide five of six layers."""
    import json

    ckpt = gemma_checkpoint("gemma3", tmp_path / "ckpt")
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "sliding_window": None}))
    with pytest.raises(checkpoint.CheckpointError, match="gemma3 GGUF without a sliding window"):
        checkpoint.load(str(write_llama_gguf(ckpt, tmp_path / "g.gguf", arch="gemma3")))


def test_an_untied_gemma2_gguf_is_refused_by_its_tensor(tmp_path):
    """llama.cpp's Gemma 2 ties its head to the embedding; transformers' loader would say lm_head."""
    import json

    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("gemma2", tmp_path / "ckpt", tie=False, padded_vocab=1)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "query_pre_attn_scalar": cfg["head_dim"]}))
    with pytest.raises(checkpoint.CheckpointError, match="gemma2 GGUF with an output.weight tensor"):
        checkpoint.load(str(write_llama_gguf(ckpt, tmp_path / "g.gguf", arch="gemma2")))


def test_a_gemma_gguf_query_scale_is_llama_cpps():
    """The head size, but for the 27B (46 layers of Gemma 2, 62 of Gemma 3): hidden / heads."""
    from types import SimpleNamespace

    def scale(arch, layers):
        attn = SimpleNamespace()
        config = SimpleNamespace(num_hidden_layers=layers, hidden_size=5376, num_attention_heads=32, head_dim=128)
        gguf_loader.gemma_keys(SimpleNamespace(config=config, model=SimpleNamespace(
            layers=[SimpleNamespace(self_attn=attn)])), gguf_loader.GgufKeys(arch))
        assert attn.scaling == config.query_pre_attn_scalar ** -0.5
        return config.query_pre_attn_scalar

    assert [scale("gemma3", 62), scale("gemma3", 34), scale("gemma2", 46), scale("gemma2", 62)] == [168, 128, 168, 128]


def test_a_gemma1_gguf_is_refused(untied_llama, tmp_path):
    """Only the architectures whose GGUF loading is checked are taken (Gemma 1's is not)."""
    path = write_llama_gguf(untied_llama, tmp_path / "g.gguf", arch="gemma")
    with pytest.raises(checkpoint.CheckpointError, match="gemma GGUF, which is not supported .* build from"):
        checkpoint.load(str(path))


def test_a_qwen3_gguf_whose_heads_are_not_128_is_refused(untied_llama, tmp_path):
    """transformers' qwen3 GGUF mapping has no key for the head size: it takes Qwen3's default 128,
    and failed to load other heads with its own 'ignore_mismatched_sizes' text (a review's)."""
    path = write_llama_gguf(untied_llama, tmp_path / "q.gguf", arch="qwen3", fields={"qwen3.attention.key_length": 16})
    with pytest.raises(checkpoint.CheckpointError, match=r"qwen3 GGUF with heads of 16 \(qwen3.attention.key_length\)"):
        checkpoint.load(str(path))


def gemma_checkpoint(arch: str, out, linear: float | None = None):
    """A tiny Gemma 3 (six layers, five of six sliding, local RoPE base 10000, global 1e6; `linear`:
    its global layers' RoPE scaling, as Gemma 3 4B-27B's) or Gemma 2 (its soft-caps bend most values)
    whose queries scale by the head size, as a GGUF gives them."""
    import json

    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint(arch, out, num_layers=6 if arch == "gemma3" else 2, padded_vocab=1)  # (a row for <mask>)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["query_pre_attn_scalar"] = cfg["head_dim"]
    if arch == "gemma3":  # (and a final soft-cap, which Gemma 3 has where its config sets one)
        cfg["final_logit_softcapping"] = 5.0
        cfg.update(layer_types=["sliding_attention"] * 5 + ["full_attention"],
                   rope_parameters={"full_attention": {"rope_theta": 1e6, "rope_type": "default"} if linear is None else
                                    {"rope_theta": 1e6, "rope_type": "linear", "factor": linear},
                                    "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}})
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return ckpt


@pytest.mark.parametrize("arch, linear", [("gemma3", None), ("gemma3", 4.0), ("gemma2", None)])
def test_a_gemma_gguf_is_its_checkpoint_read_as_llama_cpp_reads_it(arch, linear, tmp_path, monkeypatch):
    """The query scale (the head size but for the 27B), Gemma 2's soft-caps and Gemma 3's linear RoPE
    scaling of its global layers, which the GGUF or transformers' loader leave out, set as llama.cpp
    reads them: logits and an engine's greedy tokens are the checkpoint's. The wrong variant,
    transformers' model as it loads, is far off."""
    ckpt = gemma_checkpoint(arch, tmp_path / "ckpt", linear)
    gguf = write_llama_gguf(ckpt, tmp_path / f"{arch}.gguf", arch=arch, rope_scaling=linear and ("linear", linear))
    assert logits_gap(ckpt, gguf, 60) <= 1e-4
    assert engine_answers_as(ckpt, gguf, tmp_path / "engine", 60, new=12)
    monkeypatch.setattr(gguf_loader, "gemma_keys", lambda model, keys: None)
    assert logits_gap(ckpt, gguf, 60) > 0.1


def test_a_gguf_ends_generation_where_llama_cpp_does(untied_llama, tmp_path, monkeypatch):
    """A GGUF holds one eos id and no generation_config: the engine stops where llama.cpp does, at its
    eos, eot and eom ids and the tokens it knows by their text (here `<|endoftext|>`; Phi-3.5's
    `<|end|>`, Llama 3.1's `<|eom_id|>`). The wrong variant, the loader's eos alone, runs on."""
    import json

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.engine import load_engine
    from trtllm.runtime.generate import RowState, Timing, run_rows
    from trtllm.runtime.sampling import SamplingParams

    vocab = json.loads((untied_llama / "tokenizer.json").read_text())
    ids = {a["content"]: a["id"] for a in vocab["added_tokens"]}
    path = write_llama_gguf(untied_llama, tmp_path / "eog.gguf", fields={"tokenizer.ggml.eot_token_id": 7,
                                                                         "tokenizer.ggml.eom_token_id": 5000})
    assert checkpoint.load(str(path)).model.generation_config.eos_token_id == [ids["<|im_end|>"], 7,
                                                                              ids["<|endoftext|>"]]  # (5000: none)
    out = build(BuildConfig(model=str(path), output=str(tmp_path / "engine"), max_batch_size=1, max_input_len=16,
                            max_kv_cache_capacity=64), log=lambda m: None)

    def answer(engine_dir):
        eos = json.loads((engine_dir / "manifest.json").read_text())["eos_token_ids"]
        row = RowState(prompt_ids=[5, 6], params=SamplingParams(temperature=0, max_new_tokens=4,
                                                                logit_bias={ids["<|endoftext|>"]: 100.0}),
                       rng=np.random.default_rng(0), eos_ids=frozenset(eos))
        run_rows(load_engine(engine_dir), [row], None, Timing())
        return row.output_ids, row.finish_reason

    assert answer(out) == ([ids["<|endoftext|>"]], "end-of-sequence")
    monkeypatch.setattr(gguf_loader, "gguf_eog_ids", lambda reader, value: [])
    wrong = build(BuildConfig(model=str(path), output=str(tmp_path / "wrong"), max_batch_size=1, max_input_len=16,
                              max_kv_cache_capacity=64), log=lambda m: None)
    assert answer(wrong)[1] == "max-length"


@pytest.mark.parametrize("fields, skip, match", [
    ({"llama.block_count": 1}, (), r"holds tensors of layers past its llama.block_count \(1\): blk.1"),
    ({}, ("add_layer_norm_rms_eps",), "lacks llama.attention.layer_norm_rms_epsilon, which llama.cpp requires"),
    ({}, ("add_context_length",), "lacks llama.context_length"),
])
def test_keys_that_disagree_with_the_tensors_or_are_missing_are_refused(untied_llama, tmp_path, monkeypatch,
                                                                        fields, skip, match):
    """A block_count below the layers stored (the loader dropped the rest without a word) and keys
    llama.cpp requires (the loader took its defaults: a context of 2048 for a 512 model)."""
    import gguf

    for name in skip:
        monkeypatch.setattr(gguf.GGUFWriter, name, lambda self, *a, **k: None)
    if fields:  # (written after the writer's own key: replace it)
        monkeypatch.setattr(gguf.GGUFWriter, "add_block_count", lambda self, *a, **k: None)
    path = write_llama_gguf(untied_llama, tmp_path / "m.gguf", fields={k: v for k, v in fields.items()})
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.load(str(path))


@pytest.mark.parametrize("keep", [-1, 200, 2000])
def test_a_truncated_gguf_says_so(untied_llama, tmp_path, keep):
    path = write_llama_gguf(untied_llama, tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:keep])
    with pytest.raises(checkpoint.CheckpointError, match="not a readable GGUF: truncated or corrupt"):
        checkpoint.load(str(path))


@pytest.mark.parametrize("arch, gguf_arch, weight_type", [("qwen3_moe", "qwen3moe", None),
                                                          ("qwen3_moe", "qwen3moe", "Q8_0"),
                                                          ("qwen2_moe", "qwen2moe", None)])
def test_a_moe_gguf_engine_answers_as_its_checkpoint(arch, gguf_arch, weight_type, tmp_path):
    """A Qwen3-MoE or Qwen2-MoE GGUF (its shared expert and gate; every layer a mixture, as llama.cpp
    has them): transformers' loader takes the experts' width, the shared expert's and the routing's
    normalization from what llama.cpp reads (moe_keys), and the engine built from the file answers as
    the checkpoint's transformers model (Q8_0 experts: as the dequantized ones). The wrong variant,
    the loader's defaults (a 768-wide expert), does not load."""
    import transformers

    from tests.tiny_models import make_checkpoint
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.builder.verify import engine_logits
    from trtllm.runtime.engine import load_engine

    ckpt = make_checkpoint(arch, tmp_path / "ckpt", num_layers=1)  # (Qwen2-MoE's layer 1 is dense: left out)
    path = write_moe_gguf(ckpt, tmp_path / "tiny.gguf", gguf_arch, weight_type)
    loaded = checkpoint.load(str(path)).model
    source = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    if weight_type:  # (the experts as llama.cpp's Q8_0 holds them)
        source = loaded
    out = build(BuildConfig(model=str(path), output=str(tmp_path / "e"), max_input_len=64, max_kv_cache_capacity=128),
                log=lambda m: None)
    engine = load_engine(out)
    prompt = [5, 17, 42, 99, 7, 30, 31]
    generated, got = engine_logits(engine, prompt, num_decode=4)
    with torch.no_grad():
        want = source(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    from trtllm.builder import gguf as loader

    moe = {**loader.MOE_NORMALIZED}
    with pytest.raises(checkpoint.CheckpointError, match="cannot be loaded: .*ignore_mismatched_sizes"):
        try:  # the wrong variant: no mending, the loader's defaults
            loader.MOE_NORMALIZED.clear()
            checkpoint.load(str(path))
        finally:
            loader.MOE_NORMALIZED.update(moe)


def test_a_moe_gguf_without_its_experts_width_is_refused(tmp_path):
    from tests.tiny_models import make_checkpoint

    ckpt = make_checkpoint("qwen3_moe", tmp_path / "ckpt", num_layers=1)
    path = write_moe_gguf(ckpt, tmp_path / "tiny.gguf", "qwen3moe", drop=("expert_feed_forward_length",))
    with pytest.raises(checkpoint.CheckpointError, match="without qwen3moe.expert_feed_forward_length"):
        checkpoint.load(str(path))
