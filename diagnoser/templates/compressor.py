"""The compressor: miner + guard + filter set of one job family, and the compressed log of a job.

Per batch: the guard marks failure lines, the filter set matches every line at once, filters
that hit a guarded line are disabled on the spot (and their lines kept), the rest of the matched
lines are dropped and counted, and only the kept lines reach the miner. A template the miner has
seen `min_count` times, that never took a guarded line and has no failure word, is proposed as a
filter and validated; from the next batch on its lines are filtered. A new job of the family
(`Compressor.job`) starts with every filter the family has learned.

`JobLog` is what a person (or the LLM) reads: kept lines with their line numbers, filtered runs
summarised as `[x 12,345 lines] <template>`, storms of one failure template over many ranks
collapsed to one entry, and the training signals read from progress lines. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import regex

from diagnoser.rules.ruleset import RuleSet
from diagnoser.templates.filters import Filter, FilterSet, Proposer, Rejection, candidates
from diagnoser.templates.guard import Guard, GuardReason, GuardState
from diagnoser.templates.miner import MinerConfig, TemplateMiner
from diagnoser.templates.model import Slot, TemplateView
from diagnoser.templates.signals import (
    PROGRESS_WORDS,
    Extractor,
    LossRead,
    SignalConfig,
    Signals,
)
from diagnoser.templates.validation import Validator, compile_filter

_RANK = regex.compile(
    r"(?i)\[rank[ :]?(\d{1,6})\]|\brank[ =:](\d{1,6})\b|^\s*(\d{1,6}): "
    r"|^[A-Za-z][\w.-]{0,62}:\d+:\d+ \[(\d{1,4})\]"
)
_NODE = regex.compile(r"^([A-Za-z][\w.-]{0,62}):\d+:\d+ \[\d+\]|\b(?:host|node)[=: ]([\w.-]{1,63})")


_NUMBERS = frozenset((Slot.INT, Slot.FLOAT, Slot.DURATION))


@dataclass(frozen=True, slots=True)
class CompressorConfig:
    min_count: int = 8
    """Lines a template must have taken before it may become a filter..."""
    min_count_numeric: int = 3
    """...or this many (at most `min_count`) when every slot is a number (`<int>`, `<float>`,
    `<duration>`): its lines then differ in values alone, every word of text the same in each,
    and the filter's typed slots keep checking the values (a NaN loss is no float). An
    evaluation line printed every few hundred steps is kept three times, not eight."""
    chunk_lines: int = 4096
    """Batches are compressed in chunks of this many lines, so a filter learned early in a big
    batch applies to the rest of it..."""
    warmup_chunk_lines: int = 32
    """...and of this many while the last chunk kept over a quarter of its lines (warm-up, or
    a burst of novel lines): a new filter then applies 32 lines later."""
    storm_min: int = 4
    """Kept lines of one failure template (on two or more ranks or nodes) that make a storm."""
    signals: SignalConfig = field(default_factory=SignalConfig)
    read_signals: bool = True
    """Read step, loss, lr, grad norm and throughput from progress lines (filtered or kept)."""
    promote: bool = True
    """When a new job of the family starts, propose filters for the templates earlier jobs
    left unfiltered (seen fewer than `min_count` times): for the new job they are not novel."""
    promote_max: int = 1000
    """Templates tried per promotion (most frequent first)."""
    engine: str = "auto"
    """Matcher and guard engine: "hyperscan", "regex" or "auto"."""
    build_in_thread: bool = False
    """Compile the filters' matcher in a thread (`FilterSet.background`): the service's
    setting, so that a compile of hundreds of filters never stops its event loop."""
    miner: MinerConfig = field(default_factory=MinerConfig)


@dataclass(frozen=True, slots=True)
class KeptLine:
    line_no: int
    text: str
    template_id: int
    guarded: GuardReason | None
    rank: int | None
    node: str | None


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive filtered lines of one template between two kept lines."""

    template_id: int
    template: str
    count: int
    first_line: int


