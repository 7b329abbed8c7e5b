"""One simulated training rank: the program each node runs under `diagnoser run`.

It prints what a Megatron-style pretraining rank prints (NCCL INFO bring-up, the
ProcessGroupNCCL options, iteration lines with loss, learning rate, grad norm and tokens/s on
the last rank, checkpoint saves) at the pace of a real job sped up to fractions of a second
per iteration. All ranks share one wall-clock schedule (`--start-at`), so they stay in step
without talking to each other. The schedule starts when the demo writes `--start-file`, once
every rank has come up (a rendezvous: a loaded machine starts processes seconds apart).

At `--fail-at` the GPU of `--faulty-rank` falls off the PCIe bus: that rank's node logs the
driver's Xid 79 lines (the entrypoint follows the kernel log into the job output, as
`dmesg --follow` would) and PyTorch's CUDA error ends the rank with status 1. The other ranks are
then stuck in the iteration's all-reduce until the NCCL watchdog times the collective out; they
print the watchdog's messages and abort (SIGABRT), as ProcessGroupNCCL takes the process down.

The message shapes follow PyTorch's ProcessGroupNCCL.cpp, NCCL's INFO output and the NVIDIA
driver's NVRM lines. Standard library only: it stands for the user's training code.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path

FAULTY_PCI = "0000:2b:00"
FAULTY_GPU_UUID = "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae"
SEQ_BASE = 40
"""NCCL sequence numbers before the first iteration (bring-up broadcasts and barriers)."""
CHECKPOINT_EVERY = 5


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--node", required=True)
    parser.add_argument(
        "--start-file", required=True, help="file that will hold the epoch seconds of step 1"
    )
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--fail-at", type=int, default=0, help="iteration of the fault; 0: none")
    parser.add_argument("--faulty-rank", type=int, default=-1)
    parser.add_argument("--nccl-timeout-ms", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def glog(severity: str, source: str) -> str:
    """PyTorch's c10 log prefix: severity, MMDD, wall time with nanoseconds, file:line."""
    now = dt.datetime.now()
    nanos = f"{now.microsecond:06d}{random.randrange(1000):03d}"
    return f"{severity}{now:%m%d %H:%M:%S}.{nanos} {source}"


def wait_for_start(path: Path) -> float:
    """The rendezvous: every rank is up once the file exists; it holds the start time."""
    while True:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            return float(text)
        time.sleep(0.05)


def sleep_until(deadline: float) -> None:
    delay = deadline - time.time()
    if delay > 0:
        time.sleep(delay)


