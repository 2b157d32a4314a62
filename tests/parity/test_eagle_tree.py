"""EAGLE draft trees (trtllm-run --spec-draft-top-k K > 1) against transformers, on tiny random checkpoints:

- one verification step over a tree (each node at its parent's next position, seeing only its
  ancestors) gives, at every node, transformers' greedy token and the head's input (eagle_hidden)
  for the text along that node's path; the wrong variant, the same step under the plain causal
  mask, must not;
- the head's draft_top_ids are the reference head's best proposals, best first;
- the trees the runtime drafts are the reference head's: every node is its parent's candidate of
  the same rank (the head runs over a tree's nodes with a tree mask of its own); the wrong variant,
  expansions that see each other, must not be;
- speculation with trees gives transformers' greedy tokens, in a batch and in flight; with trees
  whose accepted paths are scattered through the step (an oracle writes the right tokens into
  them: random heads are rarely right), the accepted nodes' KV moves to follow the root and the
  head catches up on them, so later tokens and the head's next candidates stay exact; the wrong
  variant, a path accepted without moving its KV, must miss.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trtllm.builder.eagle_reference import Reference  # noqa: E402
from trtllm.runtime import sampling  # noqa: E402
from trtllm.runtime.engine import StepInputs, load_engine  # noqa: E402
from trtllm.runtime.generate import RowState, prefill_inputs  # noqa: E402
from trtllm.runtime.kv_cache import KVCacheManager  # noqa: E402
from trtllm.runtime.speculative import Drafter, SpecScheduler  # noqa: E402
from tests.parity.test_eagle_parity import ATOL, PROMPTS, eagle_setup, speculate  # noqa: E402,F401
from tests.parity.test_tiny_parity import hf_greedy, hf_model  # noqa: E402

pytestmark = pytest.mark.hf
# (arch, graph): our attention kernel (modern, ONNX Runtime form), the standard ops of the legacy
# graph, and sliding windows (Gemma 3's, 8 on some layers, with their own RoPE: a node's window
# counts from its position, not its slot), and Gemma 4's (its last layers reading earlier layers' KV, the
# tree's rows in it too, from our kernel's shared_kv nodes)
CASES = [("llama", "modern"), ("llama", "legacy"), ("mistral", "modern"), ("gemma3", "modern"), ("gemma4", "modern")]
# a tree over 6 nodes: 0 the row's last token, 1-2-3 the chain, 4 and 5 branches beside 1
PARENTS = [-1, 0, 1, 2, 0, 0]


def tree_step(engine_dir, prompt: list[int], nodes: list[int], causal: bool = False):
    """The prompt but its last token prefilled, then one step over the tree PARENTS with `nodes` as
    its tokens (nodes[0] = the prompt's last token): (verify_ids, eagle_hidden) at each node."""
    engine = load_engine(engine_dir)
    m = engine.manifest
    params = sampling.SamplingParams(temperature=0.0)
    batch = sampling.make_batch([params], m.model.vocab_size, m.max_top_k)
    row = RowState(prompt_ids=prompt[:-1], params=params, rng=np.random.default_rng(0), eos_ids=frozenset())
    kv = KVCacheManager(m.model, 1, 64)
    engine.step(prefill_inputs([row], m.pad_token_id, batch), kv.view(0, 1))
    p, n = len(prompt) - 1, len(nodes)
    depth, mask = [0] * n, np.zeros((1, n, n), np.bool_)
    for i, parent in enumerate(PARENTS):
        depth[i] = 0 if parent < 0 else depth[parent] + 1
        j = i
        while j >= 0:  # the node and its ancestors
            mask[0, i, j], j = True, PARENTS[j]
    out = engine.step(StepInputs(input_ids=np.array([nodes]), position_ids=p + np.array([depth]),
                                 write_index=np.array([p]), last_index=np.array([n - 1]), sampling=batch,
                                 verify_index=np.arange(n)[None], tree_mask=None if causal else mask),
                      kv.view(0, 1))
    return out.verify_ids[0], out.hidden[0]


def path(prompt: list[int], nodes: list[int], i: int) -> list[int]:
    """The text a node continues: the prompt, then its ancestors' tokens and its own."""
    tokens = []
    while i > 0:
        tokens.insert(0, nodes[i])
        i = PARENTS[i]
    return prompt + tokens


@pytest.mark.parametrize("arch,graph", CASES)
def test_a_tree_step_equals_each_path_alone(arch, graph, eagle_setup):
    ck, draft_dir, engine_dir = eagle_setup(arch, graph=graph)
    model, prompt = hf_model(ck), PROMPTS[1]
    ref = Reference(draft_dir, model)
    nodes = [prompt[-1], 17, 250, 33, 99, 5]
    ids, hidden = tree_step(engine_dir, prompt, nodes)
    for i in range(len(nodes)):
        text = path(prompt, nodes, i)
        assert int(ids[i]) == hf_greedy(model, text, 1)[0], f"node {i}"
        # (our kernel's float32 sums differ from transformers' by up to ~1e-4 at values up to ~25,
        # branch or not; the causal mask puts a branch 20+ off)
        np.testing.assert_allclose(hidden[i], ref.target_hidden(text)[-1].numpy(), atol=2 * ATOL, rtol=1e-5)
    # the wrong variant: without the tree mask, the branches (nodes 4, 5) see the chain before them
    _, causal = tree_step(engine_dir, prompt, nodes, causal=True)
    for i in (4, 5):
        assert not np.allclose(causal[i], ref.target_hidden(path(prompt, nodes, i))[-1].numpy(), atol=ATOL)


def test_the_heads_best_proposals_are_the_references(eagle_setup):
    ck, draft_dir, engine_dir = eagle_setup("llama")
    ref = Reference(draft_dir, hf_model(ck))
    engine = load_engine(engine_dir)
    drafter = Drafter.load(engine_dir, engine.manifest, 1, 4)
    prompt = PROMPTS[1]
    hidden = ref.target_hidden(prompt[:-1]).numpy()
    n = len(prompt) - 1
    d, _, top, logprobs, nodes = drafter.engine.draft(
        np.array([prompt[1:]]), hidden[None], np.arange(n)[None], np.array([0]), np.array([n - 1]),
        KVCacheManager(drafter.engine.manifest.model, 1, 64).view(0, 1), top=True)
    k = engine.manifest.eagle["top_k"]
    assert top.shape == logprobs.shape == (1, 1, k) and nodes.shape == (1, 0, 64) and int(top[0, 0, 0]) == int(d[0])
    assert top[0, 0].tolist() == ref.candidates(prompt, k)
    assert np.all(np.diff(logprobs[0, 0]) <= 0) and np.exp(logprobs[0, 0]).sum() <= 1 + 1e-6


def record_trees(monkeypatch):
    """Every tree the runtime verifies, with the text before it."""
    seen, real = [], SpecScheduler.verify_tree

    def record(self, slot, row, tree, greedy, *rest):
        seen.append((row.prompt_ids + row.output_ids, tree))
        return real(self, slot, row, tree, greedy, *rest)

    monkeypatch.setattr(SpecScheduler, "verify_tree", record)
    return seen


def check_candidates(ref, seen, k: int) -> None:
    """Each tree's nodes are the reference head's candidates of their rank after their parent's path."""
    for text, tree in seen[:6]:
        for i in range(1, len(tree)):
            parent, path = tree.parents[i], []
            while parent > 0:
                path.insert(0, tree.tokens[parent])
                parent = tree.parents[parent]
            assert tree.tokens[i] == ref.candidates(text, k, tuple(path))[tree.ranks[i]], f"node {i} of {tree}"


@pytest.mark.parametrize("arch,graph", CASES)
def test_trees_are_the_reference_heads_and_keep_transformers_tokens(arch, graph, eagle_setup, monkeypatch):
    """The head's own trees (a random head's: seldom right), batched then two slots in flight."""
    ck, draft_dir, engine_dir = eagle_setup(arch, graph=graph)
    model = hf_model(ck)
    lengths = [12, 20, 9]
    want = [hf_greedy(model, p, k) for p, k in zip(PROMPTS, lengths)]
    for slots in (None, 2):
        seen = record_trees(monkeypatch)
        # every candidate verified: the root's 3, their 9 children, the 3 best children's 9
        got, _, timing = speculate(engine_dir, PROMPTS, lengths, num_slots=slots, step=3, top_k=3, verify_size=22)
        # (near a row's end the trees are shallower: a depth-1 tree of the root's 3 candidates)
        assert got == want and sum(len(t) == 22 and max(t.depths) == 3 for _, t in seen) >= 10
        assert timing.drafted_tokens == sum(len(t) - 1 for _, t in seen)
    check_candidates(Reference(draft_dir, model), seen, 3)


def test_onnx_runtimes_attention_drafts_chains(eagle_setup):
    """Mistral's window on ONNX Runtime's own kernels (--cpu-kernels onnxruntime): the model runs on
    the standard ops (its window: no GroupQueryAttention) and the head on GroupQueryAttention, which
    takes no tree mask, so neither graph takes trees; the engine speculates with chains."""
    import onnx

    from trtllm.runtime.manifest import ManifestError, load

    ck, _, engine_dir = eagle_setup("mistral", kernels="onnxruntime")
    m = load(engine_dir)
    assert m.eagle["tree"] is False and m.eagle["draft_top_k"] == 1
    for name in (m.files["compiled"], m.eagle["compiled"]):
        assert not {"tree_mask", "draft_index"} & {i.name for i in onnx.load(engine_dir / name).graph.input}
    with pytest.raises(ManifestError, match="drafts chains only"):
        Drafter.load(engine_dir, m, 2, 2)
    got, _, _ = speculate(engine_dir, PROMPTS, 12, step=3)
    assert got == [hf_greedy(hf_model(ck), p, 12) for p in PROMPTS]


def test_wrong_variant_expansions_that_see_each_other_are_caught(eagle_setup, monkeypatch):
    from trtllm.runtime import draft_tree

    ck, draft_dir, engine_dir = eagle_setup("llama")
    real = draft_tree.expansion_mask
    monkeypatch.setattr(draft_tree, "expansion_mask", lambda *a: np.tril(np.ones_like(real(*a)), k=a[2]))
    seen = record_trees(monkeypatch)
    speculate(engine_dir, PROMPTS, [12, 20, 9], step=3, top_k=3, verify_size=22)
    with pytest.raises(AssertionError):
        check_candidates(Reference(draft_dir, hf_model(ck)), seen, 3)


def oracle(monkeypatch, model, prompts, lengths, move: bool = True):
    """Trees whose right path is scattered: under the root, a wrong node then the right token; under
    that, two wrong nodes then the right one; and so on (a depth-3 tree of 9 nodes), so that the
    accepted nodes sit at slots 2, 5 and 8 and move to 1, 2 and 3. Records each cycle's root
    candidates (what the head proposed after the last catch-up). `move` False: the wrong variant,
    the paths accepted without moving their KV."""
    from trtllm.runtime import draft_tree

    want = {tuple(p): hf_greedy(model, p, k) for p, k in zip(prompts, lengths)}
    roots, real = [], draft_tree.grow

    def grow(run_head, root_info, batch, width, depth, size, guess=None):
        trees = real(run_head, root_info, batch, width, depth, size, guess)
        for s in trees:
            if size[s] < 9 or depth < 3:  # (near a row's end, or the KV's: the head's own tree)
                continue
            row = current[0].active[s]
            roots.append((row.prompt_ids + row.output_ids, [int(t) for t in root_info[s][2][:width]]))
            full, at = want[tuple(row.prompt_ids)], len(row.output_ids)
            right = full[at: at + 3] + [0] * 3
            wrong = [(t + 1) % 300 for t in right]
            trees[s] = draft_tree.DraftTree([root_info[s][0], wrong[0], right[0], wrong[1], wrong[1] + 1, right[1],
                                             wrong[2], wrong[2] + 1, right[2]], [-1, 0, 0, 2, 2, 2, 5, 5, 5],
                                            [0, 0, 1, 0, 1, 2, 0, 1, 2])
        return trees

    current, decode = [None], SpecScheduler.decode

    def tracked(self):
        current[0] = self
        return decode(self)

    monkeypatch.setattr(draft_tree, "grow", grow)
    monkeypatch.setattr(SpecScheduler, "decode", tracked)
    if not move:
        monkeypatch.setattr(KVCacheManager, "move_position", lambda self, slot, src, dst: None)
    return [want[tuple(p)] for p in prompts], roots


@pytest.mark.parametrize("arch,graph", CASES)
def test_scattered_accepted_paths_keep_the_tokens_and_the_heads_candidates(arch, graph, eagle_setup, monkeypatch):
    ck, draft_dir, engine_dir = eagle_setup(arch, graph=graph)
    model = hf_model(ck)
    lengths = [16, 24, 10]
    want, roots = oracle(monkeypatch, model, PROMPTS, lengths)
    got, _, timing = speculate(engine_dir, PROMPTS, lengths, num_slots=2, step=3, top_k=3, verify_size=9)
    assert got == want
    assert timing.accepted_tokens >= 3 * (timing.verify_runs - 4)  # every full cycle took its 3 drafts
    ref = Reference(draft_dir, model)
    assert len(roots) >= 8 and all(ref.candidates(text, 3) == cands for text, cands in roots[:8])


def test_wrong_variant_a_path_without_its_kv_misses(eagle_setup, monkeypatch):
    ck, draft_dir, engine_dir = eagle_setup("llama")
    model = hf_model(ck)
    lengths = [16, 24, 10]
    want, roots = oracle(monkeypatch, model, PROMPTS, lengths, move=False)
    got, _, _ = speculate(engine_dir, PROMPTS, lengths, num_slots=2, step=3, top_k=3, verify_size=9)
    ref = Reference(draft_dir, model)
    assert got != want or any(ref.candidates(text, 3) != cands for text, cands in roots[:8])


def test_scattered_accepted_paths_on_tensorrt(tmp_path, monkeypatch):
    """The same on the TensorRT backend (tests/fakes: a strict stand-in that runs the plans' ONNX):
    the head's plan takes the tree inputs, and the accepted nodes' KV moves on the device."""
    from tests import fakes
    from tests.eagle_drafts import random_draft
    from tests.tiny_models import make_checkpoint
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build
    from trtllm.runtime.backends.tensorrt import DeviceKVCache

    ck = make_checkpoint("llama", tmp_path / "model", num_layers=6)
    draft_dir = random_draft(ck, tmp_path / "draft", seed=1)
    model = hf_model(ck)
    lengths = [16, 24, 10]
    moves = []
    real_move = DeviceKVCache.move_position
    monkeypatch.setattr(DeviceKVCache, "move_position",
                        lambda self, slot, src, dst: moves.append((src - dst)) or real_move(self, slot, src, dst))
    want, roots = oracle(monkeypatch, model, PROMPTS, lengths)
    with fakes.installed():
        engine_dir = build(BuildConfig(model=str(ck), output=str(tmp_path / "trt"), eagle=str(draft_dir),
                                       backend="tensorrt", max_input_len=64, max_kv_cache_capacity=128),
                           log=lambda m: None)
        got, _, timing = speculate(engine_dir, PROMPTS, lengths, num_slots=2, step=3, top_k=3, verify_size=9)
    assert got == want and timing.accepted_tokens >= 3 * (timing.verify_runs - 4)
    assert len(moves) >= 3 * 8 and set(moves) == {1, 3, 5}  # slots 2, 5, 8 to 1, 2, 3
    ref = Reference(draft_dir, model)
    assert len(roots) >= 8 and all(ref.candidates(text, 3) == cands for text, cands in roots[:8])


def test_trees_stay_shallower_than_a_sliding_window(eagle_setup):
    """A node's window counts from its position; the kernels bound it by slot, where an ancestor
    placed after a sibling sits later than its position: a tree as deep as the window would let a
    deep node see an ancestor plain decoding hides (found by review, window 1 at depth 3). Such
    depths are refused, and `auto` stays below the window; chains are not bounded."""
    import dataclasses

    from trtllm.runtime.manifest import ManifestError, load

    _, _, engine_dir = eagle_setup("llama")
    m = load(engine_dir)
    narrow = dataclasses.replace(m, model=dataclasses.replace(m.model, sliding_window=3))
    with pytest.raises(ManifestError, match="shallower than the model's sliding window \\(3\\): at most 2"):
        Drafter.load(engine_dir, narrow, 3, 2)
    auto, chain = Drafter.load(engine_dir, narrow, "auto", 2), Drafter.load(engine_dir, narrow, 5, 1)
    assert auto.step == 2 and auto.start <= 2
    assert chain.step == 5  # (a chain's ancestors sit at their positions)
    auto.close()
    chain.close()
