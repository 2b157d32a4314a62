"""Guided decoding's grammars at run time (runtime/guided.py has what a guide is): each distinct
guide compiled once per run against the engine's tokenizer by llguidance, and each sample's matcher,
which gives the logit bias for its next token."""
from __future__ import annotations

import numpy as np

from trtllm.runtime.guided import Guide


class Grammars:
    """A run's guides, compiled against the engine's tokenizer: one LLTokenizer (about a second
    for a 50k vocabulary: built on first use) and each distinct guide's grammar once."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int], tokenizer_size: int = 0):
        """`vocab_size`: the engine's logits' width; `tokenizer_size`: the tokenizer's own ids (with
        added tokens), which may be fewer (an embedding padded past them) or more (added tokens the
        model has no row for, which it can never produce)."""
        self.tokenizer_json, self.vocab_size, self.eos_ids = tokenizer_json, vocab_size, list(eos_ids)
        self.tokenizer_size = tokenizer_size
        self._tokenizer = None
        self._compiled: dict[tuple[str, str], object] = {}  # (kind, text) -> a matcher at its start

    def tokenizer(self):
        if self._tokenizer is None:
            from llguidance import LLTokenizer

            if not self.eos_ids:  # (llguidance needs one: a grammar ends there)
                raise ValueError("the engine has no EOS token (its manifest's eos_token_ids is empty), where a "
                                 "grammar's answer would end")
            n_vocab = max(self.vocab_size, self.tokenizer_size)  # masks are cut to the logits' width
            self._tokenizer = LLTokenizer(self.tokenizer_json, n_vocab=n_vocab, eos_token=self.eos_ids)
        return self._tokenizer

    def matcher(self, guide: Guide) -> Matcher:
        """A fresh matcher for one sample; ValueError naming the guide's path if it does not compile."""
        from llguidance import LLMatcher

        key = (guide.kind, guide.text)
        if key not in self._compiled:
            try:
                tokenizer = self.tokenizer()
            except ValueError as e:
                raise ValueError(f"`{guide.path}` cannot be used: {one_line(str(e))}") from None
            try:
                grammar = guide.grammar()
            except (ValueError, TypeError) as e:
                raise ValueError(f"`{guide.path}` does not compile: {one_line(str(e))}") from None
            error = LLMatcher.validate_grammar(grammar, tokenizer)
            if error:
                raise ValueError(f"`{guide.path}` does not compile: {one_line(error)}")
            m = LLMatcher(tokenizer, grammar, log_level=0)
            if m.is_error():
                raise ValueError(f"`{guide.path}` does not compile: {one_line(m.get_error())}")
            self._compiled[key] = m
        return Matcher(self._compiled[key].deep_copy(), self.vocab_size)


class Matcher:
    """One sample's place in its grammar."""

    def __init__(self, matcher, vocab_size: int):
        self.m, self.vocab_size = matcher, vocab_size

    def allowed(self) -> np.ndarray:
        """bool [V]: the tokens that may come next."""
        bits = np.frombuffer(self.m.compute_bitmask(), np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.vocab_size].astype(bool)

    def bias(self, out: np.ndarray, logit_bias: dict[int, float]) -> bool:
        """out [V] := the request's own logit_bias, -inf where the grammar allows no token; False if
        it allows none the model can produce (only ids past its vocabulary: added tokens)."""
        allowed = self.allowed()
        out[:] = np.where(allowed, np.float32(0), np.float32(-np.inf))
        for token_id, value in logit_bias.items():
            out[token_id] += value
        return bool(allowed.any())

    def consume(self, token_id: int) -> str | None:
        """Advance past a generated token; the reason, if the grammar cannot take it."""
        if self.m.consume_token(token_id):
            return None
        return one_line(self.m.get_error() or "") or f"token {token_id} is not allowed there"


def one_line(message: str, limit: int = 400) -> str:
    """llguidance's multi-line messages (a caret under the pattern, the grammar) as one line."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
