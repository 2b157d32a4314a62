"""--model FILE.gguf: what transformers' GGUF loader would silently get wrong is refused, and a
plain file loads the same model as its checkpoint."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from trtllm.builder import checkpoint  # noqa: E402

from tests.gguf_files import write_llama_gguf  # noqa: E402

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def untied_llama(tmp_path_factory):
    from tests.tiny_models import make_checkpoint

    return make_checkpoint("llama", tmp_path_factory.mktemp("gguf-src"), tie=False)


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
    assert checkpoint.load(str(path)).source["kind"] == "gguf"


@pytest.mark.parametrize("scaling", ["rope_freqs", "linear"])
def test_rope_scaling_the_loader_drops_is_refused(untied_llama, tmp_path, scaling):
    if scaling == "rope_freqs":  # Llama 3's scaling, stored as a tensor of frequency factors
        path = write_llama_gguf(untied_llama, tmp_path / "l3.gguf",
                                extra_tensors={"rope_freqs.weight": np.full(8, 2.0, np.float32)})
        match = "rope_freqs.weight"
    else:
        path = write_llama_gguf(untied_llama, tmp_path / "linear.gguf", rope_scaling=("linear", 4.0))
        match = "RoPE scaling 'linear'"
    with pytest.raises(checkpoint.CheckpointError, match=match):
        checkpoint.load(str(path))


def test_a_gemma_gguf_is_refused(untied_llama, tmp_path):
    """GGUF has no query_pre_attn_scalar or local RoPE base: transformers would fill defaults. Only
    the architectures whose GGUF loading is checked are taken."""
    path = write_llama_gguf(untied_llama, tmp_path / "g.gguf", arch="gemma3")
    with pytest.raises(checkpoint.CheckpointError, match="gemma3 GGUF, which is not supported .* build from"):
        checkpoint.load(str(path))
