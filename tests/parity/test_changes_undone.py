"""Each change of an architecture to Llama's graph, undone in its llm.onnx (DecoderSpec fields, a mixture of
experts' section, Phi-4-mini's RoPE table): every one must miss transformers' logits, and each
architecture's control (nothing undone) must pass, on the tiny random checkpoints."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

from tests.engine_helpers import resized  # noqa: E402
from tests.parity.test_tiny_parity import ATOL, PROMPTS, hf_model  # noqa: E402

pytestmark = pytest.mark.hf


# Each change of an architecture to Llama's graph, undone: every one must miss transformers' logits.
UNDONE = {
    "gemma3, nothing undone (the control: passes)": ("gemma3", {}),
    "gemma3, one RoPE table for all layers": ("gemma3", dict(local_rope=False)),
    "gemma3, the window on every layer": ("gemma3", dict(sliding_layers=None)),
    "gemma3, unscaled embeddings": ("gemma3", dict(embed_scale=1.0)),
    "gemma3, scores scaled by head_dim": ("gemma3", dict(query_scale=None)),
    "gemma3, norm scales without the 1": ("gemma3", dict(norm_offset=0.0)),
    "gemma3, SiLU MLP": ("gemma3", dict(hidden_act="silu")),
    "gemma4, nothing undone (the control: passes)": ("gemma4", {}),
    "gemma4, v not normed": ("gemma4", dict(v_norm=False)),
    "gemma4, no per-layer embeddings": ("gemma4", dict(per_layer_input=0)),
    "gemma4, layer outputs not scaled": ("gemma4", dict(layer_scalars=False)),
    "gemma4, scores scaled by head_dim": ("gemma4", dict(query_scale=None)),
    "gemma4, norm scales with a 1": ("gemma4", dict(norm_offset=1.0)),
    "gemma4-kv, nothing undone (the control: passes)": ("gemma4-kv", {}),
    "gemma4-kv, v (the full layers' k projection) not normed": ("gemma4-kv", dict(v_norm=False)),
    "lfm2, nothing undone (the control: passes)": ("lfm2", {}),
    "lfm2, no convolution and projection biases": ("lfm2", dict(conv_bias=False)),
    "lfm2, no q/k norms": ("lfm2", dict(qk_norm=False)),
    "gemma2, nothing undone (the control: passes)": ("gemma2", {}),
    "gemma2, scores not soft-capped": ("gemma2", dict(attn_softcap=None)),
    "gemma2, logits not soft-capped": ("gemma2", dict(final_softcap=None)),
    "gemma, nothing undone (the control: passes)": ("gemma", {}),
    "gemma, unscaled embeddings": ("gemma", dict(embed_scale=1.0)),
    "gemma, norm scales without the 1": ("gemma", dict(norm_offset=0.0)),
    "ministral, nothing undone (the control: passes)": ("ministral", {}),
    "ministral, the window on every layer": ("ministral", dict(sliding_layers=None)),
    "olmo3, nothing undone (the control: passes)": ("olmo3", {}),
    "olmo3, one RoPE table for all layers": ("olmo3", dict(local_rope=False)),
    "olmo3, no window": ("olmo3", dict(sliding_window=None, sliding_layers=None, local_rope=False)),
    "exaone4, nothing undone (the control: passes)": ("exaone4", {}),
    "exaone4, RoPE on every layer": ("exaone4", dict(nope_layers=())),
    "exaone4, outputs not normed": ("exaone4", dict(sandwich_norms=False)),
    "ernie4_5, nothing undone (the control: passes)": ("ernie4_5", {}),
    "ernie4_5, q and k rows kept (rotate-half RoPE)": ("ernie4_5", dict(interleaved_rope=False)),
    "helium, nothing undone (the control: passes)": ("helium", {}),
    "helium, q and k rows kept (rotate-half RoPE)": ("helium", dict(interleaved_rope=False)),
    "hunyuan, nothing undone (the control: passes)": ("hunyuan", {}),
    "hunyuan, q/k norms before RoPE": ("hunyuan", dict(qk_norm_after_rope=False)),
    "glm, nothing undone (the control: passes)": ("glm", {}),
    "glm, q and k rows kept (rotate-half RoPE)": ("glm", dict(interleaved_rope=False)),
    "glm4, nothing undone (the control: passes)": ("glm4", {}),
    "glm4, outputs not normed": ("glm4", dict(sandwich_norms=False)),
    "phi4-mini, nothing undone (the control: passes)": ("phi4-mini", {}),
    "phi4-mini, LongRoPE's long factors": ("phi4-mini", dict(long_factors=True)),
    "smollm3, nothing undone (the control: passes)": ("smollm3", {}),
    "smollm3, RoPE on every layer": ("smollm3", dict(nope_layers=())),
    "granite, nothing undone (the control: passes)": ("granite", {}),
    "granite, unscaled embeddings": ("granite", dict(embed_scale=1.0)),
    "granite, scores scaled by head_dim": ("granite", dict(query_scale=None)),
    "granite, unscaled residual branches": ("granite", dict(residual_scale=1.0)),
    "granite, unscaled logits": ("granite", dict(logits_scale=1.0)),
    "lfm3, nothing undone (the control: passes)": ("lfm3", {}),
    "lfm3, no attention gate": ("lfm3", dict(attn_gate="")),
    "lfm3, outputs not normed": ("lfm3", dict(sandwich_norms=False)),
    "lfm3, one RoPE table for all layers": ("lfm3", dict(local_rope=False)),
    "arcee, nothing undone (the control: passes)": ("arcee", {}),
    "arcee, SiLU for its ReLU squared": ("arcee", dict(hidden_act="silu")),
    "apertus, nothing undone (the control: passes)": ("apertus", {}),
    "apertus, SiLU for its xIELU": ("apertus", dict(hidden_act="silu")),
    "apertus, no q/k norms": ("apertus", dict(qk_norm=False)),
    "granite4, nothing undone (the control: passes)": ("granite4", {}),
    "granite4, unscaled residual branches": ("granite4", dict(residual_scale=1.0)),
    "olmo2, nothing undone (the control: passes)": ("olmo2", {}),
    "olmo2, no q/k norms": ("olmo2", dict(full_qk_norm=False)),
    "olmo2, outputs not normed": ("olmo2", dict(sandwich_norms=False)),
    # Mamba-2 layers: `mamba` changes the spec's Mamba section
    "granite4-h, nothing undone (the control: passes)": ("granite4-h", {}),
    "granite4-h, no convolution bias": ("granite4-h", dict(mamba=dict(conv_bias=False))),
    "granite4-h, unscaled residual branches": ("granite4-h", dict(residual_scale=1.0)),
    "bamba, nothing undone (the control: passes)": ("bamba", {}),
    "bamba, no convolution bias": ("bamba", dict(mamba=dict(conv_bias=False))),
    # mixtures of experts: `moe` changes the spec's MoE section
    "qwen3_moe, nothing undone (the control: passes)": ("qwen3_moe", {}),
    "qwen3_moe, top-k weights not normalized": ("qwen3_moe", dict(moe=dict(normalize=False))),
    "qwen3_moe, every expert on every token (top-k = all)": ("qwen3_moe", dict(moe=dict(top_k=4))),
    "qwen3_moe, one expert a token": ("qwen3_moe", dict(moe=dict(top_k=1))),
    "olmoe, top-k weights normalized": ("olmoe", dict(moe=dict(normalize=True))),
    "mixtral, top-k weights not normalized": ("mixtral", dict(moe=dict(normalize=False))),
    "qwen2_moe, nothing undone (the control: passes)": ("qwen2_moe", {}),
    "qwen2_moe, shared expert not gated": ("qwen2_moe", dict(moe=dict(shared_gate=False))),
    "granitemoe, nothing undone (the control: passes)": ("granitemoe", {}),
    "granitemoe, no shared expert": ("granitemoe", dict(moe=dict(shared_size=0))),
    "granite4-moe, nothing undone (the control: passes)": ("granite4-moe", {}),
    "granite4-moe, no shared expert": ("granite4-moe", dict(moe=dict(shared_size=0))),
    "gemma4-moe, nothing undone (the control: passes)": ("gemma4-moe", {}),
    # (normalizing the chosen weights or not is the same here: post_feedforward_layernorm_2 undoes a common factor)
    "gemma4-moe, one expert a token": ("gemma4-moe", dict(moe=dict(top_k=1))),
    "gemma4-moe, every expert on every token (top-k = all)": ("gemma4-moe", dict(moe=dict(top_k=4))),
    "ernie4_5_moe, nothing undone (the control: passes)": ("ernie4_5_moe", {}),
    "ernie4_5_moe, chosen without the selection bias": ("ernie4_5_moe", dict(moe=dict(selection_bias=False))),
    "ernie4_5_moe, the weights' sum not clamped": ("ernie4_5_moe", dict(moe=dict(norm_min=0.0))),
    "ernie4_5_moe, no shared experts": ("ernie4_5_moe", dict(moe=dict(shared_size=0))),
    "afmoe, nothing undone (the control: passes)": ("afmoe", {}),
    "afmoe, attention values ungated": ("afmoe", dict(attn_gate="")),
    "afmoe, RoPE on its full layers too": ("afmoe", dict(nope_layers=())),
    "afmoe, unscaled embeddings": ("afmoe", dict(embed_scale=1.0)),
    "afmoe, weights not scaled": ("afmoe", dict(moe=dict(routed_scale=1.0))),
    "lfm2_moe, nothing undone (the control: passes)": ("lfm2_moe", {}),
    "lfm2_moe, softmax scores": ("lfm2_moe", dict(moe=dict(scoring="softmax"))),
    "lfm2_moe, chosen without the expert bias": ("lfm2_moe", dict(moe=dict(selection_bias=False))),
    "lfm2_moe, weights not scaled": ("lfm2_moe", dict(moe=dict(routed_scale=1.0))),
}


@pytest.mark.parametrize("name", UNDONE)
def test_each_change_undone_is_caught(name, tiny_checkpoint, tiny_engine, tmp_path):
    """The deliberately wrong variants: the engine's llm.onnx rewritten with one change undone."""
    import dataclasses
    import shutil

    from trtllm.builder import checkpoint as ckpt
    from trtllm.builder import export
    from trtllm.builder.architectures import spec_for, weights_of
    from trtllm.builder.decoder import DecoderWriter
    from trtllm.runtime import manifest as mf

    arch, changes = UNDONE[name]
    engine_dir = shutil.copytree(tiny_engine(arch), tmp_path / "engine")
    ck = ckpt.load(str(tiny_checkpoint(arch)))
    long_factors = changes.get("long_factors", False)  # not the spec's: the RoPE table's
    spec = spec_for(ck.model)
    for section in ("moe", "mamba"):
        if section in changes:
            changes = {**changes, section: dataclasses.replace(getattr(spec, section), **changes[section])}
    spec = dataclasses.replace(spec, **{k: v for k, v in changes.items() if k != "long_factors"})
    manifest = mf.load(engine_dir)  # (before llm.onnx is taken away: a manifest's files must be there)
    positions = manifest.limits.max_kv_cache_capacity
    cos, sin = ckpt.rope_tables(ck.model, positions)
    if long_factors:  # what transformers uses once a sequence passes original_max_position_embeddings
        with torch.no_grad():
            cos, sin = ck.model.model.rotary_emb(torch.zeros(1), torch.arange(positions + 1)[None])
        half = cos.shape[-1] // 2
        cos, sin = cos[0, :positions, :half].numpy(), sin[0, :positions, :half].numpy()
    local = ckpt.rope_tables(ck.model, positions, "sliding_attention") if spec.local_rope else None
    for file in (export.ONNX_NAME, export.ONNX_NAME + ".data"):
        (engine_dir / file).unlink(missing_ok=True)
    writer = DecoderWriter(spec, weights_of(ck.model, spec), cos, sin, manifest.max_top_k,
                           local_rope=local, verify_logits=manifest.prompt_logits)
    export.save(writer.write(), engine_dir, export.ONNX_NAME)
    resized(engine_dir)
    model, engine = hf_model(tiny_checkpoint(arch)), load_engine(engine_dir, graph="onnx")
    prompt = PROMPTS[1]
    generated, got = engine_logits(engine, prompt, num_decode=4)
    with torch.no_grad():
        ref = model(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1:].numpy()
    if not changes:
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
        return
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
