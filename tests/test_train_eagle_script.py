"""scripts/train_eagle.py on a tiny random Llama: the EAGLE-3 checkpoint it writes (config, tensors, vocab
maps), that training lowers the loss, and its draft forward against a plain per-query reimplementation."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import train_eagle  # noqa: E402
from tests.tiny_models import make_checkpoint  # noqa: E402

NUM_LAYERS, DRAFT_VOCAB = 6, 64


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target dir, draft dir, train() result): 12 prompts x 16 tokens, 2 TTT steps, a few seconds."""
    tmp = tmp_path_factory.mktemp("eagle")
    model = make_checkpoint("llama", tmp / "m", num_layers=NUM_LAYERS)
    result = train_eagle.train(model, tmp / "draft", num_prompts=12, max_new_tokens=16, draft_vocab=DRAFT_VOCAB,
                               steps_ttt=2, epochs=4, lr=3e-3, batch_size=4, threads=2, log=lambda _: None)
    return model, tmp / "draft", result


def test_checkpoint_layout(trained):
    from safetensors.torch import load_file

    model, draft, _ = trained
    target = json.loads((model / "config.json").read_text())
    assert not (draft.parent / "draft.partial").exists()
    config = json.loads((draft / "config.json").read_text())
    H, I, V = target["hidden_size"], target["intermediate_size"], target["vocab_size"]
    nh, nkv, D = target["num_attention_heads"], target["num_key_value_heads"], target["head_dim"]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["head_dim"]) == (H, I, nh, nkv, D)
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert (config["vocab_size"], config["draft_vocab_size"]) == (V, DRAFT_VOCAB)
    assert config["rope_theta"] == 10000.0 and config["rope_scaling"] is None
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, NUM_LAYERS // 2, NUM_LAYERS - 3]}
    tensors = load_file(str(draft / "model.safetensors"))
    mid = "midlayer."
    shapes = {"fc.weight": [H, 3 * H], mid + "input_layernorm.weight": [H], mid + "hidden_norm.weight": [H],
              mid + "post_attention_layernorm.weight": [H], mid + "self_attn.q_proj.weight": [nh * D, 2 * H],
              mid + "self_attn.k_proj.weight": [nkv * D, 2 * H], mid + "self_attn.v_proj.weight": [nkv * D, 2 * H],
              mid + "self_attn.o_proj.weight": [H, nh * D], mid + "mlp.gate_proj.weight": [I, H],
              mid + "mlp.up_proj.weight": [I, H], mid + "mlp.down_proj.weight": [H, I], "norm.weight": [H],
              "lm_head.weight": [DRAFT_VOCAB, H], "d2t": [DRAFT_VOCAB], "t2d": [V]}
    assert {k: list(v.shape) for k, v in tensors.items()} == shapes
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert all(v.dtype == torch.float32 for k, v in tensors.items() if k not in ("d2t", "t2d"))
    target_ids = torch.arange(DRAFT_VOCAB) + tensors["d2t"]
    assert int(tensors["t2d"].sum()) == DRAFT_VOCAB and bool(tensors["t2d"][target_ids].all())
    assert bool((target_ids[1:] > target_ids[:-1]).all())


def test_training_lowers_the_loss(trained):
    _, _, result = trained
    losses = result["losses"]
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3, losses
    assert len(result["accuracy"]) == 2 and set(result["timings"]) >= {"generate_s", "extract_s", "epoch_1_s"}


def test_too_few_layers_names_the_field(tmp_path):
    """The default [2, L//2, L-3] is three layers of any model of 3 or more ([2, 1, 0]: trtllm-build and
    vLLM take it); 2 layers cannot have it."""
    assert train_eagle.aux_layer_ids(3, None) == [2, 1, 0]
    model = make_checkpoint("llama", tmp_path / "m", num_layers=2)
    with pytest.raises(ValueError, match="num_hidden_layers must be >= 3.*give --aux-layers"):
        train_eagle.train(model, tmp_path / "draft", num_prompts=2, max_new_tokens=2, log=lambda _: None)


