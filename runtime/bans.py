"""vLLM's `bad_words` and `allowed_token_ids`: tokens a request may not generate. Stdlib only: this
runs on the device.

- `allowed_token_ids`: only these ids may be generated (vLLM's; EOS too only if listed).
- `bad_words`: each word is tokenized as vLLM tokenizes it (`sequences`): its text without leading
  blanks, and, where it tokenizes to as many tokens with a different first one, with one space
  before it (the word in the middle of a sentence). A sequence's last token is banned at a position
  where the tokens generated just before it are the rest of the sequence: a one-token word is never
  generated, a longer one never completed. Only the answer's own tokens count (vLLM's; transformers'
  `bad_words_ids` also matches the prompt's last tokens).

The bans are -inf in the row's penalty bias (runtime/sampling.py `penalize`): like min_new_tokens'
ban, they are not in the reported logprobs, which describe the model and the logit_bias.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from trtllm.runtime.strict_json import array, fail, number, string

MAX_BAD_WORDS = 128  # vLLM's limit (VLLM_MAX_NUM_BAD_WORDS) is on the sequences: 2 per word at most here
MAX_BAD_WORD_CHARS = 256
MAX_ALLOWED_TOKEN_IDS = 1 << 20  # more than any vocabulary


def parse_bad_words(value: object, path: str) -> tuple[str, ...]:
    if value is None:  # (as `stop` reads it: none)
        return ()
    words = array(value, path, "non-empty strings", MAX_BAD_WORDS)
    for i, word in enumerate(words):
        at = f"{path}[{i}]"
        string(word, at, nonempty=True)
        if not word.lstrip():
            fail(at, "a word (its leading blanks are dropped, as vLLM drops them)", word)
        if len(word) > MAX_BAD_WORD_CHARS:
            fail(at, f"at most {MAX_BAD_WORD_CHARS} characters", word, shown=f"{len(word)} characters")
    return tuple(words)


_token_id = number(int, 0)


def parse_allowed(value: object, path: str) -> tuple[int, ...] | None:
    if value is None:  # off (vLLM's default)
        return None
    ids = array(value, path, "token ids", MAX_ALLOWED_TOKEN_IDS)
    if not ids:
        fail(path, "a non-empty array of token ids (null, or no key, allows every token)", value)
    return tuple(_token_id(v, f"{path}[{i}]") for i, v in enumerate(ids))


def sequences(words: Sequence[str], encode: Callable[[str], list[int]]) -> tuple[tuple[int, ...], ...]:
    """The token sequences the words ban, as vLLM's SamplingParams.update_from_tokenizer makes them
    (`encode`: the tokenizer without special tokens)."""
    out = []
    for word in words:
        plain = tuple(encode(word.lstrip()))
        spaced = tuple(encode(" " + word.lstrip()))
        out.append(plain)
        if spaced and plain and spaced[0] != plain[0] and len(spaced) == len(plain):
            out.append(spaced)
    return tuple(seq for seq in out if seq)


def request_sequences(words: Sequence[str], encode: Callable[..., list[int]], vocab_size: int,
                      where: str) -> tuple[tuple[tuple[int, ...], ...], str | None]:
    """A request's bad_words as the sequences they ban, or why they cannot be (`where`: their JSON
    path): a token past the model's vocabulary (one the tokenizer adds)."""
    out = []
    for i, word in enumerate(words):
        seqs = sequences([word], lambda text: encode(text, add_special_tokens=False))
        past = [t for seq in seqs for t in seq if t >= vocab_size]
        if past:
            return (), (f"`{where}[{i}]` {word!r} has token {past[0]}, past the model's vocabulary size "
                        f"{vocab_size} (a token the tokenizer adds)")
        out += seqs
    return tuple(out), None


def banned_next(seqs: Sequence[Sequence[int]], output: Sequence[int], end: int | None = None) -> set[int]:
    """The ids the bad words ban at the position after output[:end] (the answer's tokens so far; no
    copy of them is made: this runs for every token)."""
    end = len(output) if end is None else end
    out = set()
    for seq in seqs:
        n = len(seq) - 1
        if n <= end and all(output[end - n + i] == seq[i] for i in range(n)):
            out.add(seq[-1])
    return out


