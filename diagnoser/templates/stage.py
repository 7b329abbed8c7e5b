"""The compression stage of the ingest pipeline: one compressor per job family, in memory.

A job's family comes from `set_family` (job metadata) or, failing that, from its id with run
numbers, dates and hashes stripped (`family_of`). A new job of a known family starts with the
family's filters. Jobs and families are bounded (least recently active evicted); each job's
log stores at most `max_entries` kept lines and runs (its counts keep growing). Pure and in
memory: `diagnoser.store.filters.FilterStore` keeps the families' filters in the database, and
`diagnoser.store.kept_lines.KeptLineStore` writes what `drain` hands it (each job's new kept
lines and runs, tagged by why they are kept, and its counts) so every replica serves the log.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from diagnoser.ingest.framing import LineBatch
from diagnoser.pipeline import StreamKey
from diagnoser.rules.registry import RuleRegistry
from diagnoser.templates.compressor import (
    Compressor,
    CompressorConfig,
    JobCompression,
    JobLog,
    KeptLine,
    Run,
)
from diagnoser.templates.family import family_of
from diagnoser.templates.signals import LossRead

MAX_JOBS = 1000
MAX_FAMILIES = 100
MAX_ENTRIES = 10_000

FIRST_N = 1000
"""Kept lines of each stream stored as `first` (never pruned)."""
LAST_N = 1000
"""Newest `last` kept lines of each stream the database keeps (older ones: pruned)."""
GUARDED_CAP = 5000
"""Failure lines stored per job as `guarded` (never pruned); past it they are `last`."""
NOVEL_CAP = 1000
"""First kept lines of a template stored per job as `novel` (never pruned)."""
OUTGOING_MAX = 20_000
"""Unflushed prunable entries (`last`, `run`) held per job; past it the oldest half goes
(the database would prune them anyway unless the flush is failing)."""
_TEMPLATES_MAX = 10_000


@dataclass(frozen=True, slots=True)
class StoredBounds:
    """How much of a job's compressed log the database keeps (see the constants)."""

    first_n: int = FIRST_N
    last_n: int = LAST_N
    guarded_cap: int = GUARDED_CAP
    novel_cap: int = NOVEL_CAP
    outgoing_max: int = OUTGOING_MAX


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """One row of `kept_lines`: a kept line (`first`, `guarded`, `novel`, `last`) or a run."""

    stream: str
    node: str | None
    rank: int | None
    line_no: int
    kind: str
    count: int
    text: str
    template_id: int
    template: str | None
    guarded: str | None


@dataclass(slots=True)
class JobFlush:
    """What one job adds to the database since the last flush (counts are deltas)."""

    job_id: str
    family: str
    entries: list[StoredEntry]
    lines_in: int
    lines_kept: int
    filtered: dict[int, int]
    """Template id -> lines filtered since the last flush."""
    filtered_by_text: dict[str, int]
    open_runs: list[dict[str, int | str]]
    pruned: bool


@dataclass(slots=True)
class _Tally:
    """Per job: what this replica has told the database, and the kinds handed out so far."""

    job: JobCompression
    family: str
    entries: list[StoredEntry] = field(default_factory=list)
    prunable: int = 0
    pruned: bool = False
    dirty: bool = False
    lines_in: int = 0
    lines_kept: int = 0
    filtered: Counter[int] = field(default_factory=Counter)
    first: Counter[str] = field(default_factory=Counter)
    guarded: int = 0
    novel: int = 0
    templates: set[int] = field(default_factory=set)
    carried_in: int = 0
    """Unflushed lines of an earlier incarnation of the job (evicted, then sent again)."""
    carried_kept: int = 0


