"""Multi-line events: Python tracebacks, torchrun ChildFailedError reports, NCCL error reports.

An assembler is opened by a trigger line (found by the prefilter), is offered the following
lines of the same stream and rank, and closes into a `Block` that block rules match. The
engine keeps one open assembler per (stream, rank), across batches.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import Enum

import regex

from diagnoser.rules.schema import Unit

TRIGGERS: dict[Unit, tuple[str, ...]] = {
    Unit.TRACEBACK: ("Traceback (most recent call last)",),
    Unit.CHILD_FAILED: ("ChildFailedError", "Root Cause (first observed failure)"),
    Unit.NCCL_ERROR: (
        "NCCL error",
        "NCCL Error",
        "ncclSystemError",
        "ncclRemoteError",
        "ncclInternalError",
        "ncclUnhandledCudaError",
        "ncclInvalidUsage",
        "unhandled system error",
        "unhandled cuda error",
        "remote process exited or there was a network error",
        "internal error - please report this issue",
    ),
    Unit.ECC_SECTION: ("Double Bit",),
    Unit.QUERY_CSV: (
        "gpu_recovery_action",
        "reset_status.",
        "remapped_rows.",
        "retired_pages.",
        "ecc.errors.uncorrected.",
    ),
}
"""Literal anchors that open a block, fed to the prefilter next to the rules' anchors."""

TRIGGER_ORDER = (
    Unit.CHILD_FAILED,
    Unit.NCCL_ERROR,
    Unit.TRACEBACK,
    Unit.ECC_SECTION,
    Unit.QUERY_CSV,
)
"""Which unit a line holding several units' triggers opens (a ChildFailedError report's
header also reads as an exception line)."""

HEADLESS_ANCHORS = ("Error: ", "Exception: ")
"""Literal anchors of a traceback's last line seen without its header (see `headless_exception`)."""

_PREFIX = regex.compile(
    r"^(?:\[(?:rank|[a-z]+)?\d+\]:[ ]?|\d{1,5}: |\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\)[ ]?"
    r"|\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:[ ]?)"
)
_EXCEPTION_LINE = regex.compile(
    r"^(?P<qualname>(?:[A-Za-z_]\w*\.)*(?P<name>[A-Z]\w*[a-z]\w*)"
    r"|(?:[a-z_]\w*\.)+(?P<lower>[a-z]\w*))(?::[ ]?(?P<message>.*))?$"
)
"""`KeyError: 'x'`, `torch.OutOfMemoryError: ...`, and the lower-case classes some modules
define (`socket.gaierror`, `socket.timeout`), which only count when qualified by a module."""
_HEADLESS = regex.compile(
    r"^(?:(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception)|Exception)|(?:[A-Za-z_]\w*\.)+Error)"
    r": \S"
)
"""Python's own spelling of an uncaught exception: the class at column 0, a colon, a message."""
_RICH_FRAME = ("│", "╭", "╰")
"""Rich's boxed tracebacks (accelerate, transformers CLIs) draw frames inside a box."""
_FIELD = regex.compile(r"^\s*(?P<key>\w+)\s*:\s*(?P<value>.*?)\s*$")
_SIGNAL_TEXT = regex.compile(r"\b(SIG[A-Z0-9]+)\b")
_NCCL_CONTINUATION = regex.compile(r"^\s*(?:nccl[A-Z]\w*:|Last error:)")
_NCCL_VERSION = regex.compile(r"NCCL version (?P<v>[\d.]+\S*)")
_ECC_HEADER = regex.compile(r"^\s*Double Bit\s*$")
_ECC_FIELD = regex.compile(r"^\s+(?P<key>[A-Z][A-Za-z0-9 ]*?)\s*:\s*(?P<value>\S.*?)\s*$")

_CPP_BACKTRACE = regex.compile(
    r"^(?:\S+ )?(?:Exception raised from \S+ at \S+ \(most recent call first\):"
    r"|(?P<frame>frame #\d+: ))"
)
"""A line of c10::Error's C++ backtrace (c10/util/Exception.cpp): its header, or a frame."""
_WARNING_LINE = regex.compile(
    r"^(?:\[W(?:\d{3,4} \d\d:\d\d:\d\d\.\d+)? |W\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ )[^\s\]]+:\d+\] "
)
"""A warning-level line of c10's own logger (`[W901 07:40:19.968570826 TCPStore.cpp:125] `,
older releases `[W TCPStore.cpp:125] `) or of glog (`W0901 07:40:19.968570 1234 file.cc:12] `),
read past a launcher prefix (c10 writes `[rank1]:` itself)."""

