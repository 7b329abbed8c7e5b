"""Generic masking: typed slots for the variable parts of any log line, separators kept."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from diagnoser.templates.masking import _WORD_BYTES as WORD_BYTES
from diagnoser.templates.masking import (
    PLAIN_PATTERNS,
    SENTINEL,
    VARIABLE,
    coarse_skeleton,
    coarse_words,
    collapse_digits,
    flat_skeleton,
    mask,
    mask_coarse_word,
    mask_word,
    render,
    render_masked,
    skeleton,
    split_fields,
    tokenize,
    words,
)
from diagnoser.templates.model import Slot
from tests.templates.corpus import loghub_datasets, read_lines


def masked(line: str) -> str:
    return render(mask(tokenize(line)))


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step:396/20344 s:4979 trl:3.57", "step:<int>/<int> s:<int> trl:<float>"),
        (
            " iteration      100/  500000 | lm loss: 3.456789E+00 | grad norm: 0.123 |",
            " iteration      <int>/  <int> | lm loss: <float> | grad norm: <float> |",
        ),
        ("{'loss': 2.4871, 'epoch': 0.02}", "{'loss': <float>, 'epoch': <float>}"),
        ("connect to 10.0.0.12:29500 failed", "connect to <ip>:<int> failed"),
        ("addr=0x7f3a2c00 code -1", "addr=<hex> code <int>"),
        ("blk_-6952295868487656571 blk_38865049064139660", "blk_<int> blk_<int>"),
        (
            "req-38101a0b-2096-447d-96ea-a692162415ae done",
            "req-<uuid> done",
        ),
        ("open /data/shards/part-00017.bin", "open <path>"),
        ("took 12ms then 3.5s", "took <duration> then <duration>"),
        ("node dn228 rank7 at a64f992", "node <*> <*> at <hex>"),
        ("[Sun Dec 04 04:47:44 2005] [notice]", "[<*> <*> <int> <int>:<int>:<int> <int>] [notice]"),
        ("no variables here", "no variables here"),
        ("HTTP/1.1 200", "HTTP/<float> <int>"),
        ("Jan1 Jan22 Sun", "<*> <*> <*>"),
    ],
)
def test_variable_parts_become_typed_slots(line: str, expected: str) -> None:
    assert masked(line) == expected


def test_tokens_split_where_a_variable_starts_and_ends() -> None:
    assert tokenize("step:396/20344  ok") == ["step:", "396", "/", "20344", "  ", "ok"]
    assert mask(["step:", "396", "/", "20344", "  ", "ok"]) == [
        "step:",
        Slot.INT,
        "/",
        Slot.INT,
        "  ",
        "ok",
    ]


def test_sentinel_characters_in_a_line_never_read_as_slots() -> None:
    word = f"x{SENTINEL[Slot.INT]}y"
    assert SENTINEL[Slot.INT] not in mask_word(word)
    assert "\x00" not in mask_word("a\x00b")
    assert "\ud800" not in mask_word("a\ud800b")


_text = st.text(
    alphabet=st.sampled_from(list("ab fx0123456789.:-_/=[]()\"'\tZ\u00e9")), max_size=60
)


@given(_text)
def test_tokenize_is_lossless(line: str) -> None:
    assert "".join(tokenize(line)) == line


@given(_text)
def test_word_by_word_masking_matches_masking_the_line(line: str) -> None:
    by_words = [render_masked(mask_word(w)) for w in line.split()]
    assert masked(line).split() == by_words


@given(_text, st.randoms(use_true_random=False))
def test_lines_with_the_same_skeleton_mask_the_same(line: str, rnd: random.Random) -> None:
    other = "".join(rnd.choice("123456789") if c in "123456789" else c for c in line)
    assert skeleton(other) == skeleton(line)
    assert [mask_word(w) for w in other.split()] == [mask_word(w) for w in line.split()]


_PIECES = (
    *("Jan", "Mon", "0x", "0X", "x", "a", "f", "F", "Z", "-", ".", ":", "/", "_", "[", "]"),
    *("1", "23", "0", "00", "e", "E", "+", "ms", "s", "=", "'", "\u00e9", " "),
)
_pieces = st.lists(
    st.sampled_from(_PIECES),
    max_size=24,
).map("".join)


def _renumber(line: str, rnd: random.Random) -> str:
    return re.sub(r"[0-9]+", lambda m: str(rnd.randrange(1, 10 ** rnd.randint(1, 5))), line)


@given(_pieces, st.randoms(use_true_random=False))
def test_lines_with_the_same_coarse_skeleton_mask_the_same(line: str, rnd: random.Random) -> None:
    other = _renumber(line, rnd)
    if coarse_skeleton(skeleton(other)) == coarse_skeleton(skeleton(line)):
        assert [mask_word(w) for w in other.split()] == [mask_word(w) for w in line.split()]


@given(_pieces)
def test_no_digit_survives_masking(line: str) -> None:
    for word in line.split():
        assert not any(c.isdigit() for c in mask_word(word)), word


def test_a_token_is_masked_where_it_stands_in_the_line() -> None:
    """`/:/:` right after a number is no path (no separator before it), in either masking."""
    assert masked("0/:/:") == render_masked(mask_word("0/:/:")) == "<int>/:/:"


_PLAIN = re.compile("|".join(f"(?P<s{i}>{p})" for i, (_, p) in enumerate(PLAIN_PATTERNS)), re.ASCII)


def _found(pattern: re.Pattern[str], text: str) -> list[tuple[int, int, str | None]]:
    return [(m.start(), m.end(), m.lastgroup) for m in pattern.finditer(text)]


@given(st.one_of(_pieces, _text))
def test_the_masking_regex_finds_what_its_plain_spelling_finds(line: str) -> None:
    assert _found(VARIABLE, line) == _found(_PLAIN, line)


def test_the_masking_regex_finds_what_its_plain_spelling_finds_on_loghub() -> None:
    paths = loghub_datasets()
    assert paths, "loghub-2k not found (../shared/data/loghub-2k)"
    for path in paths:
        for line in read_lines(path):
            assert _found(VARIABLE, line) == _found(_PLAIN, line), line


def _plain_mask_word(word: str) -> str:
    return _PLAIN.sub(lambda m: SENTINEL[_PLAIN_SLOTS[m.lastgroup or ""]], word)


_PLAIN_SLOTS = {f"s{i}": slot for i, (slot, _) in enumerate(PLAIN_PATTERNS)}


@given(st.one_of(_pieces, _text, st.text(max_size=20)))
def test_mask_word_masks_what_the_plain_spelling_finds(line: str) -> None:
    for word in line.split():
        if word.isascii() and "\x00" not in word:
            assert mask_word(word) == _plain_mask_word(word), word


_brackets = st.lists(
    st.sampled_from([*_PIECES, "[", "]", "[a b]", " ", "\t", "\x1c", "x" * 120, "é"]), max_size=30
).map("".join)


@given(st.one_of(_pieces, _text, _brackets))
def test_a_word_masks_as_its_coarse_form_from_the_line_skeleton(line: str) -> None:
    found = coarse_words(coarse_skeleton(skeleton(line)), line)
    if found is None:
        return
    assert [mask_coarse_word(w) for w in found] == [mask_word(w) for w in words(line)]


def test_coarse_words_give_up_where_the_skeleton_may_split_otherwise() -> None:
    long_field = "[" + "1" * 150 + " " + "2" * 100 + "]"
    assert coarse_words(coarse_skeleton(skeleton(long_field)), long_field) is None
    assert coarse_words(b"a\x1cb", "a\x1cb") is None
    assert coarse_words(coarse_skeleton(skeleton("é 12")), "é 12") is None
    assert coarse_words(b"[1 1] a", "[12 3] a") == [b"[1 1]", b"a"]


@given(_pieces, st.randoms(use_true_random=False))
def test_lines_with_the_same_flat_skeleton_mask_the_same(line: str, rnd: random.Random) -> None:
    """The miner's first key: every digit but the 0 of `0x` may change, the masking may not."""
    other = re.sub(r"[0-9](?![xX])", lambda _: rnd.choice("0123456789"), line)
    assert flat_skeleton(other) == flat_skeleton(line)
    assert [mask_word(w) for w in other.split()] == [mask_word(w) for w in line.split()]
    assert collapse_digits(flat_skeleton(line)) == coarse_skeleton(skeleton(line))


