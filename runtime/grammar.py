"""Guided decoding's grammars at run time (runtime/guided.py has what a guide is): each distinct
guide compiled once per run against the engine's tokenizer by llguidance, and each sample's matcher,
which gives the logit bias for its next token."""
from __future__ import annotations

import functools
import json
import os

import numpy as np

from trtllm.runtime import structural_tag
from trtllm.runtime.guided import Guide

NEG_INF_BITS = np.float32(-np.inf).view(np.uint32)  # 0xFF800000


class Grammars:
    """A run's guides, compiled against the engine's tokenizer: one LLTokenizer (under a second for
    the demo model's 49k tokens: built on first use) and each distinct guide's grammar once."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: list[int], tokenizer_size: int = 0):
        """`vocab_size`: the engine's logits' width; `tokenizer_size`: the tokenizer's own ids (with
        added tokens), which may be fewer (an embedding padded past them) or more (added tokens the
        model has no row for, which it can never produce)."""
        self.tokenizer_json, self.vocab_size, self.eos_ids = tokenizer_json, vocab_size, list(eos_ids)
        self.tokenizer_size = tokenizer_size
        self._tokenizer = None
        self._compiled: dict[tuple[str, str], object] = {}  # (kind, text) -> a matcher at its start
        self._first: dict[tuple[str, str], np.ndarray] = {}  # (kind, text) -> the mask at its start

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
        """A fresh matcher for one sample, its first mask computed (once a guide); ValueError naming the
        guide's path if it does not compile."""
        try:
            tokenizer = self.tokenizer()
        except ValueError as e:
            raise ValueError(f"`{guide.path}` cannot be used: {one_line(str(e))}") from None
        key = (guide.kind, guide.text)
        if key not in self._compiled:  # a guide that does not compile is remembered too (a top-level one: once)
            self._compiled[key] = self.compile(guide, tokenizer)
        compiled = self._compiled[key]
        if isinstance(compiled, str):
            raise ValueError(f"`{guide.path}` does not compile: {compiled}")
        matcher = Matcher(compiled.deep_copy(), self.vocab_size, self.eos_ids, guide.path, tokenizer)
        if key not in self._first:  # (read-only: every request of the guide holds this one array, not its own)
            self._first[key] = matcher.allowed()
        matcher._allowed = self._first[key]
        return matcher

    @functools.cached_property
    def special(self) -> dict[str, int]:
        """The tokenizer's special tokens, text -> id (a structural tag's trigger may be one)."""
        added = json.loads(self.tokenizer_json).get("added_tokens") or []
        return {t["content"]: t["id"] for t in added if t.get("special") and isinstance(t.get("content"), str)
                and t["content"] and isinstance(t.get("id"), int)}

    def compile(self, guide: Guide, tokenizer):
        """A matcher at the guide's start, or why it does not compile."""
        from llguidance import LLMatcher

        try:
            grammar = guide.grammar(self.special if guide.kind == "structural_tag" else None)
        except (ValueError, TypeError) as e:
            return one_line(str(e))
        error = LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            return tag_error(guide, tokenizer, self.special) or one_line(error)
        m = LLMatcher(tokenizer, grammar, log_level=0)
        return (tag_error(guide, tokenizer, self.special) or reason(m.get_error())) if m.is_error() else m


def alone_error(make, tokenizer) -> str | None:
    """Why one part's grammar (`make()`: its Lark text) does not compile alone, on one line, or None:
    what names a failing part of a larger grammar, whose own error names none."""
    from llguidance import LLMatcher

    try:
        error = LLMatcher.validate_grammar(make(), tokenizer)
    except (ValueError, TypeError) as e:
        error = str(e)
    return one_line(error) if error else None


def tag_error(guide: Guide, tokenizer, special: dict[str, int] | None = None) -> str | None:
    """Why a structural tag does not compile, where one of its parts (a schema, a regex, a token)
    does not alone: named by that part's path (the whole grammar's error names none). Asked only
    once it has failed."""
    if guide.kind != "structural_tag":
        return None
    from llguidance import LLMatcher

    def grammar_of(node: dict) -> str:
        if node["type"] == "json_schema":
            return LLMatcher.grammar_from_json_schema(json.dumps(node["json_schema"]))
        token = node.get("token")
        token = (special or {}).get(token, token) if isinstance(token, str) else token
        one = f"/{structural_tag.slashes(node['pattern'])}/" if node["type"] == "regex" else f"<[{token}]>"
        return f"%llguidance {{}}\nstart: {one}\n"

    for node in structural_tag.parts(json.loads(guide.text)):
        if error := alone_error(lambda: grammar_of(node), tokenizer):
            return f"`{node['at']}`: {error}"
    return None


