"""A request whose KV went non-finite (the model overflowed) fails alone: the next request in its
KV slots answers as it does alone, on a graph whose attention reads the masked positions too (the
legacy graph's standard-op attention: 0 x NaN is NaN), in plain decoding and in beam search."""
from __future__ import annotations

import numpy as np
import pytest

from trtllm.builder.config import BuildConfig
from trtllm.builder.export import build
from trtllm.runtime.backends import onnxruntime as ort_backend

pytestmark = pytest.mark.hf
CHAT = [{"role": "user", "content": "the cat the cat"}]


@pytest.fixture(scope="module")
def legacy_engine(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("legacy") / "engine"
    build(BuildConfig(model=str(tiny_checkpoint("llama")), output=str(out), graph="legacy", trt_version="10.3",
                      backend="onnxruntime", max_batch_size=4, max_input_len=128, max_kv_cache_capacity=256),
          log=lambda m: None)
    return out


def poison_call(monkeypatch, call: int) -> None:
    """The engine's `call`-th step overflows: every row's KV past the position it writes becomes NaN,
    and so do its logprobs (the request fails: its logits were not finite)."""
    step, calls = ort_backend.OnnxRuntimeEngine.step, [0]

    def overflowing(self, inputs, kv, want_logits=False):
        out = step(self, inputs, kv, want_logits)
        calls[0] += 1
        if calls[0] == call:
            for buf in kv:
                buf[:, :, int(inputs.write_index.max()) + 1:] = np.nan
            out.top_logprobs[:] = np.nan
        return out

    monkeypatch.setattr(ort_backend.OnnxRuntimeEngine, "step", overflowing)


@pytest.mark.parametrize("beams", [1, 2])
def test_the_request_after_an_overflow_in_its_slots_answers_as_alone(legacy_engine, run_cli, monkeypatch, beams):
    """batch_size 1 (beams: 2): request 0 fails at its first decode step (call 2); request 1 then
    takes its slots and answers as it does alone."""
    request = {"messages": CHAT, **({"num_beams": beams} if beams > 1 else {})}
    payload = {"temperature": 0, "max_generate_length": 6, "batch_size": beams}
    result, alone = run_cli(legacy_engine, {**payload, "requests": [request]})
    assert result.exit_code == 0, result.output
    poison_call(monkeypatch, 2)
    result, out = run_cli(legacy_engine, {**payload, "requests": [request, request]})
    assert result.exit_code == 1, result.output
    failed, after = out["responses"]
    assert failed["finish_reason"] == "error" and "not finite" in failed["error"]
    assert after["output_ids"] == alone["responses"][0]["output_ids"] and after["finish_reason"] != "error"
