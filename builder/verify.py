"""Check a freshly built engine against transformers before trtllm-build reports success.

The engine prefills a short prompt and decodes greedily; transformers runs one forward pass over
the same tokens. Every position's logits must agree within `atol`, else the build fails.
"""
from __future__ import annotations

import numpy as np
import torch

from trtllm.runtime import sampling
from trtllm.runtime.engine import load_engine
from trtllm.runtime.generate import RowState, decode_inputs, prefill_inputs
from trtllm.runtime.kv_cache import KVCacheManager

VERIFY_TEXT = "The quick brown fox jumps over the lazy dog. Edge devices run language models"
NUM_DECODE = 8


class VerifyError(RuntimeError):
    """The engine's logits differ from transformers'."""


def engine_logits(engine, prompt_ids: list[int], num_decode: int) -> tuple[list[int], np.ndarray]:
    """Greedy decode with the engine; returns (generated ids, logits [1 + num_decode, V])."""
    params = sampling.SamplingParams(temperature=0.0, max_new_tokens=num_decode + 1)
    row = RowState(prompt_ids=prompt_ids, params=params, rng=np.random.default_rng(0), eos_ids=frozenset())
    batch = sampling.make_batch([params], engine.manifest.model.vocab_size, engine.manifest.max_top_k)
    kv = KVCacheManager(engine.manifest.model, 1, len(prompt_ids) + num_decode + 1)
    inputs, logits = prefill_inputs([row], engine.manifest.pad_token_id, batch), []
    for _ in range(num_decode + 1):
        out = engine.step(inputs, kv.view(0, 1), want_logits=True)
        logits.append(out.logits[0])
        row.output_ids.append(int(out.token_ids[0]))
        inputs = decode_inputs([row], engine.manifest.pad_token_id, batch)
    return row.output_ids, np.stack(logits)


def verify_engine(engine_dir, ck, atol: float = 1e-3) -> dict:
    ids = ck.tokenizer.encode(VERIFY_TEXT, add_special_tokens=False)[:24]
    if len(ids) < 4:  # tiny test tokenizers may not cover the text
        ids = list(range(1, 17))
    engine = load_engine(engine_dir, graph="compiled")
    try:
        generated, got = engine_logits(engine, ids, NUM_DECODE)
    finally:
        engine.close()
    full = torch.tensor([ids + generated[:-1]], dtype=torch.int64)
    with torch.no_grad():
        ref = ck.model(full).logits[0, len(ids) - 1:].float().numpy()
    err = float(np.abs(got - ref).max())
    agree = [int(t) for t in ref.argmax(-1)] == generated
    report = {"num_positions": int(ref.shape[0]), "max_abs_error": err, "atol": atol,
              "max_abs_logit": float(np.abs(ref).max()), "tokens_agree": agree}
    if err > atol:
        raise VerifyError(f"engine logits differ from transformers by up to {err:.3g} (> {atol}); "
                          "the build is wrong. Rebuild with --no-verify only to inspect it")
    return report
