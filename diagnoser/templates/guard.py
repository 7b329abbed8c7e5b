"""The invariant of compression: a failure line is never filtered.

A line is guarded when the rule pack's prefilter flags it (any rule anchor, block trigger or
headless-exception anchor), when it carries a failure word, or when it continues a multi-line
block (traceback, torchrun ChildFailedError report, NCCL error report) that a guarded line
opened. Guarded lines are kept whatever the filters say; the filter set disables any filter that
matches one (see `filters.FilterSet.enforce`).

Failure words are generous on purpose: keeping a benign line costs a few bytes, dropping a
failure line costs a diagnosis. They are ASCII word-bounded (`\\b`, so `error` does not fire
inside `NCCL_ASYNC_ERROR_HANDLING`), caseless, plus the CamelCase spellings (`RuntimeError`,
`ncclSystemError`, `cudaErrorLaunchFailure`) and upper-snake status codes ending in a failure
word (`CUDA_ERROR_LAUNCH_FAILED`).

Both engines find exactly the same lines: hyperscan (one scan of the batch for the failure words
and the rule pack's anchors together) and the stdlib `re` in ASCII mode (the same `\\b` and the
same ASCII-only case folding) with the rule pack's own prefilter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from diagnoser.rules import hyperscan_db
from diagnoser.rules.assembly import TRIGGER_ORDER, TRIGGERS, Assembler, Verdict, open_block
from diagnoser.rules.prefilter import Prefilter, merge
from diagnoser.rules.ruleset import RuleSet
from diagnoser.rules.schema import Unit

_WORDS = (
    r"err|errs|errno|errors?|erro?red|exceptions?|traceback|fatal|fail|fails|failed|failing",
    r"failures?|killed|kills?|killing|sigkill|sigterm|sigsegv|sigabrt|sigbus|sigill|sigfpe",
    r"timeouts?|timed[ -]?out|time[ -]out|xid|sxid|oom|oomkilled|oom[-_ ]?kill\w*",
    r"out of memory|segfaults?|segmentation fault|core dumped|abort|aborts|aborted|aborting",
    r"panic|panicked|panicking|crash|crashed|crashes|crashing|critical|crit|severe|emerg\w*",
    r"terminate called|terminated|denied|refused|unreachable|corrupt\w*|illegal",
    r"invalid|assert|asserts|assertion|unhandled|uncaught|uncorrectable|ecc|hang|hangs|hung",
    r"hanging|deadlock\w*|stuck|died|dead|lost|exit ?code|exit status|non-?zero exit|cannot",
    r"can't|could not|couldn't|unable|no space left|broken pipe|reset by peer|overflow",
    r"diverged?|diverging|mismatch\w*|retrying|unrecoverable|irrecoverable|faulted|fault|faults",
)
FAILURE_PATTERNS: tuple[tuple[str, bool], ...] = (
    (r"\b(?:" + "|".join(_WORDS) + r")\b", True),
    (r"NCCL WARN", True),
    # NaN and inf as values (`loss: nan`, `grad_norm=inf`, `loss nan |`, `is nan`), not as
    # words in a field name: Megatron prints `number of nan iterations:   0` on every step.
    (
        r"(?:[:=(\[,|]|\b(?:loss|norm|value|values|tensor|is|are|got|found|detected|became))"
        r"[ \t]*['\"]?[-+]?(?:nan|inf|infinity)\b",
        True,
    ),
    (r"\b(?:nan|inf|infinity)[ \t]*(?:[,|;)\]}]|$)", True),
    (r"\bNaNs?\b|\bInf\b|\bnumber of nan iterations:[ \t]*[1-9]", False),
    (r"[a-z0-9](?:Error|Exception|Failure|Fault|Timeout|Abort|Panic)", False),
    (r"\b[A-Z0-9][A-Z0-9_]*_(?:ERROR|FAILED|FAILURE|FATAL|TIMEOUT|ABORT|ABORTED|OOM)\b", False),
    # glog's error and fatal severities: `E1201 10:00:00.123 ...`, `F1201 ...`.
    (r"\b[EF][0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2}", False),
)
"""(regex, caseless): what makes a line a failure line by its words alone."""


class GuardReason(StrEnum):
    RULE = "rule"
    """A rule anchor, block trigger or headless-exception anchor of the rule pack."""
    WORD = "failure_word"
    BLOCK = "block"
    """A continuation line of a multi-line block opened by a guarded line."""


class _Scanner(Protocol):
    def single(self, lines: Sequence[str], data: bytes | None) -> dict[int, GuardReason]: ...


class _HyperscanScanner:
    """The failure words and every anchor of the rule pack's prefilter in one hyperscan
    database, so a batch is joined, encoded and scanned once (not once per kind)."""

    def __init__(self, ruleset: RuleSet) -> None:
        anchors = merge(ruleset.anchors())
        self._words = len(FAILURE_PATTERNS)
        self._scanner = hyperscan_db.PatternScanner(
            [(p.encode(), caseless) for p, caseless in FAILURE_PATTERNS]
            + [(_literal(a.literal.encode()), a.caseless) for a in anchors]
        )

    def single(self, lines: Sequence[str], data: bytes | None) -> dict[int, GuardReason]:
        if not lines:
            return {}
        if data is None:
            data = "\n".join(lines).encode("utf-8", "replace")
        hits = self._scanner.scan(data)
        found: dict[int, GuardReason] = {}
        if not hits:
            return found
        words = self._words
        line = 0
        pos = 0
        count = data.count
        for end, pattern in sorted(hits):
            # No match spans a newline; its last byte is at end - 1.
            line += count(b"\n", pos, end - 1)
            pos = end - 1
            if pattern >= words:
                found[line] = GuardReason.RULE
            else:
                found.setdefault(line, GuardReason.WORD)
        return found


def _literal(text: bytes) -> bytes:
    """A literal as a hyperscan regex: every byte but ASCII letters and digits as `\\xHH`."""
    return b"".join(
        bytes((c,)) if 48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 else b"\\x%02x" % c
        for c in text
    )


class _RegexScanner:
    """The failure words with the stdlib `re`, then the rule pack's prefilter."""

    def __init__(self, prefilter: Prefilter) -> None:
        self._prefilter = prefilter
        self._patterns = [
            re.compile(p, re.ASCII | re.MULTILINE | (re.IGNORECASE if caseless else 0))
            for p, caseless in FAILURE_PATTERNS
        ]

    def single(self, lines: Sequence[str], data: bytes | None) -> dict[int, GuardReason]:
        found = dict.fromkeys(self._words(lines), GuardReason.WORD)
        for index in self._prefilter.candidates(lines):
            found[index] = GuardReason.RULE
        return found

    def _words(self, lines: Sequence[str]) -> set[int]:
        if not lines:
            return set()
        text = "\n".join(lines)
        starts: list[int] = []
        for pattern in self._patterns:
            starts.extend(m.start() for m in pattern.finditer(text))
        found: set[int] = set()
        line = 0
        pos = 0
        count = text.count
        for start in sorted(starts):
            line += count("\n", pos, start)
            pos = start
            found.add(line)
        return found


