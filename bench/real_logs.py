"""Compression on real public training logs: failure-free lines kept, every failure line kept.

    .venv/bin/python bench/real_logs.py

The logs are committed under `bench/data/real-logs/` (sources, commits and licences in
`PROVENANCE.md`); nothing is fetched. Each log is one job: it is compressed the way
`diagnoser compress PATH` does it (the file read by `command.read_batches`, batches of 4,096
lines, one `Compressor` over the repository's rule pack), so the numbers are the CLI's.

Per log, side by side:

* failure-word lines: lines where one of `guard.FAILURE_PATTERNS` matches, found here with the
  stdlib `re` on the whole file, apart from the compressor's own guard; and guarded lines, from a
  fresh `Guard.scan` of the whole file (rule anchors and block continuations too). Both must be
  a subset of the kept lines;
* failure-free lines (not guarded): the fraction kept over the whole log, and after warm-up,
  two ways. As the issue means it, warm-up is the start-up chatter before the first training
  step: here it ends at the first line the service reads a step of 1 or more from
  (`progress.STEP`, the regex behind the job's last step). Step 0 does not end it: DeepSpeed
  prints `step=0` when its engine starts, before its configuration dump, and evaluation
  before training reports `'step':0`; counted from the first step-0 line, the two random-LTD
  logs keep 7.3 % (86/1,172), not 4.7 %. A log with no such line (the Megatron RL refit log, a
  start-up, a refit benchmark and a crash, no training loop) is warm-up whole and has no
  lines after it. Earlier rounds used the first 10% of each log's lines instead (these logs
  have 1,000-2,100 lines); that column stays, for comparison;
* for the family with two runs, the kept fraction of the first 1,000 lines of the second job,
  compressed by the same compressor right after the first job, against the first job's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from diagnoser.diagnosis.progress import STEP, may_step
from diagnoser.rules import RuleSet, load_dir
from diagnoser.templates.command import read_batches
from diagnoser.templates.compressor import Compressor, CompressorConfig, JobLog
from diagnoser.templates.guard import FAILURE_PATTERNS, Guard, GuardState

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench" / "data" / "real-logs"
WARMUP_FRACTION = 0.10
HEAD_LINES = 1000

LOGS = (
    ("deepspeed-chat-step1-sft-opt-1.3b.log", "DeepSpeed-Chat SFT (DeepSpeed + HF)"),
    ("deepspeed-chat-step2-reward-opt-350m.log", "DeepSpeed-Chat reward model"),
    ("deepspeed-chat-step3-rlhf-opt-1.3b.log", "DeepSpeed-Chat RLHF (actor + critic)"),
    ("random-ltd-gpt2-base-run1.log", "DeepSpeed random-LTD GPT-2 (HF), run 1"),
    ("random-ltd-gpt2-medium-run2.log", "DeepSpeed random-LTD GPT-2 (HF), run 2"),
    ("megatron-rl-refit-gloo.log", "Megatron-LM RL refit, 8 ranks"),
)
FAMILY = ("random-ltd-gpt2-base-run1.log", "random-ltd-gpt2-medium-run2.log")

_WORDS = [
    re.compile(p, re.ASCII | (re.IGNORECASE if caseless else 0)) for p, caseless in FAILURE_PATTERNS
]


def read_lines(path: Path) -> list[str]:
    """The file's lines exactly as `diagnoser compress` reads them."""
    return [line for batch in read_batches(path) for line in batch]


def failure_word_lines(lines: list[str]) -> set[int]:
    """1-based numbers of lines carrying a failure word, by the stdlib `re` alone."""
    return {n for n, line in enumerate(lines, 1) if any(p.search(line) for p in _WORDS)}


def first_step_line(lines: list[str], least: int = 1) -> int | None:
    """1-based number of the first line a step of `least` or more is read from, as the service
    reads one (`diagnosis/progress.py`): where warm-up ends."""
    for n, line in enumerate(lines, 1):
        if may_step(line) and (m := STEP.search(line)) is not None and int(m.group(1)) >= least:
            return n
    return None


def guarded_lines(ruleset: RuleSet, lines: list[str]) -> set[int]:
    """1-based numbers of every line a fresh guard marks (rules, words, block continuations)."""
    return {i + 1 for i in Guard(ruleset).scan(lines, GuardState())}


def compress(compressor: Compressor, path: Path) -> JobLog:
    """One job of the compressor's family, fed like the CLI feeds it."""
    job = compressor.job()
    for batch in read_batches(path):
        job.feed(batch)
    return job.finish()


