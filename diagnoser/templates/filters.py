"""Filters: a stable template becomes an anchored regex that drops its lines before mining.

A filter is proposed from a template (deterministically from its text by default, or by the LLM
Log Agent), validated before use, and applied with every other enabled filter as one compiled
multi-pattern matcher over a batch, so the cost per line does not grow with the number of
filters. Validation, in order, each failure recorded as a `Rejection` with its reason:

1. it compiles with `regex` and uses only what both engines run identically (no lookaround,
   no back-reference, no capturing group, nothing that can match a newline); should hyperscan
   still refuse it, the matcher rebuild disables it with hyperscan's reason;
2. it is not over-broad: at least `MIN_LITERAL` non-blank literal characters are required in
   every match and it matches none of a few generic probe lines;
3. it fullmatches every sample of its template;
4. it matches no line of the guard corpus (the rule pack's `examples.match` lines and the
   failure-word lines seen so far);
5. it finishes within `timeout` seconds on each adversarial input (`regex` timeout).

Slot patterns are ASCII classes written out (`[0-9]`, `[^ \\t\\n]`), never `\\d`/`\\s`, so that
hyperscan (bytes) and `regex` (str) accept exactly the same lines.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from itertools import accumulate
from operator import add
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any, Protocol

import regex

from diagnoser.rules import hyperscan_db
from diagnoser.templates.model import Slot, TemplateView

SLOT_PATTERNS: dict[Slot, str] = {
    Slot.INT: r"[-+]?[0-9]+",
    Slot.FLOAT: r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?",
    Slot.HEX: r"[0-9a-fA-F]+(?:[xX][0-9a-fA-F]+)?",
    Slot.IP: r"[0-9a-fA-F:.]*[0-9a-fA-F](?:[:/][0-9]+)?",
    Slot.PATH: r"[^ \t\n/\\]*[/\\][^ \t\n]*",
    Slot.UUID: r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    Slot.DURATION: r"[-+]?[0-9][0-9.:]*(?:[a-zA-Z]+[0-9.]+)*[a-zA-Z]*",
    Slot.ANY: r"[^ \t\n]+",
}
"""What each typed slot accepts. FLOAT takes no `nan`/`inf`: those lines stay out of filters.
Each is unambiguous (no nested or overlapping repeats), so a filter runs in linear time, and
digit-blind (no digit is special: `0x` is not spelled with a literal 0), which makes the
skeleton cache exact (see `FilterSet`)."""
_SLOT_MARK = regex.compile(r"<(" + "|".join(re.escape(s.value) for s in Slot) + r")>")
_BLANK = regex.compile(r"[ \t]+")

MIN_LITERAL = 4
"""Non-blank literal characters every match must contain; fewer is a `.*`-like filter."""
PROBES = ("", " ", "x", "0", "-", "ok", "a b", "hello world", "1 2 3", "foo=1 bar=2", "[x]")
"""Generic lines no real filter matches: a filter that does is over-broad."""
DEFAULT_TIMEOUT = 0.05
"""Seconds a candidate may spend on one adversarial input before it is rejected."""
MAX_CORPUS = 4096
"""Guard corpus lines remembered beyond the rule examples (failure-word lines seen so far)."""


class Proposer(StrEnum):
    DETERMINISTIC = "deterministic"
    LLM = "llm"
    HUMAN = "human"


@dataclass(slots=True)
class Filter:
    """One filter: the regex, where it came from, and what it has done."""

    id: int
    template_id: int
    template: str
    pattern: str
    proposer: Proposer = Proposer.DETERMINISTIC
    enabled: bool = True
    hits: int = 0
    created_line: int = 0
    """Input line (1-based, across the family) after which the filter was added."""
    last_hit_line: int = 0
    disabled_reason: str | None = None
    version: int = 1
    names: tuple[str, ...] = ()
    """Names of the numeric slots (step, loss, lr, ...) when a proposer gave them."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A candidate that failed validation, with the reason."""

    template_id: int
    pattern: str
    proposer: Proposer
    reason: str


