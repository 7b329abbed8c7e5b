"""A synthetic Megatron-LM style pretraining log: what a healthy multi-node job prints.

Start-up chatter (arguments, distributed init, model build), NCCL INFO lines from every rank,
then per iteration the rank-0 progress line, memory reports, throughput lines, periodic
validation and checkpoint saves with their timers. The line shapes follow Megatron-LM's
`training.py` log format (`iteration N/M | consumed samples: ... | lm loss: ...`); the numbers
come from a seeded generator, so a given seed yields the same log.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

_ARGS = (
    "accumulate_allreduce_grads_in_fp32", "adam_beta1", "adam_beta2", "adam_eps", "bf16",
    "clip_grad", "data_parallel_size", "ffn_hidden_size", "global_batch_size", "hidden_size",
    "init_method_std", "log_interval", "lr", "lr_decay_style", "lr_warmup_iters",
    "micro_batch_size", "min_lr", "num_attention_heads", "num_layers", "save_interval",
    "seq_length", "tensor_model_parallel_size", "pipeline_model_parallel_size", "weight_decay",
)  # fmt: skip


def megatron_lines(seed: int, iterations: int, *, nodes: int = 4, gpus: int = 8) -> Iterator[str]:
    """The lines of one healthy job, in order."""
    rng = random.Random(seed)
    world = nodes * gpus
    yield f"using world size: {world}, data-parallel size: {world}, tensor-model-parallel size: 1"
    yield "------------------------ arguments ------------------------"
    for name in _ARGS:
        yield f"  {name} {'.' * (48 - len(name))} {rng.choice(['True', '0.9', '1e-08', '128'])}"
    yield "-------------------- end of arguments ---------------------"
    yield "> initializing torch distributed ..."
    for rank in range(world):
        node = rank // gpus
        yield (
            f"gpu-node-{node:03d}:{1000 + rank}:{2000 + rank} [{rank % gpus}] NCCL INFO "
            f"Bootstrap : Using eth0:10.0.{node}.{rank % gpus + 10}<0>"
        )
        for channel in range(4):
            peer = (rank + 1) % world
            yield (
                f"gpu-node-{node:03d}:{1000 + rank}:{2000 + rank} [{rank % gpus}] NCCL INFO "
                f"Channel {channel:02d}/32 : {rank}[{rank % gpus}] -> {peer}[{peer % gpus}] "
                f"via P2P/IPC/read"
            )
    yield "> building GPT model ..."
    yield " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): 6738415616"
    yield "[after model, optimizer, and learning rate scheduler are built] datetime: 2024-05-01 "
    loss = 10.5
    lr = 0.0
    for it in range(1, iterations + 1):
        lr = min(3e-4, 3e-4 * it / 2000)
        loss = max(1.8, loss * 0.9995 + rng.uniform(-0.02, 0.02))
        elapsed = rng.uniform(1150.0, 1250.0)
        yield (
            f" iteration {it:>8}/{500000:>8} | consumed samples: {it * 1024:>12} | "
            f"elapsed time per iteration (ms): {elapsed:.1f} | learning rate: {lr:.6E} | "
            f"global batch size: {1024:>5} | lm loss: {loss:.6E} | loss scale: 1.0 | "
            f"grad norm: {rng.uniform(0.2, 1.5):.3f} | number of skipped iterations: {0:>3} | "
            f"number of nan iterations: {0:>3} |"
        )
        yield (
            f"[Rank 0] (after {it} iterations) memory (MB) | allocated: "
            f"{rng.uniform(20000, 21000):.1f} | max allocated: {rng.uniform(30000, 31000):.1f} | "
            f"reserved: 34000.0 | max reserved: 34000.0"
        )
        yield (
            f" [{it}] throughput per GPU (TFLOP/s/GPU): {rng.uniform(150, 170):.1f} | "
            f"tokens/s: {rng.randrange(800_000, 900_000)}"
        )
        if it % 100 == 0:
            yield "-" * 100
            yield (
                f" validation loss at iteration {it} | lm loss value: {loss * 1.02:.6E} | "
                f"lm loss PPL: {2.718**loss:.6E} |"
            )
            yield "-" * 100
        if it % 250 == 0:
            yield f"saving checkpoint at iteration {it:>7} to /checkpoints/gpt-7b"
            yield f"  successfully saved checkpoint at iteration {it:>7} to /checkpoints/gpt-7b"
            yield "(min, max) time across ranks (ms):"
            dots = "." * 32
            yield f"    save-checkpoint {dots}: ({elapsed:.2f}, {elapsed + 1:.2f})"