MAX_TRACEBACK_LINES = 400
MAX_TRACEBACK_NOISE = 20
MAX_CHILD_FAILED_LINES = 200
MAX_NCCL_LINES = 12
MAX_ECC_SECTION_LINES = 12
MAX_QUERY_ROWS = 64
_QUERY_FIELD = regex.compile(r"^(?P<name>[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)(?: \[[^\]]+\])?$")
"""A column of `nvidia-smi --format=csv`'s header: a query field, with its unit unless `nounits`."""


def strip_prefix(line: str) -> str:
    """Drop a launcher prefix (`[rank3]: `, `[default0]:`, srun `3: `, Ray `(Worker pid=12) `,
    Open MPI's `--tag-output` `[1,3]<stderr>:`, which Horovod's mpirun launches print too).

    Framing keeps these in the text (evidence must match the user's log); assembly reads past them.
    """
    m = _PREFIX.match(line)
    return line[m.end() :] if m else line


class Verdict(Enum):
    CONTINUE = 1
    """The line belongs to the block; the block stays open."""
    CLOSE_WITH = 2
    """The line completes the block."""
    CLOSE_WITHOUT = 3
    """The line does not belong; the block is complete without it."""
    ABANDON = 4
    """The line does not belong and the block can never be completed: drop it."""


@dataclass(slots=True)
class Block:
    """A completed multi-line unit, ready for block rules."""

    unit: Unit
    text: str
    """What block rules' patterns match."""
    lines: list[str]
    entities: dict[str, str]
    offset: int
    line_no: int
    evidence: tuple[str, ...]


@dataclass(slots=True)
class Assembler:
    """Base: accumulates the raw lines of one open block."""

    unit: Unit
    offset: int
    line_no: int
    lines: list[str] = field(default_factory=list)
    key_offset: int = 0
    key_line_no: int = 0
    preceding: tuple[str, ...] = ()
    """Frames of a traceback whose exception line opened this block: kept as evidence."""

    def start(self, line: str) -> None:
        """Take the trigger line that opened the block."""
        self.lines.append(line)

    def offer(self, line: str, offset: int, line_no: int) -> Verdict:
        raise NotImplementedError

    def finish(self) -> Block | None:
        raise NotImplementedError


@dataclass(slots=True)
class TracebackAssembler(Assembler):
    noise: int = 0
    exception: str | None = None

    def offer(self, line: str, offset: int, line_no: int) -> Verdict:
        body = strip_prefix(line)
        if len(self.lines) >= MAX_TRACEBACK_LINES or TRIGGERS[Unit.TRACEBACK][0] in body:
            return Verdict.ABANDON
        if not body or body[:1].isspace() or body.startswith(_RICH_FRAME):
            self.lines.append(line)
            return Verdict.CONTINUE
        if _EXCEPTION_LINE.match(body):
            self.lines.append(line)
            self.exception = body
            self.key_offset, self.key_line_no = offset, line_no
            return Verdict.CLOSE_WITH
        # Another thread's output between frames: tolerate a little, then give up.
        self.noise += 1
        return Verdict.ABANDON if self.noise > MAX_TRACEBACK_NOISE else Verdict.CONTINUE

    def finish(self) -> Block | None:
        if self.exception is None:
            return None
        m = _EXCEPTION_LINE.match(self.exception)
        entities: dict[str, str] = {}
        if m:
            entities = {
                "exception": m["name"] or m["lower"],
                "exception_qualname": m["qualname"],
            }
        frames = [ln for ln in self.lines if strip_prefix(ln).lstrip().startswith('File "')]
        if frames:
            entities["last_frame"] = strip_prefix(frames[-1]).strip()
        return Block(
            unit=self.unit,
            text=self.exception,
            lines=self.lines,
            entities=entities,
            offset=self.key_offset,
            line_no=self.key_line_no,
            evidence=tuple(self.lines[:-1]),
        )


