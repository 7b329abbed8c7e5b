"""Filters: a stable template becomes an anchored regex that drops its lines before mining.

A filter is proposed from a template (deterministically from its text by default, or by the LLM
Log Agent), validated before use, and applied with every other enabled filter as one compiled
multi-pattern matcher over a batch, so the cost per line does not grow with the number of
filters. Validation (`validation.Validator`) runs first; its reason is recorded as a
`Rejection`. Should hyperscan still refuse a validated pattern, the matcher rebuild disables it
with hyperscan's reason.

Slot patterns are ASCII classes written out (`[0-9]`, `[^ \\t\\n]`), never `\\d`/`\\s`, so that
hyperscan (bytes) and `regex` (str) accept exactly the same lines.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import regex

from diagnoser.rules import hyperscan_db
from diagnoser.templates.matcher import LiteralChecker, Matcher, build_matcher
from diagnoser.templates.model import Slot, TemplateView
from diagnoser.templates.validation import Validator, digit_blind, hex_blind

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
NUMBER = r"[-+]?[0-9]+(?:\.[0-9]+)?"
"""What an `<int>` slot of a proposed filter accepts: an integer or a decimal, so a filter
learned while a value was an integer still matches when it turns float (DeepSpeed's
`loss scale from 65536` becomes `from 32768.0`). Not where a `.`, a digit or an exponent letter
touches the slot (`<int>.<int>` versions, `<int>e`): those stay integers."""
_SLOT_MARK = regex.compile(r"<(" + "|".join(re.escape(s.value) for s in Slot) + r")>")
_BLANK = regex.compile(r"[ \t]+")


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
    """Literal text as a regex; blank runs become `[ \\t]+` (logs pad columns differently),
    and runs of four or more dots `\\.{4,}` (a dot leader pads a name to a column: the
    miner writes every leader as `....`)."""
    parts = _BLANK.split(text)
    return "[ \\t]+".join(_escape_word(p) for p in parts)


_DOTS = regex.compile(r"\.{4,}")


def _escape_word(word: str) -> str:
    if "...." not in word:
        return regex.escape(word, special_only=True)
    return r"\.{4,}".join(regex.escape(p, special_only=True) for p in _DOTS.split(word))


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
        slot = _slot_pattern(Slot(m.group(1)), text[m.start() - 1 : m.start()], text[m.end() :])
        out.append(f"[ \\t]*(?:{slot})[ \\t]*" if loose else f"(?:{slot})")
        pos = m.end()
    out.append(escape(text[pos:]))
    body = _MERGE_BLANKS.sub(_merged, f"^[ \\t]*{''.join(out)}[ \\t]*$")
    return body


def _slot_pattern(slot: Slot, before: str, after: str) -> str:
    """A slot's class in a filter: `<int>` widened to a number where nothing can glue to it."""
    glued = before == "." or after.startswith((".", "e", "E", "<")) or after[:1].isdigit()
    if slot is Slot.INT and not glued:
        return NUMBER
    return SLOT_PATTERNS[slot]


_MERGE_BLANKS = regex.compile(r"(?:\[ \\t\][*+]){2,}")


def _merged(m: regex.Match[str]) -> str:
    """Adjacent blank runs as one (`[ \\t]*[ \\t]+` backtracks quadratically on long blanks)."""
    return "[ \\t]+" if "+" in m.group(0) else "[ \\t]*"


def candidates(template: TemplateView) -> list[str]:
    """Deterministic proposals, most specific first."""
    exact = propose(template)
    loose = propose(template, loose=True)
    return [exact] if loose == exact else [exact, loose]


_SKELETON = bytes.maketrans(b"123456789", b"000000000")
MAX_SKELETONS = 200_000
"""Skeleton cache entries; a full cache is dropped and refilled."""
_RUN = b"\xff"
"""What a hex run becomes in a memo key: a byte UTF-8 never holds, so no line spells it."""
_HEX_RUN = re.compile(rb"0x(?<![A-Za-z0-9]0x)[0a-fA-F]+(?![A-Za-z0-9])")
"""A hex run in a skeleton (digits are `0` there): `0x` or `5x` then hex digits, with no letter
or digit on either side. Written to start with its literal `0x`, which `re` searches fast."""
_ABSORBING = tuple(SLOT_PATTERNS[s] for s in (Slot.HEX, Slot.ANY, Slot.PATH, Slot.DURATION))
"""The slots that take any hex run whole (see `validation.hex_blind`)."""


def _hex_keys(keys: list[bytes]) -> list[bytes] | None:
    """The keys with every hex run written as `_RUN`; None when none has one."""
    joined = b"\n".join(keys)
    if b"0x" not in joined:
        return None
    hexed = _HEX_RUN.sub(_RUN, joined)
    return None if len(hexed) == len(joined) else hexed.split(b"\n")


_BUILDS: ThreadPoolExecutor | None = None


def _builder() -> ThreadPoolExecutor:
    """One thread for every family's matcher builds: hyperscan compiles with the GIL released,
    so a build of hundreds of patterns (up to seconds) no longer stops the event loop."""
    global _BUILDS  # noqa: PLW0603 - one build thread per process
    if _BUILDS is None:
        _BUILDS = ThreadPoolExecutor(1, thread_name_prefix="filter-matcher")
    return _BUILDS


