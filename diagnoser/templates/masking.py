"""Generic masking of the variable parts of a log line into typed slots.

One set of patterns for every log (no per-source tuning). A token is split where a variable part
starts or ends, so `step:396/20344` becomes `step:`, `396`, `/`, `20344` and masks to
`step:<int>/<int>`; whitespace runs are tokens too, so `"".join(tokenize(line)) == line` and a
masked line reads like the line it came from.

The patterns decide from character classes only: neither which digit a position holds nor how
long a run of digits is ever matters, except a lone 0 before `x`. Two lines that differ only
there mask the same; the miner relies on this to look a line up by its `skeleton` (then its
`coarse_skeleton`) before it masks anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final

from diagnoser.templates.model import Slot

_ALNUM: Final = "A-Za-z0-9"
_START: Final = rf"(?<![{_ALNUM}])"
_END: Final = rf"(?![{_ALNUM}])"
_HEXC: Final = "0-9a-fA-F"
_UNITS: Final = "(?:ns|us|µs|ms|s|sec|secs|min|mins|h|hr|hrs)"
_NUMBER_START: Final = "(?:(?<=-)[0-9])?(?<=[0-9])[0-9]*+"
"""After a first character `[-0-9]`: the rest of `-?[0-9]+`."""

# (slot, first character, rest). Order is priority: at each position the first alternative
# that matches wins. Every alternative starts at `_START` (no ASCII letter or digit before it),
# written once in front of them all: a match also ends where no letter or digit follows (a
# path at a delimiter), so none can start inside a run of letters and digits. Each alternative
# opens with a character class, which lets `re` skip it on one character test where the
# alternative cannot start; the empty group after that character names the alternative.
# Read as one regex each (first + rest), they are the plain spellings in `PLAIN_PATTERNS`.
# A run is possessive (`*+`, `++`) wherever what may follow it cannot start with what it
# holds, so giving characters back could never let the alternative match: `re` then fails an
# alternative without retrying it at every shorter length, and matches the same.
_PATTERNS: Final[tuple[tuple[Slot, str, str], ...]] = (
    (Slot.UUID, f"[{_HEXC}]", rf"[{_HEXC}]*+(?:-[{_HEXC}]++){{4}}{_END}"),
    (
        Slot.PATH,
        r"(?:(?<=[\s\"'(\[=,:<>])|^)",
        r"(?:[A-Za-z]:)?(?:[/\\][^\s/\\\"'()\[\],;]++){2,}[/\\]?",
    ),
    # Month and weekday names, so dates in line headers do not read as text.
    (
        Slot.ANY,
        "",
        r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
        rf"|Mon|Tue|Wed|Thu|Fri|Sat|Sun){_END}",
    ),
    (Slot.IP, "[0-9]", rf"[0-9]*+\.[0-9]++\.[0-9]++\.[0-9]++{_END}(?!\.[0-9])"),
    (Slot.HEX, "0", rf"[xX][{_HEXC}]++{_END}"),
    (Slot.DURATION, "[0-9]", rf"[0-9]*+(?:\.[0-9]++)?{_UNITS}{_END}"),
    (Slot.ANY, "[0-9]", rf"[0-9]*+(?:\.[0-9]++){{2,}}{_END}"),
    (
        Slot.FLOAT,
        "[-0-9]",
        rf"{_NUMBER_START}(?:\.[0-9]++(?:[eE][-+]?[0-9]++)?|[eE][-+]?[0-9]++){_END}(?!\.[0-9])",
    ),
    (Slot.INT, "[-0-9]", rf"{_NUMBER_START}{_END}"),
    # A name glued to a number (`dn228`, `a64f992`, `0userId`): hex when only hex letters.
    (
        Slot.HEX,
        "[0-9a-f]",
        rf"(?:(?<=[0-9])[0-9]*+[a-f]|(?<=[a-f])[a-f]*+[0-9])[0-9a-f]*+{_END}",
    ),
    (
        Slot.HEX,
        "[0-9A-F]",
        rf"(?:(?<=[0-9])[0-9]*+[A-F]|(?<=[A-F])[A-F]*+[0-9])[0-9A-F]*+{_END}",
    ),
    (Slot.ANY, f"[{_ALNUM}]", rf"(?:(?<=[0-9])|[A-Za-z]*+[0-9])[{_ALNUM}]*+{_END}"),
)
PLAIN_PATTERNS: Final[tuple[tuple[Slot, str], ...]] = (
    (Slot.UUID, rf"{_START}[{_HEXC}]+(?:-[{_HEXC}]+){{4}}{_END}"),
    (
        Slot.PATH,
        r"(?:(?<=[\s\"'(\[=,:<>])|^)(?:[A-Za-z]:)?(?:[/\\][^\s/\\\"'()\[\],;]+){2,}[/\\]?",
    ),
    (
        Slot.ANY,
        r"(?<![A-Za-z])(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
        r"|Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?![A-Za-z0-9])",
    ),
    (Slot.IP, rf"{_START}\d+\.\d+\.\d+\.\d+{_END}(?!\.\d)"),
    (Slot.HEX, rf"{_START}0[xX][{_HEXC}]+{_END}"),
    (Slot.DURATION, rf"{_START}\d+(?:\.\d+)?{_UNITS}{_END}"),
    (Slot.ANY, rf"{_START}\d+(?:\.\d+){{2,}}{_END}"),
    (Slot.FLOAT, rf"{_START}-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+){_END}(?!\.\d)"),
    (Slot.INT, rf"{_START}-?\d+{_END}"),
    (Slot.HEX, rf"{_START}(?=[a-f]*\d)(?=\d*[a-f])[0-9a-f]+{_END}"),
    (Slot.HEX, rf"{_START}(?=[A-F]*\d)(?=\d*[A-F])[0-9A-F]+{_END}"),
    (Slot.ANY, rf"{_START}(?=[A-Za-z]*\d)[{_ALNUM}]+{_END}"),
)
"""The masking patterns as a reader would write them (ASCII mode): `VARIABLE` finds exactly
what their alternation finds, in about 60 % of the time (tests/templates/test_masking.py)."""
_GROUPS: Final = tuple(f"s{i}" for i in range(len(_PATTERNS)))
VARIABLE: Final = re.compile(
    _START
    + "(?:"
    + "|".join(
        f"{first}(?P<{g}>){rest}" for g, (_, first, rest) in zip(_GROUPS, _PATTERNS, strict=True)
    )
    + ")",
    re.ASCII,
)
"""Every variable part; `lastgroup` names the alternative (see `slot_of_group`)."""

_SLOT_OF_GROUP: Final = {g: slot for g, (slot, _, _) in zip(_GROUPS, _PATTERNS, strict=True)}
_WHITESPACE: Final = re.compile(r"\s+")
_WORD: Final = re.compile(r"(?:[^\s\[]+|\[[^\[\]\n]{0,200}\]|\[)+")
_SPLIT_WORDS: Final = re.compile(f"({_WORD.pattern})")
"""Splits a line into whitespace, word, whitespace, ..., whitespace."""
_SPLIT: Final = re.compile(rf"(\s+|{VARIABLE.pattern})")

SENTINEL: Final[dict[Slot, str]] = {slot: chr(0xE000 + i) for i, slot in enumerate(Slot)}
"""The private-use character that stands for each slot in a masked line (see `mask_word`)."""
SLOT_OF_SENTINEL: Final[dict[str, Slot]] = {c: slot for slot, c in SENTINEL.items()}
_SENTINEL_OF_GROUP: Final = {g: SENTINEL[slot] for g, slot in _SLOT_OF_GROUP.items()}
# Sentinels, NUL and lone surrogates: none may reach a template (JSON, PostgreSQL, regexes).
_SCRUB: Final = str.maketrans(
    dict.fromkeys([*SENTINEL.values(), "\x00", *map(chr, range(0xD800, 0xE000))], "\ufffd")
)
_RENDER: Final = str.maketrans({c: f"<{slot.value}>" for slot, c in SENTINEL.items()})
_INT: Final = SENTINEL[Slot.INT]
_SKELETON: Final = bytes.maketrans(b"123456789", b"111111111")
_ZERO: Final = bytes.maketrans(b"0", b"1")
_DIGITS: Final = bytes.maketrans(b"0123456789", b"1111111111")


def slot_of_group(group: str | None) -> Slot:
    """The slot of a `VARIABLE` match, from its `lastgroup`."""
    return _SLOT_OF_GROUP.get(group or "", Slot.ANY)


def tokenize(line: str) -> list[str]:
    """Split a line into tokens: whitespace runs, variable parts, and the literal text between.

    Lossless: `"".join(tokenize(line)) == line`.
    """
    tokens: list[str] = []
    pos = 0
    for m in _SPLIT.finditer(line):
        start, end = m.span()
        if start > pos:
            tokens.append(line[pos:start])
        tokens.append(m.group())
        pos = end
    if pos < len(line):
        tokens.append(line[pos:])
    return tokens


def mask(tokens: Iterable[str]) -> list[str | Slot]:
    """Each token that is a whole variable part of the line becomes its `Slot`; the others stay.

    A token is judged where it stands in the joined line, never alone: `/:/:` after `0` is
    literal text (a path needs a separator before it), though on its own it would read as one.
    """
    parts = list(tokens)
    slots = {m.span(): slot_of_group(m.lastgroup) for m in VARIABLE.finditer("".join(parts))}
    out: list[str | Slot] = []
    start = 0
    for token in parts:
        end = start + len(token)
        out.append(slots.get((start, end), token))
        start = end
    return out


def render(masked: Sequence[str | Slot]) -> str:
    """The text of a masked line: slots written `<int>`, `<*>`, ..., separators kept."""
    return "".join(f"<{t.value}>" if isinstance(t, Slot) else t for t in masked)


def mask_word(word: str) -> str:
    """A whitespace-free word with each variable part replaced by its slot's sentinel character.

    No pattern spans whitespace, so masking word by word gives what masking the line would.
    Sentinel characters already in the word become U+FFFD, so a sentinel always means a slot;
    so do NUL and lone surrogates, which JSON stores and databases reject.
    """
    if word.isascii():
        if word.isdigit():
            return _INT
        if "\x00" in word:
            word = word.translate(_SCRUB)
    else:
        word = word.translate(_SCRUB)
    if _MAYBE_VARIABLE.search(word) is None and word.count("-") < 4:
        return word
    return VARIABLE.sub(_sentinel, word)


_MAYBE_VARIABLE: Final = re.compile(
    r"[0-9/\\]|Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec|Mon|Tue|Wed|Thu|Fri|Sat|Sun"
)
"""What every variable part holds but a UUID: a digit, a path separator or a month or weekday
name (a UUID holds four dashes). A word with none of them is text (a third of new words);
this search costs a tenth of `VARIABLE`'s."""