@dataclass(slots=True)
class Storm:
    """One failure template on many ranks: shown once, in place of its first line."""

    template_id: int
    template: str
    count: int
    ranks: set[int]
    nodes: set[str]
    first: KeptLine
    last: KeptLine


Entry = KeptLine | Run | Storm


@dataclass(slots=True)
class JobLog:
    """The compressed log of one job. `entries` is in input order."""

    lines_in: int = 0
    max_entries: int | None = None
    """Kept lines and runs stored (None: all). Past it only counts grow: the service keeps a
    bounded log per job; the CLI keeps everything."""
    kept_count: int = 0
    kept: list[KeptLine] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    filtered_by_template: Counter[int] = field(default_factory=Counter)
    template_ids: list[int] | None = None
    """Per input line, its template id (only when the job was opened with `record=True`)."""
    signals: Signals = field(default_factory=Signals)
    outbox: list[KeptLine | Run] | None = None
    """Every kept line and closed run in order, bound or not (when set): the service drains it
    into the database (`diagnoser.store.kept_lines`), which keeps its own bound."""
    _order: list[tuple[int, int]] = field(default_factory=list)
    """(kind, index) of each entry: 0 = kept line, 1 = run."""

    @property
    def lines_kept(self) -> int:
        return self.kept_count

    @property
    def ratio(self) -> float:
        """Kept lines over input lines (0 for an empty job)."""
        return self.kept_count / self.lines_in if self.lines_in else 0.0

    @property
    def full(self) -> bool:
        return self.max_entries is not None and len(self._order) >= self.max_entries

    def storms(self, storm_min: int = 4) -> list[Storm]:
        """Guarded templates kept `storm_min`+ times over two or more ranks or nodes."""
        groups: dict[int, list[KeptLine]] = {}
        for k in self.kept:
            if k.guarded is not None:
                groups.setdefault(k.template_id, []).append(k)
        storms: list[Storm] = []
        for tid, lines in groups.items():
            ranks = {k.rank for k in lines if k.rank is not None}
            nodes = {k.node for k in lines if k.node is not None}
            if len(lines) >= storm_min and (len(ranks) >= 2 or len(nodes) >= 2):
                storms.append(Storm(tid, "", len(lines), ranks, nodes, lines[0], lines[-1]))
        return storms

    def entries(self, templates: dict[int, str], storm_min: int = 4) -> list[Entry]:
        """Kept lines interleaved with filtered runs; storms replace their lines."""
        storms = {s.template_id: s for s in self.storms(storm_min)}
        for s in storms.values():
            s.template = templates.get(s.template_id, s.first.text)
        out: list[Entry] = []
        shown: set[int] = set()
        for kind, index in self._order:
            if kind == 1:
                out.append(self.runs[index])
                continue
            k = self.kept[index]
            storm = storms.get(k.template_id) if k.guarded is not None else None
            if storm is None:
                out.append(k)
            elif k.template_id not in shown:
                shown.add(k.template_id)
                out.append(storm)
        return _merge_runs(out)


def _merge_runs(entries: list[Entry]) -> list[Entry]:
    """Runs of one template split only by lines a storm absorbed become one run."""
    out: list[Entry] = []
    for e in entries:
        last = out[-1] if out else None
        if isinstance(e, Run) and isinstance(last, Run) and last.template_id == e.template_id:
            out[-1] = Run(e.template_id, e.template, last.count + e.count, last.first_line)
        else:
            out.append(e)
    return out


