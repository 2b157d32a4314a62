"""Tokenizer wrapper and streaming decoder against transformers' PreTrainedTokenizerFast.

The byte-level BPE tokenizer is trained in the test on text with accents, CJK and emoji, with
fewer merges than characters, so many characters span several tokens (the interesting case for
token bytes and incremental decoding).
"""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from trtllm.runtime.chat_template import ChatTemplate
from trtllm.runtime.tokenizer import IncrementalDecoder, Tokenizer
from trtllm.runtime.text import TextStream

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "世界"]  # added but not special, like Qwen's think tags
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Edge devices run small language models on CPUs and GPUs!",
    "Héllo wörld, ünïcode çafé, naïve — “quotes” and ‘single’ ones.",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 🙂🚀👍🏽 ❤️‍🔥 👨‍👩‍👧 and flags 🇫🇷🇯🇵.",
    "Code: def f(x):\n    return x ** 2  # square\n\tindented",
] * 40
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXTS = [
    "",
    "Hello world",
    "  leading and trailing spaces  ",
    "Héllo wörld — naïve çafé",
    "日本語のテキスト、中文文本、한국어",
    "🙂🚀👍🏽 ❤️‍🔥 👨‍👩‍👧 🇫🇷",
    "unseen scripts: Ελληνικά עברית العربية ไทย देवनागरी 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<|im_start|>user\nhi 🙂<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\n世界<|endoftext|>",
    "tabs\tand\nnewlines\r\n and \x00 control \x7f bytes",
    "don't , stop . now ? yes ! they 're here",
]


def _backend() -> BackendTokenizer:
    tok = BackendTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(ADDED)
    return tok


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    """An engine directory as the builder writes it (transformers' save_pretrained) when
    transformers is installed, else the same files written by hand."""
    out_dir = tmp_path_factory.mktemp("tok")
    backend = _backend()
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        backend.save(str(out_dir / "tokenizer.json"))
        config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
        (out_dir / "chat_template.jinja").write_text(CHATML)
        return out_dir
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def ours(engine_dir):
    return Tokenizer.from_engine_dir(engine_dir)


@pytest.fixture(scope="module")
def hf(engine_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(engine_dir)


@pytest.mark.hf
def test_encode_decode_match_transformers(ours, hf):
    assert ours.vocab_size == len(hf)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), text
        assert ours.encode(text, add_special_tokens=True) == hf.encode(text), text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        assert ours.special_token(name) == getattr(hf, name)
    assert ours.token_to_id("<|im_end|>") == hf.convert_tokens_to_ids("<|im_end|>")
    assert ours.token_to_id("not-a-token-xyz") is None


@pytest.mark.hf
def test_chat_template_then_encode_matches_transformers(engine_dir, ours, hf):
    template = ChatTemplate.from_engine_dir(engine_dir)
    messages = [{"role": "system", "content": "Be brief 🙂"}, {"role": "user", "content": TEXTS[4]},
                {"role": "assistant", "content": TEXTS[5]}, {"role": "user", "content": TEXTS[6]}]
    expected = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.encode(template.render(messages, add_generation_prompt=True)) == expected


@pytest.mark.hf
def test_decode_every_token_matches_transformers(ours, hf):
    for token_id in range(ours.vocab_size):
        assert ours.decode([token_id], skip_special_tokens=False) == hf.decode([token_id]), token_id


def test_token_bytes_rebuild_text(ours):
    for text in TEXTS:
        ids = ours.encode(text)
        assert b"".join(ours.token_bytes(i) for i in ids) == text.encode("utf-8"), text
    # Some characters really are split across tokens, so the test above covers partial bytes.
    assert any(_is_partial(ours.token_bytes(i)) for text in TEXTS for i in ours.encode(text))
    assert ours.token_bytes(ours.token_to_id("<|im_start|>")) == b"<|im_start|>"
    assert ours.token_bytes(ours.token_to_id("世界")) == "世界".encode("utf-8")
    assert ours.token_bytes(ours.vocab_size + 5) == b""  # past the tokenizer (a padded vocabulary): no text
    import numpy as np

    assert ours.token_bytes(np.int64(5)) == ours.token_bytes(5)
    for bad in (-1, 3.0, True, "3"):
        with pytest.raises(ValueError, match="token_id"):
            ours.token_bytes(bad)


def test_token_bytes_agree_with_decode(ours):
    # Every whole-character token decodes to its own bytes.
    for token_id in range(ours.vocab_size):
        raw = ours.token_bytes(token_id)
        if not _is_partial(raw):
            assert raw.decode("utf-8") == ours.decode([token_id], skip_special_tokens=False), token_id


