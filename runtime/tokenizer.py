"""Tokenization for the runtime: a thin wrapper over `tokenizers` that decodes like transformers.

No transformers here (this runs on the device). What transformers adds on top of the `tokenizers`
backend for decoding is only `clean_up_tokenization_spaces` (False unless tokenizer_config.json
says otherwise, and ignored for BPE models), so `decode` reproduces `PreTrainedTokenizerFast.decode`.
"""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from pathlib import Path

import tokenizers

from .chat_template import special_tokens_from_config

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# transformers' clean_up_tokenization: meant for WordPiece, corrupts BPE output.
_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode alphabet, inverted: printable bytes stand for themselves, the
    others (controls, space, 0x7F-0xA0, 0xAD) are shifted to U+0100 and up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    shifted = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + i) for i, b in enumerate(shifted)})
    return {c: b for b, c in chars.items()}


def _decoder_types(decoder_json: dict | None) -> set[str]:
    """Every decoder type in a (possibly nested Sequence) decoder, plus "Metaspace" for a
    Replace("▁" -> " ") step, which is how Llama/Mistral tokenizer.json files write it."""
    if not decoder_json:
        return set()
    types = {decoder_json.get("type", "")}
    pattern = decoder_json.get("pattern")
    if decoder_json.get("type") == "Replace" and isinstance(pattern, dict) and pattern.get("String") == "▁":
        types.add("Metaspace")
    for child in decoder_json.get("decoders") or []:
        types |= _decoder_types(child)
    return types


