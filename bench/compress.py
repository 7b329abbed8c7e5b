"""Template mining against Drain3, side by side in one process, on Loghub-2k.

    .venv/bin/pip install -e '.[bench]'      # drain3
    .venv/bin/python bench/compress.py [--loghub DIR] [--long-lines 1000000]

Data: the 16 Loghub-2k samples (Zhu et al., "Loghub: A Large Collection of System Log Datasets
for AI-driven Log Analytics", ISSRE 2023; github.com/logpai/loghub), ground truth from the
Loghub-2.0 corrected templates (Jiang et al., ISSTA 2024) where they exist (all but Android and
Windows, which keep Loghub's original templates). Read at run time from `../shared/data/loghub-2k`.

1. Per dataset: grouping accuracy (GA) on the `Content` column and on the raw `.log` lines
   (headers and all, no header format given to either miner), and lines/s over both inputs
   (4,000 lines, a fresh miner per input, so mostly cold; best of 3 runs). Peer: Drain3 with
   its default configuration, the same lines, the same process, the same way (one call per
   line). The miner keeps no cache outside the instance, so a fresh miner is cold in every
   run: until this round a word-shape `lru_cache` was shared by every miner of the process,
   which gave runs 2 and 3 of the best of 3 words Drain3 had to see anew.
2. Long run: each dataset's raw lines repeated to `--long-lines` lines into one miner: lines/s
   overall and over the second half (steady state); Drain3 on the first `--peer-lines` of the same
   stream. Then peak memory (tracemalloc) of one miner over `--long-lines` lines that cycle
   through all 16 datasets, about 1,700 events for a cap of 1,000 templates, so eviction runs.

Rates are lines per second of this process's CPU time (`time.process_time`), so that other
processes on a shared machine do not skew them; ratios compare the two miners on the same lines.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from drain3 import TemplateMiner as Drain3Miner
from drain3.template_miner_config import TemplateMinerConfig

from diagnoser.native import compiled
from diagnoser.templates.grouping import LOGHUB_DATASETS, LoghubSample, grouping_accuracy
from diagnoser.templates.grouping import load_loghub as load_sample
from diagnoser.templates.miner import TemplateMiner

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOGHUB = ROOT.parent / "shared" / "data" / "loghub-2k"
if not DEFAULT_LOGHUB.is_dir():
    # A git worktree one level further down shares the same data.
    DEFAULT_LOGHUB = ROOT.parents[1] / "shared" / "data" / "loghub-2k"

Grouper = Callable[[Sequence[str]], Callable[[], list[int]]]
"""Groups the lines (timed), then returns how to read each line's group (not timed)."""


def ours(lines: Sequence[str]) -> Callable[[], list[int]]:
    miner = TemplateMiner()
    ids = [miner.add(line) for line in lines]

    def final() -> list[int]:
        """Each line's template at the end of the run (merges followed), as GA is scored."""
        views = {tid: miner.get(tid) for tid in set(ids)}
        return [v.id if (v := views[tid]) is not None else -tid for tid in ids]

    return final


def drain3(lines: Sequence[str]) -> Callable[[], list[int]]:
    miner = Drain3Miner(config=TemplateMinerConfig())
    ids = [int(miner.add_log_message(line)["cluster_id"]) for line in lines]
    return lambda: ids


def timed(group: Grouper, lines: Sequence[str], runs: int = 3) -> tuple[list[int], float]:
    """The groups of the first run and the best CPU time of `runs` (each with a fresh miner)."""
    best = float("inf")
    ids: list[int] = []
    for run in range(runs):
        start = time.process_time()
        read = group(lines)
        best = min(best, time.process_time() - start)
        if run == 0:
            ids = read()
    return ids, best


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    ga: dict[tuple[str, str], float]
    """(miner, input) -> GA."""
    seconds: dict[str, float]
    lines: int


def measure(sample: LoghubSample) -> Row:
    ga: dict[tuple[str, str], float] = {}
    seconds = {"ours": 0.0, "drain3": 0.0}
    for miner, group in (("ours", ours), ("drain3", drain3)):
        for field, lines in (("content", sample.content), ("raw", sample.raw)):
            ids, spent = timed(group, lines)
            ga[miner, field] = grouping_accuracy(sample.truth, ids)
            seconds[miner] += spent
    return Row(sample.name, ga, seconds, 2 * len(sample.raw))


