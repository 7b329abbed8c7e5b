"""Synthetic Megatron-style training logs: healthy, with a NaN loss, with a loss spike."""

from __future__ import annotations

import math
import random

CHECKPOINT_EVERY = 50


def iteration_line(step: int, loss: str, grad_norm: str = "0.412") -> str:
    return (
        f"[2024-05-01 10:{step // 60 % 60:02d}:{step % 60:02d}] iteration {step:8d}/  500000 | "
        f"consumed samples: {step * 128:12d} | elapsed time per iteration (ms): 1234.5 | "
        f"learning rate: 1.500E-04 | global batch size:   128 | lm loss: {loss} | "
        f"loss scale: 65536.0 | grad norm: {grad_norm} | number of skipped iterations:   0 | "
        "number of nan iterations:   0 |"
    )


def healthy_loss(step: int, rng: random.Random) -> float:
    """Warm-up decrease from about 10 to 2.4, with a few percent of noise on each step."""
    return (2.4 + 7.6 * math.exp(-step / 30)) * (1 + rng.uniform(-0.04, 0.04))


def training_log(
    steps: int = 200, *, nan_at: int | None = None, spike_at: int | None = None
) -> str:
    """`steps` iterations, a checkpoint saved every CHECKPOINT_EVERY; a NaN loss from `nan_at`
    on (the run keeps logging), or one loss three times the usual at `spike_at`."""
    rng = random.Random(12)
    lines = [
        "using world size: 8, data-parallel size: 8, tensor-model-parallel size: 1",
        "> building GPT model ...",
        "training ...",
    ]
    for step in range(1, steps + 1):
        loss = healthy_loss(step, rng)
        if nan_at is not None and step >= nan_at:
            lines.append(iteration_line(step, "NaN", "nan"))
        elif spike_at is not None and step == spike_at:
            lines.append(iteration_line(step, f"{loss * 3:.6E}"))
        else:
            lines.append(iteration_line(step, f"{loss:.6E}"))
        if step % CHECKPOINT_EVERY == 0:
            lines.append(f"saving checkpoint at iteration {step:7d} to /ckpt/gpt")
            lines.append(f"  successfully saved checkpoint at iteration {step:7d} to /ckpt/gpt")
    return "\n".join(lines) + "\n"
