"""Sampling parameters: one validated dataclass per request, pure functions to batch them.

Stage order (the graph's trtllm::Sample applies 1-2 and 4-8; see docs/sampling.md):
  1. logit_bias            added to the logits
  2. logprobs              log_softmax of the biased logits, temperature 1 (before penalties)
  3. penalties             repetition (prompt + output), frequency and presence (output), and
                           -inf for EOS / stop_token_ids until min_new_tokens  [host: penalty_bias, seen]
  4. temperature           0 = greedy: argmax of the penalised logits
  5. min_p  6. top-k  7. top-p (renormalised over the min_p/top-k survivors)
  8. draw                  with a uniform number from the request's own seeded generator
Penalty history (token counts) lives in the request's row state, not here: `penalize` updates
one row of the batch arrays after each generated token.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from trtllm.runtime import bans
from trtllm.runtime.input_fields import MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY  # the input's bounds


def _check(ok: bool, name: str, constraint: str, value) -> None:
    if not ok:
        raise ValueError(f"{name} must be {constraint}, got {value!r}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    """>= 0; 0 = greedy."""
    top_k: int = 50
    """>= 0; 0 = disabled (a value >= the vocabulary size also keeps every token)."""
    top_p: float = 0.8
    """in (0, 1]; 1 = disabled."""
    min_p: float = 0.0
    """in [0, 1]; 0 = disabled. Keep tokens with prob >= min_p * the top token's prob."""
    repetition_penalty: float = 1.0
    """in [0.01, 10] (input_format's bounds); 1 = disabled. Over prompt + output: positive logits divided, negative multiplied."""
    presence_penalty: float = 0.0
    """in [-2, 2]; 0 = disabled. Subtracted once from every token already generated."""
    frequency_penalty: float = 0.0
    """in [-2, 2]; 0 = disabled. Subtracted once per earlier occurrence in the output."""
    logit_bias: dict[int, float] = field(default_factory=dict)
    """token id -> added to its logit before everything else; {} = none."""
    num_logprobs: int = 0
    """in [0, 50]; 0 = none. Top-K log_softmax of the biased logits, temperature 1."""
    max_new_tokens: int = 256
    """>= 0: generation stops with max-length after this many tokens."""
    min_new_tokens: int = 0
    """in [0, max_new_tokens]; 0 = disabled. EOS, stop_token_ids and stop strings wait until then."""
    stop: tuple[str, ...] = ()
    """stop strings; () = none. The earliest match ends the output, without the match."""
    stop_token_ids: tuple[int, ...] = ()
    """token ids that end generation like EOS (finish_reason stop-words); () = none."""
    ignore_eos: bool = False
    """keep generating past EOS; False = EOS ends the output."""
    bad_words: tuple[tuple[int, ...], ...] = ()
    """token sequences whose last token is banned after the rest (runtime/bans.py); () = none."""
    allowed_token_ids: frozenset[int] | None = None
    """the only ids it may generate; None = all."""
    no_repeat_ngram_size: int = 0
    """>= 0; 0 = disabled. No n tokens in a row twice, over prompt + output (runtime/bans.py RepeatedNgrams)."""
    where: object = field(default=None, compare=False)
    """setting name -> its JSON path in the input (an error names it); None: the bare name."""

    def __post_init__(self):
        _check(math.isfinite(self.temperature) and self.temperature >= 0, "temperature", "a finite number >= 0",
               self.temperature)
        _check(self.top_k >= 0, "top_k", ">= 0", self.top_k)
        _check(0 < self.top_p <= 1, "top_p", "in (0, 1]", self.top_p)
        _check(0 <= self.min_p <= 1, "min_p", "in [0, 1]", self.min_p)
        # Bounded below: x / r must stay finite for any logit (the sampler needs a finite max).
        _check(MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY, "repetition_penalty",
               f"in [{MIN_REPETITION_PENALTY}, {MAX_REPETITION_PENALTY}]", self.repetition_penalty)
        _check(-2 <= self.presence_penalty <= 2, "presence_penalty", "in [-2, 2]", self.presence_penalty)
        _check(-2 <= self.frequency_penalty <= 2, "frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        _check(0 <= self.num_logprobs <= 50, "num_logprobs", "in [0, 50]", self.num_logprobs)
        _check(self.no_repeat_ngram_size >= 0, "no_repeat_ngram_size", ">= 0", self.no_repeat_ngram_size)
        _check(self.max_new_tokens >= 0, "max_new_tokens", ">= 0", self.max_new_tokens)
        _check(0 <= self.min_new_tokens <= self.max_new_tokens, "min_new_tokens",
               f"in [0, max_new_tokens={self.max_new_tokens}]", self.min_new_tokens)

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    @property
    def bans(self) -> bool:
        """bad_words, allowed_token_ids or no_repeat_ngram_size: -inf in its penalty bias."""
        return bool(self.bad_words) or self.allowed_token_ids is not None or self.no_repeat_ngram_size > 0

    @property
    def changing_bans(self) -> bool:
        """A bad word of several tokens, or no_repeat_ngram_size: what it bans changes with each token
        generated."""
        return self.no_repeat_ngram_size > 0 or self.changing_words

    @property
    def changing_words(self) -> bool:
        """A bad word of several tokens: its ban follows the answer's last tokens."""
        return any(len(seq) > 1 for seq in self.bad_words)


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Per-row arrays the graph takes. `uniform` is refilled every step by `draw`; `penalty_bias`
    and `seen` are updated in place by `penalize` after each token."""

    logit_bias: np.ndarray          # f32 [B, V]
    penalty_bias: np.ndarray        # f32 [B, V]: -(freq*count + presence*(count>0)), -inf = banned
    seen: np.ndarray                # bool [B, V]: prompt + output tokens (repetition penalty)
    repetition_penalty: np.ndarray  # f32 [B]
    temperature: np.ndarray         # f32 [B]
    min_p: np.ndarray               # f32 [B]
    top_k: np.ndarray               # int64 [B]
    top_p: np.ndarray               # f32 [B]
    uniform: np.ndarray             # f32 [B]
    version: np.ndarray             # int64 [B]: bumped when the row's [B, V] arrays change (a device copy
                                    # of a row is current while it holds the row's version)
    num_logprobs: int               # K for the whole batch (>= 1 in the graph; rows slice their own)


def empty_batch(num_rows: int, vocab_size: int, num_logprobs: int, max_top_k: int) -> SamplingBatch:
    """A batch of neutral rows (greedy, nothing applied), filled later slot by slot with `set_row`."""
    return SamplingBatch(
        logit_bias=np.zeros((num_rows, vocab_size), np.float32),
        penalty_bias=np.zeros((num_rows, vocab_size), np.float32),
        seen=np.zeros((num_rows, vocab_size), np.bool_),
        repetition_penalty=np.ones(num_rows, np.float32),
        temperature=np.zeros(num_rows, np.float32),
        min_p=np.zeros(num_rows, np.float32),
        top_k=np.zeros(num_rows, np.int64),
        top_p=np.ones(num_rows, np.float32),
        uniform=np.zeros(num_rows, np.float32),
        version=np.zeros(num_rows, np.int64),
        # The graph takes its logprobs from the sampler's top-M, so K <= M (only a vocabulary
        # under 50 tokens has M < 50, and then there are no more tokens to list anyway).
        num_logprobs=min(max(num_logprobs, 1), max_top_k),
    )


def set_row(batch: SamplingBatch, row: int, p: SamplingParams, max_top_k: int,
            prompt: list[int] | None = None, banned: frozenset[int] = frozenset(),
            repeats: bans.RepeatedNgrams | None = None) -> None:
    """Put one request's params in `row`. top_k >= vocab_size means 'all tokens' (0, disabled), as
    does temperature 0 (greedy: top_k plays no part, so the engine's max_top_k does not limit it).
    `banned` are the ids it may not produce before its min_new_tokens; `repeats`, its
    no_repeat_ngram_size's index of the prompt (what it bans first)."""
    vocab_size = batch.logit_bias.shape[1]
    top_k = 0 if p.top_k >= vocab_size or p.temperature == 0 else p.top_k
    _check(top_k <= max_top_k, "top_k", f"<= {max_top_k} (the engine's max_top_k) or >= the vocabulary size "
           f"{vocab_size}", p.top_k)
    batch.logit_bias[row] = 0
    for token_id, value in p.logit_bias.items():
        batch.logit_bias[row, token_id] = value
    batch.penalty_bias[row] = 0
    if p.allowed_token_ids is not None:
        batch.penalty_bias[row] = -np.inf
        batch.penalty_bias[row, np.fromiter(p.allowed_token_ids, np.int64)] = 0
    if p.min_new_tokens > 0 and banned:
        batch.penalty_bias[row, list(banned)] = -np.inf
    if p.bad_words:  # (its one-token words; the others ban nothing before the answer's first token)
        batch.penalty_bias[row, list(bans.banned_next(p.bad_words, ()))] = -np.inf
    if repeats is not None:
        batch.penalty_bias[row, list(repeats.banned())] = -np.inf
    batch.seen[row] = False
    if prompt is not None and p.repetition_penalty != 1:
        batch.seen[row, prompt] = True
    batch.repetition_penalty[row] = p.repetition_penalty
    batch.temperature[row] = p.temperature
    batch.min_p[row] = p.min_p
    batch.top_k[row] = top_k
    batch.top_p[row] = p.top_p
    batch.version[row] += 1


def make_batch(params: list[SamplingParams], vocab_size: int, max_top_k: int,
               prompts: list[list[int]] | None = None, banned: list[frozenset[int]] | None = None) -> SamplingBatch:
    """Batch the params, one row each (see `set_row`)."""
    batch = empty_batch(len(params), vocab_size, max([p.num_logprobs for p in params] + [1]), max_top_k)
    for row, p in enumerate(params):
        set_row(batch, row, p, max_top_k, prompts[row] if prompts else None, banned[row] if banned else frozenset())
    return batch


def rows(batch: SamplingBatch, start: int, stop: int) -> SamplingBatch:
    """Rows start..stop-1 as views: updates through either batch are shared."""
    fields = {name: getattr(batch, name)[start:stop] for name in SamplingBatch.__slots__ if name != "num_logprobs"}
    return SamplingBatch(num_logprobs=batch.num_logprobs, **fields)


def penalize(batch: SamplingBatch, row: int, params: SamplingParams, counts: dict[int, int], token_id: int,
             num_generated: int, banned: frozenset[int], output: Sequence[int] = (),
             repeats: bans.RepeatedNgrams | None = None) -> None:
    """Account for `token_id`, just generated by `row` (its count already in `counts`, and in
    `repeats`, its no_repeat_ngram_size's index; `output`: the row's tokens, `token_id` the last,
    which its bad words are matched against)."""
    touched = set()
    if params.penalized:
        touched.add(token_id)
        if params.repetition_penalty != 1:
            batch.seen[row, token_id] = True
    held = params.min_new_tokens and num_generated < params.min_new_tokens
    if params.min_new_tokens and num_generated == params.min_new_tokens:  # the ban ends now
        touched |= banned
    elif held and token_id in banned:
        touched.add(token_id)
    words = bans.banned_next(params.bad_words, output) if params.bad_words else set()
    if params.changing_words:  # what the bad words banned before this token, and ban now
        # (what changed: a word's one-token ban stays, and rewriting it would bump the row's version, a
        # device copy of its [V] arrays per token on TensorRT)
        touched |= words ^ bans.banned_next(params.bad_words, output, len(output) - 1)
    if repeats is not None:  # (likewise: what its n-grams banned before this token, and ban now)
        now = repeats.banned()
        words, touched = words | now, touched | (repeats.before ^ now)
    allowed = params.allowed_token_ids
    for t in touched:
        c = counts.get(t, 0)
        out = (held and t in banned) or t in words or (allowed is not None and t not in allowed)
        batch.penalty_bias[row, t] = -np.inf if out else -(params.frequency_penalty * c + params.presence_penalty * (c > 0))
    if touched:
        batch.version[row] += 1


def log_softmax(logits: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Step 2 above for one row: log_softmax(logits + bias) in float32 (the sum of exponentials in
    float64), for tokens whose logprobs do not come from the sampler's outputs."""
    shifted = logits + bias
    shifted -= shifted.max()
    return shifted - np.float32(np.log(np.exp(shifted).sum(dtype=np.float64)))


def position_logprobs(logits: np.ndarray | None, bias: np.ndarray, k: int, token: int):
    """A token taken at a verified position (speculative decoding), whose logprobs do not come from
    the sampler's outputs: (the k top ones, its own, whether it is a token of finite logits); None,
    None for k = 0 or where it is not (NaN, +inf logits; a draw past the vocabulary: the row then
    fails alone, as in a plain step). `logits` None: not checked (k = 0)."""
    if not 0 <= token < len(bias):
        return None, None, False
    if logits is None or not k:
        return None, None, logits is None or bool(np.isfinite(logits.max()))
    logprobs = log_softmax(logits, bias)
    if not np.isfinite(logprobs.max()):
        return None, None, False
    return top_logprobs(logprobs, k), float(logprobs[token]), True


def greedy(logits: np.ndarray, batch: SamplingBatch, row: int, native: bool) -> int:
    """A greedy row's token from one position's logits, as the engine's sampler takes it: the argmax
    of the logits under the row's biases and penalties as they stand (steps 1, 3 and 4), ties to the
    lower id; -1 where its logits overflowed (NaN or +inf), which fails the row alone, as in a plain
    step. Speculation walks verified positions with it, each after `penalize` took the tokens before
    it, so a penalty is exact at every position (the graph's sampler has the step's first position's
    penalties at all of them). `native` (`host_draws`: the engine's sampler is our kernel): the
    kernel's own code (0.05 ms on 49,152 logits), which also answers -1 where every token is banned;
    else numpy's as the standard-op sampler takes it (0.8 ms with a repetition penalty), which then
    takes token 0 (the row fails on it in the same way: Scheduler.banned_all)."""
    if native:
        return _native(logits, batch, row, 0.0, 0.0, top_k=0, max_top_k=1)
    x = logits + batch.logit_bias[row]
    if not np.isfinite(x.max()):  # (a plain step's logprobs of these logits are NaN: the row fails)
        return -1
    r = batch.repetition_penalty[row]
    if r != 1:  # (the same float32 operations as the sampler's, so the same argmax)
        x = np.where(batch.seen[row], np.where(x > 0, x / r, x * r), x)
    return int(np.argmax(x + batch.penalty_bias[row]))


def host_draws(manifest) -> bool:
    """Whether `host_draw` gives the engine's own draws, and `greedy(native=True)` its greedy tokens:
    its sampler is trtllm.cpu::Sample (an ONNX Runtime engine on our kernels), whose code the host
    calls too, and the library is here."""
    from trtllm.plugins import cpu

    return cpu.SAMPLE_LOWERING in manifest.lowerings and cpu.row_sampler() is not None


def host_draw(logits: np.ndarray, batch: SamplingBatch, row: int, uniform: float, max_top_k: int) -> int:
    """A sampled row's token from one position's logits with its uniform number, drawn on the host by
    the engine's sampler code (`host_draws`) under the row's biases and penalties as they stand:
    speculation walks verified positions with it, as `greedy` for greedy rows. -1 where the logits
    overflowed, which fails the row alone."""
    return _native(logits, batch, row, float(batch.temperature[row]), uniform, int(batch.top_k[row]), max_top_k)


def _native(logits, batch: SamplingBatch, row: int, temperature: float, uniform: float, top_k: int,
            max_top_k: int) -> int:
    from trtllm.plugins import cpu

    x = np.ascontiguousarray(logits, np.float32)
    token = int(cpu.row_sampler()(x.ctypes.data, batch.logit_bias[row].ctypes.data, batch.penalty_bias[row].ctypes.data,
                                  batch.seen[row].ctypes.data, float(batch.repetition_penalty[row]), temperature,
                                  float(batch.min_p[row]), top_k, float(batch.top_p[row]), float(uniform), len(x),
                                  max_top_k))
    if token == -2:  # (the arguments' sizes disagree: a caller's error, not the row's)
        raise ValueError(f"trtllm_cpu_sample_row refused its arguments (vocabulary {len(x)}, top_k {top_k}, "
                         f"max_top_k {max_top_k})")
    return token


def top_logprobs(logprobs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest of a row's `log_softmax`, as the sampler's logprob outputs give them:
    descending, ties lower id first (float32 values, int64 ids)."""
    # The k largest lie within some gap of the largest: widen it until it holds k (a pass over
    # the vocabulary each, where a partition of it costs ten), then keep those at least the k-th.
    gap, top = 0.25, logprobs.max()
    while len(ids := np.flatnonzero(logprobs >= top - gap)) < k:
        if gap > 1e38:  # fewer than k finite ones: -inf (or NaN) fills the rest, as in the sampler
            ids = np.arange(len(logprobs))
            break
        gap *= 2
    if len(ids) > k:
        kth = np.partition(logprobs[ids], len(ids) - k)[len(ids) - k]
        ids = ids[logprobs[ids] >= kth]
    ids = ids[np.lexsort((ids, -logprobs[ids]))][:k]
    return logprobs[ids], ids.astype(np.int64)


def move_row(batch: SamplingBatch, src: int, dst: int) -> None:
    """Row `src` (params, penalties so far) into row `dst`, whose version becomes new."""
    for name in SamplingBatch.__slots__:
        if name not in ("num_logprobs", "version"):
            getattr(batch, name)[dst] = getattr(batch, name)[src]
    batch.version[dst] = max(batch.version[dst], batch.version[src]) + 1


def draw(batch: SamplingBatch, sources: list) -> None:
    """Fill batch.uniform in place with one number in [0, 1) per row from its source, a function
    giving the row's next n (RowState.uniforms; None: an idle row, which gets 0 and consumes nothing)."""
    for row, source in enumerate(sources):
        batch.uniform[row] = 0.0 if source is None else source(1)[0]


def propose(p: SamplingParams, ids, logprobs, uniform: float) -> int:
    """A draft head's guess at the token the sampler will draw for a request with `uniform`, from
    the head's best candidates (`ids`, model ids, with their log-probabilities, best first): the
    draw of steps 1 and 4-8 above over those candidates alone, as if they were the vocabulary.
    Sharing the number makes the guess and the draw agree as often as the head's and the model's
    distributions do, where the head's argmax is kept only as often as the model draws its own top
    token. Only a guess: verification draws the token itself, so this never changes the output."""
    cands = [(float(lp) + p.logit_bias.get(int(t), 0.0), int(t)) for t, lp in zip(ids, logprobs)]
    cands = sorted((c for c in cands if c[0] > -math.inf), key=lambda c: (-c[0], c[1]))  # best first, lower id
    if not cands:
        return int(ids[0])
    top = cands[0][0]
    temperature = float(np.float32(p.temperature))  # as the batch holds it: a tinier one samples greedily
    if temperature == 0:
        return cands[0][1]
    z = [(x - top) / temperature for x, _ in cands]
    n = len(cands)
    if p.min_p > 0:
        n = sum(v >= math.log(p.min_p) for v in z)
    if p.top_k > 0:
        n = min(n, p.top_k)
    w = [math.exp(v) for v in z]
    if p.top_p < 1:
        mass, total, m = 0.0, sum(w[:n]), 0
        while m < n and mass < p.top_p * total:
            mass, m = mass + w[m], m + 1
        n = max(m, 1)
    while n < len(cands) and cands[n][0] == cands[n - 1][0]:  # ties with the last kept are kept
        n += 1
    kept = sorted(range(n), key=lambda i: cands[i][1])  # drawn in vocabulary order, as the sampler does
    target, acc = uniform * sum(w[i] for i in kept), 0.0
    for i in kept:
        acc += w[i]
        if acc > target:
            return cands[i][1]
    return cands[kept[-1]][1]