@dataclass(slots=True)
class ChildFailedAssembler(Assembler):
    in_root_cause: bool = False
    complete: bool = False
    fields: dict[str, str] = field(default_factory=dict)
    script: str | None = None

    def start(self, line: str) -> None:
        self.lines.append(line)
        # torch elastic's report cut above its root-cause section (an excerpt, a shipper that
        # split the record) opens on that section, which still says which rank failed and how.
        self.in_root_cause = strip_prefix(line).startswith("Root Cause")

    def offer(self, line: str, offset: int, line_no: int) -> Verdict:
        body = strip_prefix(line).strip()
        if TRIGGERS[Unit.TRACEBACK][0] in body or len(self.lines) >= MAX_CHILD_FAILED_LINES:
            return Verdict.CLOSE_WITHOUT
        self.lines.append(line)
        if body.startswith("Root Cause"):
            self.in_root_cause = True
        elif body.startswith("===="):
            if self.in_root_cause:
                return Verdict.CLOSE_WITH
        elif body.endswith(" FAILED") and self.script is None:
            self.script = body[: -len(" FAILED")]
        elif self.in_root_cause and (m := _FIELD.match(body)):
            self.fields.setdefault(m["key"], m["value"])
        return Verdict.CONTINUE

    def finish(self) -> Block | None:
        if not self.fields:
            return None
        f = self.fields
        entities: dict[str, str] = {}
        if "host" in f:
            entities["host"] = f["host"]
        rank = regex.match(
            r"(?P<rank>-?\d+)(?:\s*\(local_rank:\s*(?P<local>\d+)\))?", f.get("rank", "")
        )
        if rank:
            entities["rank"] = rank["rank"]
            if rank["local"] is not None:
                entities["local_rank"] = rank["local"]
        code = regex.match(r"(?P<code>-?\d+)(?:\s*\(pid:\s*(?P<pid>\d+)\))?", f.get("exitcode", ""))
        if code:
            entities["exitcode"] = code["code"]
            if code["pid"] is not None:
                entities["pid"] = code["pid"]
        sig = _signal_name(f.get("exitcode", ""), f.get("traceback", ""), entities.get("exitcode"))
        if sig:
            entities["signal"] = sig
        if "time" in f:
            entities["failed_at"] = f["time"]
        if self.script:
            entities["script"] = self.script
        summary = f"exitcode={entities.get('exitcode', '?')} signal={sig or 'none'}"
        return Block(
            unit=self.unit,
            text=summary,
            lines=self.lines,
            entities=entities,
            offset=self.offset,
            line_no=self.line_no,
            evidence=self.preceding + tuple(self.lines),
        )


def _signal_name(exitcode_field: str, traceback_field: str, exitcode: str | None) -> str | None:
    for text in (exitcode_field, traceback_field):
        if m := _SIGNAL_TEXT.search(text):
            return m[1]
    if exitcode and exitcode.startswith("-"):
        try:
            return signal.Signals(-int(exitcode)).name
        except ValueError:
            return None
    return None


@dataclass(slots=True)
class NcclErrorAssembler(Assembler):
    expect_detail: bool = False

    def offer(self, line: str, offset: int, line_no: int) -> Verdict:
        if len(self.lines) >= MAX_NCCL_LINES:
            return Verdict.CLOSE_WITHOUT
        body = strip_prefix(line)
        if self.expect_detail or _NCCL_CONTINUATION.match(body):
            self.expect_detail = body.strip() == "Last error:"
            self.lines.append(line)
            return Verdict.CONTINUE
        return Verdict.CLOSE_WITHOUT

    def finish(self) -> Block | None:
        bodies = [strip_prefix(ln).strip() for ln in self.lines]
        entities: dict[str, str] = {}
        for i, body in enumerate(bodies):
            if body == "Last error:" and i + 1 < len(bodies):
                entities["last_error"] = bodies[i + 1]
            if m := _NCCL_VERSION.search(body):
                entities.setdefault("nccl_version", m["v"].rstrip(",."))
        return Block(
            unit=self.unit,
            text="\n".join(bodies),
            lines=self.lines,
            entities=entities,
            offset=self.offset,
            line_no=self.line_no,
            evidence=self.preceding + tuple(self.lines),
        )


@dataclass(slots=True)
class EccSectionAssembler(Assembler):
    """`nvidia-smi -q` before R450 prints its ECC counts in sections: `Volatile` / `Aggregate`,
    then `Single Bit` / `Double Bit`, then `Device Memory : 2`, ..., `Total : 2`. A count means
    an uncorrectable error only under `Double Bit`, which a line rule cannot see; this block
    holds the fields under that header, up to the next header. Any other line holding the
    trigger (`Double Bit ECC : 0` in Retired Pages) opens nothing that finishes."""

    def offer(self, line: str, offset: int, line_no: int) -> Verdict:
        if len(self.lines) > MAX_ECC_SECTION_LINES or not _ECC_HEADER.match(self.lines[0]):
            return Verdict.CLOSE_WITHOUT
        if _ECC_FIELD.match(line):
            self.lines.append(line)
            return Verdict.CONTINUE
        return Verdict.CLOSE_WITHOUT

    def finish(self) -> Block | None:
        fields = [m for ln in self.lines[1:] if (m := _ECC_FIELD.match(ln)) is not None]
        if not _ECC_HEADER.match(self.lines[0]) or not fields:
            return None
        return Block(
            unit=self.unit,
            text="\n".join(f"{m['key']}: {m['value']}" for m in fields),
            lines=self.lines,
            entities={"section": "Double Bit"},
            offset=self.offset,
            line_no=self.line_no,
            evidence=tuple(self.lines),
        )


