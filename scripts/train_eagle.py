#!/usr/bin/env python3
"""Train an EAGLE-3 draft head for a Llama-family Hugging Face model on the CPU, from text the model writes.

    python scripts/train_eagle.py --model models/smollm2-135m-instruct --output models/smollm2-eagle3

Data: built-in chat prompts, answered by the target's own greedy `generate`; one more target pass over
prompt + answer gives the aux hiddens (residual stream entering layers 2, L//2, L-3) and the labels (the
target's argmax at each position). Output: the EAGLE-3 checkpoint as SpecForge writes it (config.json with
`LlamaForCausalLMEagle3`, model.safetensors with fc/midlayer/norm/lm_head/d2t/t2d; no embedding: the
draft reads the target's). The draft starts from the target's last layer, final norm and lm_head rows.

Training-time test (TTT), the faithful EAGLE-3 form. Index q of the batch, unrolled step t = 1..T:

    hidden in  : t = 1: fc(aux_q)         t > 1: the step t-1 hidden out at index q
    token      : x_{q+t}                  position q+t-1     label: target argmax at q+t (= x_{q+t+1})
    attention  : step-1 keys at indices <= q (causal)  +  keys of steps 2..t at index q only (diagonal)

    step-1 keys  k1_0 k1_1 ... k1_q   <- what the draft cache holds for the context
    step-2 key                  k2_q  <- the first drafted token (position q+1)
    step-t key                  kt_q  <- the (t-1)-th drafted token (position q+t-1)

which is what a query sees in drafting: the context keys, then the keys of the tokens drafted so far.
Loss: cross-entropy on the draft vocab, answer positions only (labels outside the draft vocab masked),
step t weighted 0.8^(t-1). With --soft-labels K the label is instead the target's distribution (its K
likeliest tokens at temperature 1, those in the draft vocab, renormalised), as SpecForge trains: the head
then learns how likely each token is, not only which one is likeliest, which is what a sampled request's
drafts are drawn from (trtllm-run guesses at the draw with the head's candidates; docs/eagle.md).
Held-out accuracy: the draft's top-1 (mapped to a target id) equals the target's argmax, over all
held-out answer positions (a label outside the draft vocab counts as a miss).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from eagle_prompts import build_prompts  # (a sibling: scripts/ is on the path, run as a script or imported)

@torch.no_grad()
def generate(model, tok, chats, max_new_tokens: int, batch_size: int) -> list[tuple[list[int], int]]:
    """(prompt + greedy answer ids, prompt length) per chat; batched with left padding, cut after the first EOS."""
    prompts = [list(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True)["input_ids"]) for c in chats]
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths share a batch
    out = [None] * len(prompts)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in idx])
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in idx])
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=pad)[:, width:].tolist()
        for i, answer in zip(idx, gen):
            end = next((j + 1 for j, t in enumerate(answer) if t in eos), len(answer))
            out[i] = (prompts[i] + answer[:end], len(prompts[i]))
    return out


@torch.no_grad()
def extract(model, seqs, layer_ids, batch_size: int, soft: int = 0) -> list[dict]:
    """Aux hiddens [n, 3H] and the target's argmax labels [n] per sequence (right padding: causal keeps it
    exact); `soft` > 0: also its `soft` likeliest tokens [n, soft] and their probabilities."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))  # little padding
    data = [None] * len(seqs)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        width = max(len(seqs[i][0]) for i in idx)
        ids = torch.tensor([seqs[i][0] + [0] * (width - len(seqs[i][0])) for i in idx])
        mask = torch.tensor([[1] * len(seqs[i][0]) + [0] * (width - len(seqs[i][0])) for i in idx])
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i] for i in layer_ids], -1)  # [B, S, 3H]
        greedy = out.logits.argmax(-1)  # [B, S]
        for j, i in enumerate(idx):
            n = len(seqs[i][0])
            data[i] = {"ids": torch.tensor(seqs[i][0]), "aux": aux[j, :n].clone(), "greedy": greedy[j, :n].clone(),
                       "prompt_len": seqs[i][1]}
            if soft:
                p, t = out.logits[j, :n].softmax(-1).topk(soft, -1)
                data[i].update(soft_p=p.clone(), soft_ids=t.clone())
    return data


