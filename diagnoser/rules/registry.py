"""The active rule set, its hot reload, and the checks behind `diagnoser rules check|test`."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from diagnoser.ingest.framing import LineBatch
from diagnoser.rules.events import RuleEvent
from diagnoser.rules.loader import digest, load_dir, read_dir
from diagnoser.rules.problems import Problem, RuleLoadError
from diagnoser.rules.ruleset import DEFAULT_TIMEOUT, CompiledRule, RuleSet
from diagnoser.rules.schema import RuleFile

BATCH_LINES = 4096


class RuleRegistry:
    """Holds the active RuleSet; `reload()` swaps it atomically or keeps it and raises.

    Readers take `registry.active` once per job (a plain attribute read, atomic under the GIL);
    scanners already running keep the set they started with.
    """

    def __init__(
        self,
        directory: Path,
        *,
        prefilter: str = "auto",
        timeout: float = DEFAULT_TIMEOUT,
        compiled: RuleSet | None = None,
    ) -> None:
        """`compiled`: a set already compiled from `directory`, used while the files still match.

        `serve` compiles the pack to refuse a broken one before it starts; compiling it again
        would double the start time.
        """
        self.directory = directory
        self._prefilter = prefilter
        self._timeout = timeout
        self._lock = threading.Lock()
        if compiled is not None and _matches(directory, compiled):
            self.active: RuleSet = compiled
        else:
            self.active = load_dir(directory, prefilter=prefilter, timeout=timeout)

    @property
    def digest(self) -> str:
        return self.active.digest

    def reload(self) -> RuleSet:
        """Validate the directory again; on success make it active, else raise RuleLoadError."""
        with self._lock:
            fresh = load_dir(self.directory, prefilter=self._prefilter, timeout=self._timeout)
            self.active = fresh
            return fresh


def _matches(directory: Path, compiled: RuleSet) -> bool:
    files, problems = read_dir(directory)
    return not problems and digest(files) == compiled.digest


def make_batch(lines: Sequence[str], stream_offset: int = 0, first_line_no: int = 1) -> LineBatch:
    """A LineBatch for text that did not come through framing (files, examples, tests)."""
    ends: list[int] = []
    offset = stream_offset
    for line in lines:
        offset += len(line.encode("utf-8", "replace")) + 1
        ends.append(offset)
    return LineBatch(
        stream_offset=stream_offset, first_line_no=first_line_no, lines=list(lines), ends=ends
    )


def batches(lines: Iterable[str], size: int = BATCH_LINES) -> Iterator[LineBatch]:
    chunk: list[str] = []
    offset, line_no = 0, 1
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            batch = make_batch(chunk, offset, line_no)
            yield batch
            offset, line_no, chunk = batch.ends[-1], line_no + len(chunk), []
    if chunk:
        yield make_batch(chunk, offset, line_no)


def scan_lines(
    ruleset: RuleSet, lines: Iterable[str], *, node: str = "local", now: float = 0.0
) -> list[RuleEvent]:
    """Every event the rule set produces on one stream of lines (`diagnoser rules test LOGFILE`).

    Each event names its rule and line number; windows use timestamps in the lines, else `now`.
    """
    scanner = ruleset.job_scanner()
    events: list[RuleEvent] = []
    for batch in batches(lines):
        events.extend(scanner.feed(node, None, batch, now))
    events.extend(scanner.flush(node, None, now))
    return events


@dataclass(frozen=True, slots=True)
class ExampleResult:
    rule: CompiledRule
    example: str
    expected: bool
    fired: bool

    @property
    def ok(self) -> bool:
        return self.expected is self.fired


def run_examples(ruleset: RuleSet) -> Iterator[ExampleResult]:
    """Run each rule's examples through the whole pipeline (prefilter, assembly, windows)."""
    for rule in ruleset.rules:
        for expected, examples in (
            (True, rule.spec.examples.match),
            (False, rule.spec.examples.no_match),
        ):
            for example in examples:
                events = scan_lines(ruleset, example.rstrip("\n").split("\n"))
                fired = any(e.rule_id == rule.id for e in events)
                yield ExampleResult(rule, example, expected, fired)


def check(directory: Path, *, prefilter: str = "auto") -> list[Problem]:
    """Validate a rule directory and run every example; an empty list means it is fit to load."""
    files, problems = read_dir(directory)
    if problems:
        return problems
    return check_files(files, prefilter=prefilter)


def check_files(files: Sequence[tuple[str, RuleFile]], *, prefilter: str = "auto") -> list[Problem]:
    """`check` of rule files held in memory (a rule about to be written, say)."""
    try:
        ruleset = RuleSet(files, digest(list(files)), prefilter=prefilter)
    except RuleLoadError as exc:
        return list(exc.problems)
    return [
        Problem(
            result.rule.file,
            result.rule.id,
            f"{'match' if result.expected else 'no_match'} example "
            f"{'did not fire' if result.expected else 'fired'}: {result.example.strip()[:160]!r}",
        )
        for result in run_examples(ruleset)
        if not result.ok
    ]
