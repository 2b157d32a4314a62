"""A beam search's parameters and how a step scores its candidates: each running beam's next-token
log-probabilities, shaped as transformers' beam search shapes them (its logits processors), and the
best of them (runtime/beam.py runs the search)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime import bans, grammar, sampling


@dataclass(frozen=True)
class BeamParams:
    num_beams: int
    max_new_tokens: int
    eos_ids: frozenset[int]
    min_new_tokens: int = 0
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # False, True or "never"
    adapter: object = field(default=None, compare=False)  # its LoRA adapter (runtime/lora.py), None: the base model
    num_logprobs: int = 0  # each token's step's best this many log-probabilities, kept with its hypothesis
    # with stop strings: the request's text (runtime/text.py TextStream), before any token: a
    # continuation whose text then holds a stop string ends its hypothesis, as EOS does
    text: object = field(default=None, compare=False)
    # transformers' logits processors on the log-probabilities (shaped_candidates): a sequence_bias
    # of one-token sequences, ((id, bias), ...), then repetition_penalty over the prompt and the beam
    logit_bias: tuple = ()
    repetition_penalty: float = 1.0
    # its system-prompt prefix (a prefix of the prompt) whose saved KV it restores, and saves where
    # none was (save_system_prompt_kv_cache); whether it looks up --context-reuse's KV, and keeps its
    # prompt's there (every slot of a search holds it; no one beam's answer is the request's KV)
    prefix_ids: tuple = ()
    save_prefix: bool = False
    context_lookup: bool = False
    context_commit: str | None = None  # --context-reuse: its context_cache_commit_policy (None: keeps nothing)
    scorer: object = field(default=None, compare=False)  # prompt_logprobs: the row its prompt's scores go to
    # guided decoding: its matcher at the start (runtime/grammar.py Matcher); each beam's next tokens
    # are those its grammar allows (-inf elsewhere, as transformers' prefix_allowed_tokens_fn masks)
    guide: object = field(default=None, compare=False)
    # vLLM's bad_words (as token sequences, runtime/bans.py) and allowed_token_ids: -inf on what each
    # beam may not take next (transformers' bad_words_ids; its answer's tokens only, as plain decoding's)
    bad_words: tuple = ()
    allowed_token_ids: frozenset[int] | None = None
    # transformers' no_repeat_ngram_size: -inf on each beam's tokens that would repeat n of its
    # prompt's and answer's tokens in a row (NoRepeatNGramLogitsProcessor; runtime/bans.py)
    no_repeat_ngram_size: int = 0
    where: object = field(default=None, compare=False)  # setting name -> its JSON path (bans.banning)
    # a vision-language engine's prompt images (runtime/media.py PromptImages): their embeddings go in
    # at the prompt step; its KV is keyed by their ids (keyed); Qwen's beams take its RoPE shift
    images: object = field(default=None, compare=False)

    @property
    def shaped(self) -> bool:
        return (bool(self.logit_bias) or self.repetition_penalty != 1.0 or self.guide is not None
                or bool(self.bad_words) or self.allowed_token_ids is not None or self.no_repeat_ngram_size > 0)


def best(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest, largest first, ties to the lower index (a partition first:
    B x V scores a step, where a sort of them all would cost more than the rest of the search)."""
    if len(values) > 4 * k:
        kth = values[np.argpartition(values, len(values) - k)[len(values) - k]]
        at_least = np.flatnonzero(values >= kth)  # (every tie with the k-th too)
        return at_least[np.argsort(-values[at_least], kind="stable")[:k]]
    return np.argsort(-values, kind="stable")[:k]


def top_candidates(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k best log-probabilities and their ids, largest first, ties lower id first: what
    the graph's top_logprobs give, computed on the host as the sampler's twin does (sampling.py),
    for a width the graph has not got."""
    rows = [sampling.top_logprobs(sampling.log_softmax(row, np.float32(0)), k) for row in logits]
    return np.stack([values for values, _ in rows]), np.stack([ids for _, ids in rows])


def shaped_candidates(logits: np.ndarray, p: BeamParams, prompt: list[int], running: list, k: int,
                      guides: list | None = None, repeats: bans.RepeatedNgrams | None = None):
    """top_candidates of log-probabilities shaped as transformers' beam search shapes them (its
    logits processors take log_softmax of the logits): logit_bias added (SequenceBiasLogitsProcessor),
    then repetition_penalty over the prompt's and each beam's tokens (RepetitionPenaltyLogitsProcessor:
    a log-probability below 0 times it, else over it); `guides`: each beam's matcher, -inf where its
    grammar allows no token (a beam without one, ended or out of its grammar, allows none); `repeats`,
    no_repeat_ngram_size's index of the prompt (Beams.repeats). With what
    the answer's logprobs report, as plain decoding's do (log_softmax of the logits plus logit_bias and
    the grammar's -inf, before penalties): (scores, ids, reported) for Search.advance."""
    ids = np.array([t for t, _ in p.logit_bias], np.int64)
    bias = np.array([b for _, b in p.logit_bias], np.float32)
    scores, found_ids, full = [], [], []
    if guides is not None:
        # (together, on llguidance's threads; the rows' own: the prompt step's one row stands for all beams)
        grammar.fill([g for g in guides[:len(logits)] if g is not None and g.stale])
    for i, (row, beam) in enumerate(zip(logits, running)):
        shaped = sampling.log_softmax(row, np.float32(0))
        shaped[ids] += bias
        banned = None
        if guides is not None:
            banned = ~guides[i].allowed() if guides[i] is not None else np.ones(len(row), bool)
            shaped[banned] = -np.inf
        if p.repetition_penalty != 1.0:
            seen = np.unique(np.array(prompt + list(beam), np.int64))
            s = shaped[seen]
            shaped[seen] = np.where(s < 0, s * np.float32(p.repetition_penalty), s / np.float32(p.repetition_penalty))
        if p.allowed_token_ids is not None:
            shaped[np.setdiff1d(np.arange(len(row)), np.fromiter(p.allowed_token_ids, np.int64))] = -np.inf
        if p.bad_words:
            shaped[list(bans.banned_next(p.bad_words, beam))] = -np.inf
        if repeats is not None:
            shaped[list(repeats.banned_after(beam))] = -np.inf
        values, top = sampling.top_logprobs(shaped, k)
        scores.append(values)
        found_ids.append(top)
        if p.num_logprobs:
            dense = np.zeros(len(row), np.float32)
            dense[ids] = bias
            if banned is not None:
                dense[banned] = -np.inf
            full.append(sampling.log_softmax(row, dense))
    reported = None
    if p.num_logprobs:
        full = np.stack(full)
        tops = [sampling.top_logprobs(f, p.num_logprobs) for f in full]
        reported = (np.stack([v for v, _ in tops]), np.stack([i for _, i in tops]), full)
    return np.stack(scores), np.stack(found_ids), reported
