"""What the scheduler (runtime/generate.py) keeps per request sample, what it counts for a run, and
what it asks of saved system-prompt KV."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from trtllm.runtime import bans, sampling
from trtllm.runtime.text import TextStream


def overflow_causes(adapter) -> str:
    """What can make a row's logits overflow (NaN or +inf): its LoRA adapter by name, where it has one."""
    name = getattr(adapter, "name", None)
    return (f"its LoRA adapter {name!r} can make it: a lora_alpha or matrices too large; so can a float16 "
            "engine" if name else "a float16 engine or a LoRA adapter's weights can")


@dataclass
class RowState:
    """One request sample's progress; `text` (stop strings, streaming) is optional."""

    prompt_ids: list[int]
    params: sampling.SamplingParams
    rng: np.random.Generator
    eos_ids: frozenset[int]
    text: TextStream | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)  # each generated token's own (with logprobs)
    counts: dict[int, int] = field(default_factory=dict)
    finish_reason: str | None = None
    ended: str | None = None          # how a hypothesis it replays ended, where an interrupt then cancelled it
    error: str | None = None          # why it failed alone (finish_reason "error"), e.g. a broken draw
    max_new_tokens: int = -1  # params.max_new_tokens, capped by the KV capacity
    prefix_ids: tuple[int, ...] = ()  # its system-prompt prefix (a prefix of prompt_ids), if any
    save_prefix: bool = False         # store that prefix's KV for later requests
    num_reused: int = 0               # prompt tokens restored from a saved prefix
    context_lookup: bool = False      # --context-reuse: may restore an earlier request's KV (use_cache)
    context_commit: str | None = None  # and keeps its own: its context_cache_commit_policy (None: not)
    computed: int = 0                 # prompt positions whose KV is in its slot (restored, copied or computed)
    adapter: object = None            # its LoRA adapter (runtime/lora.py Adapter), None for the base model
    images: object = None             # its prompt's images (runtime/media.py PromptImages), None without
    speculative: bool = True          # may decode speculatively (EAGLE engines; False: disable_spec_decode)
    guesses: bool = True              # a sampled row's drafts guess at its draws (False: spec_proposal_sampling greedy)
    guide: object = None              # guided decoding's matcher (runtime/grammar.py Matcher), None if unconstrained
    prompt_logprobs: int | None = None  # vLLM's: score its prompt, with this many top tokens (runtime/prompt_scores.py)
    # per prompt token from the second: (its own logprob, the top values, their ids)
    prompt_scores: list[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=list)
    spare: list = field(default_factory=list)  # random numbers a verification drew and did not use: next first
    verified: bool = False            # a verification step has emitted for it (the profile's eagle runs)
    slot: int | None = None
    batch_idx: int | None = None      # the slot it was admitted to (the output's batch_idx); `slot` may move
    banned: frozenset[int] = field(init=False)  # what min_new_tokens holds back: EOS, stop token ids
    repeats: bans.RepeatedNgrams | None = field(init=False)  # no_repeat_ngram_size's n-grams so far

    def __post_init__(self):
        if self.max_new_tokens < 0:
            self.max_new_tokens = self.params.max_new_tokens
        eos = frozenset() if self.params.ignore_eos else self.eos_ids
        self.banned = eos | frozenset(self.params.stop_token_ids)  # once: it is read every token
        n = self.params.no_repeat_ngram_size
        self.repeats = bans.RepeatedNgrams(n, self.prompt_ids) if n else None

    def uniforms(self, n: int) -> list:
        """The row's next n random numbers (float32): those a verification drew and did not use,
        then new draws from its generator. One stream, a number per token, as plain decoding takes
        it: a seeded request draws the same tokens whether or not it speculates."""
        out = self.spare[:n]
        del self.spare[:n]
        return out + [self.rng.random(dtype=np.float32) for _ in range(n - len(out))]

    def peek(self, n: int) -> list:
        """The row's next n random numbers, left in the stream (what a draft head guesses with)."""
        out = self.uniforms(n)
        self.spare[:0] = out
        return out

    def accept(self, token_id: int, top: tuple[np.ndarray, np.ndarray] | None, chosen: float | None = None) -> None:
        """`top`: the step's top logprobs (values, ids); `chosen`: the token's own logprob, with them."""
        self.output_ids.append(token_id)
        self.counts[token_id] = self.counts.get(token_id, 0) + 1
        if self.repeats is not None:
            self.repeats.add(token_id)
        if top is not None:
            self.logprobs.append(top)
            self.token_logprobs.append(chosen)
        n, p = len(self.output_ids), self.params
        # Stop strings count from token min_new_tokens + 1 on (vLLM's min_tokens): those first
        # tokens are always kept, as EOS cannot come before token min_new_tokens + 1 either.
        look = n > p.min_new_tokens
        if token_id in self.eos_ids and not p.ignore_eos:
            self.finish_reason = "end-of-sequence"
        elif token_id in p.stop_token_ids:
            self.finish_reason = "stop-words"
        elif self.text is not None and self.text.push(token_id, check_stops=look):
            self.finish_reason = "stop-words"
        elif n >= self.max_new_tokens:
            self.finish_reason = "max-length"
        if self.stopped_by_token() and self.text is not None and self.text.include_stop:
            # vLLM's: the EOS or stop token that ended the answer keeps its text too (none where
            # skip_special_tokens skips it)
            self.text.push(token_id, check_stops=False)
        # the text held back comes out now, and may hold a stop string that ends the text sooner
        if self.finish_reason and self.text is not None and self.text.finish(check_stops=look):
            self.finish_reason = "stop-words"

    @property
    def prefilling(self) -> bool:
        """Part of its prompt is not in its KV yet: a chunked prompt, or a copy still to come."""
        return self.computed < len(self.prompt_ids)

    def filled(self) -> int:
        """KV positions written so far: the prompt's, and every output token but the last."""
        return self.computed + max(len(self.output_ids) - 1, 0)

    def cancel(self) -> None:
        """Ctrl-C: the row ends where it is; what it generated so far is its answer."""
        self.finish_reason = "cancelled"
        if self.text is not None:
            self.text.finish(check_stops=False)

    def fail(self, error: str) -> None:
        self.finish_reason, self.error = "error", error
        if self.text is not None:
            self.text.finish(check_stops=False)

    def dead_end(self) -> str:
        """Why no token can come next, where its bans leave none (sampling.penalize's, a grammar's)."""
        p = self.params
        return (f"no token can come at its token {len(self.output_ids) + 1}: "
                + bans.banning(p, p.min_new_tokens > len(self.output_ids) and bool(self.banned), self.guide is not None)
                + " ban every one")

    def overflow_causes(self) -> str:
        return overflow_causes(self.adapter)

    def stopped_by_token(self) -> bool:
        """Whether the last token ended the answer as an EOS or a stop token id."""
        reason = self.ended or self.finish_reason
        return reason == "end-of-sequence" or (
            reason == "stop-words" and bool(self.output_ids) and self.output_ids[-1] in self.params.stop_token_ids)

    def visible_ids(self) -> list[int]:
        """The output without a final EOS or stop token (they are not part of output_text, unless
        include_stop_str_in_output)."""
        if self.stopped_by_token() and not (self.text is not None and self.text.include_stop):
            return self.output_ids[:-1]
        return self.output_ids


