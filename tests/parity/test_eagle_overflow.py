"""A model that overflows (NaN logits) at positions fed some tokens: a row fails where plain decoding
fails, at the token plain decoding draws from overflowed logits, never because a rejected draft
held such a token. A verification's top logprob is its last drafted position's, so it cannot say
which; the verified positions' logits can (`emit`)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")

from tests.parity.test_eagle_sampled import generate  # noqa: E402
from tests.parity.test_eagle_trained import trained  # noqa: E402,F401 (the fixture)
from trtllm.runtime.sampling import SamplingParams  # noqa: E402
from trtllm.runtime.speculative import SpecScheduler  # noqa: E402

pytestmark = pytest.mark.hf
PARAMS = [SamplingParams(temperature=0, repetition_penalty=1.3, max_new_tokens=24),
          SamplingParams(temperature=0.5, presence_penalty=0.5, max_new_tokens=24),
          SamplingParams(temperature=0, max_new_tokens=24)]


@pytest.fixture(scope="module")
def overflowing(trained, tmp_path_factory):
    """(engine dir, prompts, the tokens whose embedding is NaN): tokens the head drafts on these prompts
    that plain decoding under the first two PARAMS never emits."""
    from safetensors.numpy import load_file, save_file

    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    ck, draft_dir, engine_dir, prompts = trained
    emitted = set(np.concatenate(prompts).tolist())
    for p in PARAMS[:2]:
        emitted.update(t for ids in generate(engine_dir, prompts, 0, params=[p] * len(prompts))[0] for t in ids)
    drafted, real = [], SpecScheduler.verify
    mp = pytest.MonkeyPatch()
    mp.setattr(SpecScheduler, "verify", lambda self, slot, row, ids, drafts, *rest:
               drafted.extend(drafts) or real(self, slot, row, ids, drafts, *rest))
    for p in PARAMS[:2]:
        generate(engine_dir, prompts, 3, params=[p] * len(prompts))
    mp.undo()
    bad = sorted(set(drafted) - emitted)[:4]
    assert bad
    root = tmp_path_factory.mktemp("eagle-overflow")
    shutil.copytree(ck, root / "model")
    weights = load_file(str(ck / "model.safetensors"))
    embedding = weights["model.embed_tokens.weight"]
    weights["lm_head.weight"] = embedding.copy()  # (untied: the output rows stay as they were)
    embedding = embedding.copy()
    embedding[bad] = np.nan
    weights["model.embed_tokens.weight"] = embedding
    save_file(weights, str(root / "model" / "model.safetensors"))
    config = json.loads((root / "model" / "config.json").read_text())
    (root / "model" / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    out = build(BuildConfig(model=str(root / "model"), output=str(root / "engine"), eagle=str(draft_dir),
                            max_input_len=128, max_kv_cache_capacity=256, verify=False), log=lambda m: None)
    return out, prompts, bad


@pytest.mark.parametrize("params", PARAMS, ids=["penalized", "sampled", "greedy"])
def test_a_rejected_draft_that_overflows_fails_nothing(overflowing, params):
    engine_dir, prompts, _ = overflowing
    n = len(prompts)

    def run(step, top_k=1):
        _, _, rows = generate(engine_dir, prompts, step, top_k, params=[params] * n, rows_out=True)
        return [(r.output_ids, r.finish_reason, r.error) for r in rows]

    plain = run(0)
    if params is not PARAMS[2]:  # (plain greedy decoding itself feeds some of them: rows fail there too)
        assert all(why != "error" for _, why, _ in plain)
    assert run(3) == plain and run(3, 3) == plain


def test_wrong_variant_a_row_failed_on_its_last_draft_s_overflow(overflowing, monkeypatch):
    """The wrong variant: a verification whose last drafted position overflowed fails the row, though
    a rejected draft held the token (its top logprob cannot say which): rows fail that plain
    decoding answers."""
    from trtllm.runtime import speculative

    def failed_on_the_last(s, out):  # (whatever the positions' logits say)
        return not np.isfinite(out.top_logprobs[s, 0])

    engine_dir, prompts, _ = overflowing
    params = [PARAMS[0]] * len(prompts)
    plain = generate(engine_dir, prompts, 0, params=params, rows_out=True)[2]
    monkeypatch.setattr(speculative.SpecScheduler, "overflowed", staticmethod(failed_on_the_last))
    drafted = generate(engine_dir, prompts, 3, params=params, rows_out=True)[2]
    assert [r.finish_reason for r in drafted] != [r.finish_reason for r in plain]
