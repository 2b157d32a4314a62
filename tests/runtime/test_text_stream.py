"""TextStream (stop strings, streaming hold-back) and the penalty bookkeeping, without an engine."""
from __future__ import annotations

import numpy as np
import pytest

from trtllm.runtime import sampling
from trtllm.runtime.text import TextStream


class CharTokenizer:
    """Each id is one character of ALPHABET; enough for IncrementalDecoder's interface."""

    ALPHABET = "abc XYZ\n:!é🙂中"
    special_ids = frozenset()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.ALPHABET[i] for i in ids)


def stream(text: str, stops=(), check_from: int = 0):
    ts = TextStream(CharTokenizer(), tuple(stops))
    pieces, stopped = [], False
    for k, ch in enumerate(text):
        stopped = ts.push(CharTokenizer.ALPHABET.index(ch), check_stops=k + 1 >= check_from)
        if stopped:
            break
        pieces.append(ts.take())
    ts.finish()
    pieces.append(ts.take(final=True))
    return ts, "".join(pieces), stopped


def test_no_stops_streams_everything():
    ts, streamed, stopped = stream("abc XYZ")
    assert not stopped and streamed == ts.final_text() == "abc XYZ"


@pytest.mark.parametrize("text, stops, expected, by", [
    ("abc XYZ abc", ["XYZ"], "abc ", "XYZ"),
    ("abc XYZ abc", ["c X", "Y"], "ab", "c X"),      # earliest position wins, not first listed
    ("abc XYZ abc", ["Y", "c X"], "ab", "c X"),
    ("abcXYZ", ["Z", "XYZ"], "abc", "XYZ"),          # both complete on one token: the earliest start wins
    ("abc XYZ abc", ["XY", "X"], "abc ", "X"),       # "X" is there a token before "XY"
    ("abc\n\nXYZ", ["\n\n"], "abc", "\n\n"),
    ("abé🙂中 c", ["🙂中"], "abé", "🙂中"),            # multi-character unicode stop
    ("aaaa", ["aa"], "", "aa"),
])
def test_stop_strings(text, stops, expected, by):
    ts, streamed, stopped = stream(text, stops)
    assert stopped and ts.final_text() == expected and ts.stopped_by == by  # (the response's stop_reason)
    assert streamed == expected  # nothing past (or inside) the stop string is ever streamed


@pytest.mark.parametrize("text, stops, expected", [
    ("abc XYZ abc", ["XYZ"], "abc XYZ"),
    ("abc XYZ abc", ["c X", "Y"], "abc X"),  # the earliest, whole
    ("abcXYZ", ["Z", "XYZ"], "abcXYZ"),
    ("aaaa", ["aa"], "aa"),
])
def test_a_stop_string_kept_in_the_text(text, stops, expected):
    """include_stop_str_in_output: the text ends after the stop string, streamed the same."""
    ts = TextStream(CharTokenizer(), tuple(stops), include_stop=True)
    pieces = []
    for ch in text:
        stopped = ts.push(CharTokenizer.ALPHABET.index(ch))
        pieces.append(ts.take())
        if stopped:
            break
    ts.finish()
    pieces.append(ts.take(final=True))
    assert ts.final_text() == "".join(pieces) == expected


def test_stop_strings_wait_for_min_new_tokens():
    ts, _, stopped = stream("XYZ abc XYZ", ["XYZ"], check_from=4)
    assert stopped and ts.final_text() == "XYZ abc "


@pytest.mark.parametrize("min_new, expected", [(0, ""), (1, "X"), (2, "XX")])
def test_row_keeps_min_new_tokens_before_a_stop_string(min_new, expected):
    """A row keeps its first min_new_tokens tokens whatever they spell (a stop string must end in
    a later token's text), as it keeps them free of EOS."""
    from trtllm.runtime.generate import RowState

    params = sampling.SamplingParams(temperature=0, max_new_tokens=8, min_new_tokens=min_new)
    row = RowState([0], params, np.random.default_rng(0), frozenset(),
                   text=TextStream(CharTokenizer(), ("X",)))
    for ch in "XXXX":
        row.accept(CharTokenizer.ALPHABET.index(ch), None)
        if row.finish_reason:
            break
    assert row.finish_reason == "stop-words" and row.text.final_text() == expected