def pick_draft_vocab(data, draft_vocab: int, vocab: int) -> torch.Tensor:
    """The draft vocab (sorted ids): the most frequent answer tokens, then the lowest unseen ids (as SpecForge)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for d in data:
        counts += torch.bincount(d["ids"][d["prompt_len"]:], minlength=vocab)
    size = min(draft_vocab, vocab)
    # stable sort by count, descending: ties (and the unseen) in id order; low BPE ids are the early, frequent merges
    ranked = torch.sort(-counts, stable=True).indices
    return ranked[:size].sort().values


class Eagle3Draft(nn.Module):
    """The EAGLE-3 draft: fc over three target hiddens, one decoder layer on (embedding, hidden), norm, lm_head.

    state_dict() is exactly the checkpoint: the target's embedding and the rotary tables are not saved.
    """

    def __init__(self, cfg, embed_weight: torch.Tensor, draft_ids: torch.Tensor):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        H, I, eps = cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or H // self.num_heads
        qd, kd = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        lin = lambda i, o: nn.Linear(i, o, bias=False)  # noqa: E731
        self.fc = lin(3 * H, H)
        m = self.midlayer = nn.Module()
        m.input_layernorm, m.hidden_norm, m.post_attention_layernorm = (nn.RMSNorm(H, eps=eps) for _ in range(3))
        m.self_attn = nn.Module()
        m.self_attn.q_proj, m.self_attn.k_proj, m.self_attn.v_proj = lin(2 * H, qd), lin(2 * H, kd), lin(2 * H, kd)
        m.self_attn.o_proj = lin(qd, H)
        m.mlp = nn.Module()
        m.mlp.gate_proj, m.mlp.up_proj, m.mlp.down_proj = lin(H, I), lin(H, I), lin(I, H)
        self.norm = nn.RMSNorm(H, eps=eps)
        self.lm_head = lin(H, len(draft_ids))
        self.register_buffer("d2t", draft_ids - torch.arange(len(draft_ids)))  # target = draft + d2t[draft]
        t2d = torch.zeros(embed_weight.shape[0], dtype=torch.bool)
        t2d[draft_ids] = True
        self.register_buffer("t2d", t2d)
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)  # frozen, the target's
        self.rotary = LlamaRotaryEmbedding(config=cfg)  # the target's rope, scaling included (inv_freq not saved)

    def forward(self, input_ids, hidden, positions, cache=()):
        """One step. input_ids [B, S]; hidden [B, S, H]: fc(aux) at step 1, else the previous step's hidden out;
        positions [B, S]; cache: (k, v) of earlier unrolled steps, step 1 first. Returns (hidden out, (k, v))."""
        B, S, H = hidden.shape
        m, a = self.midlayer, self.midlayer.self_attn
        e = F.embedding(input_ids, self.embed_weight)
        x = torch.cat([m.input_layernorm(e), m.hidden_norm(hidden)], -1)  # [B, S, 2H]: embedding half first
        q = a.q_proj(x).view(B, S, self.num_heads, self.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(B, S, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, S, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(hidden, positions)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        o = ttt_attention(q, [c[0] for c in cache] + [k], [c[1] for c in cache] + [v])
        g = hidden + a.o_proj(o.transpose(1, 2).reshape(B, S, -1))
        y = m.post_attention_layernorm(g)
        return g + m.mlp.down_proj(F.silu(m.mlp.gate_proj(y)) * m.mlp.up_proj(y)), (k, v)

    def logits(self, hidden_out):
        return self.lm_head(self.norm(hidden_out))  # [.., draft vocab]


def apply_rope(x, cos, sin):
    """x [B, heads, S, D]; cos/sin [B, S, D] (HF layout: halves rotated, not interleaved)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def ttt_attention(q, keys, values):
    """q [B, nh, S, D]; keys/values per unrolled step [B, nkv, S, D]. Query i sees step-1 keys j <= i and each
    later step's key at i only (the diagonal). Returns [B, nh, S, D]."""
    S, D = q.shape[2], q.shape[3]
    rep = q.shape[1] // keys[0].shape[1]  # GQA: each kv head serves rep query heads
    keys = [k.repeat_interleave(rep, 1) for k in keys]
    values = [v.repeat_interleave(rep, 1) for v in values]
    causal = (q @ keys[0].transpose(-1, -2)).masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), -math.inf)
    diag = [(q * k).sum(-1, keepdim=True) for k in keys[1:]]  # [B, nh, S, 1] each
    p = torch.softmax(torch.cat([causal, *diag], -1) / math.sqrt(D), -1)
    out = p[..., :S] @ values[0]
    for j, v in enumerate(values[1:]):
        out = out + p[..., S + j, None] * v
    return out