def _sentinel(m: re.Match[str]) -> str:
    return _SENTINEL_OF_GROUP[m.lastgroup or ""]


def skeleton(line: str) -> bytes:
    """The line's UTF-8 with digits 1-9 written as 1: lines with equal skeletons mask the same.

    0 stays, since a lone 0 before `x` opens a hex slot; no other pattern depends on which digit
    it sees. Bytes, because `bytes.translate` is ten times faster than `str.translate`.
    """
    return line.encode("utf-8", "surrogatepass").translate(_SKELETON)


def coarse_skeleton(fine: bytes) -> bytes:
    """A `skeleton` with each run of digits written as one 1: still masks the same, and more
    lines share it, since no pattern counts digits either. A 0 before `x` is kept apart (as a
    byte UTF-8 never uses). `bytes.replace` passes, many times faster than a regex."""
    if b"0x" in fine or b"0X" in fine:
        fine = fine.replace(b"0x", b"\xffx").replace(b"0X", b"\xffX")
    return collapse_digits(fine.translate(_ZERO))


def flat_skeleton(line: str) -> bytes:
    """The line's UTF-8 with every digit written as 1, but for the 0 of `0x`, written (as in
    `coarse_skeleton`) as a byte UTF-8 never uses: that 0 is the only digit a pattern tells
    apart, so lines with equal flat skeletons mask the same, and far more of them share one
    than share a `skeleton`. `collapse_digits` of it is the `coarse_skeleton`. The `0x` test
    is on the str (one character first, which `memchr` finds), several times faster than
    on bytes."""
    raw = line.encode("utf-8", "surrogatepass")
    if ("x" in line and "0x" in line) or ("X" in line and "0X" in line):
        raw = raw.replace(b"0x", b"\xffx").replace(b"0X", b"\xffX")
    return raw.translate(_DIGITS)