class CompressionStage:
    """`Pipeline` stage: compresses every batch; `log(job_id)` is the job's compressed log."""

    def __init__(
        self,
        registry: RuleRegistry,
        config: CompressorConfig | None = None,
        *,
        max_jobs: int = MAX_JOBS,
        max_families: int = MAX_FAMILIES,
        max_entries: int = MAX_ENTRIES,
        bounds: StoredBounds | None = None,
    ) -> None:
        self.registry = registry
        self.config = config or CompressorConfig()
        self.max_jobs = max_jobs
        self.max_families = max_families
        self.max_entries = max_entries
        self.bounds = bounds or StoredBounds()
        self.families: OrderedDict[str, Compressor] = OrderedDict()
        self.jobs: OrderedDict[str, JobCompression] = OrderedDict()
        self._family_of_job: dict[str, str] = {}
        self.to_promote: set[str] = set()
        """Families a new job started in: their earlier jobs' templates are promoted to
        filters off the ingest path (`FilterStore`), not in `process`."""
        self.lines_in = 0
        self.lines_kept = 0
        self._tallies: dict[str, _Tally] = {}
        """Jobs with state to write; an evicted job stays until its last flush."""
        self._share_reads = False
        self._reads: tuple[LineBatch, dict[int, LossRead]] | None = None
        """The last batch and what its progress lines' extractors read for `loss_reads`."""

    def share_loss_reads(self) -> Callable[[LineBatch], Mapping[int, LossRead] | None]:
        """From now on keep, per batch, what the live diagnosis's loss reader would read from
        the progress lines this stage's extractors read and prove (`LossPlan`); the answer
        is `loss_reads`, for a stage after this one in the pipeline (`DiagnosisStage`)."""
        self._share_reads = True
        return self.loss_reads

    def loss_reads(self, batch: LineBatch) -> Mapping[int, LossRead] | None:
        """Batch index -> `LossRead` of the lines of `batch` read here (None: another batch)."""
        reads = self._reads
        return reads[1] if reads is not None and reads[0] is batch else None

    def set_family(self, job_id: str, family: str) -> None:
        """Name a job's family (`PUT /v1/jobs/{id}`, `X-Diagnoser-Job-Family`) before its
        first batch; once the job is being compressed its family stays the one it started in."""
        if job_id not in self.jobs:
            self._family_of_job[job_id] = family

    def family(self, job_id: str) -> str:
        return self._family_of_job.get(job_id) or family_of(job_id)

    def compressor(self, family: str) -> Compressor:
        found = self.families.get(family)
        if found is None:
            found = self.families[family] = Compressor(self.registry.active, self.config)
            while len(self.families) > self.max_families:
                self.families.popitem(last=False)
        else:
            self.families.move_to_end(family)
        return found

    def open(self, job_id: str) -> JobCompression:
        """The job's compression, started now if it is new (before its first batch)."""
        return self._job(job_id)

    def _job(self, job_id: str) -> JobCompression:
        job = self.jobs.get(job_id)
        if job is None:
            family = self.family(job_id)
            compressor = self.compressor(family)
            if compressor.jobs_started and compressor.config.promote:
                self.to_promote.add(family)
            job = self.jobs[job_id] = compressor.job(max_entries=self.max_entries, promote=False)
            job.log.outbox = []
            tally = _Tally(job, family)
            old = self._tallies.get(job_id)
            if old is not None:  # evicted, sent again before its last flush: keep what it had
                tally.entries = old.entries
                tally.prunable, tally.pruned, tally.dirty = old.prunable, old.pruned, old.dirty
                tally.carried_in = old.carried_in + old.job.log.lines_in - old.lines_in
                tally.carried_kept = old.carried_kept + old.job.log.lines_kept - old.lines_kept
            self._tallies[job_id] = tally
            while len(self.jobs) > self.max_jobs:
                evicted, _ = self.jobs.popitem(last=False)
                self._family_of_job.pop(evicted, None)
                gone = self._tallies.get(evicted)
                if gone is not None and not gone.dirty:
                    del self._tallies[evicted]
        else:
            self.jobs.move_to_end(job_id)
        return job

    def process(self, key: StreamKey, batch: LineBatch) -> None:
        job = self._job(key.job_id)
        before = job.log.lines_kept
        if self._share_reads:
            reads: dict[int, LossRead] = {}
            job.loss_reads = reads
            self._reads = (batch, reads)
        job.feed(
            batch.lines,
            stream=f"{key.node}/{key.stream}",
            ranks=batch.ranks,
            node=key.node,
            first_line_no=batch.first_line_no,
        )
        job.loss_reads = None
        self.lines_in += len(batch.lines)
        self.lines_kept += job.log.lines_kept - before
        tally = self._tallies.get(key.job_id)
        if tally is not None and tally.job is job:
            tally.dirty = True
            outbox = job.log.outbox
            if outbox:
                self._collect(tally, key, outbox)
                outbox.clear()

    def _collect(self, tally: _Tally, key: StreamKey, outbox: list[KeptLine | Run]) -> None:
        """Tag the batch's kept lines and runs by why the database keeps them."""
        stream = key.stream
        miner = tally.job.compressor.miner
        bounds = self.bounds
        for e in outbox:
            node: str | None
            rank: int | None
            guarded: str | None
            template: str | None
            if isinstance(e, Run):
                kind, node, rank, text, template = "run", key.node, None, e.template, None
                guarded = None
            else:
                node, rank, text, guarded, template = e.node, e.rank, e.text, None, None
                if e.guarded is not None:
                    guarded = e.guarded.value
                if guarded is not None and tally.guarded < bounds.guarded_cap:
                    kind = "guarded"
                    tally.guarded += 1
                    view = miner.get(e.template_id)
                    template = view.text if view is not None else None
                elif tally.first[stream] < bounds.first_n:
                    kind = "first"
                    tally.first[stream] += 1
                elif e.template_id not in tally.templates and tally.novel < bounds.novel_cap:
                    kind = "novel"
                    tally.novel += 1
                else:
                    kind = "last"
                if len(tally.templates) < _TEMPLATES_MAX:
                    tally.templates.add(e.template_id)
            count = e.count if isinstance(e, Run) else 1
            line_no = e.first_line if isinstance(e, Run) else e.line_no
            tally.entries.append(
                StoredEntry(
                    stream, node, rank, line_no, kind, count, text, e.template_id, template, guarded
                )
            )
            if kind in ("last", "run"):
                tally.prunable += 1
        if tally.prunable > bounds.outgoing_max:
            drop = tally.prunable - bounds.outgoing_max // 2
            kept: list[StoredEntry] = []
            for entry in tally.entries:
                if drop and entry.kind in ("last", "run"):
                    drop -= 1
                    continue
                kept.append(entry)
            tally.entries = kept
            tally.prunable = bounds.outgoing_max // 2
            tally.pruned = True

    def drain(self, only: str | None = None) -> list[JobFlush]:
        """Each changed job's new rows and count deltas (all jobs, or `only` that one)."""
        ids = [only] if only is not None else list(self._tallies)
        out: list[JobFlush] = []
        for job_id in ids:
            tally = self._tallies.get(job_id)
            if tally is None or not tally.dirty:
                continue
            job = tally.job
            log = job.log
            texts = job._texts()
            filtered: dict[int, int] = {}
            by_text: dict[str, int] = {}
            for tid, n in log.filtered_by_template.items():
                delta = n - tally.filtered[tid]
                if delta:
                    filtered[tid] = delta
                    name = texts.get(tid, "")
                    by_text[name] = by_text.get(name, 0) + delta
            runs: list[dict[str, int | str]] = [
                {
                    "template_id": r.template_id,
                    "template": r.template,
                    "count": r.count,
                    "first_line": r.first_line,
                }
                for r in job.pending_runs()
            ]
            out.append(
                JobFlush(
                    job_id,
                    tally.family,
                    tally.entries,
                    log.lines_in - tally.lines_in + tally.carried_in,
                    log.lines_kept - tally.lines_kept + tally.carried_kept,
                    filtered,
                    by_text,
                    runs,
                    tally.pruned,
                )
            )
            tally.entries = []
            tally.prunable = 0
            tally.pruned = False
            tally.dirty = False
            tally.carried_in = tally.carried_kept = 0
            tally.lines_in = log.lines_in
            tally.lines_kept = log.lines_kept
            tally.filtered.update(filtered)
            if job_id not in self.jobs:
                del self._tallies[job_id]
        return out

    def restore(self, flushes: list[JobFlush]) -> None:
        """A flush that failed: its rows and deltas go back, to be written by the next one."""
        for f in flushes:
            tally = self._tallies.get(f.job_id)
            if tally is None:
                job = self.jobs.get(f.job_id)
                if job is None:
                    continue
                tally = self._tallies[f.job_id] = _Tally(job, f.family)
            tally.entries[:0] = f.entries
            tally.prunable += sum(e.kind in ("last", "run") for e in f.entries)
            tally.pruned = tally.pruned or f.pruned
            tally.dirty = True
            tally.lines_in -= f.lines_in
            tally.lines_kept -= f.lines_kept
            tally.filtered.subtract(f.filtered)

    def job_compressor(self, job_id: str) -> Compressor | None:
        """The family compressor of a job this stage has seen (None once evicted)."""
        job = self.jobs.get(job_id)
        return None if job is None else job.compressor

    def log(self, job_id: str) -> JobLog | None:
        job = self.jobs.get(job_id)
        return None if job is None else job.log