def _is_partial(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _stream(tokenizer, ids, skip_special_tokens=True):
    decoder = IncrementalDecoder(tokenizer, skip_special_tokens=skip_special_tokens)
    pieces = [decoder.push(i) for i in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == decoder.text
    return pieces


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_incremental_decoder_matches_decode(ours, skip_special_tokens):
    for text in TEXTS + ["".join(TEXTS)]:
        ids = ours.encode(text)
        pieces = _stream(ours, ids, skip_special_tokens)
        assert "".join(pieces) == ours.decode(ids, skip_special_tokens=skip_special_tokens), text
        assert not any("\ufffd" in piece for piece in pieces), text


def test_incremental_decoder_holds_partial_characters(ours):
    ids = ours.encode("a🙂")
    assert len(ids) > 2, "the emoji must span several tokens for this test"
    decoder = IncrementalDecoder(ours)
    assert [decoder.push(i) for i in ids] == ["a"] + [""] * (len(ids) - 2) + ["🙂"]
    # An incomplete character at the end of the stream comes out as U+FFFD only at flush().
    truncated = IncrementalDecoder(ours)
    assert "".join(truncated.push(i) for i in ids[:-1]) == "a"
    assert truncated.flush() == ours.decode(ids[:-1])[1:] and truncated.text == ours.decode(ids[:-1])
    # Invalid bytes in the middle are not held back forever.
    broken = ids[1:2] + ours.encode("xyz")
    assert "".join(_stream(ours, broken)) == ours.decode(broken)


def _wordlevel_dir(tmp_path, clean_up):
    backend = BackendTokenizer(models.WordLevel({w: i for i, w in enumerate(
        ["[UNK]", "don", "'", "t", ",", "stop", ".", "now", "?", "they", "'re", "here"])}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"unk_token": "[UNK]", "clean_up_tokenization_spaces": clean_up}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("clean_up", [True, False])
def test_clean_up_tokenization_spaces(tmp_path, clean_up):
    # Without a decoder, tokens are joined by spaces; the clean-up (not for BPE) removes some.
    ours = Tokenizer.from_engine_dir(_wordlevel_dir(tmp_path, clean_up))
    ids = ours.encode("don ' t , stop . now ? they 're here")
    expected = "don't, stop. now? they're here" if clean_up else "don ' t , stop . now ? they 're here"
    assert ours.decode(ids) == expected
    transformers = pytest.importorskip("transformers")
    assert ours.decode(ids) == transformers.AutoTokenizer.from_pretrained(tmp_path).decode(ids)


def test_streaming_with_clean_up_equals_decode(tmp_path):
    # The clean-up rewrites text before the newest token (" ' " -> "'"): streamed pieces must still
    # add up to decode(ids), and a stop string must be found in the cleaned text.
    import random

    ours = Tokenizer.from_engine_dir(_wordlevel_dir(tmp_path, True))
    rng = random.Random(0)
    for length in [*range(1, 12), *[40] * 300]:
        ids = [rng.randrange(1, 12) for _ in range(length)]
        decoder = IncrementalDecoder(ours)
        pieces = [decoder.push(i) for i in ids] + [decoder.flush()]
        assert "".join(pieces) == ours.decode(ids), ids
    stream = TextStream(ours, stops=("don't",))
    ids = ours.encode("they 're here now don ' t stop")
    # found at the token that completes it, though it lies in the last characters held back
    found_at = next(k for k, i in enumerate(ids) if stream.push(i))
    assert ours.decode(ids[:found_at + 1]).endswith("don't") and not ours.decode(ids[:found_at]).endswith("don't")
    assert not stream.finish() and stream.final_text() == "they're here now "


def test_clean_up_is_ignored_for_bpe(engine_dir, ours, tmp_path):
    config = json.loads((engine_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    (tmp_path / "tokenizer.json").write_bytes((engine_dir / "tokenizer.json").read_bytes())
    ids = ours.encode(TEXTS[-1])
    assert Tokenizer.from_engine_dir(tmp_path).decode(ids) == TEXTS[-1]


def test_sentencepiece_style_token_bytes(tmp_path):
    # Llama/Mistral style: "▁" stands for a space and <0xNN> tokens for raw bytes.
    vocab = {"<unk>": 0, "<s>": 1, "▁hi": 2, "<0xE2>": 3, "<0x9C>": 4, "<0x93>": 5, "▁": 6}
    backend = BackendTokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(["<s>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.from_engine_dir(tmp_path)
    assert [ours.token_bytes(i) for i in range(7)] == [b"<unk>", b"<s>", b" hi", b"\xe2", b"\x9c", b"\x93", b" "]
    ids = [1, 2, 6, 3, 4, 5, 2]
    assert ours.decode(ids) == "hi ✓ hi"
    assert "".join(_stream(ours, ids)) == ours.decode(ids)


def _byte_fallback_tokenizer(tmp_path) -> Tokenizer:
    vocab = {"<unk>": 0, "<s>": 1, "▁hi": 2, "<0xE4>": 3, "<0xB8>": 4, "<0xAD>": 5, "<0x0A>": 6, "▁": 7}
    backend = BackendTokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.save(str(tmp_path / "tokenizer.json"))
    return Tokenizer.from_engine_dir(tmp_path)


@pytest.mark.parametrize("ids", [
    [2, 3, 4, 5, 3, 4],     # "中" then a cut-off "中": the decoder turns the whole run into U+FFFD
    [2, 6, 3, 2],           # a newline byte in a run with a broken character
    [2, 3, 4, 5, 2, 6, 7],  # valid runs
])
def test_byte_fallback_runs_stream_as_decode_does(tmp_path, ids):
    """Streamed text adds up to decode() at every length (max_generate_length can cut anywhere)."""
    ours = _byte_fallback_tokenizer(tmp_path)
    for n in range(1, len(ids) + 1):
        assert "".join(_stream(ours, ids[:n])) == ours.decode(ids[:n]), ids[:n]


@pytest.mark.parametrize("block", ["truncation", "padding"])
def test_a_saved_truncation_or_padding_block_is_ignored(engine_dir, ours, tmp_path, block):
    """A tokenizer.json saved after a truncating or padding call keeps the setting; transformers
    turns it off per call, and so must we, or every prompt is cut or padded."""
    state = json.loads((engine_dir / "tokenizer.json").read_text())
    state[block] = ({"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
                    if block == "truncation" else
                    {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 2,
                     "pad_type_id": 0, "pad_token": "<|im_end|>"})
    (tmp_path / "tokenizer.json").write_text(json.dumps(state))
    (tmp_path / "tokenizer_config.json").write_bytes((engine_dir / "tokenizer_config.json").read_bytes())
    assert Tokenizer.from_engine_dir(tmp_path).encode(TEXTS[-1]) == ours.encode(TEXTS[-1])


def test_split_special_tokens_encodes_control_tokens_as_text(engine_dir, ours, hf, tmp_path):
    config = json.loads((engine_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "split_special_tokens": True}))
    (tmp_path / "tokenizer.json").write_bytes((engine_dir / "tokenizer.json").read_bytes())
    text = "<|im_start|>user\nhi<|im_end|>"
    split = Tokenizer.from_engine_dir(tmp_path).encode(text)
    assert split != ours.encode(text)
    from transformers import AutoTokenizer

    assert split == AutoTokenizer.from_pretrained(tmp_path).encode(text, add_special_tokens=False)


def test_a_replacement_character_no_byte_can_complete_is_streamed_at_once(ours):
    """A stray continuation byte (0x80) or a lead byte followed by a non-continuation is U+FFFD for
    good: it streams at once (holding it stalled the stream and grew the decode window for good),
    while a lead byte alone still waits for the bytes that may complete it."""
    byte_id = {ours.token_bytes(i): i for i in range(ours.vocab_size) if len(ours.token_bytes(i)) == 1}
    stray, lead, a = byte_id[b"\x80"], byte_id[b"\xe4"], byte_id[b"a"]
    decoder = IncrementalDecoder(ours)
    assert [decoder.push(stray) for _ in range(3)] == ["\ufffd"] * 3
    assert decoder.push(lead) == ""  # may still become a character
    assert decoder.push(a) == "\ufffda"  # it did not
    ids = [stray, lead, a, lead, stray, stray]
    assert "".join(_stream(ours, ids)) == ours.decode(ids)
    # a lead byte after a lead byte: the first is final, and streams as the second arrives
    decoder = IncrementalDecoder(ours)
    assert [decoder.push(lead) for _ in range(4)] == ["", "\ufffd", "\ufffd", "\ufffd"]
    assert decoder.flush() == "\ufffd"
    e9, acute = byte_id[b"\xc3"], byte_id[b"\xa9"]  # a lead byte and then its character's two bytes: é
    ids = [lead, e9, acute, lead, lead, byte_id[b"\xb8"], byte_id[b"\x96"], a]
    assert "".join(_stream(ours, ids)) == ours.decode(ids) == "\ufffdé\ufffd世a"
    # ids past the tokenizer (a padded vocabulary) stand for no text, inside a character too
    pad = ours.vocab_size + 3
    ids = [a, lead, pad, pad, pad, pad, byte_id[b"\xb8"], pad, byte_id[b"\x96"]]
    assert "".join(_stream(ours, ids)) == ours.decode(ids) == "a世"


def test_a_safe_cut_never_changes_the_clean_up():
    """safe_cut against the whole text's clean-up, for every cut it allows of every string of up to
    6 characters from the characters the patterns are made of, and of 20,000 random longer ones.
    The deliberately wrong variant: cutting after a lone "n" or "'" too changes some."""
    import itertools
    import random

    from trtllm.runtime.tokenizer import _CLEANUPS, safe_cut

    def clean(text):  # Tokenizer.clean_up's passes
        for old, new in _CLEANUPS:
            text = text.replace(old, new)
        return text

    def strings():
        for n in range(2, 7):
            yield from ("".join(t) for t in itertools.product(" 'ntx.e", repeat=n))
        rng = random.Random(0)
        alphabet = [" "] * 6 + list("'.nt msver,x?!")
        for _ in range(20000):
            yield "".join(rng.choice(alphabet) for _ in range(rng.randint(7, 24)))

    cuts = wrong = 0
    for raw in strings():
        whole = clean(raw)
        for c in range(1, len(raw)):
            if safe_cut(raw, c):
                cuts += 1
                assert clean(raw[:c]) + clean(raw[c:]) == whole, (raw, c)
            elif raw[c] == " " and raw[c - 1] in "'n" and clean(raw[:c]) + clean(raw[c:]) != whole:
                wrong += 1
    assert not safe_cut("ab c", 4)  # the end is no place to cut
    assert safe_cut(" in on an", 3) and safe_cut(" a b", 2) and not safe_cut(" n ' n", 2)  # two-letter words too
    assert cuts > 100000 and wrong > 0


def test_streaming_with_clean_up_keeps_a_bounded_window(tmp_path):
    """3,000 tokens: the pieces still add up to decode(ids), and the clean-up looks only at the
    text since its last cut (cleaning everything each token was quadratic)."""
    import random

    ours = Tokenizer.from_engine_dir(_wordlevel_dir(tmp_path, True))
    rng = random.Random(1)
    for seed_ids in ([rng.randrange(1, 12) for _ in range(3000)], [5, 7, 11, 6] * 750,  # "stop now here ."
                     [rng.choice([2, 3, 4, 6]) for _ in range(3000)]):  # one character between spaces: ' t , .
        decoder, longest = IncrementalDecoder(ours), 0
        pieces = []
        for i in seed_ids:
            pieces.append(decoder.push(i))
            longest = max(longest, len(decoder._raw))
        pieces.append(decoder.flush())
        assert "".join(pieces) == ours.decode(seed_ids)
        assert longest <= 2 * IncrementalDecoder.CLEAN_UP_WINDOW


def test_a_stop_string_never_matches_the_character_the_end_cut_off(ours, tmp_path):
    """A row that ends inside a character shows it as U+FFFD; that is not text the model wrote, so
    a stop string "\\ufffd" leaves the row at max-length. A U+FFFD no byte can complete is text."""
    byte_id = {ours.token_bytes(i): i for i in range(ours.vocab_size) if len(ours.token_bytes(i)) == 1}
    cut = TextStream(ours, ("\ufffd",))
    assert not cut.push(byte_id[b"a"]) and not cut.push(byte_id[b"\xe4"])
    assert not cut.finish() and cut.stop_at is None and cut.final_text() == "a\ufffd"
    wrong = TextStream(ours, ("\ufffd",))  # a stray continuation byte: its U+FFFD stops the row
    assert wrong.push(byte_id[b"\x80"]) and wrong.final_text() == ""
    held = TextStream(ours, ("\ufffd",))  # a lead byte, then a non-continuation: final as it comes
    assert not held.push(byte_id[b"\xe4"]) and held.push(byte_id[b"a"]) and held.final_text() == ""
    # a byte-fallback tokenizer makes one U+FFFD per byte token of the cut-off character
    fallback = TextStream(_byte_fallback_tokenizer(tmp_path), ("\ufffd",))
    assert not any(fallback.push(t) for t in (2, 3, 4))  # ▁hi <0xE4> <0xB8>: 中 without its last byte
    assert not fallback.finish() and fallback.final_text() == "hi\ufffd\ufffd"


@pytest.mark.parametrize("clean_up", [True, False])
def test_a_stop_within_the_first_min_new_tokens_never_counts_even_if_held_back(tmp_path, clean_up):
    """min_new_tokens 1: "stop" is all token 1's text, which a clean-up tokenizer still holds back
    when token 2 is checked; it must not end the answer there (nor later), as without the clean-up."""
    ours = Tokenizer.from_engine_dir(_wordlevel_dir(tmp_path, clean_up))
    stream = TextStream(ours, stops=("stop",))
    ids = ours.encode("stop now here now here now here")
    assert not any(stream.push(i, check_stops=k >= 1) for k, i in enumerate(ids))
    assert not stream.finish() and stream.final_text() == "stop now here now here now here"