def _scanner(ruleset: RuleSet, engine: str) -> _Scanner:
    if engine == "hyperscan" or (engine == "auto" and hyperscan_db.available()):
        return _HyperscanScanner(ruleset)
    if engine in ("regex", "auto"):
        return _RegexScanner(ruleset.prefilter)
    raise ValueError(f"unknown guard engine {engine!r}")


@dataclass(slots=True)
class GuardState:
    """Open multi-line blocks of one stream, keyed by rank (None: no per-line rank)."""

    open: dict[int | None, Assembler] = field(default_factory=dict)


class Guard:
    """Finds the guarded lines of a batch. Pure; the per-stream block state is passed in."""

    def __init__(self, ruleset: RuleSet, *, engine: str = "auto") -> None:
        self.engine = engine
        self._scanner = _scanner(ruleset, engine)
        self._rule_example_lines = tuple(
            line
            for rule in ruleset.rules
            for example in rule.spec.examples.match
            for line in example.split("\n")
            if line.strip()
        )

    @property
    def rule_examples(self) -> tuple[str, ...]:
        """Every line of every rule's `examples.match`: the fixed part of the guard corpus."""
        return self._rule_example_lines

    def single(self, lines: Sequence[str], data: bytes | None = None) -> dict[int, GuardReason]:
        """Lines guarded on their own text (rule pack prefilter, failure words). `data`: the
        lines joined by newlines, UTF-8 with errors replaced, when the caller has it already."""
        return self._scanner.single(lines, data)

    def scan(
        self,
        lines: Sequence[str],
        state: GuardState,
        ranks: Sequence[int | None] | None = None,
        data: bytes | None = None,
    ) -> dict[int, GuardReason]:
        """Every guarded line of the batch, block continuations included, in line order."""
        found = self.single(lines, data)
        if not found and not state.open:
            return found
        blocks = state.open
        out: dict[int, GuardReason] = {}
        order = sorted(found)
        next_hit = 0
        pos = 0
        total = len(lines)
        while True:
            if blocks:
                if pos >= total:
                    break
                index = pos
            else:
                while next_hit < len(order) and order[next_hit] < pos:
                    next_hit += 1
                if next_hit >= len(order):
                    break
                index = order[next_hit]
            line = lines[index]
            rank = ranks[index] if ranks is not None else None
            assembler = blocks.get(rank)
            continued = False
            if assembler is not None:
                verdict = assembler.offer(line, 0, index)
                continued = verdict in (Verdict.CONTINUE, Verdict.CLOSE_WITH)
                if verdict is not Verdict.CONTINUE:
                    del blocks[rank]
            reason = found.get(index)
            if reason is not None:
                out[index] = reason
            elif continued:
                out[index] = GuardReason.BLOCK
            if reason is not None and not (continued and rank in blocks):
                unit = _trigger(line)
                if unit is not None:
                    blocks[rank] = open_block(unit, line, 0, index)
            pos = index + 1
        return out


def _trigger(line: str) -> Unit | None:
    for unit in TRIGGER_ORDER:
        if any(literal in line for literal in TRIGGERS[unit]):
            return unit
    return None