@dataclass(frozen=True, slots=True)
class Disabled:
    """A filter that matched a guarded line and was disabled on the spot."""

    filter_id: int
    template_id: int
    line_no: int
    line: str
    reason: str


def escape(text: str) -> str:
    """Literal text as a regex; blank runs become `[ \\t]+` (logs pad columns differently)."""
    parts = _BLANK.split(text)
    return "[ \\t]+".join(regex.escape(p, special_only=True) for p in parts)


def propose(template: TemplateView, *, loose: bool = False) -> str:
    """The deterministic filter of a template: its literal text escaped, each slot typed.

    `loose` allows blanks around every slot, for templates whose samples the exact form does
    not fullmatch (padding the miner normalised away). Slots keep their type either way: a
    FLOAT slot never takes `nan`, so a NaN loss line is no match and disables nothing.
    """
    out: list[str] = []
    pos = 0
    text = template.text
    for m in _SLOT_MARK.finditer(text):
        out.append(escape(text[pos : m.start()]))
        slot = SLOT_PATTERNS[Slot(m.group(1))]
        out.append(f"[ \\t]*(?:{slot})[ \\t]*" if loose else f"(?:{slot})")
        pos = m.end()
    out.append(escape(text[pos:]))
    body = _MERGE_BLANKS.sub(_merged, f"^[ \\t]*{''.join(out)}[ \\t]*$")
    return body


_MERGE_BLANKS = regex.compile(r"(?:\[ \\t\][*+]){2,}")


def _merged(m: regex.Match[str]) -> str:
    """Adjacent blank runs as one (`[ \\t]*[ \\t]+` backtracks quadratically on long blanks)."""
    return "[ \\t]+" if "+" in m.group(0) else "[ \\t]*"


def candidates(template: TemplateView) -> list[str]:
    """Deterministic proposals, most specific first."""
    exact = propose(template)
    loose = propose(template, loose=True)
    return [exact] if loose == exact else [exact, loose]


class _UnsupportedError(ValueError):
    pass


def _check_structure(items: Any) -> int:
    """Raise on constructs one engine would treat differently; return required literal count."""
    required = 0
    for op, av in items:
        if op is sre.LITERAL:
            if av == 10:
                raise _UnsupportedError("matches a newline")
            if chr(av) not in " \t":
                required += 1
        elif op in (sre.ASSERT, sre.ASSERT_NOT, sre.GROUPREF, sre.GROUPREF_EXISTS):
            raise _UnsupportedError("lookaround or back-reference")
        elif op is sre.ANY:
            raise _UnsupportedError("`.` (write the slot's class)")
        elif op in (sre.IN, sre.NOT_LITERAL, sre.CATEGORY):
            if _class_takes_newline(op, av):
                raise _UnsupportedError("a class that matches a newline")
        elif op is sre.SUBPATTERN:
            if av[0] is not None:
                raise _UnsupportedError(
                    "a capturing group (write `(?:...)`, name slots in `names`)"
                )
            required += _check_structure(av[3])
        elif op is sre.ATOMIC_GROUP:
            required += _check_structure(av)
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            inner = _check_structure(av[2])
            required += inner * min(av[0], 1)
        elif op is sre.BRANCH:
            counts = [_check_structure(alt) for alt in av[1]]
            required += min(counts, default=0)
        elif op is sre.AT:
            continue
        else:
            raise _UnsupportedError(f"unsupported construct {op}")
    return required


def _class_takes_newline(op: Any, av: Any) -> bool:
    if op is sre.NOT_LITERAL:
        return bool(av != 10)
    items = [(op, av)] if op is sre.CATEGORY else list(av)
    negate = bool(items and items[0][0] is sre.NEGATE)
    hit = False
    for iop, iav in items:
        if (iop is sre.LITERAL and iav == 10) or (iop is sre.RANGE and iav[0] <= 10 <= iav[1]):
            hit = True
        elif iop is sre.CATEGORY:
            if iav in (sre.CATEGORY_SPACE, sre.CATEGORY_NOT_WORD, sre.CATEGORY_NOT_DIGIT):
                hit = True
            elif iav in (sre.CATEGORY_DIGIT, sre.CATEGORY_WORD, sre.CATEGORY_NOT_SPACE):
                # Unicode-aware in `regex`, ASCII in hyperscan: write the class out.
                raise _UnsupportedError("`\\d`, `\\w`, `\\S` (write the ASCII class out)")
    return hit is not negate