def collapse_digits(flat: bytes) -> bytes:
    """Each run of 1s written as one 1 (digits are 1s in a `flat_skeleton`).

    `find`, not `in`: `bytes in bytes` first tries the operand as an integer and pays for the
    TypeError it raises (a tenth of this function's cost)."""
    raw = flat.replace(b"11111", b"1").replace(b"111", b"1").replace(b"11", b"1")
    while raw.find(b"11") >= 0:
        raw = raw.replace(b"11", b"1")
    return raw


def render_masked(text: str) -> str:
    """A `mask_word` result (or part of one) with its sentinels written `<int>`, `<*>`, ..."""
    return text.translate(_RENDER)


def words(line: str) -> list[str]:
    """The line's words: runs of non-space, where a short `[...]` may hold spaces.

    A bracketed header field (`[AsyncDispatcher event handler]`, `[req-... - - -]`) is one
    value however many words it has, so it does not change the word count of its event.
    """
    if "[" not in line:
        return line.split()
    return _WORD.findall(line)


_WORD_BYTES: Final = re.compile(rb"(?:[^\s\[]+|\[[^\[\]\n]{0,200}\]|\[)+")
_ODD_SPACE: Final = re.compile(rb"[\x1c-\x1f]")
"""ASCII characters `str.split` and `re`'s `\\s` take as whitespace, but bytes patterns do not."""


