"""EAGLE on an engine with an int8 KV cache (`--kv-cache-dtype int8`): verification writes the
drafted positions' rows (values and scale) into the int8 cache as a prompt chunk does, trees keep the
accepted path's rows (compacted row by row, scale with values), and the draft head keeps its own
float KV. Speculative answers are then plain decoding's on the same engine, token for token, greedy,
sampled and seeded, with logprobs and penalties, in chains and trees, in flight. The wrong variant,
a tree whose accepted rows are not moved into place, must differ."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")

from tests.parity.test_eagle_sampled import PARAMS, generate  # noqa: E402
from tests.parity.test_eagle_trained import trained  # noqa: E402,F401 (the fixture)
from trtllm.runtime.engine import load_engine  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402
from trtllm.runtime.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.hf
ROWS = [dataclasses.replace(p, num_logprobs=n) for p, n in zip(PARAMS, (2, 0, 3, 0, 1, 0))]
ROWS[5] = SamplingParams(temperature=0, repetition_penalty=0.9, presence_penalty=-0.3, max_new_tokens=24)


@pytest.fixture(scope="module")
def int8_engine(trained, tmp_path_factory):
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ck, draft_dir, _, _ = trained
    out = tmp_path_factory.mktemp("eagle-int8-kv") / "engine"
    return build(BuildConfig(model=str(ck), output=str(out), eagle=str(draft_dir), kv_cache_dtype="int8",
                             max_input_len=128, max_kv_cache_capacity=256,
                             verify=False), log=lambda m: None)  # (its flat random text: under the 93% floor)


def same(got, want) -> bool:
    """Tokens equal; logprobs within float rounding (a verified position's come from numpy)."""
    return all(g.output_ids == w.output_ids and len(g.logprobs) == len(w.logprobs)
               and np.allclose(g.token_logprobs, w.token_logprobs, atol=1e-4) for g, w in zip(got, want))


@pytest.mark.parametrize("step, top_k, num_slots", [(3, 1, None), (3, 1, 2), (2, 2, None), (3, 3, 3)])
def test_speculation_on_an_int8_cache_is_plain_decoding(trained, int8_engine, step, top_k, num_slots):
    _, _, _, prompts = trained
    m = load_engine(int8_engine).manifest
    assert m.model.kv_dtype == "int8" and m.eagle["verify"] == "sampled" and m.eagle["logprobs"]
    plain, _, want = generate(int8_engine, prompts, 0, params=ROWS, rows_out=True)
    got, timing, rows = generate(int8_engine, prompts, step, top_k, num_slots, params=ROWS, rows_out=True)
    assert got == plain and same(rows, want)
    assert timing.accepted_tokens >= 8


def test_wrong_variant_a_tree_that_keeps_its_rows_in_place_differs(trained, int8_engine, monkeypatch):
    """A tree's accepted nodes lie at their node positions in the KV; left there (not compacted to
    the path's positions), the next steps read the wrong rows."""
    _, _, _, prompts = trained
    greedy = [SamplingParams(temperature=0, max_new_tokens=24)] * len(prompts)
    plain, _ = generate(int8_engine, prompts, 0, params=greedy)
    got, timing = generate(int8_engine, prompts, 3, 3, params=greedy)
    assert got == plain and timing.accepted_tokens >= 8
    monkeypatch.setattr(KVCacheManager, "move_position", lambda *a: None)
    assert generate(int8_engine, prompts, 3, 3, params=greedy)[0] != plain
