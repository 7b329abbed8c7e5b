"""Launcher and container-runtime prefixes: who wrote a line, and when.

Two kinds of prefix, treated differently on purpose:

- Launcher prefixes (torchrun ``[rank3]:``, torchelastic ``[default0]:``, ``srun --label``
  ``0: ``) are part of what the job printed. Line text keeps them verbatim, because evidence
  quoted back to a user must match their log; they are only read into per-line metadata.
- The Kubernetes CRI header (``<RFC 3339 time> stdout|stderr P|F <message>``) is the container
  runtime's framing, not the application's text: it is stripped, its time kept as epoch
  nanoseconds, and ``P`` (partial) records joined with the records that complete them.

Every prefix starts a line and is bounded in length, so most chunks are ruled out cheaply:
first by `line_starts` (one character per line, a C-level pass whatever the line lengths), then
by one regex search over the chunk's text (`find_prefix`). Only a chunk that has a prefix pays
for per-line parsing, done on `line_heads` (each line's first `HEAD_CHARS` characters).
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime
from itertools import repeat
from operator import add, itemgetter, mul, sub
from typing import cast

HEAD_CHARS = 48
"""Every prefix parsed here fits in a line's first HEAD_CHARS characters."""

_FIRST_CHAR = itemgetter(slice(0, 1))
_HEAD = itemgetter(slice(0, HEAD_CHARS))
_MAY_LEAD = re.compile(r"[0-9 \[]")

# The bounds below keep each prefix inside HEAD_CHARS: a label of at most 18 characters, then
# a role of at most 16 letters and a 7-digit rank. One match per line; each consumes its "\n".
_LABEL = r" {0,8}(\d{1,8}):(?: |(?=\n))"
_BRACKET = r"\[([A-Za-z_][A-Za-z_-]{0,15}\d{1,7})\]:"
_CRI_HEADER = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) std(?:out|err) [PF]"
_ANY = rf"(?:{_LABEL}|{_BRACKET}|{_CRI_HEADER})"
_ANY_FIRST = re.compile(_ANY)
_ANY_NEXT = re.compile(r"\n" + _ANY)
_LABEL_FIRST = re.compile(_LABEL)
_LABEL_NEXT = re.compile(r"\n" + _LABEL)
_TORCH = re.compile(rf"(?:{_BRACKET})?[^\n]*\n")
_SRUN_TORCH = re.compile(rf"(?:{_LABEL})?(?:{_BRACKET})?[^\n]*\n")
_CRI = re.compile(
    r"(?:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)"
    r" (stdout|stderr) ([PF])(?: |(?=\n)))?([^\n]*)\n"
)
_DIGITS = "0123456789"
_CACHE_CAP = 1 << 16
_NS = 1_000_000_000


def line_starts(lines: list[str]) -> str:
    """The first character of every line ("" for an empty one), joined into one string."""
    return "".join(map(_FIRST_CHAR, lines))


def may_have_prefix(starts: str) -> bool:
    """False when no line (per `line_starts`) begins the way any prefix begins."""
    return _MAY_LEAD.search(starts) is not None


def find_prefix(text: str) -> bool:
    """Whether any line of `text` (lines each followed by "\\n") starts with a prefix."""
    return _ANY_FIRST.match(text) is not None or _ANY_NEXT.search(text) is not None


def line_heads(lines: list[str]) -> str:
    """Each line's first HEAD_CHARS characters, each followed by "\\n"."""
    return "\n".join(map(_HEAD, lines)) + "\n" if lines else ""


class _GlobalRankOf(dict[str, int | None]):
    """Bracket key -> global rank: ``rank12`` -> 12; any other role, or "", -> None."""

    def __missing__(self, key: str) -> int | None:
        if len(self) > _CACHE_CAP:
            self.clear()
        value = int(key[4:]) if key.startswith("rank") and key[4:].isdigit() else None
        self[key] = value
        return value


