"""Framing throughput next to its floor, ``bytes.split(b"\\n")`` over the same chunks.

    python bench/framing.py                  # 1,000,000 lines per row, 64 KiB chunks
    python bench/framing.py --lines 100000   # a quick run

Each row frames a synthetic log (one core, best of ``--repeat`` runs) with a fresh `Framer`
and splits the same chunks with ``bytes.split``; the ratio says how much of the floor the
framer keeps.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from diagnoser.ingest.framing import Framer

_WORDS = [
    *("step", "loss", "lr", "grad_norm", "tokens/s", "allreduce", "NCCL", "rank", "node"),
    *("gpu", "memory", "allocated", "reserved", "iteration", "epoch", "checkpoint", "saved"),
    *("loading", "shard", "dataloader", "worker", "throughput", "elapsed"),
]


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(_WORDS) if rng.random() < 0.7 else f"{rng.random():.6f}"
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:size]


def _plain(rng: random.Random, size: int, index: int) -> str:
    return _text(rng, size)


def _torchrun(rng: random.Random, size: int, index: int) -> str:
    prefix = f"[rank{rng.randrange(256)}]:"
    return prefix + _text(rng, size - len(prefix))


def _cri(rng: random.Random, size: int, index: int) -> str:
    # A busy pod: about 800 lines a second, times increasing as the kubelet writes them.
    second, nanos = divmod(index * 1_250_000 + rng.randrange(1_000_000), 10**9)
    hours, rest = divmod(second % 86_400, 3600)
    header = f"2024-05-01T{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{nanos:09d}Z stdout F "
    return header + _text(rng, size - len(header))


def _dirty(rng: random.Random, size: int, index: int) -> str:
    text = _text(rng, size - 12)
    return f"\x1b[31m{text}\x1b[0m ✓" if rng.random() < 0.2 else text + " ünïcødé"


Maker = Callable[[random.Random, int, int], str]


def _chunks(make: Maker, lines: int, size: int, chunk: int) -> list[bytes]:
    rng = random.Random(size)
    data = "".join(make(rng, size, index) + "\n" for index in range(lines)).encode()
    return [data[i : i + chunk] for i in range(0, len(data), chunk)]


def _best(run: Callable[[list[bytes]], int], chunks: list[bytes], repeat: int) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        start = time.perf_counter()
        count = run(chunks)
        best = min(best, time.perf_counter() - start)
    return best, count


def _frame(chunks: list[bytes]) -> int:
    framer = Framer()
    count = 0
    for chunk in chunks:
        count += len(framer.feed(chunk).lines)
    return count + len(framer.close().lines)


def _split(chunks: list[bytes]) -> int:
    count = 0
    for chunk in chunks:
        count += len(chunk.split(b"\n")) - 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines per row")
    parser.add_argument("--chunk", type=int, default=64 * 1024, help="chunk size in bytes")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the best counts")
    parser.add_argument("--only", default="", help="run only rows whose name contains this")
    args = parser.parse_args()

    rows: list[tuple[str, Maker, int]] = [
        ("plain ~80 B", _plain, 80),
        ("plain ~400 B", _plain, 400),
        ("[rankN]: ~80 B", _torchrun, 80),
        ("CRI ~80 B msg", _cri, 120),
        ("ANSI+UTF-8 ~80 B", _dirty, 80),
    ]
    table = Table(title=f"framing {args.lines:,} lines in {args.chunk:,}-byte chunks, 1 core")
    for column in ("stream", "MB/s", "framer lines/s", "bytes.split lines/s", "framer/split"):
        table.add_column(column, justify="left" if column == "stream" else "right")
    for name, make, size in rows:
        if args.only not in name:
            continue
        chunks = _chunks(make, args.lines, size, args.chunk)
        megabytes = sum(map(len, chunks)) / 1e6
        framed, lines = _best(_frame, chunks, args.repeat)
        floor, split_lines = _best(_split, chunks, args.repeat)
        assert lines == split_lines == args.lines, (lines, split_lines)
        table.add_row(
            escape(name),
            f"{megabytes / framed:,.0f}",
            f"{lines / framed:,.0f}",
            f"{lines / floor:,.0f}",
            f"{floor / framed:.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