class Compressor:
    """One job family's learned state, shared by every job of the family (not thread-safe)."""

    def __init__(
        self,
        ruleset: RuleSet,
        config: CompressorConfig | None = None,
        *,
        miner: TemplateMiner | None = None,
        filters: FilterSet | None = None,
    ) -> None:
        self.config = config or CompressorConfig()
        self.guard = Guard(ruleset, engine=self.config.engine)
        self.miner = miner or TemplateMiner(self.config.miner)
        self.filters = filters or FilterSet(
            engine=self.config.engine, background=self.config.build_in_thread
        )
        self.validator = Validator(self.guard.rule_examples)
        self.tainted: set[int] = set()
        """Templates that took a guarded line: never filtered."""
        self._seen: Counter[int] = Counter()
        self._next_try: dict[int, int] = {}
        self._progress: dict[int, bool] = {}
        self._extractors: dict[int, Extractor | None] = {}
        self._last_readers: tuple[list[Filter], int, dict[int, Extractor | bool]] | None = None
        self.lines_in = 0
        """Lines fed across every job of the family (the miner's line numbers)."""
        self.jobs_started = 0
        self._promoted: dict[int, str] = {}
        """Template id -> the text a promotion last tried (tried once per text)."""

    def job(
        self,
        *,
        record: bool = False,
        max_entries: int | None = None,
        promote: bool | None = None,
    ) -> JobCompression:
        """Start compressing a new job of this family (its own line numbers, log, signals).

        From the second job on, the templates earlier jobs taught are promoted to filters
        first (`CompressorConfig.promote`; `promote=False` leaves it to the caller, as the
        service does off the ingest path with `promotion` and `finish_promotion`)."""
        if self.jobs_started and (self.config.promote if promote is None else promote):
            self.promote()
        self.jobs_started += 1
        return JobCompression(self, record=record, max_entries=max_entries)

    def promotion(self) -> tuple[list[tuple[TemplateView, list[str]]], Validator]:
        """What a promotion validates: unfiltered clean templates with their deterministic
        candidates, and a snapshot validator (safe to run in a thread)."""
        covered = self.filters.by_template()
        work: list[tuple[TemplateView, list[str]]] = []
        for view in self.miner.templates():
            if len(work) >= self.config.promote_max:
                break
            if view.id in covered or view.id in self.tainted:
                continue
            if self._promoted.get(view.id) == view.text:
                continue
            self._promoted[view.id] = view.text
            if self.guard.single([view.text, *view.samples]):
                self.tainted.add(view.id)
                continue
            work.append((view, candidates(view)))
        snapshot = Validator(self.validator.corpus, timeout=self.validator.timeout)
        return work, snapshot

    def finish_promotion(
        self,
        found: Sequence[tuple[TemplateView, str]],
        snapshot: Validator,
        rejected: Sequence[Rejection] = (),
    ) -> int:
        """Add the promoted filters validated against `snapshot`; a failure line remembered
        since then, or a template merged, evicted or filtered meanwhile, drops the candidate."""
        records = self.filters.rejections
        records.extend(rejected)
        del records[: -FilterSet.MAX_RECORDS]
        known = set(snapshot.corpus)
        fresh = [line for line in self.validator.corpus if line not in known]
        added = 0
        for view, pattern in found:
            live = self.miner.get(view.id)
            if live is None or live.id != view.id or view.id in self.filters.by_template():
                continue
            if view.id in self.tainted:
                continue
            if fresh and Validator(fresh).check(pattern, view.samples) is not None:
                continue
            self.filters.add_checked(view, pattern, line_no=self.lines_in)
            added += 1
        return added

    def promote(self) -> int:
        """Promote now (in the caller's thread); how many filters were added."""
        work, snapshot = self.promotion()
        found, rejected = validate_promotion(work, snapshot)
        return self.finish_promotion(found, snapshot, rejected)

    def templates(self) -> list[TemplateView]:
        return self.miner.templates()

    def _is_progress(self, template_id: int, text: str | None = None) -> bool:
        """Whether a template's lines carry training progress (cached per template)."""
        known = self._progress.get(template_id)
        if known is None:
            if text is None:
                view = self.miner.get(template_id)
                text = view.text if view is not None else ""
            known = self._progress[template_id] = PROGRESS_WORDS.search(text) is not None
        return known

    def _readers(self, active: list[Filter]) -> dict[int, Extractor | bool]:
        """`_reader` of each filter of a match's list that has one, by index; kept for the
        last list (a filter set hands out the same list until its filters change)."""
        last = self._last_readers
        if last is not None and last[0] is active and last[1] == len(active):
            return last[2]
        readers: dict[int, Extractor | bool] = {}
        for x, f in enumerate(active):
            reader = self._reader(f)
            if reader is not False:
                readers[x] = reader
        self._last_readers = (active, len(active), readers)
        return readers

    def _reader(self, f: Filter) -> Extractor | bool:
        """How to read a filter's lines for signals: an extractor, True (slow path), False."""
        if "checkpoint" in f.template.lower():
            return True
        if f.template_id not in self._extractors:
            self._extractors[f.template_id] = Extractor.of(f.template)
        extractor = self._extractors[f.template_id]
        return extractor if extractor is not None else False

    def threshold(self, view: TemplateView) -> int:
        """Lines a template needs before it may become a filter (`min_count`, or
        `min_count_numeric` when every slot is a number)."""
        if set(view.slots) <= _NUMBERS:
            return min(self.config.min_count, self.config.min_count_numeric)
        return self.config.min_count

    def _consider(self, template_id: int, line_no: int) -> None:
        """Propose a filter for a template once it is seen often enough (retried at 2x, 4x)."""
        seen = self._seen[template_id] = self._seen[template_id] + 1
        limit = self._next_try.get(template_id)
        if limit is None:
            config = self.config
            if seen < min(config.min_count, config.min_count_numeric):
                return
            if seen < config.min_count:
                view = self.miner.get(template_id)
                if view is None or seen < self.threshold(view):
                    self._next_try[template_id] = config.min_count
                    return
        elif seen < limit:
            return
        self._next_try[template_id] = seen * 2
        if template_id in self.tainted:
            return
        view = self.miner.get(template_id)
        if view is None or view.id != template_id:
            return
        known = self.filters.by_template().get(view.id)
        if known is not None and (known.template == view.text or not known.enabled):
            return
        # New, or its template widened since the filter was made (a slot that took another
        # type): the old filter no longer takes these lines, so the widened one is proposed.
        if self.guard.single([view.text, *view.samples]):
            self.tainted.add(template_id)
            return
        self.filters.propose(view, self.validator, line_no)