class _LocalRankOf(dict[str, int | None]):
    """Bracket key -> local rank: ``default3`` -> 3; ``rank12`` and "" -> None."""

    def __missing__(self, key: str) -> int | None:
        if len(self) > _CACHE_CAP:
            self.clear()
        role = key.rstrip(_DIGITS)
        value = None if not key or role == "rank" else int(key[len(role) :])
        self[key] = value
        return value


class _TaskOf(dict[str, int | None]):
    """srun label digits -> task id; "" (no label) -> None."""

    def __missing__(self, key: str) -> int | None:
        if len(self) > _CACHE_CAP:
            self.clear()
        value = int(key) if key else None
        self[key] = value
        return value


class _SecondOf(dict[str, int | None]):
    """``2024-05-01T10:00:00`` -> Unix seconds; an impossible date or time -> None."""

    def __missing__(self, key: str) -> int | None:
        if len(self) > _CACHE_CAP:
            self.clear()
        try:
            value: int | None = calendar.timegm(datetime.fromisoformat(key).timetuple())
        except ValueError:
            value = None
        self[key] = value
        return value


class _OffsetOf(dict[str, int]):
    """UTC offset suffix -> seconds east of UTC: ``Z`` -> 0, ``-05:30`` -> -19800."""

    def __missing__(self, key: str) -> int:
        value = 0 if len(key) != 6 else int(key[1:3]) * 3600 + int(key[4:6]) * 60
        value = -value if key.startswith("-") else value
        self[key] = value
        return value


def _or_none(values: list[int | None]) -> list[int | None] | None:
    return values if values.count(None) < len(values) else None


@dataclass(frozen=True, slots=True)
class LauncherFields:
    """Per-line launcher metadata for one batch; a list is None when no line had that prefix."""

    ranks: list[int | None] | None
    """Global rank: ``[rankN]:``, else the srun task id of a line with no role prefix."""
    local_ranks: list[int | None] | None
    """Local rank from torchelastic's ``[{role}{local_rank}]:`` prefix."""
    tasks: list[int | None] | None
    """Slurm task id from ``srun --label``."""


class LauncherPrefixes:
    """Reads launcher prefixes; one per stream (it caches prefix keys, nothing else).

    An srun task id is taken as the global rank only when the line has no torchelastic role
    prefix: srun launching one task per rank is the usual setup, but when srun starts one
    torchrun per node the task id is a node index, and the ``[roleN]:`` after it says so.
    """

    __slots__ = ("_global", "_local", "_task")

    def __init__(self) -> None:
        self._global = _GlobalRankOf()
        self._local = _LocalRankOf()
        self._task = _TaskOf()

    def parse(self, heads: str) -> LauncherFields | None:
        """Per-line fields from `line_heads`, or None when no line has a launcher prefix."""
        if _LABEL_FIRST.match(heads) is not None or _LABEL_NEXT.search(heads) is not None:
            return self._parse_srun(heads)
        if "]:" not in heads:
            return None
        keys = _TORCH.findall(heads)
        ranks = _or_none(list(map(self._global.__getitem__, keys)))
        local = _or_none(list(map(self._local.__getitem__, keys)))
        if ranks is None and local is None:
            return None
        return LauncherFields(ranks, local, None)

    def _parse_srun(self, heads: str) -> LauncherFields:
        found: list[tuple[str, str]] = _SRUN_TORCH.findall(heads)
        tasks = [self._task[task] for task, _ in found]
        ranks = [
            self._global[key] if key else task for (_, key), task in zip(found, tasks, strict=True)
        ]
        local = [self._local[key] for _, key in found]
        return LauncherFields(_or_none(ranks), _or_none(local), _or_none(tasks))


@dataclass(slots=True)
class _Partial:
    """A CRI line still arriving as ``P`` records: its first record's time and bounded bytes."""

    ts: int | None
    data: bytearray
    dropped: int