def dead_end(allowed: frozenset[int] | None, seqs: Sequence[Sequence[int]], held: frozenset[int],
             repeated: frozenset[int] = frozenset()) -> str | None:
    """Why a request's bans leave it no first token, whatever the model says (`held`: what
    min_new_tokens holds back then, EOS and stop_token_ids; empty without it; `repeated`: what
    no_repeat_ngram_size bans first), or None."""
    if allowed is None:
        return None
    left = allowed - {seq[0] for seq in seqs if len(seq) == 1}
    if not left:
        return "every id of allowed_token_ids is a one-token word of bad_words"
    left -= repeated
    if not left:
        return "the ids allowed_token_ids leaves would each repeat an n-gram of the prompt (no_repeat_ngram_size)"
    if not left - held:
        return ("the ids allowed_token_ids leaves are all EOS or stop_token_ids, which min_new_tokens holds back "
                "for its first tokens")
    return None


def banning(p, held: bool, guided: bool) -> str:
    """The settings of a request that ban tokens, named for an error where they ban every one (`p`:
    its sampling.SamplingParams or beam_candidates.BeamParams; `held`: min_new_tokens holds EOS back there),
    each by its JSON path where `p.where` names them (trtllm-run: the request's own or the top level's)."""
    where = getattr(p, "where", None) or (lambda name: name)
    names = [name for name, on in ((f"`{where('allowed_token_ids')}`", p.allowed_token_ids is not None),
                                   (f"`{where('bad_words')}`", bool(p.bad_words)),
                                   (f"`{where('no_repeat_ngram_size')}`", p.no_repeat_ngram_size > 0),
                                   (f"`{where('min_new_tokens')}` (EOS and stop_token_ids held back)", held),
                                   (f"`{where('guided_decoding')}`'s grammar", guided)) if on]
    return " and ".join(names) or "its biases"


class RepeatedNgrams:
    """transformers' `no_repeat_ngram_size` n (NoRepeatNGramLogitsProcessor): no n tokens in a row
    twice. The tokens it bans next are those that followed the last n-1 tokens before, anywhere in
    the prompt and the answer (n = 1: every token either holds). An index of each (n-1)-gram's next
    tokens, kept up to date as the row takes tokens (`add`), so a token costs one lookup, not a scan."""

    def __init__(self, n: int, prompt: Sequence[int]):
        self.n, self.tokens, self.next = n, list(prompt), {}
        for end in range(n, len(self.tokens) + 1):
            self._index(end)
        self.before: frozenset[int] = frozenset()  # what it banned before the last token added

    def _index(self, end: int) -> None:
        self.next.setdefault(tuple(self.tokens[end - self.n:end - 1]), set()).add(self.tokens[end - 1])

    def add(self, token: int) -> None:
        """A token the row took."""
        self.before = self.banned()
        self.tokens.append(token)
        if len(self.tokens) >= self.n:
            self._index(len(self.tokens))

    def banned(self) -> frozenset[int]:
        """The ids it bans next (a copy: the index grows with the next token)."""
        if len(self.tokens) < self.n:  # (no n-gram yet)
            return frozenset()
        return frozenset(self.next.get(tuple(self.tokens[len(self.tokens) - self.n + 1:]), ()))

    def banned_after(self, output: Sequence[int]) -> set[int]:
        """The ids banned after the tokens so far and then `output`, the index left as it is (a beam's
        answer, on an index of its prompt alone: the answer's own n-grams are looked for in it)."""
        tokens = self.tokens + list(output)
        if len(tokens) < self.n:
            return set()
        key = tokens[len(tokens) - self.n + 1:]
        out = set(self.next.get(tuple(key), ()))
        m = self.n - 1  # (the answer's n-grams: those ending in it, before the last position)
        for end in range(max(len(self.tokens), m), len(tokens)):
            if tokens[end - m:end] == key:
                out.add(tokens[end])
        return out
