"""The live diagnosis stage's cost per line, with and without the hang detector's bookkeeping.

    python bench/stage.py                # 1 M benign lines in 64 KiB batches, best of 5

Both rows run the real `DiagnosisStage` (prefilter, rules, progress parsing) on the same
batches in this process, alternating; the peer row replaces the hang bookkeeping (per-node
last-line times, step intervals, tails) with a no-op, so the ratio is what hang detection adds
to the ingest pipeline.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path

from training_log import benign_line

from diagnoser.diagnosis.live import DiagnosisStage, JobState
from diagnoser.ingest.framing import Framer, LineBatch
from diagnoser.pipeline import StreamKey
from diagnoser.rules import RuleRegistry

ROOT = Path(__file__).resolve().parents[1]
BATCH_BYTES = 64 * 1024
STREAMS = 64


class WithoutHangTracking(DiagnosisStage):
    def _observe_time(
        self, state: JobState, node: str, batch: LineBatch, now: float, step: int | None
    ) -> None:
        return None


def batches(total: int) -> list[LineBatch]:
    rng = random.Random(7)
    text = "".join(benign_line(rng, n) + "\n" for n in range(total)).encode()
    framer = Framer()
    out = [framer.feed(text[i : i + BATCH_BYTES]) for i in range(0, len(text), BATCH_BYTES)]
    out.append(framer.close())
    return [b for b in out if b.lines]


def seconds_per_run(stage_type: type[DiagnosisStage], work: list[LineBatch]) -> Callable[[], float]:
    registry = RuleRegistry(ROOT / "rules")

    def run() -> float:
        stage = stage_type(registry)
        start = time.perf_counter()
        for i, batch in enumerate(work):
            node = f"node-{i % STREAMS}"
            stage.process(StreamKey("job", f"{node}/stdout", node, None), batch)
        return time.perf_counter() - start

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    work = batches(args.lines)
    lines = sum(len(b.lines) for b in work)
    rows = {"stage with hang tracking": DiagnosisStage, "peer: without it": WithoutHangTracking}
    runs = {name: seconds_per_run(kind, work) for name, kind in rows.items()}
    best = dict.fromkeys(rows, float("inf"))
    for _ in range(args.runs):  # alternate, so drift on a shared machine hits both alike
        for name, run in runs.items():
            best[name] = min(best[name], run())
    peer = best["peer: without it"]
    print(f"{lines:,} benign lines, {len(work)} batches of ~64 KiB over {STREAMS} streams")
    print(f"best of {args.runs}\n")
    print("| stage | lines/s | s per M lines | vs peer |")
    print("|---|---:|---:|---:|")
    for name, seconds in best.items():
        print(
            f"| {name} | {lines / seconds:,.0f} | {seconds / lines * 1e6:.3f} "
            f"| {seconds / peer:.3f}x |"
        )


if __name__ == "__main__":
    main()