def test_aux_layers_train_a_head_for_a_small_model(tmp_path, capsys):
    """--aux-layers: a 2-layer model (the default [2, L//2, L-3] cannot be) gets a head reading the
    layers given, written into its eagle_config, which the builder takes. Indices out of the model's
    range, or not three, are usage errors (exit 2) before the model loads."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    model = make_checkpoint("llama", tmp_path / "m", num_layers=2)
    train_eagle.train(model, tmp_path / "draft", num_prompts=4, max_new_tokens=4, draft_vocab=DRAFT_VOCAB, steps_ttt=1,
                      epochs=1, batch_size=4, aux_layers=[0, 1, 1], log=lambda _: None)
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 1]
    engine = build(BuildConfig(model=str(model), output=str(tmp_path / "engine"), eagle=str(tmp_path / "draft"),
                               max_input_len=32, max_kv_cache_capacity=64), log=lambda _: None)
    assert json.loads((engine / "verify.json").read_text())["eagle"]["proposals_agree"]
    in_range = "--aux-layers must be three layer indices in [0, 2)"
    # (-1,0,1: argparse read a leading "-" as an option, "expected one argument")
    for bad, said in (("0,1,2", in_range), ("0,1", in_range), ("-1,0,1", in_range),
                      ("a,b,c", "three comma-separated layer indices, got 'a,b,c'")):
        with pytest.raises(SystemExit) as e:
            train_eagle.main(["--model", str(model), "--output", str(tmp_path / "bad"), "--aux-layers", bad])
        assert e.value.code == 2 and said in capsys.readouterr().err, bad


def test_output_never_replaces_the_model_or_what_is_not_a_head(tmp_path, capsys):
    """--output is replaced whole: it deleted the files of a directory given by mistake, and the
    model itself as --output. Refused before the model loads (exit 2), as are options out of range."""
    model = make_checkpoint("llama", tmp_path / "m", num_layers=4)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "important.txt").write_text("mine")
    for output, says in ((model, "would replace or sit inside --model"), (model / "head", "sit inside --model"),
                         (tmp_path / "notes", "holds more than an earlier head")):
        with pytest.raises(SystemExit) as e:
            train_eagle.main(["--model", str(model), "--output", str(output)])
        assert e.value.code == 2 and says in capsys.readouterr().err
    assert (tmp_path / "notes" / "important.txt").read_text() == "mine" and (model / "config.json").is_file()
    for option, value in (("--batch-size", "0"), ("--num-prompts", "1"), ("--steps-ttt", "0"), ("--lr", "-1")):
        with pytest.raises(SystemExit) as e:
            train_eagle.main(["--model", str(model), "--output", str(tmp_path / "head"), option, value])
        assert e.value.code == 2 and option in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        train_eagle.main(["--model", str(model), "--output", str(tmp_path / "head"), "--draft-vocab", "100000"])
    assert e.value.code == 2 and "--draft-vocab must be at most the model's vocabulary size" in capsys.readouterr().err


def test_prompts_do_not_repeat_and_held_out_asks_are_unseen():
    import eagle_prompts

    chats, held = eagle_prompts.build_prompts(len(eagle_prompts.QUESTIONS) * len(eagle_prompts.SYSTEMS), seed=0)
    assert len({json.dumps(c) for c in chats}) == len(chats)  # a duplicate chat is a duplicate greedy answer
    asks = [{c[-1]["content"] for c, h in zip(chats, held) if h == side} for side in (True, False)]
    assert asks[0] and not asks[0] & asks[1] and 0.05 < sum(held) / len(held) < 0.15


def reference_step(w, cfg, embed, ids, hidden, positions, earlier, swap_halves=False):
    """One draft step, query by query in float64: query i sees step-1 keys j <= i and earlier steps' keys at i."""
    nh, nkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, 1e-6
    w = {k: v.double() for k, v in w.items() if v.is_floating_point()}
    m = "midlayer."
    rms = lambda x, g: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g  # noqa: E731
    halves = [rms(embed[ids].double(), w[m + "input_layernorm.weight"]),
              rms(hidden.double(), w[m + "hidden_norm.weight"])]
    x = torch.cat(halves[::-1] if swap_halves else halves, -1)  # [S, 2H]
    S = len(ids)

    def rope(v, p):  # v [heads, D] at position p
        angle = p * 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        cos, sin = torch.cat([angle.cos()] * 2), torch.cat([angle.sin()] * 2)
        return v * cos + torch.cat([-v[:, D // 2:], v[:, :D // 2]], -1) * sin

    q = torch.stack([rope(r, p) for r, p in zip((x @ w[m + "self_attn.q_proj.weight"].T).view(S, nh, D), positions)])
    k = torch.stack([rope(r, p) for r, p in zip((x @ w[m + "self_attn.k_proj.weight"].T).view(S, nkv, D), positions)])
    v = (x @ w[m + "self_attn.v_proj.weight"].T).view(S, nkv, D)
    steps = earlier + [(k, v)]
    out = torch.zeros(S, nh, D, dtype=torch.float64)
    for i in range(S):
        keys = torch.cat([steps[0][0][:i + 1]] + [s[0][i:i + 1] for s in steps[1:]])  # [n, nkv, D]
        values = torch.cat([steps[0][1][:i + 1]] + [s[1][i:i + 1] for s in steps[1:]])
        for h in range(nh):
            p = torch.softmax(keys[:, h * nkv // nh] @ q[i, h] / D ** 0.5, 0)
            out[i, h] = p @ values[:, h * nkv // nh]
    g = hidden.double() + out.reshape(S, nh * D) @ w[m + "self_attn.o_proj.weight"].T
    y = rms(g, w[m + "post_attention_layernorm.weight"])
    gate, up = y @ w[m + "mlp.gate_proj.weight"].T, y @ w[m + "mlp.up_proj.weight"].T
    return g + (torch.nn.functional.silu(gate) * up) @ w[m + "mlp.down_proj.weight"].T, (k, v)


def test_draft_forward_matches_a_plain_reimplementation(trained):
    """Two TTT steps of Eagle3Draft (loaded strictly from the checkpoint) against reference_step; the
    deliberately wrong variant (embedding and hidden halves swapped) must not match."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    model, draft_dir, _ = trained
    cfg = AutoConfig.from_pretrained(model)
    embed = AutoModelForCausalLM.from_pretrained(model).get_input_embeddings().weight.detach()
    w = load_file(str(draft_dir / "model.safetensors"))
    draft = train_eagle.Eagle3Draft(cfg, embed, torch.arange(DRAFT_VOCAB) + w["d2t"])
    draft.load_state_dict(w, strict=True)
    torch.manual_seed(1)
    S, H = 7, cfg.hidden_size
    ids1, ids2 = torch.randint(0, cfg.vocab_size, (2, S))
    aux = torch.randn(S, 3 * H) * 3.0
    positions = torch.arange(S) + 5
    with torch.no_grad():
        g1 = draft.fc(aux[None])
        out1, kv1 = draft(ids1[None], g1, positions[None])
        out2, _ = draft(ids2[None], out1, positions[None] + 1, [kv1])
        ref1, ref_kv1 = reference_step(w, cfg, embed, ids1, g1[0], positions, [])
        ref2, _ = reference_step(w, cfg, embed, ids2, out1[0], positions + 1, [ref_kv1])
        wrong, _ = reference_step(w, cfg, embed, ids1, g1[0], positions, [], swap_halves=True)
    for got, want in ((out1[0], ref1), (out2[0], ref2)):
        err = (got.double() - want).abs()
        assert float(err.max()) < 1e-4 * (1 + float(want.abs().max())), f"max abs error {float(err.max()):.3g}"
    assert float((out1[0].double() - wrong).abs().max()) > 1e-2


def test_unrolled_steps_are_aligned(trained):
    """TTT step t at index q: token x_{q+t} at position q+t-1, label the target's argmax at q+t, answers only."""
    from transformers import AutoConfig

    model, _, _ = trained
    cfg = AutoConfig.from_pretrained(model)
    n, prompt_len, H = 9, 3, cfg.hidden_size
    draft = train_eagle.Eagle3Draft(cfg, torch.randn(cfg.vocab_size, H), torch.arange(DRAFT_VOCAB))
    item = {"ids": torch.arange(100, 100 + n), "greedy": torch.arange(n) % DRAFT_VOCAB + 1,
            "aux": torch.randn(n, 3 * H), "prompt_len": prompt_len}
    t2d_index = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    t2d_index[:DRAFT_VOCAB] = torch.arange(DRAFT_VOCAB)
    calls, forward = [], draft.forward
    draft.forward = lambda ids, hidden, positions, cache=(): calls.append((ids[0], positions[0])) or forward(
        ids, hidden, positions, cache)
    with torch.no_grad():
        steps = list(train_eagle.unroll(draft, train_eagle.collate([item], t2d_index), 3))
    assert len(calls) == len(steps) == 3
    for t, ((_, target, labels, _), (ids, positions)) in enumerate(zip(steps, calls), start=1):
        q = torch.arange(prompt_len - 1 - t, n - t).clamp(min=0).unique()  # q + t in [prompt_len - 1, n - 1]
        assert torch.equal(ids[q], item["ids"][q + t]) and torch.equal(positions[q], q + t - 1)
        assert torch.equal(target, item["greedy"][q + t]) and torch.equal(labels, target)


def test_trtllm_build_takes_the_trained_head(trained, tmp_path):
    """What the script writes is what --eagle reads: the build loads it, exports its graph and checks
    that graph against the reference head (verify.json's eagle section)."""
    from trtllm.builder.config import BuildConfig
    from trtllm.builder.export import build

    model, draft, _ = trained
    engine = build(BuildConfig(model=str(model), output=str(tmp_path / "engine"), eagle=str(draft),
                               max_batch_size=2, max_input_len=32, max_kv_cache_capacity=64), log=lambda m: None)
    report = json.loads((engine / "verify.json").read_text())["eagle"]
    assert report["proposals_agree"], report
    assert report["hidden_max_abs_error"] <= 1e-3 * max(1.0, report["hidden_max_abs"]), report
    assert report["draft_max_abs_error"] <= 1e-3 * max(1.0, report["draft_max_abs"]), report


def test_soft_labels(trained, tmp_path):
    """--soft-labels K: the target's K likeliest tokens and probabilities as the label. One-hot soft labels
    on the argmax give the hard loss exactly; training on real ones lowers the loss."""
    from transformers import AutoConfig

    model, _, _ = trained
    cfg = AutoConfig.from_pretrained(model)
    n, H = 9, cfg.hidden_size
    draft = train_eagle.Eagle3Draft(cfg, torch.randn(cfg.vocab_size, H), torch.arange(DRAFT_VOCAB))
    greedy = torch.arange(n) % DRAFT_VOCAB + 1
    soft_ids = torch.stack([greedy, greedy + 1, torch.full((n,), DRAFT_VOCAB + 5)], -1)  # the last: not drafted
    item = {"ids": torch.arange(100, 100 + n), "greedy": greedy, "aux": torch.randn(n, 3 * H), "prompt_len": 3,
            "soft_ids": soft_ids, "soft_p": torch.tensor([1.0, 0.0, 0.0]).expand(n, 3)}
    t2d_index = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
    t2d_index[:DRAFT_VOCAB] = torch.arange(DRAFT_VOCAB)
    hard = {k: v for k, v in item.items() if not k.startswith("soft")}
    with torch.no_grad():
        want = train_eagle.step_loss(draft, train_eagle.collate([hard], t2d_index), 3)
        got = train_eagle.step_loss(draft, train_eagle.collate([item], t2d_index), 3)
        assert torch.allclose(got, want, rtol=1e-5)
        item["soft_p"] = torch.tensor([0.5, 0.3, 0.2]).expand(n, 3)  # renormalised over the drafted two
        assert not torch.allclose(train_eagle.step_loss(draft, train_eagle.collate([item], t2d_index), 3), want)
    result = train_eagle.train(model, tmp_path / "soft", num_prompts=12, max_new_tokens=16, draft_vocab=DRAFT_VOCAB,
                               steps_ttt=2, epochs=4, lr=3e-3, batch_size=4, threads=2, soft_labels=8,
                               log=lambda _: None)
    losses = result["losses"]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