@dataclass(frozen=True, slots=True)
class CriLines:
    """CRI records turned back into application lines."""

    lines: list[str]
    ends: list[int]
    ts: list[int | None]
    truncated: list[tuple[int, int]]
    """(line index, bytes dropped) for joined lines that grew past the limit."""


class CriRecords:
    """Strips CRI headers and joins partial records; one per stream, stateful across chunks.

    A ``P`` record produces no line: its text waits (at most ``limit + 1`` bytes per CRI
    stream) for the ``F`` record of the same stdout/stderr stream, and the joined line ends
    where that ``F`` record ends and carries the first record's time. Lines without a CRI
    header pass through unchanged with time None.
    """

    __slots__ = ("_limit", "_offset", "_partial", "_second")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._partial: dict[str, _Partial] = {}
        self._second = _SecondOf()
        self._offset = _OffsetOf()

    @staticmethod
    def may_contain(heads: str) -> bool:
        """Cheap check on `line_heads`: False means no line has a CRI header."""
        return " stdout " in heads or " stderr " in heads

    def strip(self, text: str, lines: list[str], ends: list[int]) -> CriLines | None:
        """Return the application lines, or None when no line has a CRI header.

        `text` is `lines` joined, each followed by "\\n".
        """
        found: list[tuple[str, str, str, str, str, str]] = _CRI.findall(text)
        if not found:
            return None
        seconds, fractions, zones, streams, tags, messages = zip(*found, strict=True)
        if not any(seconds):
            return None
        stamps = self._times(seconds, fractions, zones)
        if "P" not in tags and not self._partial:
            return CriLines(list(messages), ends, stamps, [])
        out_lines: list[str] = []
        out_ends: list[int] = []
        out_ts: list[int | None] = []
        truncated: list[tuple[int, int]] = []
        for second, stream, tag, record, ts, end in zip(
            seconds, streams, tags, messages, stamps, ends, strict=True
        ):
            message, line_ts = record, ts
            if second:
                partial = self._partial.get(stream)
                if tag == "P":
                    if partial is None:
                        self._partial[stream] = partial = _Partial(ts, bytearray(), 0)
                    self._append(partial, message)
                    continue
                if partial is not None:
                    del self._partial[stream]
                    self._append(partial, message)
                    message, dropped = self._join(partial)
                    line_ts = partial.ts
                    if dropped:
                        truncated.append((len(out_lines), dropped))
            out_lines.append(message)
            out_ends.append(end)
            out_ts.append(line_ts)
        return CriLines(out_lines, out_ends, out_ts, truncated)

    def flush(self, end: int) -> CriLines:
        """Emit lines still waiting for their ``F`` record (the stream ended without one)."""
        out = CriLines([], [], [], [])
        for partial in self._partial.values():
            message, dropped = self._join(partial)
            if dropped:
                out.truncated.append((len(out.lines), dropped))
            out.lines.append(message)
            out.ends.append(end)
            out.ts.append(partial.ts)
        self._partial.clear()
        return out

    def _append(self, partial: _Partial, message: str) -> None:
        room = self._limit + 1 - len(partial.data)
        raw = message.encode()
        if len(raw) <= room:
            partial.data += raw
        else:
            partial.data += raw[:room]
            partial.dropped += len(raw) - room

    def _join(self, partial: _Partial) -> tuple[str, int]:
        size = len(partial.data) + partial.dropped
        if size <= self._limit:
            return partial.data.decode(), 0
        # Cutting at the limit may split a character: drop its leading bytes too.
        kept = partial.data[: self._limit].decode("utf-8", "ignore")
        return kept, size - len(kept.encode())

    def _times(
        self, seconds: tuple[str, ...], fractions: tuple[str, ...], zones: tuple[str, ...]
    ) -> list[int | None]:
        """Unix epoch nanoseconds per line; None without a header or with an impossible date.

        Seconds repeat from line to line, so they are cached; the rest is C-level maps.
        """
        whole = list(map(self._second.__getitem__, seconds))
        nanos = map(int, map(str.ljust, fractions, repeat(9), repeat("0")))
        if None in whole:
            return [
                None if second is None else (second - self._offset[zone]) * _NS + nano
                for second, zone, nano in zip(whole, zones, nanos, strict=True)
            ]
        utc = map(sub, cast(list[int], whole), map(self._offset.__getitem__, zones))
        return list(map(add, map(mul, utc, repeat(_NS)), nanos))


