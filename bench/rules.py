"""Rule-pack throughput: the prefiltered scanner against "every regex on every line".

    .venv/bin/python bench/rules.py [--lines 1000000]

Benign text: loghub-2k logs (public research data, read at run time from
/work/shared/data/loghub-2k) interleaved with generated training-progress lines. Error-heavy
text: the fixture logs in tests/fixtures/logs, repeated. Batches of ~64 KiB, as framing makes.
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from diagnoser.ingest.framing import LineBatch
from diagnoser.rules import RuleSet, load_dir, make_batch

ROOT = Path(__file__).resolve().parents[1]
LOGHUB = Path("/work/shared/data/loghub-2k")
BATCH_BYTES = 64 * 1024


def progress_lines(n: int, seed: int = 7) -> list[str]:
    """Healthy training output in the shapes HF Trainer, Megatron and tqdm print."""
    rng = random.Random(seed)
    out = []
    for step in range(n):
        loss = 2.5 - step * 1e-5 + rng.random() * 0.1
        kind = step % 3
        if kind == 0:
            out.append(
                f"{{'loss': {loss:.4f}, 'grad_norm': {rng.random():.3f}, "
                f"'learning_rate': {3e-4 * rng.random():.3e}, 'epoch': {step / 5e4:.2f}}}"
            )
        elif kind == 1:
            out.append(
                f" iteration {step:>9}/  500000 | consumed samples: {step * 128:>12} | "
                f"elapsed time per iteration (ms): {900 + rng.random() * 50:.1f} | "
                f"lm loss: {loss:.6E} | loss scale: 65536.0 | grad norm: {rng.random():.3f} |"
            )
        else:
            out.append(
                f"[rank{step % 8}]:[I{step % 1000:04d} 12:00:00.000000 train.py:88] step {step} "
                f"tokens/s {50000 + rng.randint(0, 999)} mem {70 + rng.random():.1f}GiB"
            )
    return out


def benign(total: int) -> list[str]:
    lines: list[str] = []
    for path in sorted(LOGHUB.glob("*/*.log")):
        lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    mixed = [x for pair in zip(lines, progress_lines(len(lines)), strict=True) for x in pair]
    return list(itertools.islice(itertools.cycle(mixed), total))


def error_heavy(total: int) -> list[str]:
    lines: list[str] = []
    for path in sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.log")):
        lines += path.read_text(encoding="utf-8").splitlines()
    return list(itertools.islice(itertools.cycle(lines), total))


def to_batches(lines: Sequence[str]) -> list[LineBatch]:
    batches, chunk, size, offset, line_no = [], [], 0, 0, 1
    for line in lines:
        chunk.append(line)
        size += len(line) + 1
        if size >= BATCH_BYTES:
            batch = make_batch(chunk, offset, line_no)
            batches.append(batch)
            offset, line_no, chunk, size = batch.ends[-1], line_no + len(chunk), [], 0
    if chunk:
        batches.append(make_batch(chunk, offset, line_no))
    return batches


def best_of(runs: int, fn: Callable[[], int]) -> tuple[float, int]:
    best, result = float("inf"), 0
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def scanner_rate(ruleset: RuleSet, batches: list[LineBatch]) -> tuple[float, int]:
    lines = sum(len(b.lines) for b in batches)

    def run() -> int:
        scanner = ruleset.job_scanner()
        events = sum(len(scanner.feed("node", None, b, 0.0)) for b in batches)
        return events + len(scanner.flush_all(0.0))

    seconds, events = best_of(3, run)
    return lines / seconds, events


def naive_rate(ruleset: RuleSet, lines: Sequence[str]) -> float:
    patterns = [p for rule in ruleset.rules for p in rule.patterns]

    def run() -> int:
        hits = 0
        for line in lines:
            for pattern in patterns:
                if pattern.search(line):
                    hits += 1
        return hits

    seconds, _ = best_of(1, run)
    return len(lines) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--naive-lines", type=int, default=20_000)
    args = parser.parse_args()

    packs = {
        engine: load_dir(ROOT / "rules", prefilter=engine) for engine in ("hyperscan", "regex")
    }
    n_rules = len(packs["hyperscan"])
    print(f"rule pack: {n_rules} rules; {args.lines:,} lines per stream; 64 KiB batches\n")
    print("| stream | path | lines/s | events | vs naive (same stream) |")
    print("|---|---|---:|---:|---:|")
    for name, make in (("benign", benign), ("error-heavy", error_heavy)):
        lines = make(args.lines)
        naive = naive_rate(packs["regex"], lines[: args.naive_lines])
        batches = to_batches(lines)
        for engine, ruleset in packs.items():
            rate, events = scanner_rate(ruleset, batches)
            print(f"| {name} | {engine} | {rate:,.0f} | {events:,} | {rate / naive:,.1f}x |")
        print(f"| {name} | naive: every regex on every line | {naive:,.0f} | - | 1.0x |")


if __name__ == "__main__":
    main()