@dataclass(frozen=True, slots=True)
class _Built:
    """A main tier built off the loop: its matcher, and the patterns hyperscan refused."""

    matcher: Matcher
    refused: dict[int, str]
    """Index in the build's pattern list -> hyperscan's reason."""


def _build(patterns: list[str], engine: str) -> _Built:
    try:
        return _Built(build_matcher(patterns, engine=engine), {})
    except ValueError:
        # Rare: find the patterns hyperscan refuses (one compile each), leave them out, retry.
        refused: dict[int, str] = {}
        for index, pattern in enumerate(patterns):
            problem = hyperscan_db.compiles(pattern.encode("utf-8"))
            if problem is not None:
                refused[index] = problem
        kept = [p for i, p in enumerate(patterns) if i not in refused]
        return _Built(build_matcher(kept, engine=engine), refused)


@dataclass
class FilterSet:
    """The filters of one family, the record of what was rejected or disabled, and the matcher.

    `match` runs the enabled filters; `disable` takes one out at once (its matches are
    dropped from the next result on). Compiling a hyperscan database of hundreds of patterns
    takes seconds, so the matcher has two tiers: the main one (every filter as of its last
    build) and the filters added since, run with `regex` on the few lines the main one left.
    The main tier is rebuilt once `rebuild_pending` filters wait, or after `rebuild_lines`
    input lines with any waiting; in the service the build runs in a thread (`background`), and
    the filters added meanwhile stay in the second tier until the new main tier takes over.
    Which tier matches a line changes the cost and, for a line two filters match, which one
    is credited, never whether the line is filtered.

    In front of both, an exact memo: a line's skeleton (its UTF-8 bytes with every digit turned
    into `0`, one `bytes.translate` per batch) maps to the filter its first line matched. For a
    digit-blind filter (`digit_blind`: every deterministic one whose literal text has no digit)
    every line with that skeleton matches it too; "no filter" is remembered only while every
    enabled filter is digit-blind. A line the skeleton misses is looked up once more with each
    hex run (`0x7f3a...` standing alone) written as one byte, so lines that differ only in a
    pointer or id share a key; that key serves only `hex_blind` filters ("no filter": only
    while every enabled one is). Any change to the set empties the memo.
    """

    engine: str = "auto"
    filters: list[Filter] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    disabled: list[Disabled] = field(default_factory=list)
    rebuild_lines: int = 65_536
    rebuild_pending: int = 32
    background: bool = False
    """Build the main tier in a thread (the service: the event loop never waits for a
    compile). Off, the caller builds it and the next match waits: the offline CLI's results
    then do not depend on a thread's timing (of two filters that match one line, the tier that
    answers decides which is credited)."""
    _active: list[Filter] = field(default_factory=list, init=False, repr=False)
    _building: tuple[Future[_Built], list[Filter]] | None = field(
        default=None, init=False, repr=False
    )
    _matcher: Matcher | None = field(default=None, init=False, repr=False)
    _pending: list[Filter] = field(default_factory=list, init=False, repr=False)
    _pending_matcher: Matcher | None = field(default=None, init=False, repr=False)
    _stale: bool = field(default=False, init=False, repr=False)
    _since: int = field(default=0, init=False, repr=False)
    _broken: int = field(default=0, init=False, repr=False)
    _memo: dict[bytes, int] = field(default_factory=dict, init=False, repr=False)
    _blind: dict[int, bool] = field(default_factory=dict, init=False, repr=False)
    _blind_flags: list[bool] = field(default_factory=list, init=False, repr=False)
    _hex_blind: dict[int, bool] = field(default_factory=dict, init=False, repr=False)
    _hex_flags: list[bool] = field(default_factory=list, init=False, repr=False)

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
        return self.add_checked(template, pattern, proposer=proposer, line_no=line_no, names=names)

    def add_checked(
        self,
        template: TemplateView,
        pattern: str,
        *,
        proposer: Proposer = Proposer.DETERMINISTIC,
        line_no: int = 0,
        names: tuple[str, ...] = (),
    ) -> Filter:
        """Add a pattern the caller has just validated (in a thread, against a snapshot)."""
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

    def match_indexes(
        self, lines: Sequence[str], data: bytes | None = None
    ) -> tuple[list[int | None], list[Filter]]:
        """The raw form of `match` for the hot path: indexes into the returned filter list.
        `data`: the lines joined by newlines, UTF-8 with errors replaced, if already made."""
        self._since += len(lines)
        self._take_finished_build()
        if self._matcher is None:
            self._start()
        if (
            self._stale
            and self._building is None
            and (self._since >= self.rebuild_lines or len(self._pending) >= self.rebuild_pending)
        ):
            self._rebuild()
        active = [*self._active, *self._pending] if self._pending else self._active
        if not lines:
            return [], active
        memo = self._memo
        if data is None:
            data = "\n".join(lines).encode("utf-8", "replace")
        keys = data.translate(_SKELETON).split(b"\n")
        if len(keys) != len(lines):  # a line held a lone surrogate's replacement: no memo
            return self._match(lines, active), active
        known: list[int | None] = list(map(memo.get, keys))
        if None not in known:
            if -1 in known:
                known = [None if x == -1 else x for x in known]
            return known, active
        missed = [i for i, x in enumerate(known) if x is None]
        hexed = _hex_keys([keys[i] for i in missed])
        if hexed is not None:
            again = list(map(memo.get, hexed))
            still = [k for k, x in enumerate(again) if x is None]
            for k, x in enumerate(again):
                if x is not None:
                    known[missed[k]] = x
            missed = [missed[k] for k in still]
            hexed = [hexed[k] for k in still]
        found = self._match([lines[i] for i in missed], active) if missed else []
        if len(memo) > MAX_SKELETONS:
            memo.clear()
        blind = self._blind_flags
        if len(blind) != len(active):
            blind = self._blind_flags = [self._is_blind(f) for f in active]
            pairs = zip(active, blind, strict=True)
            self._hex_flags = [b and self._is_hex_blind(f) for f, b in pairs]
        hex_ok = self._hex_flags
        all_blind = all(b for f, b in zip(active, blind, strict=True) if f.enabled)
        all_hex = all(b for f, b in zip(active, hex_ok, strict=True) if f.enabled)
        result = [None if x == -1 else x for x in known] if -1 in known else known
        for k, (i, x) in enumerate(zip(missed, found, strict=True)):
            result[i] = x
            # A hex run is a fresh pointer each time: only the key with it blanked repeats.
            if hexed is not None and _RUN in hexed[k] and (all_hex if x is None else hex_ok[x]):
                memo[hexed[k]] = -1 if x is None else x
                continue
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

    def _is_hex_blind(self, f: Filter) -> bool:
        blind = self._hex_blind.get(f.id)
        if blind is None:
            blind = self._hex_blind[f.id] = hex_blind(f.pattern, _ABSORBING)
        return blind

    def _match(self, lines: Sequence[str], active: list[Filter]) -> list[int | None]:
        assert self._matcher is not None
        idx = self._matcher.match(lines)
        if self._pending:
            if self._pending_matcher is None:
                self._pending_matcher = LiteralChecker([f.pattern for f in self._pending])
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

    def adopt(self, f: Filter) -> Filter:
        """Add a filter validated elsewhere (the family's stored set, another replica).

        It gets a fresh local id; its template id is the caller's (one outside this miner's
        ids, so its runs never mix with a local template's)."""
        f.id = max((x.id for x in self.filters), default=0) + 1
        self.filters.append(f)
        if f.enabled and self._matcher is not None:
            self._pending.append(f)
            self._pending_matcher = None
        self._stale = True
        self._memo.clear()
        return f

    def enable(self, f: Filter) -> None:
        """Turn a disabled filter back on (a person's decision); it joins the pending tier."""
        if f.enabled:
            return
        f.enabled = True
        f.disabled_reason = None
        f.version += 1
        if self._matcher is not None and f not in self._pending and f not in self._active:
            self._pending.append(f)
            self._pending_matcher = None
        self._stale = True
        self._memo.clear()

    def _record(self, records: list[Any], item: object) -> None:
        records.append(item)
        if len(records) > self.MAX_RECORDS:
            del records[0]

    def _start(self) -> None:
        """The first match. In the background, the main tier starts empty with every enabled
        filter in the second while it is built (a family's stored filters can be hundreds)."""
        if not self.background:
            self._rebuild()
            return
        self._install(_Built(build_matcher([], engine=self.engine), {}), [])
        if self._pending:
            self._rebuild()

    def _take_finished_build(self) -> None:
        if self._building is not None and self._building[0].done():
            future, snapshot = self._building
            self._building = None
            self._install(future.result(), snapshot)

    def _rebuild(self) -> None:
        """Build the main tier of every enabled filter: in a thread, or here."""
        snapshot = self.enabled
        patterns = [f.pattern for f in snapshot]
        if self.background:
            self._building = (_builder().submit(_build, patterns, self.engine), snapshot)
        else:
            self._install(_build(patterns, self.engine), snapshot)

    def _install(self, built: _Built, snapshot: list[Filter]) -> None:
        """A main tier built of `snapshot` takes over; what changed since is carried over:
        filters added since wait in the second tier, filters disabled since are masked."""
        refused = [snapshot[i] for i in built.refused]
        self._active = [f for i, f in enumerate(snapshot) if i not in built.refused]
        self._matcher = built.matcher
        left_out = {id(f) for f in self._active} | {id(f) for f in refused}
        self._pending = [f for f in self.filters if f.enabled and id(f) not in left_out]
        self._pending_matcher = None
        self._memo.clear()
        self._blind_flags = []
        self._broken = sum(not f.enabled for f in self._active)
        self._stale = bool(self._pending) or self._broken > 0
        self._since = 0
        for f, reason in zip(refused, built.refused.values(), strict=True):
            self.disable(f, 0, "", reason)

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