@dataclass(frozen=True, slots=True)
class LogResult:
    name: str
    lines: int
    kept: int
    words: int
    words_kept: int
    guarded: int
    guarded_kept: int
    free: int
    free_kept: int
    warm_free: int
    warm_free_kept: int
    first_step: int | None
    """1-based number of the first line a step is read from (None: no training step)."""
    stepped_free: int
    stepped_free_kept: int
    filters: int
    templates: int


def measure(ruleset: RuleSet, name: str) -> LogResult:
    path = DATA / name
    lines = read_lines(path)
    compressor = Compressor(ruleset)
    log = compress(compressor, path)
    kept = {k.line_no for k in log.kept}
    words = failure_word_lines(lines)
    guarded = guarded_lines(ruleset, lines) | words
    free = [n for n in range(1, len(lines) + 1) if n not in guarded]
    warm_start = int(len(lines) * WARMUP_FRACTION)
    warm = [n for n in free if n > warm_start]
    first_step = first_step_line(lines)
    stepped = [] if first_step is None else [n for n in free if n >= first_step]
    return LogResult(
        name=name,
        lines=len(lines),
        kept=len(kept),
        words=len(words),
        words_kept=len(words & kept),
        guarded=len(guarded),
        guarded_kept=len(guarded & kept),
        free=len(free),
        free_kept=sum(1 for n in free if n in kept),
        warm_free=len(warm),
        warm_free_kept=sum(1 for n in warm if n in kept),
        first_step=first_step,
        stepped_free=len(stepped),
        stepped_free_kept=sum(1 for n in stepped if n in kept),
        filters=len(compressor.filters.enabled),
        templates=len(compressor.templates()),
    )


def family(ruleset: RuleSet, promote: bool = True) -> tuple[int, int, int, int]:
    """Kept lines among the first 1,000 of job 1 and of job 2 (same compressor), and counts."""
    compressor = Compressor(ruleset, CompressorConfig(promote=promote))
    first = compress(compressor, DATA / FAMILY[0])
    second = compress(compressor, DATA / FAMILY[1])
    head1 = sum(1 for k in first.kept if k.line_no <= HEAD_LINES)
    head2 = sum(1 for k in second.kept if k.line_no <= HEAD_LINES)
    return head1, head2, first.lines_kept, second.lines_kept


def _pct(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def main() -> None:
    ruleset = load_dir(ROOT / "rules")
    results = [measure(ruleset, name) for name, _ in LOGS]
    print(
        "| log | lines | kept | failure-word lines kept | guarded lines kept "
        "| failure-free kept | after warm-up: from the first line of a step >= 1 "
        "| after warm-up: first 10% excluded (earlier definition) | filters | templates |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        stepped = (
            "no step line: all warm-up"
            if r.first_step is None
            else f"line {r.first_step:,} on: {r.stepped_free_kept:,}/{r.stepped_free:,} "
            f"({_pct(r.stepped_free_kept, r.stepped_free)})"
        )
        print(
            f"| {r.name} | {r.lines:,} | {r.kept:,} ({_pct(r.kept, r.lines)}) "
            f"| {r.words_kept}/{r.words} | {r.guarded_kept}/{r.guarded} "
            f"| {r.free_kept:,}/{r.free:,} ({_pct(r.free_kept, r.free)}) | {stepped} "
            f"| {r.warm_free_kept:,}/{r.warm_free:,} ({_pct(r.warm_free_kept, r.warm_free)}) "
            f"| {r.filters} | {r.templates} |"
        )
    lost = [r.name for r in results if r.words_kept != r.words or r.guarded_kept != r.guarded]
    print(f"\nfailure lines dropped: {'none' if not lost else ', '.join(lost)}")

    for promote in (False, True):
        head1, head2, kept1, kept2 = family(ruleset, promote)
        print(f"\npromotion of earlier jobs' templates: {'on (default)' if promote else 'off'}")
        print(
            "| family random-ltd-gpt2, one compressor | first 1,000 lines kept | whole job kept |"
        )
        print("|---|---:|---:|")
        print(f"| job 1 ({FAMILY[0]}) | {head1} ({_pct(head1, HEAD_LINES)}) | {kept1:,} |")
        print(f"| job 2 ({FAMILY[1]}) | {head2} ({_pct(head2, HEAD_LINES)}) | {kept2:,} |")
        print(f"job 2 / job 1, first 1,000 lines: {head2 / head1:.2f}x" if head1 else "")


if __name__ == "__main__":
    main()
