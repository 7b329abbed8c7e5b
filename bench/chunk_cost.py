"""CPU per line of the ingest pipeline at `bench/load.py`'s shape, in one process, no HTTP.

    python bench/chunk_cost.py                 # 512 nodes x 10 lines/s for 60 s, best of 5

`bench/load.py` measures the service on a shared machine, where a run's CPU per line swings
with the other sessions' load. This replays its streams (nodes of 8 torchrun ranks in jobs of
64 nodes, one ~10-line chunk per node per second, the same pool of benign lines) through
what an upload's chunk meets after the HTTP layer: each stream's `Framer`, then the app's
`Pipeline` (line counter, compression stage, live diagnosis stage, built as `diagnoser/app.py`
builds them). It reports the CPU microseconds per line of each run (process time, so another
process's load costs nothing but cache), best and median. Run it for two trees in turn
(`PYTHONPATH=<tree>`) for a ratio that the machine's load does not move.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import load

from diagnoser.diagnosis.live import DiagnosisStage
from diagnoser.ingest.framing import Framer
from diagnoser.pipeline import LineCounter, Pipeline, StreamKey
from diagnoser.rules import RuleRegistry
from diagnoser.templates.stage import CompressionStage

ROOT = Path(load.__file__).resolve().parents[1]
"""The tree whose `bench/load.py` was imported (it puts its tree first on the path)."""
RANKS = 8
JOB_NODES = 64


def chunks(nodes: int, seconds: int, rate: int, seed: int) -> list[tuple[int, bytes]]:
    """(node, chunk) in send order: each node's `rate` lines of each second, round robin over
    its ranks, as `load.Node.produce` writes them."""
    pool = load.make_pool(RANKS, seed)
    size = len(pool[0])
    out = []
    for second in range(seconds):
        for node in range(nodes):
            first = second * rate
            lines = [
                pool[n % RANKS][(n // RANKS + node) % size] for n in range(first, first + rate)
            ]
            out.append((node, b"".join(lines)))
    return out


def run(work: list[tuple[int, bytes]], nodes: int, registry: RuleRegistry) -> tuple[float, int]:
    """CPU seconds and lines of one replay through a fresh pipeline."""
    compression = CompressionStage(registry)
    live = DiagnosisStage(registry, loss_reads=compression.share_loss_reads())
    pipeline = Pipeline([LineCounter(), compression, live])
    keys = [
        StreamKey(f"job-{n // JOB_NODES:03d}", f"gpu-node-{n:04d}", f"gpu-node-{n:04d}", None)
        for n in range(nodes)
    ]
    framers = [Framer() for _ in range(nodes)]
    lines = 0
    start = time.process_time()
    for node, chunk in work:
        batch = framers[node].feed(chunk)
        pipeline.process(keys[node], batch)
        lines += len(batch.lines)
    return time.process_time() - start, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rate", type=int, default=10, help="lines per node per second")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    registry = RuleRegistry(ROOT / "rules")
    work = chunks(args.nodes, args.seconds, args.rate, args.seed)
    per_line = []
    for _ in range(args.runs):
        cpu, lines = run(work, args.nodes, registry)
        per_line.append(cpu / lines * 1e6)
    print(
        f"{ROOT.name}: {lines:,} lines in {len(work):,} chunks; CPU us per line: best "
        f"{min(per_line):.2f}, median {statistics.median(per_line):.2f} "
        f"({', '.join(f'{x:.2f}' for x in per_line)})"
    )


if __name__ == "__main__":
    main()
