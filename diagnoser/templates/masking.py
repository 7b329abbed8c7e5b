"""Generic masking of the variable parts of a log line into typed slots.

One set of patterns for every log (no per-source tuning). A token is split where a variable part
starts or ends, so `step:396/20344` becomes `step:`, `396`, `/`, `20344` and masks to
`step:<int>/<int>`; whitespace runs are tokens too, so `"".join(tokenize(line)) == line` and a
masked line reads like the line it came from.

The patterns decide from character classes only, never from how many digits a run has. Two lines
that differ only in their digit runs therefore mask the same; the miner relies on this to look a
line up by its digit-normalised skeleton before it masks anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from diagnoser.templates.model import Slot

_ALNUM = "A-Za-z0-9"
_START = rf"(?<![{_ALNUM}])"
_END = rf"(?![{_ALNUM}])"
_HEXC = "0-9a-fA-F"

# Order is priority: at each position the first alternative that matches wins.
_PATTERNS: tuple[tuple[Slot, str], ...] = (
    (Slot.UUID, rf"{_START}[{_HEXC}]+(?:-[{_HEXC}]+){{4}}{_END}"),
    (
        Slot.PATH,
        r"(?:(?<=[\s\"'(\[=,:<>])|^)(?:[A-Za-z]:)?(?:[/\\][^\s/\\\"'()\[\],;]+){2,}[/\\]?",
    ),
    # Month and weekday names, so dates in line headers do not read as text.
    (
        Slot.ANY,
        r"(?<![A-Za-z])(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
        r"|Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?![A-Za-z])",
    ),
    (Slot.IP, rf"{_START}\d+\.\d+\.\d+\.\d+{_END}(?!\.\d)"),
    (Slot.HEX, rf"{_START}0[xX][{_HEXC}]+{_END}"),
    (
        Slot.DURATION,
        rf"{_START}\d+(?:\.\d+)?(?:ns|us|µs|ms|s|sec|secs|min|mins|h|hr|hrs){_END}",
    ),
    (Slot.ANY, rf"{_START}\d+(?:\.\d+){{2,}}{_END}"),
    (Slot.FLOAT, rf"{_START}-?\d+(?:\.\d+(?:[eE][-+]?\d+)?|[eE][-+]?\d+){_END}(?!\.\d)"),
    (Slot.INT, rf"{_START}-?\d+{_END}"),
    # A name glued to a number (`dn228`, `a64f992`, `0userId`): hex when only hex letters.
    (Slot.HEX, rf"{_START}(?=[a-f]*\d)(?=\d*[a-f])[0-9a-f]+{_END}"),
    (Slot.HEX, rf"{_START}(?=[A-F]*\d)(?=\d*[A-F])[0-9A-F]+{_END}"),
    (Slot.ANY, rf"{_START}(?=[A-Za-z]*\d)[{_ALNUM}]+{_END}"),
)
_GROUPS = tuple(f"s{i}" for i in range(len(_PATTERNS)))
VARIABLE = re.compile(
    "|".join(f"(?P<{g}>{p})" for g, (_, p) in zip(_GROUPS, _PATTERNS, strict=True)), re.ASCII
)
"""Every variable part; `lastgroup` names the alternative (see `slot_of_group`)."""

_SLOT_OF_GROUP = {g: slot for g, (slot, _) in zip(_GROUPS, _PATTERNS, strict=True)}
_WHITESPACE = re.compile(r"\s+")
_SPLIT = re.compile(rf"(\s+|{VARIABLE.pattern})")

SENTINEL: dict[Slot, str] = {slot: chr(0xE000 + i) for i, slot in enumerate(Slot)}
"""The private-use character that stands for each slot in a masked line (see `mask_line`)."""
SLOT_OF_SENTINEL: dict[str, Slot] = {c: slot for slot, c in SENTINEL.items()}
_SENTINEL_OF_GROUP = {g: SENTINEL[slot] for g, slot in _SLOT_OF_GROUP.items()}
_SCRUB = str.maketrans(dict.fromkeys(SENTINEL.values(), "\ufffd"))
_RENDER = str.maketrans({c: f"<{slot.value}>" for slot, c in SENTINEL.items()})
# Digit runs become "1"; a "0" that opens a `0x` prefix is kept, since it decides a hex slot.
_DIGIT_RUN = re.compile(r"(?!0[xX])[0-9]+")


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
    """Each token that is a whole variable part becomes its `Slot`; the others stay as they are."""
    out: list[str | Slot] = []
    for token in tokens:
        m = VARIABLE.fullmatch(token)
        out.append(slot_of_group(m.lastgroup) if m and not token.isspace() else token)
    return out


def render(masked: Sequence[str | Slot]) -> str:
    """The text of a masked line: slots written `<int>`, `<*>`, ..., separators kept."""
    return "".join(f"<{t.value}>" if isinstance(t, Slot) else t for t in masked)


def mask_line(line: str) -> str:
    """The line with each variable part replaced by its slot's sentinel character.

    Sentinel characters already in the line become U+FFFD, so a sentinel always means a slot.
    """
    return VARIABLE.sub(_sentinel, line.translate(_SCRUB))


def _sentinel(m: re.Match[str]) -> str:
    return _SENTINEL_OF_GROUP[m.lastgroup or ""]


def skeleton(line: str) -> str:
    """The line with every digit run normalised: lines with equal skeletons mask the same."""
    return _DIGIT_RUN.sub("1", line)


def render_masked(text: str) -> str:
    """A `mask_line` result (or part of one) with its sentinels written `<int>`, `<*>`, ..."""
    return text.translate(_RENDER)


def split_words(line: str) -> tuple[list[str], list[str]]:
    """Words and the whitespace around them: `seps[i]` precedes `words[i]`, one more at the end."""
    parts = _WHITESPACE.split(line)
    seps = _WHITESPACE.findall(line)
    if parts and parts[0] == "":
        parts = parts[1:]
    else:
        seps.insert(0, "")
    if parts and parts[-1] == "":
        parts.pop()
    else:
        seps.append("")
    return parts, seps