def init_from_target(draft: Eagle3Draft, target, draft_ids):
    """midlayer <- the target's last layer (q/k/v into the hidden half, zeros for the embedding half),
    norm <- final norm, lm_head <- lm_head rows of the draft vocab; fc <- [0, 0, I], the deepest aux hidden
    (on SmolLM2-135M it trained a little faster than a random N(0, 0.02) fc)."""
    H = draft.fc.out_features
    last, m = target.model.layers[-1], draft.midlayer
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(m.self_attn, name).weight
            w.zero_()
            w[:, H:] = getattr(last.self_attn, name).weight
        m.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(m.mlp, name).weight.copy_(getattr(last.mlp, name).weight)
        for norm in (m.input_layernorm, m.hidden_norm):
            norm.weight.copy_(last.input_layernorm.weight)
        m.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        draft.norm.weight.copy_(target.model.norm.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight[draft_ids])
        draft.fc.weight.zero_()
        draft.fc.weight[:, 2 * H:] = torch.eye(H)


def collate(items, t2d_index):
    """Right-padded batch: ids, aux, draft labels (-1: none) and answer mask ([B, S] each, aux [B, S, 3H])."""
    width = max(len(d["ids"]) for d in items)
    pad = lambda x, v: F.pad(x, (0, width - len(x)), value=v)  # noqa: E731
    ids = torch.stack([pad(d["ids"], 0) for d in items])
    greedy = torch.stack([pad(d["greedy"], -1) for d in items])
    aux = torch.stack([F.pad(d["aux"], (0, 0, 0, width - len(d["ids"]))) for d in items])
    # greedy at p predicts x_{p+1}: an answer token from p = prompt_len - 1 on
    answer = torch.stack([pad(torch.arange(len(d["ids"])) >= d["prompt_len"] - 1, False) for d in items])
    labels = torch.where(greedy >= 0, t2d_index[greedy.clamp(min=0)], -1)
    soft = None
    if "soft_ids" in items[0]:  # (draft ids [B, S, K], -1: none; their target probabilities)
        pad3 = lambda x, v: F.pad(x, (0, 0, 0, width - len(x)), value=v)  # noqa: E731
        soft = (torch.stack([pad3(t2d_index[d["soft_ids"]], -1) for d in items]),
                torch.stack([pad3(d["soft_p"], 0.0) for d in items]))
    return ids, aux, greedy, labels, answer, soft


