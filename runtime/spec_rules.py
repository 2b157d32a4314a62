"""Which rows EAGLE speculation (runtime/speculative.py) decodes exactly as plain decoding would,
and how far into a cycle: the rules of greedy and sampled verification."""
from __future__ import annotations

from trtllm.runtime import sampling
from trtllm.runtime.rows import RowState


def greedy(p: sampling.SamplingParams) -> bool:
    """What an engine with greedy verification (built before sampled verification; verify_ids the
    argmax of the raw logits) reproduces exactly. Not top_k 1 at a temperature: the sampler keeps
    every token tied with the k-th, and draws among them. Nor min_new_tokens, penalties or bans: biases."""
    return (p.temperature == 0 and not p.logit_bias and p.min_new_tokens == 0 and not p.penalized and not p.bans
            and sampled(p))


def sampled(p: sampling.SamplingParams, logprobs: bool = False) -> bool:
    """What sampled verification reproduces exactly (eagle.verify "sampled": the sampler at every
    drafted position, with the row's parameters and its next random numbers): any temperature,
    top-k, top-p, min-p, logit bias, allowed_token_ids and one-token bad words, which are the same at
    every position; min_new_tokens, whose ban is too within a cycle that stops at its end (`held`);
    and penalties on a greedy request when they only ever lower a token as it is generated
    (`lowering`), within a cycle that stops before a token it has already emitted (`exact`). Not penalties on a sampled request: each token changes
    the distribution, nor bad words of several tokens (`changing`). Nor logprobs, unless the engine
    gives the verified positions' logits (`logprobs`)."""
    return ((logprobs or p.num_logprobs == 0) and not p.changing_bans
            and (not p.penalized or (p.temperature == 0 and lowering(p))))


def lowering(p: sampling.SamplingParams) -> bool:
    """Penalties that only ever lower a token's logit as it is generated: repetition_penalty >= 1 (a
    seen token's logit divided by it, or multiplied if negative), frequency and presence penalties
    >= 0. Verification applies the penalties the row has at a cycle's first position to all of them;
    the tokens emitted since are then lower than verification had them, and nothing else moved, so
    the argmax at a later position stands unless it is one of those tokens."""
    return p.repetition_penalty >= 1 and p.frequency_penalty >= 0 and p.presence_penalty >= 0


def changing(row: RowState) -> bool:
    """Biases that change with every token the row takes (its penalties count it, its grammar's mask
    follows it, its bad words of several tokens match it): the graph's sampler has a step's first at
    every verified position, so speculation walks such a row's positions on the host where it can
    (ngram.py, speculative.py `walked`)."""
    return row.params.penalized or row.guide is not None or row.params.changing_bans


def exact(row: RowState, tokens: list[int]) -> int:
    """How many of a cycle's verified tokens (its first position's first) plain decoding emits too:
    all of them, but while min_new_tokens holds tokens back, none past the ban's end (`held`), and
    with penalties (greedy, `lowering`), none from the first that repeats a token of the cycle."""
    n = len(tokens)
    if held(row):
        n = min(n, held(row))
    if row.params.penalized:
        n = next((i for i in range(1, n) if tokens[i] in tokens[:i]), n)
    return n


def held(row: RowState) -> int:
    """How many more tokens min_new_tokens holds EOS and stop_token_ids back for (0: none). Every
    position of a verification is sampled with the ban the row has at its first, so a cycle emits
    at most this many while the ban lasts: the token after the ban's end was drawn under it."""
    return max(0, row.params.min_new_tokens - len(row.output_ids))


def room(row: RowState) -> int:
    """The most drafts a cycle verifies for the row: up to its last token and, while
    min_new_tokens holds tokens back, to the ban's last token (`held`)."""
    left = row.max_new_tokens - len(row.output_ids) - 1
    return min(left, held(row) - 1) if held(row) else left