class Rank:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank: int = args.rank
        self.world: int = args.world
        self.node: str = args.node
        self.pid = os.getpid()
        self.rng = random.Random(args.seed * 1000 + self.rank)
        self.ip = f"10.0.0.{11 + self.rank}"

    def nccl(self, thread: int, message: str) -> None:
        emit(f"{self.node}:{self.pid}:{thread} [0] NCCL INFO {message}")

    def bring_up(self) -> None:
        """What every rank prints before the first iteration."""
        if self.rank == 0:
            emit(
                f"using world size: {self.world}, data-parallel size: {self.world}, "
                "context-parallel size: 1, tensor-model-parallel size: 1, "
                "pipeline-model-parallel size: 1"
            )
            emit("> initializing torch distributed ...")
        emit(
            f"[rank{self.rank}]:[{glog('I', 'ProcessGroupNCCL.cpp:900')}] [PG 0 Rank {self.rank}]"
            f" ProcessGroupNCCL initialization options: size: {self.world}, global rank: "
            f"{self.rank}, TIMEOUT(ms): {self.args.nccl_timeout_ms}"
        )
        main, comm = self.pid, self.pid + 67
        self.nccl(main, f"Bootstrap : Using eth0:{self.ip}<0>")
        self.nccl(main, "cudaDriverVersion 12040")
        if self.rank == 0:
            emit("NCCL version 2.21.5+cuda12.4")
        self.nccl(comm, f"NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:{self.ip}<0>")
        self.nccl(comm, "Using network IB")
        if self.rank == 0:
            ring = " ".join(str(r) for r in range(self.world))
            self.nccl(comm, f"Channel 00/02 :    {ring}")
            self.nccl(comm, f"Channel 01/02 :    {ring}")
        previous, following = (self.rank - 1) % self.world, (self.rank + 1) % self.world
        for channel in range(2):
            self.nccl(
                comm, f"Channel {channel:02d}/0 : {previous}[0] -> {self.rank}[0] [receive] via "
                "NET/IB/0"
            )  # fmt: skip
            self.nccl(
                comm, f"Channel {channel:02d}/0 : {self.rank}[0] -> {following}[0] [send] via "
                "NET/IB/0"
            )  # fmt: skip
        self.nccl(comm, "Connected all rings")
        self.nccl(comm, "Connected all trees")
        self.nccl(
            comm,
            f"comm 0x55d0c8a1e{self.rank:03x} rank {self.rank} nranks {self.world} cudaDev 0 "
            f"nvmlDev 0 busId {0x2B + self.rank:x}000 commId 0x6f1c2a9e4b7d3e10 - Init COMPLETE",
        )
        if self.rank == self.world - 1:
            emit("> building GPT model ...")
            emit(
                " > number of parameters on (tensor, pipeline) model parallel rank (0, 0): "
                "1557686400"
            )
            emit("[after model, optimizer, and learning rate scheduler are built] done")
            emit("training ...")

    def iteration_line(self, iteration: int, loss: float) -> str:
        lr = 3.0e-4 * min(1.0, iteration / 100)
        elapsed_ms = self.args.step_seconds * 1000 * self.rng.uniform(0.97, 1.03)
        tokens = int(512 * 4096 / (elapsed_ms / 1000) / 400)  # a sped-up clock, scaled down
        stamp = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        return (
            f" [{stamp}] iteration {iteration:>8}/{self.args.iterations:>8} | consumed samples: "
            f"{iteration * 512:>12} | elapsed time per iteration (ms): {elapsed_ms:.1f} | "
            f"throughput per GPU (TFLOP/s/GPU): {self.rng.uniform(150, 170):.1f} | "
            f"tokens/s: {tokens} | learning rate: {lr:.6E} | global batch size: {512:>5} | "
            f"lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: {self.rng.uniform(0.6, 2.4):.3f}"
            " | number of skipped iterations:   0 | number of nan iterations:   0 |"
        )

    def train(self) -> int:
        self.bring_up()
        start, step = wait_for_start(Path(self.args.start_file)), self.args.step_seconds
        loss = 10.9
        for iteration in range(1, self.args.iterations + 1):
            sleep_until(start + iteration * step)
            if iteration == self.args.fail_at:
                return self.fault(iteration)
            loss = max(2.0, loss * 0.985 + self.rng.uniform(-0.03, 0.03))
            if self.rank == self.world - 1:
                emit(self.iteration_line(iteration, loss))
                if iteration % CHECKPOINT_EVERY == 0:
                    self.checkpoint(iteration)
        return 0

    def checkpoint(self, iteration: int) -> None:
        path = "/checkpoints/gpt-1.5b"
        emit(f"saving checkpoint at iteration {iteration:>7} to {path}")
        emit(f"  successfully saved checkpoint at iteration {iteration:>7} to {path}")

    def fault(self, iteration: int) -> int:
        seq = SEQ_BASE + iteration
        if self.rank == self.args.faulty_rank:
            return self.fall_off_the_bus(seq)
        return self.time_out(seq)

    def fall_off_the_bus(self, seq: int) -> int:
        uptime = 9312.402118 + self.rng.uniform(0, 1)
        # The entrypoint follows the kernel log (dmesg --follow) into the job's output.
        emit(f"[{uptime:12.6f}] NVRM: GPU at PCI:{FAULTY_PCI}: {FAULTY_GPU_UUID}")
        xid = f"NVRM: Xid (PCI:{FAULTY_PCI}): 79, GPU has fallen off the bus."
        emit(f"[{uptime + 0.000013:12.6f}] {xid}")
        emit(f"[{uptime + 0.000022:12.6f}] NVRM: GPU {FAULTY_PCI}.0: GPU has fallen off the bus.")
        time.sleep(0.2)
        prefix = f"[rank{self.rank}]:"
        for line in (
            "Traceback (most recent call last):",
            '  File "/workspace/Megatron-LM/pretrain_gpt.py", line 278, in <module>',
            "    pretrain(",
            '  File "/workspace/Megatron-LM/megatron/training/training.py", line 386, in pretrain',
            "    iteration, num_floating_point_operations_so_far = train(",
            '  File "/workspace/Megatron-LM/megatron/training/training.py", line 1432, in train',
            "    train_step(forward_step_func,",
            '  File "/workspace/Megatron-LM/megatron/core/distributed/param_and_grad_buffer.py", '
            "line 412, in finish_grad_sync",
            "    self.grad_reduce_handle.wait()",
            "torch.AcceleratorError: CUDA error: unspecified launch failure",
            "CUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
        ):
            emit(prefix + " " + line)
        return 1

    def time_out(self, seq: int) -> int:
        timeout_ms = self.args.nccl_timeout_ms
        # Blocked in the all-reduce the faulty rank never joins, until the watchdog fires.
        ran_ms = timeout_ms + self.rng.randrange(5, 40)
        time.sleep(ran_ms / 1000)
        work = (
            f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=1557686400, "
            f"NumelOut=1557686400, Timeout(ms)={timeout_ms})"
        )
        tag = f"[rank{self.rank}]:"
        caught = (
            f"[Rank {self.rank}] Watchdog caught collective operation timeout: {work} ran for "
            f"{ran_ms} milliseconds before timing out."
        )
        emit(f"{tag}[{glog('E', 'ProcessGroupNCCL.cpp:632')}] {caught}")
        emit(
            f"{tag}[{glog('E', 'ProcessGroupNCCL.cpp:1664')}] [PG 0 (default_pg) Rank "
            f"{self.rank}] Exception (either an error or timeout) detected by watchdog at work: "
            f"{seq}, last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}."
        )
        emit(
            f"{tag}[{glog('E', 'ProcessGroupNCCL.cpp:684')}] [Rank {self.rank}] Some NCCL "
            "operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, "
            "subsequent GPU operations might run on corrupted/incomplete data."
        )
        emit(
            f"{tag}[{glog('E', 'ProcessGroupNCCL.cpp:690')}] [Rank {self.rank}] To avoid data "
            "inconsistency, we are taking the entire process down."
        )
        emit(
            f"{tag}[{glog('E', 'ProcessGroupNCCL.cpp:1595')}] [PG 0 (default_pg) Rank "
            f"{self.rank}] Process group watchdog thread terminated with exception: {caught}"
        )
        emit("terminate called after throwing an instance of 'c10::DistBackendError'")
        # No core file for a simulated abort; then die as ProcessGroupNCCL's std::abort does.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGABRT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGABRT)
        return 134


def main(argv: list[str] | None = None) -> int:
    return Rank(parse(sys.argv[1:] if argv is None else argv)).train()


if __name__ == "__main__":
    sys.exit(main())
