"""A reference EAGLE-3 draft head made of transformers' own Llama modules (attention, MLP, RMSNorm,
rotary): what the engine's eagle_hidden and draft graph must compute. The build checks them with it
(builder/verify.py), and so do the tests.

It recomputes the draft over the whole sequence of (hidden, token) pairs each time it proposes (no
cache): the runtime's cached, rewritten draft KV must give the same proposals.
"""
from __future__ import annotations

import json
from pathlib import Path


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
        t = {}
        for f in sorted(Path(draft_dir).glob("*.safetensors")):
            t.update({k.removeprefix("model."): v.float() if v.is_floating_point() else v
                      for k, v in load_file(str(f)).items()})
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
        self.fc, self.lm_head = t["fc.weight"], t["lm_head.weight"]
        self.d2t = t.get("d2t", torch.zeros(self.lm_head.shape[0], dtype=torch.int64))
        self.rotary, self.target = m.LlamaRotaryEmbedding(config), target
        self.embed = t.get("embed_tokens.weight", target.model.embed_tokens.weight)

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
            e = self.embed[torch.tensor([ids])].float()  # (a held target's rows, widened: builder/held.py)
            x = torch.cat([self.norms["input_layernorm"](e), self.norms["hidden_norm"](hidden[None])], -1)
            pos = self.rotary(x, torch.arange(s)[None])
            mask = torch.full((s, s), float("-inf")).triu(1)[None, None]
            g = hidden[None] + self.attn(x, pos, mask)[0]
            g = g + self.mlp(self.norms["post_attention_layernorm"](g))
            logits = self.norms["norm"](g) @ self.lm_head.T
            best = logits.argmax(-1)[0]
            self.last_logits = logits[0, -1]
            return (best + self.d2t[best]).tolist(), g[0]

    def candidates(self, tokens: list[int], n: int, path: tuple[int, ...] = ()) -> list[int]:
        """The head's n best proposals (target ids, best first) after `tokens` and then the drafted
        `path` (each fed with the head's own hidden state, as drafting ahead does)."""
        import torch

        hidden, ids = self.target_hidden(tokens[:-1]), list(tokens[1:])
        _, out = self.forward(ids, hidden)
        for token in path:
            hidden, ids = torch.cat([hidden, out[-1:]]), ids + [token]
            _, out = self.forward(ids, hidden)
        top = self.last_logits.topk(n).indices
        return (top + self.d2t[top]).tolist()

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