def _csv_cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().split(",")]


def _query_header(line: str) -> list[str] | None:
    """The field names of a `--query-gpu` CSV header, or None when the line is not one."""
    names = []
    for cell in _csv_cells(line):
        m = _QUERY_FIELD.match(cell)
        if m is None:
            return None
        names.append(m["name"])
    return names


@dataclass(slots=True)
class QueryCsvAssembler(Assembler):
    """`nvidia-smi --query-gpu=index,gpu_recovery_action --format=csv` prints a header of the
    field names, then one row per GPU (`1, Reset`): a value means something only under its
    column, which a line rule cannot see. This block holds the rows under such a header, up to
    the first line with another number of cells. A line that merely names a field (the command
    line itself, `--query-gpu=...`) is no header and opens nothing that finishes."""

    columns: list[str] = field(default_factory=list)
    """The header's field names; empty when the trigger line is no header."""

    def start(self, line: str) -> None:
        self.lines.append(line)
        self.columns = _query_header(line) or []

    def offer(self, line: str, offset: int, line_no: int) -> Verdict:
        if not self.columns or len(self.lines) > MAX_QUERY_ROWS:
            return Verdict.CLOSE_WITHOUT
        cells = _csv_cells(line)
        if len(cells) == len(self.columns) and not _query_header(line):
            self.lines.append(line)
            return Verdict.CONTINUE
        return Verdict.CLOSE_WITHOUT

    def finish(self) -> Block | None:
        columns = self.columns
        rows = [_csv_cells(line) for line in self.lines[1:]]
        if not columns or not rows:
            return None
        text: list[str] = []
        for number, row in enumerate(rows):
            gpu = row[columns.index("index")] if "index" in columns else str(number)
            text.extend(
                f"[gpu {gpu}] {column}: {value}" for column, value in zip(columns, row, strict=True)
            )
        return Block(
            unit=self.unit,
            text="\n".join(text),
            lines=self.lines,
            entities={"fields": ",".join(columns)},
            offset=self.offset,
            line_no=self.line_no,
            evidence=tuple(self.lines),
        )


def cpp_backtrace_line(line: str) -> int:
    """0 if the line is no part of a C++ backtrace, 1 for its `Exception raised from ...`
    header, 2 for a `frame #N:` line."""
    m = _CPP_BACKTRACE.match(strip_prefix(line))
    if m is None:
        return 0
    return 2 if m["frame"] is not None else 1


def warning_level(line: str) -> bool:
    """Whether the line is a message c10 (or glog) logged at warning level."""
    return _WARNING_LINE.match(strip_prefix(line)) is not None


def headless_exception(line: str, offset: int, line_no: int) -> Block | None:
    """The last line of a traceback whose header never arrived, as a one-line traceback block.

    Excerpts pasted into tickets, shippers that split or cut multi-line records and the line cap
    all lose the `Traceback (most recent call last):` header; the exception line alone still says
    what killed the process. Only Python's exact shape counts (`SomeError: message` at column 0),
    never an exception named inside a sentence, which is how handled errors are usually logged.
    The block carries `headless`: the engine gives it only to specific traceback rules (never
    the catch-all for unknown types), and the verdict's confidence says the evidence is partial.
    """
    body = strip_prefix(line)
    if not _HEADLESS.match(body):
        return None
    m = _EXCEPTION_LINE.match(body)
    if m is None:
        return None
    entities = {
        "exception": m["name"] or m["lower"],
        "exception_qualname": m["qualname"],
        "headless": "true",
    }
    return Block(
        unit=Unit.TRACEBACK,
        text=body,
        lines=[line],
        entities=entities,
        offset=offset,
        line_no=line_no,
        evidence=(),
    )


_KINDS: dict[Unit, type[Assembler]] = {
    Unit.TRACEBACK: TracebackAssembler,
    Unit.CHILD_FAILED: ChildFailedAssembler,
    Unit.NCCL_ERROR: NcclErrorAssembler,
    Unit.ECC_SECTION: EccSectionAssembler,
    Unit.QUERY_CSV: QueryCsvAssembler,
}


def open_block(
    unit: Unit, line: str, offset: int, line_no: int, preceding: tuple[str, ...] = ()
) -> Assembler:
    """Start a block on its trigger line."""
    assembler = _KINDS[unit](unit=unit, offset=offset, line_no=line_no, preceding=preceding)
    assembler.start(line)
    return assembler