def test_flat_skeleton_keeps_the_zero_of_hex_apart() -> None:
    assert flat_skeleton("0x1f") != flat_skeleton("1x1f")
    assert mask_word("0x1f") != mask_word("1x1f")
    assert flat_skeleton("0X1F 10") == flat_skeleton("0X1F 99")


@pytest.mark.parametrize(
    "line",
    [
        "2017 [AsyncDispatcher event handler] INFO step 3",
        "[a b] [c] d[e f]g [ h",
        "x [" + "y" * 150 + " " + "z" * 60 + "] 12 end",  # a field longer than 200: split
        "x [" + "y 1" * 60 + "] 12",  # 180 characters inside: one word
        "[" + "1" * 250 + " a]",  # the skeleton's field is short, the line's is not
        "no brackets here 12 34",
        "[nospace] [alsonospace]1 tail",
    ],
)
def test_coarse_words_split_as_the_line_does(line: str) -> None:
    found = coarse_words(coarse_skeleton(skeleton(line)), line)
    if found is not None:
        assert [mask_coarse_word(w) for w in found] == [mask_word(w) for w in words(line)]


_field_bytes = st.lists(
    st.sampled_from(
        [
            *(
                b"[",
                b"]",
                b"[a b]",
                b"a",
                b"1",
                b"\xff",
                b"-",
                b"x" * 90,
                b"[" + b"y 1" * 60 + b"]",
            ),
            *(b" ", b"  ", b"\t", b"\r", b"\n", b"\x0b", b"\x0c"),
        ]
    ),
    max_size=30,
).map(b"".join)


@given(_field_bytes)
def test_split_fields_finds_the_words_the_word_pattern_finds(coarse: bytes) -> None:
    assert split_fields(coarse) == WORD_BYTES.findall(coarse)


def test_split_fields_finds_the_words_the_word_pattern_finds_on_loghub() -> None:
    paths = loghub_datasets()
    assert paths, "loghub-2k not found (../shared/data/loghub-2k)"
    for path in paths:
        for line in read_lines(path):
            if line.isascii():
                coarse = coarse_skeleton(skeleton(line))
                assert split_fields(coarse) == WORD_BYTES.findall(coarse), line