# Host headers: which machine wrote a line, when a file holds several machines' lines (a
# journal export, a syslog server's file, pdsh or DeepSpeed output). Each form is anchored at
# a line start by a structure ordinary text does not have (a syslog timestamp and a `tag:`,
# srun's `error: HOST: task N`), so a word at the start of a log message is never taken for a
# host. The bare `HOST: ` of pdsh is the exception: `LineHosts` reads it only in a file whose
# lines mostly carry it.

HOST_HEAD_CHARS = 192
"""Every host header parsed here fits in a line's first HOST_HEAD_CHARS characters."""

# A log level where a syslog header has its host is an application's own log format
# (`2024-05-01T10:00:00Z INFO trainer: ...`), not a host.
_NOT_LEVEL = r"(?!(?i:info|warn|warning|error|err|debug|critical|crit|fatal|trace|notice)\b)"
_HOSTNAME = _NOT_LEVEL + r"([A-Za-z0-9](?:[A-Za-z0-9._-]{0,125}[A-Za-z0-9])?)"
_SYSLOG_TAG = r" [A-Za-z0-9_()./@-]{1,64}(?:\[\d{1,10}\])?:(?=[ \n])"
_SRUN_LABEL = r" {0,8}\d{1,8}: "
_ISO_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)"
_PRI = r"(?:<\d{1,3}>)?"
_BSD_TIME = r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})?"
_FULL_TIME = r"[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,9})? [A-Za-z0-9+_/-]{1,32}"
_UNIX_TIME = r"\d{9,11}\.\d{1,9}"
_SYSLOG_TIME = rf"(?:{_PRI}(?:{_BSD_TIME}|{_ISO_TIME})|{_FULL_TIME}|{_UNIX_TIME})"
_HOST_FORMS = (
    # BSD syslog as rsyslog writes it, rsyslog's RFC 3339 file format, and journalctl -o
    # short, short-precise, short-iso(-precise), short-full and short-unix
    (
        ("syslog header",),
        rf"{_SYSLOG_TIME} {_HOSTNAME}{_SYSLOG_TAG}",
    ),
    # RFC 5424: `<PRI>1 TIMESTAMP HOST APP PROCID MSGID`; a nil host (`-`) names no one
    (
        ("RFC 5424 syslog header",),
        rf"<\d{{1,3}}>1 (?:-|{_ISO_TIME}) {_HOSTNAME} \S{{1,48}} \S{{1,128}} \S{{1,32}} ",
    ),
    # srun's report of a failed task; slurmstepd's `*** JOB 123 ON gpu-3 CANCELLED AT ...`;
    # either may follow an `srun --label` prefix
    (
        ("srun error line", "slurmstepd notice"),
        rf"(?:{_SRUN_LABEL})?(?:srun: error: {_HOSTNAME}: tasks? \d|slurmstepd"
        rf"(?:-[A-Za-z0-9._-]{{1,64}})?: error: \*\*\* (?:JOB|STEP) [\d.]{{1,24}} ON {_HOSTNAME} )",
    ),
    # Ray's worker prefix names the worker's address: `(RayTrainWorker pid=12, ip=10.0.0.3)`
    (
        ("Ray worker prefix",),
        r"\((?:[A-Za-z_][\w.]{0,63} )?pid=\d{1,10}, ip=([0-9A-Fa-f.:]{3,45})\) ",
    ),
)
_HOST_KINDS = tuple(kind for kinds, _ in _HOST_FORMS for kind in kinds)
"""The kind of header of each capture group, in group order."""
_HOST_ALTERNATIVES = "(?=[<A-Z0-9 s(])(?:" + "|".join(form for _, form in _HOST_FORMS) + ")"
_HOST_LINE = re.compile(f"(?:{_HOST_ALTERNATIVES})?[^\\n]*\\n")
_HOST_FIRST = re.compile(_HOST_ALTERNATIVES)
_HOST_NEXT = re.compile("\n" + _HOST_ALTERNATIVES)
# pdsh / clush / DeepSpeed's multi-node runner: `gpu-3: <line>`. Lower-case labels with a
# digit in the first, as cluster node names have (`gpu-3`, `node017`, `ip-10-0-0-1.ec2`), so
# `RuntimeError:` or `boto3.exceptions.S3UploadFailedError:` do not qualify.
_PDSH_HOST = r"[a-z][a-z0-9-]{0,62}(?<=\d)[a-z0-9-]{0,62}"
_PDSH = rf"({_PDSH_HOST}(?:\.[a-z0-9-]{{1,63}}){{0,8}}): "
_PDSH_LINE = re.compile(rf"(?:{_PDSH})?[^\n]*\n")
_PDSH_FIRST = re.compile(_PDSH)
PDSH_SAMPLE = 1000
"""Lines of a file's first batch that decide whether the file is pdsh output."""
_CONTINUES = (" ", "\t")
PDSH_KIND = "pdsh host prefix"


