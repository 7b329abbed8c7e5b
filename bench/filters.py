"""Compression: the filter set as one multi-pattern matcher, against a loop of re.fullmatch.

    .venv/bin/python bench/filters.py [--lines 1000000]

Benign training lines (`training_log.benign_line`: DeepSpeed progress, NCCL INFO chatter,
allocator and DataLoader warnings). Filters: the 5 the compressor learns on those lines, plus
195 learned from loghub-2k templates (public research data, read at run time from
/work/shared/data/loghub-2k), so the other filters look like real ones (shared headers,
typed slots), not like noise no line can touch. Rows, on the same lines:

* matcher: `FilterSet.match_indexes` only (hyperscan, and the pure-`regex` fallback on a
  sample), with 1 filter and with 200;
* naive: per line, `re.fullmatch` of each filter in turn until one matches;
* stage: the whole compression stage after warm-up (guard, matcher, disable check, counts,
  filtered runs; with and without reading training signals).

Then the kept fraction of a synthetic Megatron-style log (`megatron_log`) after warm-up, and
the first 1,000 lines of a second job of the same family against the first job's.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

from megatron_log import megatron_lines
from training_log import benign_line

from diagnoser.rules import RuleSet, load_dir
from diagnoser.templates.compressor import Compressor, CompressorConfig
from diagnoser.templates.filters import Filter, FilterSet, candidates
from diagnoser.templates.miner import TemplateMiner
from diagnoser.templates.validation import Validator

ROOT = Path(__file__).resolve().parents[1]
LOGHUB = Path("/work/shared/data/loghub-2k")
BATCH = 4096


def loghub_filters(limit: int) -> list[str]:
    validator = Validator()
    patterns: list[str] = []
    paths = sorted(LOGHUB.glob("*/*_2k.log"))
    for path in paths:
        miner = TemplateMiner()
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            miner.add(line)
        chosen = 0
        for view in sorted(miner.templates(), key=lambda v: -v.count):
            if view.count < 5 or chosen >= limit // len(paths) + 8:
                continue
            for pattern in candidates(view):
                if validator.check(pattern, view.samples) is None:
                    patterns.append(pattern)
                    chosen += 1
                    break
    return patterns[:limit]


def timed(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    rng = random.Random(42)
    lines = [benign_line(rng, n) for n in range(args.lines)]
    batches = [lines[i : i + BATCH] for i in range(0, len(lines), BATCH)]

    ruleset = load_dir(ROOT / "rules")
    warm = Compressor(ruleset)
    job = warm.job()
    for batch in batches[:10]:
        job.feed(batch)
    learned = [f.pattern for f in warm.filters.enabled]
    others = loghub_filters(200 - len(learned))
    print(f"{len(lines):,} benign lines; {len(learned)} learned filters + {len(others)} others")

    rows = matcher_rows({1: [learned[0]], 200: learned + others}, batches, lines)
    rows += stage_rows(ruleset, batches, others)

    naive_rate = {c: n / s for label, c, n, s in rows if label.startswith("naive")}
    print()
    print("| path | filters | lines/s | vs naive loop (same filters) |")
    print("|---|---:|---:|---:|")
    for label, count, n, seconds in rows:
        rate = n / seconds
        base = naive_rate.get(count, naive_rate[200])
        print(f"| {label} | {count} | {rate:,.0f} | {rate / base:.1f}x |")

    megatron(ruleset)


Row = tuple[str, int, int, float]


def matcher_rows(
    sets: dict[int, list[str]], batches: list[list[str]], lines: list[str]
) -> list[Row]:
    rows: list[Row] = []
    for count, patterns in sets.items():
        for engine, chunks in (("hyperscan", batches), ("regex", batches[:5])):
            filters = FilterSet(engine=engine)
            filters.filters = []
            for i, pattern in enumerate(patterns):
                filters.filters.append(Filter(i + 1, i, "", pattern))
            filters.match_indexes(chunks[0])  # build outside the timing
            n = sum(len(b) for b in chunks)
            seconds = timed(lambda f=filters, s=chunks: [f.match_indexes(b) for b in s])  # type: ignore[misc]
            rows.append((f"matcher, {engine}", count, n, seconds))
        compiled = [re.compile(p) for p in patterns]
        order = compiled[:]
        random.Random(1).shuffle(order)
        head = lines[:20_000]

        def naive(order: list[re.Pattern[str]] = order, sample: list[str] = head) -> None:
            for line in sample:
                for pattern in order:
                    if pattern.fullmatch(line):
                        break

        rows.append(("naive re.fullmatch loop", count, len(head), timed(naive)))
    return rows


def stage_rows(ruleset: RuleSet, batches: list[list[str]], others: list[str]) -> list[Row]:
    rows: list[Row] = []
    for read_signals in (False, True):
        config = CompressorConfig(read_signals=read_signals)
        stage = Compressor(ruleset, config)
        first = stage.job()
        for batch in batches[:10]:
            first.feed(batch)  # warm-up: learn the filters
        for pattern in others:
            extra = Filter(10_000 + len(stage.filters.filters), -1, "", pattern)
            stage.filters.filters.append(extra)
        stage.filters.rebuild_lines = 0
        steady = stage.job()
        steady.feed(batches[10])
        label = "stage (guard+filters+runs)" + (" + signals" if read_signals else "")
        n = sum(len(b) for b in batches[11:])
        seconds = timed(lambda j=steady: [j.feed(b) for b in batches[11:]])  # type: ignore[misc]
        rows.append((label, len(stage.filters.enabled), n, seconds))
        kept = steady.finish().lines_kept
        print(f"{label}: {kept:,} of {n + len(batches[10]):,} lines kept")
    return rows


def megatron(ruleset: RuleSet) -> None:
    compressor = Compressor(ruleset)
    first_lines = list(megatron_lines(1, 5000))
    second_lines = list(megatron_lines(2, 2000))
    job = compressor.job()
    for i in range(0, len(first_lines), 512):
        job.feed(first_lines[i : i + 512])
    log = job.finish()
    warm = [k for k in log.kept if k.line_no > 2000]
    after = len(first_lines) - 2000
    first_1000 = sum(1 for k in log.kept if k.line_no <= 1000)
    job2 = compressor.job()
    for i in range(0, len(second_lines), 512):
        job2.feed(second_lines[i : i + 512])
    log2 = job2.finish()
    second_1000 = sum(1 for k in log2.kept if k.line_no <= 1000)
    print()
    print("| Megatron-style synthetic log | lines | kept | kept fraction |")
    print("|---|---:|---:|---:|")
    print(f"| job 1, whole | {len(first_lines):,} | {log.lines_kept:,} | {log.ratio:.2%} |")
    print(f"| job 1, after warm-up (line 2,001 on) | {after:,} | {len(warm):,} | "
          f"{len(warm) / after:.2%} |")  # fmt: skip
    print(f"| job 1, first 1,000 lines | 1,000 | {first_1000} | {first_1000 / 1000:.1%} |")
    print(f"| job 2 (same family), first 1,000 lines | 1,000 | {second_1000} | "
          f"{second_1000 / 1000:.1%} |")  # fmt: skip
    print(f"filters: {len(compressor.filters.enabled)} enabled, "
          f"{len(compressor.filters.rejections)} rejected, {len(compressor.filters.disabled)} "
          f"disabled; templates {len(compressor.templates())}")  # fmt: skip


if __name__ == "__main__":
    main()