_DIGITS = frozenset(range(48, 58))


def digit_blind(pattern: str) -> bool:
    """Whether swapping any digit of a line for another digit never changes the match.

    True when no literal is a digit and every class takes all ten digits or none: then two
    lines with the same skeleton (digits replaced by `0`) both match or both fail.
    """
    try:
        return _blind(sre_parse.parse(pattern))
    except (re.error, OverflowError, RecursionError):
        return False


def _blind(items: Any) -> bool:
    for op, av in items:
        if op in (sre.LITERAL, sre.NOT_LITERAL):
            if av in _DIGITS:
                return False
        elif op is sre.IN:
            covered: set[int] = set()
            for iop, iav in av:
                if iop is sre.LITERAL:
                    covered |= {iav} & _DIGITS
                elif iop is sre.RANGE:
                    covered |= set(range(iav[0], iav[1] + 1)) & _DIGITS
                elif iop is sre.CATEGORY:
                    return False
            if covered and covered != _DIGITS:
                return False
        elif op is sre.SUBPATTERN:
            if not _blind(av[3]):
                return False
        elif op is sre.ATOMIC_GROUP:
            if not _blind(av):
                return False
        elif op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            if not _blind(av[2]):
                return False
        elif op is sre.BRANCH:
            if not all(_blind(alt) for alt in av[1]):
                return False
        elif op is not sre.AT:
            return False
    return True


_SKELETON = bytes.maketrans(b"123456789", b"000000000")
MAX_SKELETONS = 200_000
"""Skeleton cache entries; a full cache is dropped and refilled."""