class JobCompression:
    """Feeds one job's lines through its family's compressor into a `JobLog`."""

    def __init__(
        self, compressor: Compressor, *, record: bool = False, max_entries: int | None = None
    ) -> None:
        self.compressor = compressor
        self.log = JobLog(template_ids=[] if record else None, max_entries=max_entries)
        self.log.signals = Signals(compressor.config.signals)
        self._state: dict[str, GuardState] = {}
        self._pending: Counter[int] = Counter()
        self._pending_first: dict[int, int] = {}
        self._warm_up = True
        self._shift = 0
        """Stream line number minus job line number, for the batch being fed."""
        self.loss_reads: dict[int, LossRead] | None = None
        """When set (a dict), `feed` fills it: batch index -> what `Signals.observe_loss`
        reads from that line, for the progress lines an extractor read and proved
        (`LossPlan`), so the live diagnosis need not read them again."""
        self._at = 0
        """Index in the batch of the first line of the part being compressed."""
        self.filters: FilterSet | None = None
        """Filters of this job alone (`job`-scope rows), tried on what the family's left."""

    def job_filters(self) -> FilterSet:
        """This job's own filter set, created on first use."""
        if self.filters is None:
            config = self.compressor.config
            self.filters = FilterSet(engine=config.engine, background=config.build_in_thread)
        return self.filters

    def _texts(self) -> dict[int, str]:
        texts = {f.template_id: f.template for f in self.compressor.filters.filters}
        if self.filters is not None:
            texts.update({f.template_id: f.template for f in self.filters.filters})
        return texts

    def _match(
        self, lines: Sequence[str], data: bytes | None = None
    ) -> tuple[list[int | None], list[Filter]]:
        """The family's filters, then this job's own on the lines they left."""
        idx, active = self.compressor.filters.match_indexes(lines, data)
        own = self.filters
        if own is None or not own.filters or None not in idx:
            return idx, active
        missed = [i for i, x in enumerate(idx) if x is None]
        found, own_active = own.match_indexes([lines[i] for i in missed])
        if all(x is None for x in found):
            return idx, active
        base = len(active)
        idx = list(idx)
        for i, x in zip(missed, found, strict=True):
            if x is not None:
                idx[i] = base + x
        return idx, [*active, *own_active]

    def feed(
        self,
        lines: Sequence[str],
        *,
        stream: str = "",
        ranks: Sequence[int | None] | None = None,
        node: str | None = None,
        first_line_no: int | None = None,
    ) -> list[int]:
        """Compress one batch of one stream; return the indexes (into `lines`) of kept lines.

        `first_line_no`: the stream's 1-based number of the batch's first line (the ingest
        writer's, from the committed stream), which kept lines and runs then carry, so that
        uploads of one stream split over replicas number its lines as one stream. Without it
        they are numbered by the job's own count of lines fed (the CLI: input line numbers)."""
        config = self.compressor.config
        self._shift = 0 if first_line_no is None else first_line_no - self.log.lines_in - 1
        kept: list[int] = []
        start = 0
        while start < len(lines):
            size = config.warmup_chunk_lines if self._warm_up else config.chunk_lines
            part = ranks[start : start + size] if ranks is not None else None
            chunk = lines[start : start + size]
            self._at = start
            found = self._feed(chunk, stream, part, node)
            self._warm_up = len(found) * 4 > len(chunk)
            kept.extend(start + i for i in found)
            start += size
        return kept

    def _feed(
        self,
        lines: Sequence[str],
        stream: str,
        ranks: Sequence[int | None] | None,
        node: str | None,
    ) -> list[int]:
        """Guard the chunk once, then filter it; when a kept line teaches a new filter, the
        new filter is tried on the rest of the chunk's unmatched lines (the others' matches
        stand), so it applies from the very next line."""
        c = self.compressor
        state = self._state.setdefault(stream, GuardState())
        # Joined and encoded once, for the guard's scan and the filter set's skeleton memo.
        data = "\n".join(lines).encode("utf-8", "replace")
        guarded = c.guard.scan(lines, state, ranks, data)
        kept: list[int] = []
        start = 0
        matched: tuple[list[int | None], list[Filter]] | None = None
        at = self._at
        while start < len(lines):
            self._at = at + start
            if start:
                part = lines[start:]
                shifted = {i - start: r for i, r in guarded.items() if i >= start}
                found, used, matched = self._part(
                    part, shifted, ranks[start:] if ranks is not None else None, node, matched
                )
            else:
                matched = self._match(lines, data)
                found, used, matched = self._part(lines, guarded, ranks, node, matched)
            kept.extend(start + i for i in found)
            start += used
        return kept

    def _part(
        self,
        lines: Sequence[str],
        guarded: dict[int, GuardReason],
        ranks: Sequence[int | None] | None,
        node: str | None,
        matched: tuple[list[int | None], list[Filter]] | None,
    ) -> tuple[list[int], int, tuple[list[int | None], list[Filter]] | None]:
        """Filter and keep lines until one teaches a filter; return kept indexes, lines used."""
        c = self.compressor
        log = self.log
        first = log.lines_in + 1
        base = c.lines_in
        idx, active = self._match(lines) if matched is None else matched

        idx = self._enforce(lines, guarded, idx, active, first)
        kept = [i for i, x in enumerate(idx) if x is None] if None in idx else []

        tids = log.template_ids
        tids_before = 0
        if tids is not None:
            tids_before = len(tids)
            tids.extend(-1 if x is None else active[x].template_id for x in idx)

        used = len(lines)
        filters_before = len(c.filters.filters)
        prev = 0
        done: list[int] = []
        progress_kept: list[int] = []
        hits: Counter[int | None] = Counter()
        for i in kept:
            if i > prev:
                hits += self._gap(idx, active, prev, i, first)
            prev = i + 1
            self._flush_runs()
            rank = ranks[i] if ranks is not None else None
            tid = self._keep(
                lines[i], first + i, guarded.get(i), rank, node, base + i + 1, self._shift
            )
            done.append(i)
            if c._is_progress(tid):
                progress_kept.append(i)
            if len(c.filters.filters) != filters_before and i + 1 < len(lines):
                used = i + 1
                break
        if prev < used:
            hits += self._gap(idx, active, prev, used, first)
        rest: tuple[list[int | None], list[Filter]] | None = None
        if used < len(lines):
            if tids is not None:
                del tids[tids_before + used :]
            rest = _with_new_filters(
                lines[used:], idx[used:], active, c.filters.filters[filters_before:]
            )
            idx = idx[:used]
            lines = lines[:used]
        log.lines_in += used
        c.lines_in += used
        self._count(hits, active, first + used - 1)
        if c.config.read_signals:
            self._signals(lines, idx, active, first, progress_kept)
        return done, used, rest

    def _enforce(
        self,
        lines: Sequence[str],
        guarded: dict[int, GuardReason],
        idx: list[int | None],
        active: list[Filter],
        first: int,
    ) -> list[int | None]:
        """The invariant: a filter that matches a guarded line is disabled on the spot, and
        every line of the batch it matched is kept. A blank line inside a guarded block is
        kept too, but says nothing against the filter of blank lines, which stays."""
        broken: set[int] = set()
        blank: list[int] = []
        for i, reason in guarded.items():
            x = idx[i]
            if x is not None:
                if reason is GuardReason.BLOCK and not lines[i].strip():
                    blank.append(i)
                    continue
                f = active[x]
                reason_text = f"matched a guarded line ({reason.value})"
                own = self.filters
                mine = own is not None and any(f is g for g in own.filters)
                owner = own if own is not None and mine else self.compressor.filters
                owner.disable(f, first + i, lines[i], reason_text)
                broken.add(x)
        if broken:
            idx = [None if x in broken else x for x in idx]
        elif blank:
            idx = list(idx)
        for i in blank:
            idx[i] = None
        return idx

    def _count(self, hits: Counter[int | None], active: list[Filter], last_line: int) -> None:
        for x, n in hits.items():
            if x is None:
                continue
            f = active[x]
            f.hits += n
            f.last_hit_line = last_line
            self.log.filtered_by_template[f.template_id] += n

    def _keep(
        self,
        line: str,
        line_no: int,
        reason: GuardReason | None,
        rank: int | None,
        node: str | None,
        family_line: int,
        shift: int = 0,
    ) -> int:
        """Mine a kept line and add it to the log (numbered `line_no + shift`); return its
        template id."""
        c = self.compressor
        log = self.log
        tid = c.miner.add(line)
        if reason is not None:
            c.tainted.add(tid)
            c.validator.remember(line)
            rank, node = _origin(line, rank, node)
        else:
            c._consider(tid, family_line)
        if log.template_ids is not None:
            log.template_ids[line_no - 1] = tid
        log.kept_count += 1
        if not log.full or log.outbox is not None:
            kept = KeptLine(line_no + shift, line, tid, reason, rank, node)
            if log.outbox is not None:
                log.outbox.append(kept)
            if not log.full:
                log._order.append((0, len(log.kept)))
                log.kept.append(kept)
        return tid

    def pending_runs(self) -> list[Run]:
        """The filtered runs since the last kept line (still open: a live job's log tail)."""
        texts = self._texts()
        return [
            Run(tid, texts.get(tid, ""), n, self._pending_first[tid])
            for tid, n in self._pending.items()
        ]

    def finish(self) -> JobLog:
        """End of the job's input: close the last filtered runs."""
        self._flush_runs()
        return self.log

    def _gap(
        self, idx: list[int | None], active: list[Filter], start: int, end: int, first: int
    ) -> Counter[int | None]:
        """Count the filtered lines between two kept lines into the pending runs."""
        counts: Counter[int | None] = Counter(idx[start:end] if start or end < len(idx) else idx)
        counts.pop(None, None)
        for x, n in counts.items():
            if x is None:
                continue
            tid = active[x].template_id
            if tid not in self._pending:
                self._pending_first[tid] = first + self._shift + idx.index(x, start, end)
            self._pending[tid] += n
        return counts

    def _flush_runs(self) -> None:
        if not self._pending:
            return
        log = self.log
        if log.outbox is not None:
            texts = self._texts()
            log.outbox.extend(
                Run(tid, texts.get(tid, ""), n, self._pending_first[tid])
                for tid, n in self._pending.items()
            )
        if log.full:
            self._pending.clear()
            self._pending_first.clear()
            return
        texts = self._texts()
        for tid, n in self._pending.items():
            log._order.append((1, len(log.runs)))
            log.runs.append(Run(tid, texts.get(tid, ""), n, self._pending_first[tid]))
        self._pending.clear()
        self._pending_first.clear()

    def _signals(
        self,
        lines: Sequence[str],
        idx: list[int | None],
        active: list[Filter],
        first: int,
        kept: list[int],
    ) -> None:
        """Progress lines of the batch, filtered or kept, read in line order.

        A filtered line is read by its template's `Extractor` (one fullmatch); checkpoint
        lines and kept lines, which are few, by the generic `Signals.observe`.
        """
        c = self.compressor
        readers = c._readers(active)
        if not readers and not kept:
            return
        chosen = [i for i, x in enumerate(idx) if x in readers] if readers else []
        if kept:
            chosen = sorted(chosen + kept)
        signals = self.log.signals
        reads = self.loss_reads
        at = self._at
        for i in chosen:
            slot = idx[i]
            reader = readers.get(slot, True) if slot is not None else True
            line_no = first + i
            if isinstance(reader, Extractor):
                read = reader.record(lines[i], signals, line_no, reads is not None)
                if read is not False:
                    if read is not None and reads is not None:
                        reads[at + i] = read
                    continue
            signals.observe(lines[i], line_no)