def unroll(draft: Eagle3Draft, batch, steps: int):
    """Yield (draft logits, target labels, draft labels, soft labels or None) at the valid answer positions
    of each TTT step."""
    ids, aux, greedy, labels, answer, soft = batch
    B, S = ids.shape
    shift = lambda x, t, v: F.pad(x[:, t:], (0, t), value=v)  # index q takes the entry at q + t  # noqa: E731
    hidden, cache = draft.fc(aux), []
    for t in range(1, steps + 1):
        positions = (torch.arange(S) + t - 1).expand(B, S)
        hidden, kv = draft(shift(ids, t, 0), hidden, positions, cache)
        cache.append(kv)
        valid = shift(answer, t, False)
        labels_t = None if soft is None else tuple(F.pad(x[:, t:], (0, 0, 0, t), value=v)[valid]
                                                   for x, v in zip(soft, (-1, 0.0)))
        yield draft.logits(hidden[valid]), shift(greedy, t, -1)[valid], shift(labels, t, -1)[valid], labels_t


def step_loss(draft, batch, steps):
    """Cross-entropy per TTT step, step t weighted 0.8^(t-1) (later steps start from noisier hiddens):
    against the target's argmax, or with soft labels its distribution over the draft vocab."""
    loss = torch.zeros(())
    for t, (logits, _, lab, soft) in enumerate(unroll(draft, batch, steps)):
        if soft is not None:
            ids, p = soft
            p = torch.where(ids >= 0, p, 0.0)
            mass = p.sum(-1)
            keep = mass > 0  # none of the K in the draft vocab: masked
            if keep.any():
                lp = F.log_softmax(logits[keep], -1).gather(-1, ids[keep].clamp(min=0))
                loss = loss - 0.8 ** t * (p[keep] / mass[keep, None] * lp).sum(-1).mean()
            continue
        keep = lab >= 0  # labels outside the draft vocab: masked
        if keep.any():
            loss = loss + 0.8 ** t * F.cross_entropy(logits[keep], lab[keep])
    return loss


@torch.no_grad()
def evaluate(draft, data, t2d_index, steps, batch_size) -> list[float]:
    """Per TTT step: how often the draft's top-1, mapped to a target id, is the target's argmax."""
    hits, total = [0] * steps, [0] * steps
    for b in range(0, len(data), batch_size):
        for t, (logits, target, _, _) in enumerate(unroll(draft, collate(data[b:b + batch_size], t2d_index), steps)):
            best = logits.argmax(-1)
            hits[t] += int((best + draft.d2t[best] == target).sum())
            total[t] += len(target)
    return [h / max(n, 1) for h, n in zip(hits, total)]


def save(draft: Eagle3Draft, cfg, output_dir: Path, layer_ids):
    """config.json + model.safetensors (float32), written to OUTPUT.partial and renamed."""
    from safetensors.torch import save_file

    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    theta = rope.pop("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    scaling = rope if rope.get("rope_type", "default") != "default" else None
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": cfg.hidden_size,
              "intermediate_size": cfg.intermediate_size, "num_attention_heads": draft.num_heads,
              "num_key_value_heads": draft.num_kv_heads, "head_dim": draft.head_dim, "num_hidden_layers": 1,
              "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": theta, "rope_scaling": scaling,
              "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": len(draft.t2d),
              "draft_vocab_size": len(draft.d2t), "tie_word_embeddings": False, "hidden_act": "silu",
              "torch_dtype": "float32", "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}
    partial = output_dir.with_name(output_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {k: v.detach().contiguous() for k, v in draft.state_dict().items()}
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(output_dir, ignore_errors=True)
    partial.rename(output_dir)


def fit(draft, train_data, val_data, t2d_index, *, steps_ttt, epochs, lr, batch_size, seed, log=print) -> dict:
    """AdamW over the TTT loss; held-out per-step accuracy after each epoch."""
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    num_batches = math.ceil(len(train_data) / batch_size)
    total, warmup = epochs * num_batches, max(1, epochs * num_batches // 20)
    # linear warm-up, then cosine down to a tenth: the last steps polish rather than jump
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warmup, 0.1 + 0.45 * (1 + math.cos(
        math.pi * min(1.0, (s - warmup) / max(1, total - warmup))))))
    losses, timings, rng, accuracy = [], {}, random.Random(seed), None
    for epoch in range(1, epochs + 1):
        t0, order, running = time.time(), list(range(len(train_data))), []
        rng.shuffle(order)
        for b in range(num_batches):
            batch = collate([train_data[i] for i in order[b * batch_size:(b + 1) * batch_size]], t2d_index)
            loss = step_loss(draft, batch, steps_ttt)
            if loss.requires_grad:  # else no label of this batch is in the draft vocab
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 0.5)
                opt.step()
            sched.step()
            losses.append(loss.item())
            running.append(loss.item())
            if (b + 1) % 20 == 0 or b + 1 == num_batches:
                log(f"epoch {epoch} batch {b + 1}/{num_batches} loss {sum(running) / len(running):.3f}")
                running = []
        timings[f"epoch_{epoch}_s"] = time.time() - t0
        accuracy = evaluate(draft, val_data, t2d_index, steps_ttt, batch_size)
        log(f"epoch {epoch} in {timings[f'epoch_{epoch}_s']:.0f}s; held-out top-1 per TTT step: "
            + " ".join(f"{a:.3f}" for a in accuracy))
    return {"accuracy": accuracy, "losses": losses, "timings": timings}


