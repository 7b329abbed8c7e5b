"""The compression stage of the ingest pipeline: one compressor per job family, in memory.

A job's family comes from `set_family` (job metadata) or, failing that, from its id with run
numbers, dates and hashes stripped (`family_of`). A new job of a known family starts with the
family's filters. Jobs and families are bounded (least recently active evicted); each job's
log stores at most `max_entries` kept lines and runs (its counts keep growing). Pure and in
memory: `diagnoser.store.filters.FilterStore` keeps the families' filters in the database.
"""

from __future__ import annotations

from collections import OrderedDict

from diagnoser.ingest.framing import LineBatch
from diagnoser.pipeline import StreamKey
from diagnoser.rules.registry import RuleRegistry
from diagnoser.templates.compressor import (
    Compressor,
    CompressorConfig,
    JobCompression,
    JobLog,
)
from diagnoser.templates.family import family_of

MAX_JOBS = 1000
MAX_FAMILIES = 100
MAX_ENTRIES = 10_000


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
    ) -> None:
        self.registry = registry
        self.config = config or CompressorConfig()
        self.max_jobs = max_jobs
        self.max_families = max_families
        self.max_entries = max_entries
        self.families: OrderedDict[str, Compressor] = OrderedDict()
        self.jobs: OrderedDict[str, JobCompression] = OrderedDict()
        self._family_of_job: dict[str, str] = {}
        self.to_promote: set[str] = set()
        """Families a new job started in: their earlier jobs' templates are promoted to
        filters off the ingest path (`FilterStore`), not in `process`."""
        self.lines_in = 0
        self.lines_kept = 0

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
            while len(self.jobs) > self.max_jobs:
                evicted, _ = self.jobs.popitem(last=False)
                self._family_of_job.pop(evicted, None)
        else:
            self.jobs.move_to_end(job_id)
        return job

    def process(self, key: StreamKey, batch: LineBatch) -> None:
        job = self._job(key.job_id)
        before = job.log.lines_kept
        job.feed(batch.lines, stream=f"{key.node}/{key.stream}", ranks=batch.ranks, node=key.node)
        self.lines_in += len(batch.lines)
        self.lines_kept += job.log.lines_kept - before

    def job_compressor(self, job_id: str) -> Compressor | None:
        """The family compressor of a job this stage has seen (None once evicted)."""
        job = self.jobs.get(job_id)
        return None if job is None else job.compressor

    def log(self, job_id: str) -> JobLog | None:
        job = self.jobs.get(job_id)
        return None if job is None else job.log
