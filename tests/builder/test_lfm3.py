"""LFM3's quantized engines on our kernels: its convolutions' projections and its attention gate (g_proj, a
logit a head: a projection only num_heads wide) quantized as every other projection, and the logits those
weights give in transformers, past the sliding layers' window."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.quantize import QuantScheme  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.plugins import cpu as cpu_kernels  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

from tests.builder.test_quantized import dequantized_model  # noqa: E402

pytestmark = pytest.mark.hf


@pytest.mark.parametrize("name", ["int8", "int4"])
def test_lfm3_on_our_kernels_matches_dequantized_transformers(name, tiny_checkpoint, tmp_path):
    """The same logits as transformers with the dequantized weights; the deliberately wrong variant (the
    float weights) misses them."""
    import onnx

    ckpt = tiny_checkpoint("lfm3")
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization=name, max_input_len=64,
                            max_kv_cache_capacity=128, verify=False), log=lambda m: None)
    nodes = onnx.load(out / "llm.ort.onnx", load_external_data=False).graph.node
    gates = [n for n in nodes if n.op_type == cpu_kernels.OP and "/g_proj" in n.name]
    assert len(gates) == 3  # (one on each of the tiny model's three attention layers)
    prompt = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11, 12, 13]  # past the window (8)
    generated, got = engine_logits(load_engine(out), prompt, num_decode=4)
    ids = torch.tensor([prompt + generated[:-1]])
    with torch.no_grad():
        ref = dequantized_model(ckpt, QuantScheme.named(name))(ids).logits[0, len(prompt) - 1:].numpy()
        model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        wrong = model(ids).logits[0, len(prompt) - 1:].numpy()
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=0)
    assert np.abs(got - wrong).max() > 1e-3
