"""Benign training-log lines for the benchmarks: what healthy jobs print, generated at run time.

Mostly DeepSpeed-style progress lines, then NCCL INFO chatter, allocator warnings, the
deprecated NCCL_ASYNC_ERROR_HANDLING warning (a trap no rule may fire on) and DataLoader
warnings. Deterministic for a given random generator.
"""

from __future__ import annotations

import random


def benign_line(rng: random.Random, n: int) -> str:
    """One line a healthy job prints: mostly progress, then NCCL chatter and warnings."""
    stamp = f"2024-05-01 {n // 3_600_000 % 24:02d}:{n // 60_000 % 60:02d}:{n // 1000 % 60:02d}"
    kind = rng.random()
    rank = rng.randrange(64)
    if kind < 0.5:
        return (
            f"[{stamp},{n % 1000:03d}] [INFO] [logging.py:96:log_dist] [Rank {rank}] "
            f"step={n} loss={rng.uniform(1.5, 3.0):.4f} lr={rng.uniform(1e-5, 3e-4):.3e} "
            f"grad_norm={rng.uniform(0.1, 2.0):.3f} tokens/s={rng.randrange(80_000, 160_000)}"
        )
    if kind < 0.8:
        peer = (rank + 1) % 64
        return (
            f"gpu-node-{rank // 8:03d}:{4000 + rank}:{4100 + rank} [{rank % 8}] NCCL INFO "
            f"Channel {rng.randrange(32):02d}/32 : {rank}[{rank % 8}] -> {peer}[{peer % 8}] "
            f"via P2P/IPC/read comm 0x{rng.getrandbits(32):08x} nRanks 64"
        )
    if kind < 0.9:
        return (
            f"[{stamp},{n % 1000:03d}] [WARNING] [stage3.py:1850:step] {rng.randrange(1, 9)} "
            "pytorch allocator cache flushes since last step. this happens when there is high "
            "memory pressure"
        )
    if kind < 0.95:
        return (
            "Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use "
            "TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function getCvarInt)"
        )
    return (
        f"/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py:{rng.randrange(900)}"
        f": UserWarning: This DataLoader will create {rng.randrange(8, 33)} worker processes"
    )


def benign_text(rng: random.Random, size: int, start: int = 0) -> tuple[str, int]:
    """Whole benign lines adding up to at least `size` bytes, and how many."""
    lines: list[str] = []
    length = 0
    while length < size:
        line = benign_line(rng, start + len(lines))
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines) + "\n", len(lines)