def print_accuracy(rows: list[Row]) -> None:
    print(
        "| dataset | GA Content ours | Drain3 | GA raw ours | Drain3 "
        "| lines/s ours | Drain3 | speed ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rate_o = r.lines / r.seconds["ours"]
        rate_d = r.lines / r.seconds["drain3"]
        print(
            f"| {r.name} | {r.ga['ours', 'content']:.3f} | {r.ga['drain3', 'content']:.3f} "
            f"| {r.ga['ours', 'raw']:.3f} | {r.ga['drain3', 'raw']:.3f} "
            f"| {rate_o:,.0f} | {rate_d:,.0f} | {rate_o / rate_d:.2f}x |"
        )
    n = len(rows)

    def mean(key: tuple[str, str]) -> float:
        return sum(r.ga[key] for r in rows) / n

    total = sum(r.lines for r in rows)
    rate_o = total / sum(r.seconds["ours"] for r in rows)
    rate_d = total / sum(r.seconds["drain3"] for r in rows)
    print(
        f"| **mean of {n}** | **{mean(('ours', 'content')):.3f}** "
        f"| {mean(('drain3', 'content')):.3f} | **{mean(('ours', 'raw')):.3f}** "
        f"| {mean(('drain3', 'raw')):.3f} | {rate_o:,.0f} | {rate_d:,.0f} "
        f"| {rate_o / rate_d:.2f}x |"
    )


def repeat(lines: Sequence[str], n: int) -> list[str]:
    return [lines[i % len(lines)] for i in range(n)]


def long_run(samples: list[LoghubSample], n: int, peer_n: int) -> None:
    print(f"\nLong run: each dataset's raw lines repeated to {n:,} lines, one miner each")
    print(f"(Drain3 on the first {peer_n:,} lines of the same stream).\n")
    print("| dataset | templates | lines/s ours | steady (2nd half) | Drain3 | steady ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    totals = {"ours": 0.0, "steady": 0.0, "drain3": 0.0}
    ratios = []
    for sample in samples:
        stream = repeat(sample.raw, n)
        miner = TemplateMiner()
        add = miner.add
        half = n // 2
        start = time.process_time()
        for line in stream[:half]:
            add(line)
        middle = time.process_time()
        for line in stream[half:]:
            add(line)
        end = time.process_time()
        peer = Drain3Miner(config=TemplateMinerConfig())
        peer_add = peer.add_log_message
        peer_start = time.process_time()
        for line in stream[:peer_n]:
            peer_add(line)
        peer_seconds = time.process_time() - peer_start
        totals["ours"] += end - start
        totals["steady"] += end - middle
        totals["drain3"] += peer_seconds
        steady = (n - half) / (end - middle)
        peer_rate = peer_n / peer_seconds
        ratios.append(steady / peer_rate)
        print(
            f"| {sample.name} | {len(miner)} | {n / (end - start):,.0f} | {steady:,.0f} "
            f"| {peer_rate:,.0f} | {steady / peer_rate:.1f}x |"
        )
    k = len(samples)
    steady = k * (n - n // 2) / totals["steady"]
    peer_rate = k * peer_n / totals["drain3"]
    print(
        f"| **all {k}** | - | {k * n / totals['ours']:,.0f} | {steady:,.0f} | {peer_rate:,.0f} "
        f"| {steady / peer_rate:.1f}x (median of the {k}: {statistics.median(ratios):.1f}x) |"
    )


def memory_run(samples: list[LoghubSample], n: int) -> None:
    blocks = [line for sample in samples for line in sample.raw]
    stream = repeat(blocks, n)
    tracemalloc.start()
    miner = TemplateMiner()
    for line in stream:
        miner.add(line)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\nMemory: {n:,} lines cycling through all {len(samples)} datasets into one miner "
        f"(max_templates={miner.config.max_templates}): {len(miner)} templates live at the end; "
        f"peak traced by tracemalloc {peak / 2**20:.1f} MiB (the miner and its caches; the input "
        f"is allocated before tracing starts); process peak RSS {rss:.0f} MiB."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loghub", type=Path, default=DEFAULT_LOGHUB)
    parser.add_argument("--long-lines", type=int, default=1_000_000)
    parser.add_argument("--peer-lines", type=int, default=50_000)
    parser.add_argument("--datasets", nargs="*", default=list(LOGHUB_DATASETS))
    args = parser.parse_args()
    logging.getLogger("drain3").setLevel(logging.ERROR)

    samples = [load_sample(args.loghub, name) for name in args.datasets]
    print(
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}; Loghub-2k from {args.loghub}"
    )
    build = "compiled by mypyc" if all(compiled().values()) else "pure Python"
    print(f"miner: {build} (diagnoser.native; DIAGNOSER_PURE_PYTHON=1 runs the .py files)")
    legacy = [s.name for s in samples if not s.corrected]
    print(f"ground truth: Loghub-2.0 corrected templates; original Loghub for {legacy}\n")
    print_accuracy([measure(s) for s in samples])
    if args.long_lines:
        long_run(samples, args.long_lines, min(args.peer_lines, args.long_lines))
        memory_run(samples, args.long_lines)


if __name__ == "__main__":
    main()