def host_of(line: str, pdsh: bool = False) -> tuple[str, str] | None:
    """(host, the kind of header that names it) for one line, or None."""
    m = _HOST_FIRST.match(line, 0, HOST_HEAD_CHARS)
    if m is not None:
        index = next(i for i, group in enumerate(m.groups()) if group)
        return m.group(index + 1), _HOST_KINDS[index]
    if pdsh and (p := _PDSH_FIRST.match(line, 0, HOST_HEAD_CHARS)) is not None:
        return p.group(1), PDSH_KIND
    return None


class LineHosts:
    """Per-line host names of one file's lines, batch by batch; one per file.

    A line without a header of its own that starts with white space continues the line
    before it (journalctl indents the rest of a multi-line message) and keeps its host.
    Whether the file is pdsh output is decided on its first batch: at least half of the
    sampled non-empty lines start with a host prefix.
    """

    __slots__ = ("_last", "pdsh")

    def __init__(self) -> None:
        self.pdsh: bool | None = None
        self._last: str | None = None

    def parse(self, lines: list[str]) -> list[str | None] | None:
        """The host of each line (None where none is named), or None when no line names one."""
        if not lines:
            return None
        if self.pdsh is None:
            sample = [line for line in lines[:PDSH_SAMPLE] if line.strip()]
            hits = sum(1 for line in sample if _PDSH_FIRST.match(line, 0, HOST_HEAD_CHARS))
            self.pdsh = bool(sample) and 2 * hits >= len(sample)
        # One C-level search rules out the usual batch, where no line names a host.
        text = "\n".join(lines) + "\n"
        if (
            self._last is None
            and not self.pdsh
            and _HOST_FIRST.match(text) is None
            and _HOST_NEXT.search(text) is None
        ):
            return None
        found: list[tuple[str, ...]] = _HOST_LINE.findall(text)
        hosts = list(map("".join, found))
        if self.pdsh:
            hosts = [h or p for h, p in zip(hosts, _PDSH_LINE.findall(text), strict=True)]
        if all(hosts):  # every line has its header: nothing continues, nothing is missing
            self._last = hosts[-1]
            return list[str | None](hosts)
        if self._last is None and not any(hosts):
            return None
        out: list[str | None] = []
        last = self._last
        for line, host in zip(lines, hosts, strict=True):
            if host:
                last = host
            elif not line.startswith(_CONTINUES):
                last = None
            out.append(last)
        self._last = last
        return out if any(out) else None