class OptionError(ValueError):
    """An option that does not fit the model (main: a usage error, exit 2)."""


def aux_layer_ids(num_layers: int, given: list[int] | None) -> list[int]:
    """The three layers whose input hiddens the head reads: `given`, or EAGLE-3's [2, L//2, L-3]."""
    if given is None:
        if num_layers < 3:  # (3 layers: [2, 1, 0], as trtllm-build and vLLM take the default)
            raise OptionError(f"config.num_hidden_layers must be >= 3 for the default aux layers 2, L//2, L-3, got "
                              f"{num_layers!r}: give --aux-layers (three layer indices in [0, {num_layers}))")
        return [2, num_layers // 2, num_layers - 3]
    if len(given) != 3 or not all(0 <= i < num_layers for i in given):
        raise OptionError(f"--aux-layers must be three layer indices in [0, {num_layers}) (the model's "
                          f"num_hidden_layers), got {given}")
    return list(given)


def train(model_dir, output_dir, *, num_prompts=512, max_new_tokens=128, draft_vocab=8192, steps_ttt=3, epochs=5,
          lr=3e-3, batch_size=8, seed=0, threads=2, soft_labels=0, aux_layers=None, log=print) -> dict:
    """Generate, extract, train, save. Returns held-out per-step accuracy (initial and final), losses and timings.
    `aux_layers`: the three layers the head reads (written into its eagle_config), else [2, L//2, L-3]."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    target_config = AutoConfig.from_pretrained(model_dir)
    layer_ids = aux_layer_ids(target_config.num_hidden_layers, aux_layers)  # before loading
    for name, value in (("--draft-vocab", draft_vocab), ("--soft-labels", soft_labels)):
        if value > target_config.vocab_size:
            raise OptionError(f"{name} must be at most the model's vocabulary size {target_config.vocab_size}, "
                              f"got {value}")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(model_dir)
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cfg = target.config
    chats, held = build_prompts(num_prompts, seed)
    seqs = generate(target, tok, chats, max_new_tokens, batch_size=64)  # 64: ~25% more tokens/s than 32
    timings = {"generate_s": time.time() - t0}
    log(f"generated {len(seqs)} answers, {sum(len(s) - p for s, p in seqs)} tokens in {timings['generate_s']:.0f}s")
    t0 = time.time()
    data = extract(target, seqs, layer_ids, batch_size=8, soft=soft_labels)
    timings["extract_s"] = time.time() - t0
    log(f"extracted hiddens of {sum(len(s) for s, _ in seqs)} tokens in {timings['extract_s']:.0f}s")
    train_data = [d for d, h in zip(data, held) if not h]
    val_data = [d for d, h in zip(data, held) if h]
    draft_ids = pick_draft_vocab(train_data, draft_vocab, cfg.vocab_size)
    draft = Eagle3Draft(cfg, target.get_input_embeddings().weight, draft_ids)
    init_from_target(draft, target, draft_ids)
    del target
    t2d_index = torch.full((cfg.vocab_size,), -1, dtype=torch.long)  # target id -> draft id, -1: not drafted
    t2d_index[draft_ids] = torch.arange(len(draft_ids))
    initial = evaluate(draft, val_data, t2d_index, steps_ttt, batch_size)
    log(f"{len(train_data)} train / {len(val_data)} held-out answers; held-out top-1 before training: "
        + " ".join(f"{a:.3f}" for a in initial))
    result = fit(draft, train_data, val_data, t2d_index, steps_ttt=steps_ttt, epochs=epochs, lr=lr,
                 batch_size=batch_size, seed=seed, log=log)
    save(draft, cfg, Path(output_dir), layer_ids)
    log(f"wrote {output_dir}")
    return {**result, "initial_accuracy": initial, "timings": {**timings, **result["timings"]}}


def output_problem(model: Path, output: Path) -> str:
    """Why --output must not be written (it is replaced whole), or "": it must not hold the model or
    lie inside it, and may hold only an earlier head (config.json and model.safetensors)."""
    model, output = model.resolve(), output.resolve()
    if output == model or model.is_relative_to(output) or output.is_relative_to(model):
        return f"--output {output} would replace or sit inside --model {model}: choose another directory"
    if output.exists() and (not output.is_dir() or {e.name for e in output.iterdir()} - {"config.json", "model.safetensors"}):
        return (f"--output {output} exists and holds more than an earlier head (config.json, model.safetensors): "
                "choose a new or empty directory (it is replaced whole)")
    return ""


def layer_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"three comma-separated layer indices, got {text!r}") from None


def joined_values(argv: list[str], *options: str) -> list[str]:
    """`--aux-layers -1,2,3` as `--aux-layers=-1,2,3`: argparse reads a value that starts with "-" and
    is not a plain number as an option ("expected one argument"), so the range check never spoke."""
    out = []
    for arg in argv:
        if out and out[-1] in options and re.fullmatch(r"-\d[-\d,]*", arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="Hugging Face checkpoint dir (Llama family)")
    p.add_argument("--output", required=True, help="EAGLE-3 checkpoint dir to write")
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocab size (at most the target's)")
    p.add_argument("--steps-ttt", type=int, default=3, help="unrolled training-time-test steps")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW peak learning rate")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--soft-labels", type=int, default=0, metavar="K",
                   help="train on the target's K likeliest tokens and their probabilities (0: its argmax)")
    p.add_argument("--aux-layers", type=layer_list, default=None, metavar="A,B,C",
                   help="the three layers whose input hidden states the head reads (default: 2, L//2, L-3; a "
                        "model of fewer than 3 layers needs them)")
    a = p.parse_args(joined_values(sys.argv[1:] if argv is None else argv, "--aux-layers"))
    for name in ("num_prompts", "max_new_tokens", "draft_vocab", "steps_ttt", "epochs", "batch_size", "threads"):
        least = 2 if name == "num_prompts" else 1  # (num_prompts: one is held out)
        if getattr(a, name) < least:
            p.error(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(a, name)}")
    if a.soft_labels < 0 or not 0 < a.lr < float("inf"):
        p.error(f"--soft-labels must be >= 0 and --lr > 0, got {a.soft_labels} and {a.lr}")
    if problem := output_problem(Path(a.model), Path(a.output)):
        p.error(problem)
    options = {k: v for k, v in vars(a).items() if k not in ("model", "output")}
    try:
        result = train(a.model, Path(a.output).resolve(), **options)
    except OptionError as e:
        p.error(str(e))
    print(json.dumps({k: result[k] for k in ("accuracy", "initial_accuracy", "timings")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