def _with_new_filters(
    lines: Sequence[str], idx: list[int | None], active: list[Filter], new: Sequence[Filter]
) -> tuple[list[int | None], list[Filter]]:
    """The matches of the rest of a chunk with the filters just learned added: each is tried
    (its own `regex` fullmatch, same language as the matcher's) on the lines nothing matched."""
    added = [f for f in new if f.enabled]
    if not added or None not in idx:
        return idx, active
    compiled = [compile_filter(f.pattern) for f in added]
    base = len(active)
    out = list(idx)
    for i, x in enumerate(idx):
        if x is None:
            line = lines[i]
            for k, pattern in enumerate(compiled):
                try:
                    hit = pattern.fullmatch(line, timeout=MATCH_TIMEOUT_S)
                except TimeoutError:
                    hit = None  # kept, never wrongly dropped
                if hit is not None:
                    out[i] = base + k
                    break
    return out, [*active, *added]


MATCH_TIMEOUT_S = 0.05
"""Per line and filter on that path (validated filters finish far sooner)."""


def validate_promotion(
    work: Sequence[tuple[TemplateView, list[str]]], validator: Validator
) -> tuple[list[tuple[TemplateView, str]], list[Rejection]]:
    """The first valid candidate of each template, and the rejected ones (pure: a thread may
    run it against a snapshot validator)."""
    found: list[tuple[TemplateView, str]] = []
    rejected: list[Rejection] = []
    for view, patterns in work:
        for pattern in patterns:
            reason = validator.check(pattern, view.samples)
            if reason is None:
                found.append((view, pattern))
                break
            rejected.append(Rejection(view.id, pattern, Proposer.DETERMINISTIC, reason))
    return found, rejected


def _origin(line: str, rank: int | None, node: str | None) -> tuple[int | None, str | None]:
    """Rank and node of a failure line, from the stream or from the line's own prefix."""
    if rank is None and (m := _RANK.search(line, 0, 200)) is not None:
        rank = int(m.group(1) or m.group(2) or m.group(3) or m.group(4))
    if node is None and (m := _NODE.search(line, 0, 200)) is not None:
        node = m.group(1) or m.group(2)
    return rank, node