def first_schema_error(schemas: list[tuple[str, object]], tokenizer) -> str | None:
    """Of (JSON path, JSON schema) pairs, the first that does not compile alone, named by its path:
    a forced tool choice's tools, whose whole schema's error names none of them."""
    from llguidance import LLMatcher

    for path, schema in schemas:
        if error := alone_error(lambda: LLMatcher.grammar_from_json_schema(json.dumps(schema)), tokenizer):
            return f"`{path}` does not compile: {error}"
    return None


class Matcher:
    """One sample's place in its grammar. Its messages name the guide's JSON path."""

    def __init__(self, matcher, vocab_size: int, eos_ids: list[int], path: str, tokenizer):
        self.m, self.vocab_size, self.eos_ids, self.path, self.tokenizer = matcher, vocab_size, eos_ids, path, tokenizer
        self._allowed = None  # the mask at this place, until the next token (a large schema's costs ms)

    def copy(self) -> Matcher:
        """Another sample's matcher at the same place, sharing the mask computed there."""
        other = Matcher(self.m.deep_copy(), self.vocab_size, self.eos_ids, self.path, self.tokenizer)
        other._allowed = self._allowed
        return other

    def allowed(self) -> np.ndarray:
        """bool [V], read-only: the tokens that may come next. EOS only where the grammar is complete:
        llguidance reads a special token's text in a guide ("<|im_end|>") as that token, and would
        allow EOS there, ending the answer short of a match."""
        if self._allowed is None:
            self.take(np.frombuffer(self.m.compute_bitmask(), np.uint8))
        return self._allowed

    def take(self, bits: np.ndarray) -> None:
        """The mask at this place from llguidance's bits (uint8, little-endian bit order)."""
        allowed = np.unpackbits(bits, bitorder="little")[:self.vocab_size].view(bool)  # (0/1 bytes: no copy)
        if not self.m.is_accepting():
            allowed[self.eos_ids] = False
        allowed.flags.writeable = False
        self._allowed = allowed

    @property
    def stale(self) -> bool:
        return self._allowed is None

    def bias(self, out: np.ndarray, logit_bias: dict[int, float]) -> str | None:
        """out [V] := the request's own logit_bias, -inf where the grammar allows no token; or why
        nothing can come next."""
        allowed = self.allowed()
        if self.m.is_error():  # a grammar that matches nothing (from here): llguidance's word for it
            return f"`{self.path}` matches no text from here: {reason(self.m.get_error())}"
        if not allowed.any():
            return (f"`{self.path}` leaves no token the answer can continue with (a special token's text in a "
                    "guide, such as <|im_end|>, is read as that token; or only ids past the model's vocabulary)")
        # 0 where allowed, -inf where not, written as float32 bits in place: np.where made and copied a
        # [V] array (about 50 us a row and step at V = 49152, a cost per guided row)
        assert out.dtype == np.float32 and out.flags.c_contiguous
        np.multiply(np.logical_not(allowed), NEG_INF_BITS, out=out.view(np.uint32))
        for token_id, value in logit_bias.items():
            out[token_id] += value
        return None

    def consume(self, token_id: int) -> str | None:
        """Advance past a generated token; why not, if the grammar cannot take it."""
        self._allowed = None
        if self.m.consume_token(token_id):
            return None
        special = " (a special token: its text in a guide is read as the token)" if self.tokenizer.is_special_token(
            token_id) else ""
        # (not always the token's fault: a parser limit reached there, "Current row has 2007 items", too)
        return f"`{self.path}` stopped at token {token_id}{special}: {reason(self.m.get_error())}"


_executor = None
_threads: int | None = None  # trtllm-run --threads (None: every core, as the engine takes them)


def use_threads(n: int | None) -> None:
    """The mask pool's threads: --threads holds for them as for the engine's."""
    global _executor, _threads
    if n != _threads:
        _executor, _threads = None, n


def fill(matchers: list[Matcher]) -> None:
    """Each matcher's next mask, computed together by llguidance's thread pool (the GIL released),
    for a decode step's guided rows: one at a time they would add up, a large schema's at ms each."""
    global _executor
    if len(matchers) < 2 or len({id(m.tokenizer) for m in matchers}) > 1:
        for m in matchers:
            m.allowed()
        return
    from llguidance import LLExecutor
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask_par

    if _executor is None:
        _executor = LLExecutor(num_threads=_threads or os.cpu_count() or 1)
    bits = allocate_token_bitmask(len(matchers), matchers[0].tokenizer.vocab_size)
    fill_next_token_bitmask_par(_executor, [(m.m, i) for i, m in enumerate(matchers)], bits)
    for m, row in zip(matchers, bits.view(np.uint8)):
        m.take(row)


def reason(message: str) -> str:
    """llguidance's message without the parser state it appends."""
    return one_line(message.split("<state>")[0]) or "(no reason given)"


def one_line(message: str, limit: int = 400) -> str:
    """llguidance's multi-line messages (a caret under the pattern, the grammar) as one line."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