def coarse_words(coarse: bytes, line: str) -> list[bytes] | None:
    """The `coarse_skeleton` of each of `words(line)`, or None where the two might split apart.

    A word masks as its coarse form does, and far more words share a coarse form (every number
    one key), so the miner caches masked words by it. Words are found in the line's coarse
    skeleton, which splits as the line does when the line is ASCII, holds no separator
    control character, and has no `[...]` field of more than 200 characters (the skeleton is
    shorter, and may group a field the line leaves split)."""
    if not line.isascii() or (not line.isprintable() and _ODD_SPACE.search(coarse) is not None):
        return None
    if coarse.find(b"[") < 0 or _SPACED_FIELD.search(coarse) is None:
        return coarse.split()
    if len(line) > _FIELD + 2 and _long_field(line):
        return None
    return split_fields(coarse)


_FIELD_BYTES: Final = re.compile(rb"\[[^\[\]\n]{0,200}\]")
_HIDE: Final = bytes.maketrans(b" \t\r\x0b\x0c", b"\x80\x81\x82\x83\x84")
_SHOW: Final = bytes.maketrans(b"\x80\x81\x82\x83\x84", b" \t\r\x0b\x0c")


def _hide(m: re.Match[bytes]) -> bytes:
    return m.group().translate(_HIDE)


def split_fields(coarse: bytes) -> list[bytes]:
    """`_WORD_BYTES.findall(coarse)` for bytes with no byte from 0x80 to 0x84 (a coarse
    skeleton of an ASCII line), in half the time. The word pattern tries a field at every `[`
    of the line, so the fields are what `_FIELD_BYTES` finds; their whitespace is hidden as
    bytes the line cannot hold, the rest is split by `bytes.split` and shown again. No word
    holds a newline (a field cannot), so one join and split carry the words through."""
    found = _FIELD_BYTES.sub(_hide, coarse).split()
    if not found:
        return found
    return b"\n".join(found).translate(_SHOW).split(b"\n")


_FIELD: Final = 200
"""The longest `[...]` field (`_WORD`) that stays one word."""
_SPACED_FIELD: Final = re.compile(rb"\[[^\[\]\s]*+\s[^\[\]\n]*+\]")
"""A `[...]` field with whitespace inside (of any length): without one, `_WORD` finds the words
`split` does (a field with no whitespace lies inside one of them), and `split` is many times
faster."""


def _long_field(line: str) -> bool:
    """Whether a `[` of the line is closed by a `]` more than `_FIELD` characters on (with no
    `[` between): the only field the line and its shorter skeleton may split differently."""
    return any(piece.find("]") > _FIELD for piece in line.split("[")[1:])


def mask_coarse_word(word: bytes) -> str:
    """`mask_word` of a word given by its coarse form (an ASCII word's `coarse_words` entry)."""
    if word == b"1":  # digits only (a run of them is one 1)
        return _INT
    text = word.decode("latin-1")
    if "\xff" in text:
        text = text.replace("\xff", "0")
    if not text.isascii() or "\x00" in text:
        return mask_word(text)
    # `mask_word` for an ASCII word that is not all digits, written out: most words of a cold
    # miner come here.
    if _MAYBE_VARIABLE.search(text) is None and text.count("-") < 4:
        return text
    return VARIABLE.sub(_sentinel, text)


def split_words(line: str) -> tuple[list[str], list[str]]:
    """`words(line)` and the whitespace around them: `seps[i]` precedes `words[i]`."""
    parts = _SPLIT_WORDS.split(line)
    return parts[1::2], parts[::2]