@dataclass
class Timing:
    prefill_runs: int = 0
    prefill_tokens: int = 0   # computed prompt tokens
    reused_tokens: int = 0    # prompt tokens restored from saved prefixes
    prefill_seconds: float = 0.0
    generation_runs: int = 0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    kv_cache_bytes: int = 0   # the largest KV allocation of the run (slots x capacity x bytes/token)
    draft_kv_bytes: int = 0   # EAGLE: the largest allocation of the draft head's own KV
    # EAGLE (runtime/speculative.py): verify steps, draft graph runs and their time (in prefill_seconds
    # and generation_seconds too), tokens drafted for verification, those accepted, and what the
    # speculating rows emitted in verify steps (accepted drafts plus each step's own token)
    verify_runs: int = 0
    verify_seconds: float = 0.0
    row_iterations: int = 0  # verification rounds summed over the rows verified (Edge-LLM's total_iterations)
    speculative_rows: int = 0  # samples a verification emitted for (Edge-LLM's eagle total_runs)
    draft_runs: int = 0
    draft_seconds: float = 0.0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    speculative_tokens: int = 0
    branch_tokens: int = 0    # draft trees: accepted drafts that were not the head's first choice
    draft_steps: dict[int, int] = field(default_factory=dict)  # k -> decode cycles that drafted k (0: paused)
    images: int = 0           # vision-language engines: the images the run's prompts held, and their tokens
    image_tokens: int = 0
    # Edge-LLM's profile stages (llm_prefill, llm_generation, spec_decode_*): each engine call's seconds
    stages: dict[str, list[float]] = field(default_factory=dict)

    def record(self, stage: str, seconds: float) -> None:
        self.stages.setdefault(stage, []).append(seconds)


class PrefixSource(Protocol):
    """Saved system-prompt KV (runtime/prefix_cache.py); kv is [2*layers, kv_heads, n, kv_row],
    keyed by the prefix and the adapter's digest (an adapter changes the KV)."""

    def load(self, prefix_ids: tuple[int, ...], adapter: str | None = None,
             expect: tuple[tuple[int, ...], np.dtype] | None = None) -> np.ndarray | None: ...

    def save(self, prefix_ids: tuple[int, ...], kv: np.ndarray, adapter: str | None = None) -> None: ...

    def has(self, prefix_ids: tuple[int, ...], adapter: str | None = None) -> bool: ...
