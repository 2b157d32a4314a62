"""--lm-head-quantization int4: a quantized engine's lm_head in int4 (with offsets, as the int4 layers) and its
token embedding in int8 on its own (a tied table is then two): the logits transformers gives with those
weights on our kernels; the manifest, the check's floor, and ONNX Runtime's MatMulNBits form."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trtllm.builder.config import BuildConfig  # noqa: E402
from trtllm.builder.export import build  # noqa: E402
from trtllm.builder.quantize import QuantScheme  # noqa: E402
from trtllm.builder.verify import engine_logits  # noqa: E402
from trtllm.builder.verify_logits import min_agreement, number_format  # noqa: E402
from trtllm.runtime import manifest as mf  # noqa: E402
from trtllm.runtime.engine import load_engine  # noqa: E402

from tests.builder.test_quantized import dequantized_weight  # noqa: E402

pytestmark = pytest.mark.hf
PROMPT = [5, 17, 42, 99, 7, 31, 8, 64, 3, 11]


def reference(ckpt, scheme: QuantScheme):
    """transformers with its projections in `scheme`, its lm_head in the lm_head's and its token embedding
    in the tables' (untied: the engine holds two tables)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    table = model.model.embed_tokens.weight.detach().numpy()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.copy_(torch.from_numpy(dequantized_weight(p.numpy(), scheme).copy()))
        model.model.embed_tokens.weight = torch.nn.Parameter(
            torch.from_numpy(dequantized_weight(table, scheme.for_tables()).copy()))
        head = dequantized_weight(table, scheme.for_lm_head())
        model.lm_head.weight = torch.nn.Parameter(torch.from_numpy(head.copy()))
    return model


@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_an_int4_lm_head_computes_its_dequantized_weights(quantization, tiny_checkpoint, tmp_path):
    """Against transformers with those weights; the deliberately wrong variant, the int8 lm_head the
    engine would hold without the option, misses."""
    ckpt = tiny_checkpoint("llama")  # (tied: the lookup reads its int8 table, the lm_head its int4 one)
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization=quantization,
                            lm_head_quantization="int4", max_input_len=64, max_kv_cache_capacity=128, verify=False),
                log=lambda m: None)
    manifest = mf.load(out)
    assert manifest.quantization_scheme["lm_head_bits"] == 4
    assert number_format(manifest) == f"{quantization} lm_head-int4" and min_agreement(number_format(manifest)) == 0.70
    generated, got = engine_logits(load_engine(out), PROMPT, num_decode=4)
    ids = torch.tensor([PROMPT + generated[:-1]])
    with torch.no_grad():
        want = reference(ckpt, QuantScheme.named(quantization, lm_head="int4"))(ids).logits[0, len(PROMPT) - 1:]
        wrong = reference(ckpt, QuantScheme.named(quantization))(ids).logits[0, len(PROMPT) - 1:]
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4 * max(1.0, float(want.abs().max())), rtol=0)
    assert float(np.abs(got - wrong.numpy()).max()) > 1e-2


def test_matmulnbits_takes_an_int4_lm_head_and_an_int8_table_of_its_own(tiny_checkpoint, tmp_path):
    """ONNX Runtime's own kernels (--cpu-kernels onnxruntime): MatMulNBits reads the 4-bit lm_head, the lookup
    its own int8 table; the engine answers and says what it holds."""
    import onnx

    ckpt = tiny_checkpoint("llama")
    out = build(BuildConfig(model=str(ckpt), output=str(tmp_path / "e"), quantization="int4", cpu_kernels="onnxruntime",
                            lm_head_quantization="int4", max_input_len=64, max_kv_cache_capacity=128, verify=False),
                log=lambda m: None)
    nodes = {n.name: n for n in onnx.load(out / "llm.ort.onnx", load_external_data=False).graph.node}
    head = [n for name, n in nodes.items() if name.startswith("/lm_head") and n.op_type == "MatMulNBits"]
    assert len(head) == 1 and {a.name: a.i for a in head[0].attribute}["bits"] == 4
    scheme = json.loads((out / "manifest.json").read_text())["quantization_scheme"]
    assert "the lm_head in int4 and the token embedding in int8" in scheme["weights"]
    generated, _ = engine_logits(load_engine(out), PROMPT, num_decode=4)
    assert len(generated) == 5
