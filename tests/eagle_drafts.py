"""EAGLE-3 draft heads for tests: random ones in the trainers' format, and a reference made of
transformers' own Llama modules (attention, MLP, RMSNorm, rotary), which the draft graph must equal.

The reference recomputes the draft over the whole sequence of (hidden, token) pairs each time it
proposes (no cache): the runtime's cached, rewritten draft KV must give the same proposals.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def random_draft(target_dir: Path, out_dir: Path, seed: int = 0, draft_vocab: int | None = None,
                 aux: list[int] | None = None, std: float = 2.0) -> Path:
    """A random EAGLE-3 head for the checkpoint in target_dir (its shapes, RoPE and vocabulary).
    A smaller draft vocabulary takes every other target id from 3 on (d2t then maps it back)."""
    from safetensors.numpy import save_file

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, d, inter, vocab = cfg["num_key_value_heads"], cfg.get("head_dim") or h // heads, cfg["intermediate_size"], \
        cfg["vocab_size"]
    vd = draft_vocab or vocab
    ids = np.arange(vd) if vd == vocab else 3 + 2 * np.arange(vd)
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) * std / shape[-1] ** 0.5).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors = {"fc.weight": w(h, 3 * h), "norm.weight": norm(h), "lm_head.weight": w(vd, h),
               "midlayer.input_layernorm.weight": norm(h), "midlayer.hidden_norm.weight": norm(h),
               "midlayer.post_attention_layernorm.weight": norm(h),
               "midlayer.self_attn.q_proj.weight": w(heads * d, 2 * h), "midlayer.self_attn.k_proj.weight": w(kv * d, 2 * h),
               "midlayer.self_attn.v_proj.weight": w(kv * d, 2 * h), "midlayer.self_attn.o_proj.weight": w(h, heads * d),
               "midlayer.mlp.gate_proj.weight": w(inter, h), "midlayer.mlp.up_proj.weight": w(inter, h),
               "midlayer.mlp.down_proj.weight": w(h, inter),
               "d2t": (ids - np.arange(vd)).astype(np.int64), "t2d": np.isin(np.arange(vocab), ids)}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "model.safetensors"))
    rope = {k: cfg[k] for k in ("rope_theta", "rope_parameters", "rope_scaling") if cfg.get(k) is not None}
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": h,
              "intermediate_size": inter, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d,
              "num_hidden_layers": 1, "rms_norm_eps": cfg["rms_norm_eps"], "vocab_size": vocab,
              "draft_vocab_size": vd, "max_position_embeddings": cfg["max_position_embeddings"], **rope}
    if aux is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": aux}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


class Reference:
    """The EAGLE-3 draft forward with transformers' modules, and greedy chain speculation with it."""

    def __init__(self, draft_dir: Path, target):
        import torch
        from safetensors.torch import load_file
        from transformers import LlamaConfig
        from transformers.models.llama import modeling_llama as m

        cfg = json.loads((Path(draft_dir) / "config.json").read_text())
        keep = {k: v for k, v in cfg.items() if k not in ("architectures", "draft_vocab_size", "eagle_config")}
        config = LlamaConfig(**keep)
        config._attn_implementation = "eager"
        t = load_file(str(Path(draft_dir) / "model.safetensors"))
        h, layers = config.hidden_size, target.config.num_hidden_layers
        self.aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [2, layers // 2, layers - 3]
        self.attn = m.LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):  # EAGLE-3: q/k/v read concat(embedding, hidden), 2H wide
            setattr(self.attn, name, torch.nn.Linear(2 * h, t[f"midlayer.self_attn.{name}.weight"].shape[0], bias=False))
        self.mlp = m.LlamaMLP(config)
        self.norms = {n: m.LlamaRMSNorm(h, eps=config.rms_norm_eps)
                      for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm", "norm")}
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                getattr(self.attn, name).weight.copy_(t[f"midlayer.self_attn.{name}.weight"])
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(self.mlp, name).weight.copy_(t[f"midlayer.mlp.{name}.weight"])
            for name, mod in self.norms.items():
                mod.weight.copy_(t["norm.weight" if name == "norm" else f"midlayer.{name}.weight"])
        self.fc, self.lm_head, self.d2t = t["fc.weight"], t["lm_head.weight"], t["d2t"]
        self.rotary, self.target = m.LlamaRotaryEmbedding(config), target

    def target_hidden(self, ids: list[int]):
        """fc(concat of the residual stream at the input of the aux layers), every position [S,H]."""
        import torch

        with torch.no_grad():
            hs = self.target(torch.tensor([ids]), output_hidden_states=True).hidden_states
            return torch.cat([hs[i][0] for i in self.aux], -1) @ self.fc.T

    def forward(self, ids: list[int], hidden):
        """Draft outputs for (hidden[q], ids[q]) at positions 0..S-1: (proposed target ids, hidden out)."""
        import torch

        with torch.no_grad():
            s = len(ids)
            e = self.target.model.embed_tokens(torch.tensor([ids]))
            x = torch.cat([self.norms["input_layernorm"](e), self.norms["hidden_norm"](hidden[None])], -1)
            pos = self.rotary(x, torch.arange(s)[None])
            mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
            g = hidden[None] + self.attn(x, pos, mask)[0]
            g = g + self.mlp(self.norms["post_attention_layernorm"](g))
            best = (self.norms["norm"](g) @ self.lm_head.T).argmax(-1)[0]
            return (best + self.d2t[best]).tolist(), g[0]

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """k drafts after `tokens`: pairs (target hidden q, token q+1) up to the last token, then the
        draft's own hidden out with each drafted token."""
        import torch

        hidden, ids = self.target_hidden(tokens[:-1]), list(tokens[1:])
        drafts = []
        for _ in range(k):
            proposed, out = self.forward(ids, hidden)
            drafts.append(proposed[-1])
            hidden, ids = torch.cat([hidden, out[-1:]]), ids + [proposed[-1]]
        return drafts