def _adversarial(samples: Sequence[str]) -> list[str]:
    """Inputs that make a backtracking pattern blow up, if it can: long runs of one character
    where a slot starts (after a blank, mid-line), and the sample repeated."""
    inputs = ["a" * 4000 + "!", "0" * 4000 + "!", " \t" * 2000 + "!", "0." * 2000 + "x"]
    for sample in samples[:3]:
        inputs.append(" ".join([sample] * 30) + "\x00")
        cuts = [*[i + 1 for i, ch in enumerate(sample) if ch in " \t"][:6], len(sample) // 2]
        chars = sorted(set(sample) - {" ", "\t"})[:8]
        for cut in cuts:
            for ch in chars:
                inputs.append(sample[:cut] + ch * 3000 + "\x00")
    return inputs


class Validator:
    """Checks a candidate filter before use against the samples and the guard corpus."""

    def __init__(
        self, rule_examples: Iterable[str] = (), *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.timeout = timeout
        self._fixed = [line for line in rule_examples if "\n" not in line]
        self._seen: dict[str, None] = {}

    def remember(self, line: str) -> None:
        """Add a failure line to the guard corpus (the oldest beyond `MAX_CORPUS` go)."""
        if line in self._seen:
            return
        self._seen[line] = None
        if len(self._seen) > MAX_CORPUS:
            del self._seen[next(iter(self._seen))]

    @property
    def corpus(self) -> list[str]:
        return [*self._fixed, *self._seen]

    def check(self, pattern: str, samples: Sequence[str]) -> str | None:
        """None when the candidate may be used, else why not."""
        try:
            compiled = regex.compile(pattern)
        except regex.error as exc:
            return f"does not compile: {exc}"
        try:
            literal = _check_structure(sre_parse.parse(pattern))
        except _UnsupportedError as exc:
            return f"unsupported: {exc}"
        except (re.error, OverflowError, RecursionError) as exc:
            return f"unsupported syntax: {exc}"
        if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
            return "not anchored: a filter starts with `^` and ends with `$`"
        if literal < MIN_LITERAL:
            return f"over-broad: only {literal} literal characters required"
        try:
            for probe in PROBES:
                if compiled.fullmatch(probe, timeout=self.timeout):
                    return f"over-broad: matches the generic line {probe!r}"
            for sample in samples:
                if compiled.fullmatch(sample, timeout=self.timeout) is None:
                    return f"does not fullmatch its sample {sample[:200]!r}"
            corpus = "\n".join(self.corpus)
            hit = regex.compile(pattern, regex.MULTILINE).search(corpus, timeout=self.timeout * 20)
            if hit is not None:
                return f"matches a guarded line {hit.group(0)[:200]!r}"
            for text in _adversarial(samples):
                compiled.fullmatch(text, timeout=self.timeout)
        except TimeoutError:
            return f"too slow: over {self.timeout}s on adversarial input"
        return None


class Matcher(Protocol):
    name: str

    def match(self, lines: Sequence[str]) -> list[int | None]:
        """Per line, the index (into the compiled patterns) of a matching pattern, or None."""


class HyperscanMatcher:
    """Every pattern in one hyperscan database, one scan per batch.

    A fullmatch ends exactly at its line's end, so each hit's end offset names its line: the
    line ends are computed in bulk (C-speed `accumulate`), and a dict lookup per line does the
    rest. No per-hit Python work beyond the callback.
    """

    name = "hyperscan"

    def __init__(self, patterns: Sequence[str]) -> None:
        self._scanner = hyperscan_db.PatternScanner([(p.encode("utf-8"), False) for p in patterns])

    def match(self, lines: Sequence[str]) -> list[int | None]:
        if not lines:
            return []
        text = "\n".join(lines)
        data = text.encode("utf-8", "replace")
        hits = self._scanner.scan(data)
        if not hits:
            return [None] * len(lines)
        if len(data) == len(text):
            lengths: Iterable[int] = map(len, lines)
        else:
            lengths = map(len, data.split(b"\n"))
        ends = map(add, accumulate(lengths), range(len(lines)))
        return list(map(dict(hits).get, ends))


class RegexMatcher:
    """The pure-`regex` path: one alternation, each pattern one capturing group."""

    name = "regex"

    def __init__(self, patterns: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        body = "|".join(f"({_without_anchors(p)})" for p in patterns)
        self._fullmatch = regex.compile(f"^(?:{body})$" if patterns else "(?!)").fullmatch
        self._timeout = timeout

    def match(self, lines: Sequence[str]) -> list[int | None]:
        fullmatch = self._fullmatch
        timeout = self._timeout
        out: list[int | None] = []
        append = out.append
        for line in lines:
            try:
                m = fullmatch(line, timeout=timeout)
            except TimeoutError:
                m = None
            append(None if m is None else (m.lastindex or 1) - 1)
        return out


def _without_anchors(pattern: str) -> str:
    """Drop the outer `^`/`$` (validated filters have no capturing group of their own)."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    return body[:-1] if body.endswith("$") and not body.endswith("\\$") else body


def build_matcher(patterns: Sequence[str], *, engine: str = "auto") -> Matcher:
    """`engine`: "hyperscan", "regex", or "auto" (hyperscan when its wheel is installed)."""
    if engine == "hyperscan" or (engine == "auto" and hyperscan_db.available()):
        return HyperscanMatcher(patterns) if patterns else RegexMatcher(())
    if engine in ("regex", "auto"):
        return RegexMatcher(patterns)
    raise ValueError(f"unknown filter engine {engine!r}")


@dataclass
class FilterSet:
    """The filters of one family, the record of what was rejected or disabled, and the matcher.

    `match` runs the enabled filters; `disable` takes one out at once (its matches are
    dropped from the next result on). Compiling a hyperscan database of hundreds of patterns
    takes seconds, so the matcher has two tiers: the main one (every filter as of its last
    build) and the filters added since, run with `regex` on the few lines the main one left.
    The main tier is rebuilt once `rebuild_pending` filters wait, or after `rebuild_lines`
    input lines with any waiting.

    In front of both, an exact memo: a line's skeleton (its UTF-8 bytes with every digit turned
    into `0`, one `bytes.translate` per batch) maps to the filter its first line matched. For a
    digit-blind filter (`digit_blind`: every deterministic one whose literal text has no digit)
    every line with that skeleton matches it too; "no filter" is remembered only while every
    enabled filter is digit-blind. Any change to the set empties the memo.
    """

    engine: str = "auto"
    filters: list[Filter] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    disabled: list[Disabled] = field(default_factory=list)
    rebuild_lines: int = 65_536
    rebuild_pending: int = 32
    _active: list[Filter] = field(default_factory=list, init=False, repr=False)
    _matcher: Matcher | None = field(default=None, init=False, repr=False)
    _pending: list[Filter] = field(default_factory=list, init=False, repr=False)
    _pending_matcher: Matcher | None = field(default=None, init=False, repr=False)
    _stale: bool = field(default=False, init=False, repr=False)
    _since: int = field(default=0, init=False, repr=False)
    _broken: int = field(default=0, init=False, repr=False)
    _memo: dict[bytes, int] = field(default_factory=dict, init=False, repr=False)
    _blind: dict[int, bool] = field(default_factory=dict, init=False, repr=False)
    _blind_flags: list[bool] = field(default_factory=list, init=False, repr=False)

    MAX_RECORDS = 1000
    """Rejections and disable events kept (the oldest go first)."""

    def __len__(self) -> int:
        return len(self.filters)

    @property
    def enabled(self) -> list[Filter]:
        return [f for f in self.filters if f.enabled]

    def by_template(self) -> dict[int, Filter]:
        return {f.template_id: f for f in self.filters}

    def add(
        self,
        template: TemplateView,
        pattern: str,
        validator: Validator,
        *,
        proposer: Proposer = Proposer.DETERMINISTIC,
        line_no: int = 0,
        names: tuple[str, ...] = (),
    ) -> Filter | None:
        """Validate `pattern` for `template`; add it, or record the rejection and return None."""
        reason = validator.check(pattern, template.samples)
        if reason is not None:
            self._record(self.rejections, Rejection(template.id, pattern, proposer, reason))
            return None
        new = Filter(
            id=max((f.id for f in self.filters), default=0) + 1,
            template_id=template.id,
            template=template.text,
            pattern=pattern,
            proposer=proposer,
            created_line=line_no,
            names=names,
        )
        self.filters.append(new)
        if self._matcher is not None:
            self._pending.append(new)
            self._pending_matcher = None
        self._stale = True
        self._memo.clear()
        return new

    def propose(self, template: TemplateView, validator: Validator, line_no: int = 0) -> bool:
        """Try the deterministic candidates of `template` in order; True when one was added."""
        for pattern in candidates(template):
            if self.add(template, pattern, validator, line_no=line_no) is not None:
                return True
        return False

    def match(self, lines: Sequence[str]) -> list[Filter | None]:
        """Per line, the enabled filter that matches it, or None."""
        idx, active = self.match_indexes(lines)
        return [None if i is None else active[i] for i in idx]

    def match_indexes(self, lines: Sequence[str]) -> tuple[list[int | None], list[Filter]]:
        """The raw form of `match` for the hot path: indexes into the returned filter list."""
        self._since += len(lines)
        if self._matcher is None or (
            self._stale
            and (self._since >= self.rebuild_lines or len(self._pending) >= self.rebuild_pending)
        ):
            self._rebuild()
        active = [*self._active, *self._pending] if self._pending else self._active
        if not lines:
            return [], active
        memo = self._memo
        keys = "\n".join(lines).encode("utf-8", "replace").translate(_SKELETON).split(b"\n")
        if len(keys) != len(lines):  # a line held a lone surrogate's replacement: no memo
            return self._match(lines, active), active
        known: list[int | None] = list(map(memo.get, keys))
        if None not in known:
            if -1 in known:
                known = [None if x == -1 else x for x in known]
            return known, active
        missed = [i for i, x in enumerate(known) if x is None]
        found = self._match([lines[i] for i in missed], active)
        if len(memo) > MAX_SKELETONS:
            memo.clear()
        blind = self._blind_flags
        if len(blind) != len(active):
            blind = self._blind_flags = [self._is_blind(f) for f in active]
        all_blind = all(b for f, b in zip(active, blind, strict=True) if f.enabled)
        result = [None if x == -1 else x for x in known] if -1 in known else known
        for i, x in zip(missed, found, strict=True):
            result[i] = x
            if x is None:
                if all_blind:
                    memo[keys[i]] = -1
            elif blind[x]:
                memo[keys[i]] = x
        return result, active

    def _is_blind(self, f: Filter) -> bool:
        blind = self._blind.get(f.id)
        if blind is None:
            blind = self._blind[f.id] = digit_blind(f.pattern)
        return blind

    def _match(self, lines: Sequence[str], active: list[Filter]) -> list[int | None]:
        assert self._matcher is not None
        idx = self._matcher.match(lines)
        if self._pending:
            if self._pending_matcher is None:
                self._pending_matcher = RegexMatcher([f.pattern for f in self._pending])
            missed = [i for i, x in enumerate(idx) if x is None]
            found = self._pending_matcher.match([lines[i] for i in missed])
            base = len(self._active)
            for i, y in zip(missed, found, strict=True):
                if y is not None:
                    idx[i] = base + y
        if self._broken:
            idx = [None if i is None or not active[i].enabled else i for i in idx]
        return idx

    def count_hits(self, counts: Counter[int | None], active: list[Filter], line_no: int) -> None:
        for index, n in counts.items():
            if index is not None:
                active[index].hits += n
                active[index].last_hit_line = line_no

    def disable(self, f: Filter, line_no: int, line: str, reason: str) -> None:
        """Disable `f` on the spot and record why; the next match no longer uses it."""
        if not f.enabled:
            return
        f.enabled = False
        f.disabled_reason = reason
        f.version += 1
        self._record(self.disabled, Disabled(f.id, f.template_id, line_no, line[:500], reason))
        if f in self._active or f in self._pending:
            self._broken += 1
            self._stale = True
        self._memo.clear()

    def _record(self, records: list[Any], item: object) -> None:
        records.append(item)
        if len(records) > self.MAX_RECORDS:
            del records[0]

    def _rebuild(self) -> None:
        self._active = self.enabled
        try:
            self._matcher = build_matcher([f.pattern for f in self._active], engine=self.engine)
        except ValueError:
            # Rare: find the patterns hyperscan refuses (one compile each), drop them, retry.
            for f in self._active:
                problem = hyperscan_db.compiles(f.pattern.encode("utf-8"))
                if problem is not None:
                    self.disable(f, 0, "", problem)
            self._active = self.enabled
            self._matcher = build_matcher([f.pattern for f in self._active], engine=self.engine)
        self._pending = []
        self._pending_matcher = None
        self._memo.clear()
        self._blind_flags = []
        self._stale = False
        self._since = 0
        self._broken = 0

    def to_json(self) -> dict[str, object]:
        """Plain JSON (no pickle) for storage and reuse by the next job of the family."""
        return {
            "version": 1,
            "filters": [{**asdict(f), "proposer": f.proposer.value} for f in self.filters],
            "rejections": [{**asdict(r), "proposer": r.proposer.value} for r in self.rejections],
            "disabled": [asdict(d) for d in self.disabled],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], *, engine: str = "auto") -> FilterSet:
        out = cls(engine=engine)
        for raw in data.get("filters", []):
            item = dict(raw)
            item["proposer"] = Proposer(item.get("proposer", Proposer.DETERMINISTIC))
            item["names"] = tuple(item.get("names", ()))
            out.filters.append(Filter(**item))
        for raw in data.get("rejections", []):
            out.rejections.append(
                Rejection(
                    int(raw["template_id"]),
                    str(raw["pattern"]),
                    Proposer(raw["proposer"]),
                    str(raw["reason"]),
                )
            )
        for raw in data.get("disabled", []):
            out.disabled.append(Disabled(**raw))
        return out