class Tokenizer:
    """tokenizer.json + tokenizer_config.json of an engine directory."""

    def __init__(self, backend: tokenizers.Tokenizer, config: dict):
        self._backend = backend
        self._config = config
        self._special_tokens = special_tokens_from_config(config)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()  # {id: AddedToken}
        self._added = {i: t.content for i, t in added.items()}
        self.special_ids = frozenset(i for i, t in added.items() if t.special)
        decoder_state = json.loads(backend.decoder.__getstate__()) if backend.decoder is not None else None
        self._decoder_types = _decoder_types(decoder_state)
        self._byte_decoder = _byte_decoder() if "ByteLevel" in self._decoder_types else None
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False)) and (
            type(backend.model).__name__ != "BPE"
            or bool(config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output")))
        self._bytes_cache: dict[int, bytes] = {}
        # Byte-fallback tokens (<0xNN>): the decoder turns a run of them that is not valid UTF-8
        # into U+FFFD as a whole, complete characters in it included, so a run is streamed whole.
        self.byte_token_ids = frozenset(
            i for t, i in backend.get_vocab(with_added_tokens=False).items() if _BYTE_TOKEN.fullmatch(t)
        ) if "ByteFallback" in self._decoder_types else frozenset()
        # transformers turns off a truncation or padding block saved in tokenizer.json for every
        # call unless asked; left on, it would cut or pad every prompt without a word
        backend.no_truncation()
        backend.no_padding()
        # split_special_tokens: control tokens in the text are encoded as plain text, as transformers does
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

    @classmethod
    def from_engine_dir(cls, engine_dir, files: dict | None = None) -> Tokenizer:
        """`files`: the manifest's (the names the build wrote); the usual names without one."""
        engine_dir, files = Path(engine_dir), files or {}
        backend = tokenizers.Tokenizer.from_file(str(engine_dir / files.get("tokenizer", "tokenizer.json")))
        config_path = engine_dir / files.get("tokenizer_config", "tokenizer_config.json")
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.exists() else {}
        return cls(backend, config)

    def to_json(self) -> str:
        """tokenizer.json's content (what guided decoding's matcher reads: runtime/grammar.py)."""
        return self._backend.to_str()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`. Chat-templated text already holds its special tokens, hence the
        False default, as in transformers' apply_chat_template(tokenize=True)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True, clean_up: bool = True) -> str:
        """As transformers' decode; `clean_up=False` skips the clean-up of spaces (IncrementalDecoder
        applies it to the whole text instead)."""
        text = self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.clean_up(text) if clean_up else text

    @property
    def cleans_up(self) -> bool:
        """Whether decode removes spaces before punctuation (clean_up_tokenization_spaces, not BPE)."""
        return self._clean_up

    def clean_up(self, text: str) -> str:
        if self._clean_up:
            for old, new in _CLEANUPS:
                text = text.replace(old, new)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (possibly part of a UTF-8 character)."""
        if type(token_id) is not int:  # a numpy integer; a bool, float or anything else is no id
            if isinstance(token_id, bool) or not hasattr(token_id, "__index__"):
                raise ValueError(f"token_id must be a token id >= 0, got {token_id!r}")
            token_id = token_id.__index__()
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._bytes_cache[token_id] = self._compute_token_bytes(token_id)
        return cached

    def _compute_token_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise ValueError(f"token_id must be a token id >= 0, got {token_id!r}")
        if token_id in self._added:
            # The text an added token matches. (tokenizers' ByteLevel decoder maps an added token
            # made only of alphabet characters, e.g. "é", through the byte table, so decode()
            # garbles it; the bytes the token stands for in the input are still its UTF-8 content.)
            return self._added[token_id].encode("utf-8")
        token = self._backend.id_to_token(token_id)
        if token is None:
            # past the tokenizer: a model whose vocabulary is padded (Qwen2.5, Phi-3, Gemma) can
            # still draw such an id; it stands for no text, as decode (and transformers') has it
            return b""
        if self._byte_decoder is not None:
            # Like the ByteLevel decoder: a token with a character outside the alphabet is raw UTF-8.
            if all(c in self._byte_decoder for c in token):
                return bytes(self._byte_decoder[c] for c in token)
            return token.encode("utf-8")
        if "ByteFallback" in self._decoder_types and (match := _BYTE_TOKEN.fullmatch(token)):
            return bytes([int(match.group(1), 16)])
        if "Metaspace" in self._decoder_types:
            return token.replace("▁", " ").encode("utf-8")
        # WordPiece and other decoders rewrite tokens in context; the lone decode is the best guess.
        return self._backend.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def special_token(self, name: str) -> str | None:
        """A named special token from tokenizer_config.json, e.g. special_token("eos_token")."""
        return self._special_tokens.get(name)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's piece for an id (byte-level BPE's "Ġthe"), as transformers' convert_ids_to_tokens."""
        return self._backend.id_to_token(token_id)

    def vocab(self) -> dict[str, int]:
        """Every token, added ones too, with its id."""
        return self._backend.get_vocab(with_added_tokens=True)


def safe_cut(raw: str, c: int) -> bool:
    """Whether the clean-up (_CLEANUPS, pass by pass) of raw[:c] and raw[c:] apart is that of raw.

    Every pattern starts with a space and only deletes spaces, so the characters that are not
    spaces stay, and a match across the cut must start at a space before it and take what stands
    after it. These places allow none:
    - three characters without a space before the cut (a pattern is at most 4 long);
    - a space at the cut, which stays first after it or, once an earlier pass deleted it, gives way
      to a pattern's second character (. ? ! , ' n); a pattern across the cut then holds the
      character x before the cut second, and that first character third: only " ' " (x "'") and
      " n't" (x "n", after " ' t" became "'t") do. So x may not be a space, "'" or "n"; or x and
      the one before it are no spaces (" in in"): a match would start three back and hold that
      first character fourth, and no pattern's fourth is one of them.
    Checked against the whole text's clean-up for every cut of short strings (tests/runtime)."""
    if c >= 3 and " " not in raw[c - 3:c]:
        return True
    if not 1 <= c < len(raw) or raw[c] != " " or raw[c - 1] == " ":
        return False
    return raw[c - 1] not in "'n" or (c >= 2 and raw[c - 2] != " ")


class IncrementalDecoder:
    """Streaming detokenization: feed ids one at a time, get the newly completed text.

    Decodes a short window of ids twice, with and without the newest (the vLLM scheme): the
    difference is the new text. Decoding in context, rather than one token alone, keeps what
    decoders do across tokens (leading-space stripping, byte fallback) identical to `decode`.

        ids:   ... | prefix_offset ...... read_offset ...... len(ids)
                     '-- already emitted --'  '--- pending ---'

    Text ending in U+FFFD (an incomplete UTF-8 character) is held back until the ids that complete
    it arrive, or until flush(); so is a run of byte-fallback tokens (<0xNN>) until a token that is
    not one ends it, because the decoder replaces a whole run that is not valid UTF-8. Skipped
    special tokens are dropped before they enter the window, so they cannot change how the
    window's first token decodes.

    A tokenizer that cleans up spaces (" ." -> ".", " ' " -> "'") rewrites text that came before
    the newest token, and streamed text cannot be taken back. So the window is decoded without the
    clean-up, which is applied to the text since the last cut instead, and its last CLEAN_UP_HOLD
    characters are held back: a match needs at most 3 more characters, and the passes' chained
    effects stay within a few more. The text is cut (what is before the cut never looked at again)
    where no clean-up pass can match across the cut (safe_cut), so cleaning the two sides apart
    gives the whole's clean-up. Cleaning all the text every token was quadratic in the output's
    length. (Text with no such place, one-character "n" or "'" between spaces for ever, is not cut.)
    """

    CLEAN_UP_HOLD = 16
    CLEAN_UP_WINDOW = 256  # raw characters kept after the last cut, about

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._pieces: list[str] = []
        self._raw = ""        # the text since the last cut, before the clean-up (a tokenizer that cleans up)
        self._cut = 0         # cleaned characters before that cut (all emitted)
        self._emitted = 0     # characters emitted
        self.cut_short = False  # flush() ended a character the ids had not completed

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._pieces)

    def peek(self) -> str:
        """What flush() would emit now, this decoder left as it is ("" where it holds nothing)."""
        if self._read_offset == len(self._ids) and not getattr(self._tokenizer, "cleans_up", False):
            return ""
        probe = copy.copy(self)  # (flush reads the ids and appends to the pieces: a list of its own for
        probe._pieces = []       # those, the ids shared; copying both each token grew with the output)
        return probe.flush()

    def fork(self) -> IncrementalDecoder:
        """A copy that goes on apart from this one (a beam's text, from the beam it extends)."""
        new = copy.copy(self)
        new._ids, new._pieces = list(self._ids), list(self._pieces)
        return new

    def push(self, token_id: int) -> str:
        if self._skip_special_tokens and token_id in self._tokenizer.special_ids:
            return ""
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Emits whatever is held back, an incomplete character included (as U+FFFD); `cut_short`
        then says whether it ends with one."""
        self.cut_short = self._read_offset < len(self._ids) and self._incomplete_tail() != 0
        return self._emit(final=True)

    def _incomplete_tail(self) -> int:
        """How many tokens at the end hold the start of a UTF-8 character that later bytes can
        complete (0: none; negative: they hold the end of the character before it too). A U+FFFD
        that no byte can fix (a stray continuation byte, a lead byte followed by a non-continuation)
        is final: holding it would stall the stream and grow the decode window for good (quadratic
        in a model that loops on such a token)."""
        token_bytes = getattr(self._tokenizer, "token_bytes", None)
        if token_bytes is None:  # (test stand-ins): hold the pending tokens, as before
            return len(self._ids) - self._read_offset
        # the last tokens' bytes, back to 3 bytes (tokens of none, a padded vocabulary's, do not count)
        pending, total = [], 0
        for i in reversed(self._ids[self._read_offset:]):
            pending.append(token_bytes(i))
            total += len(pending[-1])
            if total >= 3:
                break
        pending.reverse()
        tail = b"".join(pending)[-3:]
        for k in range(1, len(tail) + 1):
            b = tail[-k]
            if b & 0xC0 == 0x80:  # a continuation byte: look further back for its lead
                continue
            need = 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
            if need <= k:
                return 0
            tokens, held = 0, 0  # the tokens that hold those k bytes
            while held < k and tokens < len(pending):
                tokens += 1
                held += len(pending[-tokens])
            # (-tokens where the first of them starts with the character: what comes before ends
            # between characters; else the pending tokens are held whole)
            return tokens if held == k else -(len(self._ids) - self._read_offset)
        return 0

    def _emit(self, final: bool) -> str:
        tok, skip = self._tokenizer, self._skip_special_tokens
        cleans_up = getattr(tok, "cleans_up", False)  # (tests stand in tokenizers that do not)
        extra = {"clean_up": False} if cleans_up else {}
        prefix_text = tok.decode(self._ids[self._prefix_offset:self._read_offset], skip, **extra)
        new_text = tok.decode(self._ids[self._prefix_offset:], skip, **extra)
        delta = ""
        tail = self._incomplete_tail() if not final and new_text.endswith("\ufffd") else 0
        # a byte-fallback run may go on: held whole
        run = not final and bool(self._ids) and self._ids[-1] in getattr(tok, "byte_token_ids", ())
        held = not final and (tail or run)
        if len(new_text) > len(prefix_text) and not held:
            delta = new_text[len(prefix_text):]
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        elif tail > 0 and not run and len(self._ids) - tail > self._read_offset:
            # what comes before the character that may still be completed is final: emit it
            split = len(self._ids) - tail
            text = tok.decode(self._ids[self._prefix_offset:split], skip, **extra)
            if len(text) > len(prefix_text):
                delta = text[len(prefix_text):]
                self._prefix_offset, self._read_offset = self._read_offset, split
        if cleans_up:
            delta = self._cleaned(delta, final)
        if delta:
            self._pieces.append(delta)
            self._emitted += len(delta)
        return delta

    def _cleaned(self, raw: str, final: bool) -> str:
        """The cleaned text that `raw` (new, not cleaned) makes safe to emit; cuts the text kept."""
        tok, self._raw = self._tokenizer, self._raw + raw
        cleaned = tok.clean_up(self._raw)
        done = self._emitted - self._cut  # of `cleaned`
        out = cleaned[done:len(cleaned) if final else max(done, len(cleaned) - self.CLEAN_UP_HOLD)]
        if len(self._raw) > self.CLEAN_UP_WINDOW:
            n = len(self._raw)  # (only the newest half-window: the older places were looked at before)
            cut = next((c for c in range(n - self.CLEAN_UP_WINDOW // 2, max(3, n - self.CLEAN_UP_WINDOW), -1)
                        if safe_cut(self._raw, c)), 0)
            head = len(tok.clean_up(self._raw[:cut])) if cut else 0
            if cut and head <= done + len(out):  # (only what is emitted is left behind)
                self._cut, self._raw = self._cut + head, self._raw[cut:]
        return out