@pytest.mark.parametrize("ignore_eos, reason", [(False, "end-of-sequence"), (True, "stop-words")])
def test_an_eos_id_in_stop_token_ids_ends_as_eos(ignore_eos, reason):
    """input_format.md: a stop_token_ids id ends the sample with stop-words, except an EOS id, which
    ends it with end-of-sequence unless ignore_eos is set (as vLLM checks EOS first). Users list
    <|im_end|> in stop_token_ids often."""
    from trtllm.runtime.generate import RowState

    params = sampling.SamplingParams(temperature=0, stop_token_ids=(3,), ignore_eos=ignore_eos)
    row = RowState([1, 2], params, np.random.default_rng(0), frozenset({3}))
    row.accept(3, None)
    assert row.finish_reason == reason


def test_a_short_stop_before_min_new_tokens_stays_unmatched_beside_a_long_one():
    """The long stop holds back 6 characters; "XY" ended before checking began, so it is not a match."""
    ts, _, stopped = stream("abXYc abc", ["XY", "ZZZZZZZ"], check_from=5)
    assert not stopped and ts.final_text() == "abXYc abc"


def test_hold_back_never_leaks_a_partial_stop():
    ts = TextStream(CharTokenizer(), ("XYZ!",))
    out = ""
    for ch in "ab XYZ":
        ts.push(CharTokenizer.ALPHABET.index(ch))
        out += ts.take()
    assert out == "ab "  # "XYZ" could still become "XYZ!"


def test_sampling_params_errors_name_their_field():
    for kwargs, name in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"min_p": 2}, "min_p"),
                         ({"repetition_penalty": 0}, "repetition_penalty"), ({"presence_penalty": 3}, "presence_penalty"),
                         ({"frequency_penalty": -3}, "frequency_penalty"), ({"num_logprobs": 51}, "num_logprobs"),
                         ({"max_new_tokens": 2, "min_new_tokens": 3}, "min_new_tokens"), ({"top_k": -1}, "top_k")]:
        with pytest.raises(ValueError, match=f"^{name} must be"):
            sampling.SamplingParams(**kwargs)


def test_penalty_bookkeeping():
    params = sampling.SamplingParams(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=1.2,
                                     min_new_tokens=2, max_new_tokens=8)
    banned = frozenset({9})
    batch = sampling.make_batch([params], vocab_size=10, max_top_k=10, prompts=[[1, 2]], banned=[banned])
    assert batch.seen[0].tolist() == [False, True, True] + [False] * 7
    assert batch.penalty_bias[0, 9] == -np.inf
    counts = {}
    for n, token in enumerate([3, 3], start=1):
        counts[token] = counts.get(token, 0) + 1
        sampling.penalize(batch, 0, params, counts, token, n, banned)
    assert batch.penalty_bias[0, 3] == pytest.approx(-(0.5 * 2 + 0.25))
    assert batch.seen[0, 3]
    assert batch.penalty_bias[0, 9] == 0  # the ban on EOS ended at min_new_tokens
    assert sampling.make_batch([sampling.SamplingParams(top_k=10)], 10, 4).top_k[0] == 0  # >= vocab: all tokens
    with pytest.raises(ValueError, match="top_k must be <= 4"):
        sampling.make_batch([sampling.SamplingParams(top_k=5)], 10, 4)


def test_a_fork_goes_on_apart_from_its_parent():
    """runtime/beam.py forks a beam's text for each continuation: each fork, fed its own characters,
    is what a fresh stream fed the whole text gives, and the parent is left as it was."""
    ids = CharTokenizer.ALPHABET.index
    parent = TextStream(CharTokenizer(), ("XYZ",))
    for ch in "ab X":
        parent.push(ids(ch))
    left, right = parent.fork(), parent.fork()
    assert [left.push(ids(ch)) for ch in "YZ"] == [False, True] and left.final_text() == "ab "
    assert [right.push(ids(ch)) for ch in "Y!"] == [False, False] and right.text == "ab XY!"
    assert parent.text == "ab X" and parent.stop_at is None
    assert [parent.push(ids(ch)) for ch in "YZ"] == [False, True]
