"""Generalisation pass 7: families written from upstream spellings, as a verdict.

Each failing log is a few healthy training steps and one report as its upstream code prints
it: host-memory kills in job managers' words (Slurm's srun and slurmstepd, the OUT_OF_MEMORY job
state, the memory cgroup's pre-4.19 kill header, Hadoop YARN and Spark) and host allocations a
Python runtime refused (NumPy, Arrow); PyTorch's debug-mode collective checks (monitored
barriers, mismatched collectives), its 1.x wait() timeout and its device-mismatch check; NCCL's
fatal-error stats check and proxy UDS calls; torch.save's central-directory write; torch's cuDNN
version check; accelerate's port check; Ray's GCS client; XLA's coordination-service RPC
rewrite; c10d's store error where a rank raises it. Each healthy log carries a harmless
neighbour of those reports (a completed task, a state query, a progress line, a retry), which
must stay silent, and a run that ended with c10d's store warnings at teardown is healthy.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import Action, RuleSet
from tests.rules.families import assert_family_verdict, assert_healthy, verdict_of

STEPS = "".join(
    f"[2024-05-01 10:0{i}:00] step {i * 50:>5} | loss 1.873 | lr 2.0e-05 | 3.1 it/s\n"
    for i in range(1, 4)
)

ESCALATE = Action.ESCALATE
NOTIFY = Action.NOTIFY_USER
RESTART = Action.RESTART_JOB

FAILING: dict[str, tuple[str, str, Action]] = {
    # host memory, as job managers report the kill
    "srun task oom": ("srun: error: gpu-node-3: task 0: Out Of Memory", "host_oom", NOTIFY),
    "srun tasks oom": (
        "srun: error: gpu-node-[3-4]: tasks 0-15: Out Of Memory",
        "host_oom",
        NOTIFY,
    ),
    "slurmstepd task oom": ("slurmstepd: task 3 (41822) Out Of Memory (OOM)", "host_oom", NOTIFY),
    "seff state": ("State: OUT_OF_MEMORY (exit code 0)", "host_oom", NOTIFY),
    "scontrol state": (
        "JobId=4411 JobName=train JobState=OUT_OF_MEMORY Reason=OutOfMemory Dependency=(null)",
        "host_oom",
        NOTIFY,
    ),
    "sacct cut state": (
        "4411.0           python        gpu    default         16 OUT_OF_ME+    0:125",
        "host_oom",
        NOTIFY,
    ),
    "memcg kill header": (
        "[  818.375717] Task in /kubepods/burstable/pod42/abc killed as a result of limit of "
        "/kubepods/burstable/pod42",
        "host_oom",
        NOTIFY,
    ),
    "yarn physical": (
        "Container [pid=8788,containerID=container_1598507699008_0094_01_000010] is running "
        "beyond physical memory limits. Current usage: 9.8 GB of 9.8 GB physical memory used; "
        "43.0 GB of 47.6 TB virtual memory used. Killing container.",
        "host_oom",
        NOTIFY,
    ),
    "yarn hadoop 3": (
        "Container [pid=3730,containerID=container_1725006692302_0009_01_000003] is running "
        "1723304448B beyond the 'PHYSICAL' memory limit. Current usage: 1.1 GB of 1 GB physical "
        "memory used; 1.7 GB of 2.1 GB virtual memory used. Killing container.",
        "host_oom",
        NOTIFY,
    ),
    "spark on yarn": (
        "ExecutorLostFailure (executor 3 exited caused by one of the running tasks) Reason: "
        "Container killed by YARN for exceeding memory limits. 10.4 GB of 10 GB physical memory "
        "used.",
        "host_oom",
        NOTIFY,
    ),
    # host allocations a Python runtime refused
    "numpy array": (
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 12.0 GiB for an array "
        "with shape (50000, 64000) and data type float32",
        "host_oom",
        NOTIFY,
    ),
    "numpy 2 array": (
        "numpy._core._exceptions._ArrayMemoryError: Unable to allocate 512. MiB for an array "
        "with shape (8192, 8192) and data type float64",
        "host_oom",
        NOTIFY,
    ),
    "numpy as MemoryError": (
        "MemoryError: Unable to allocate 3.73 GiB for an array with shape (1000000000,) and "
        "data type float32",
        "host_oom",
        NOTIFY,
    ),
    "arrow malloc": (
        "pyarrow.lib.ArrowMemoryError: malloc of size 4294967296 failed",
        "host_oom",
        NOTIFY,
    ),
    "arrow realloc": (
        "pyarrow.lib.ArrowMemoryError: realloc of size 2147483712 failed",
        "host_oom",
        NOTIFY,
    ),
    # PyTorch's debug-mode collective checks and its 1.x wait() timeout
    "monitored barrier rank 0": (
        "RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1800000 ms",
        "nccl_timeout",
        RESTART,
    ),
    "monitored barrier all ranks": (
        "[rank0]: RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 600000 ms",
        "nccl_timeout",
        RESTART,
    ),
    "monitored barrier other rank": (
        "RuntimeError: Rank 2 successfully reached monitoredBarrier, but received errors while "
        "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.",
        "nccl_timeout",
        RESTART,
    ),
    "wrapper barrier": (
        "RuntimeError: ProcessGroupWrapper: Monitored Barrier encountered error running "
        "collective: CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE, "
        "TensorShape=[1024], TensorDtypes=Float, TensorDeviceTypes=cuda). Error: ",
        "nccl_timeout",
        RESTART,
    ),
    "1.x wait timeout": (
        "RuntimeError: NCCL communicator was aborted on rank 1.  Original reason for failure "
        "was: Work WorkNCCL(OpType=ALLREDUCE, TensorShape=[1024], Timeout(ms)=1800000) timed "
        "out in call to wait().",
        "nccl_timeout",
        RESTART,
    ),
    "mismatched collectives": (
        "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running "
        "collective: CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE), but Rank 1 is "
        "running collective: CollectiveFingerPrint(SequenceNumber=12, OpType=BROADCAST).",
        "RuntimeError",
        NOTIFY,
    ),
    "tensors on two devices": (
        "RuntimeError: Expected all tensors to be on the same device, but found at least two "
        "devices, cuda:0 and cpu!",
        "RuntimeError",
        NOTIFY,
    ),
    # NCCL's transport floor
    "nccl ib fatal stats": (
        "gpu-node-3:1234:1290 [0] transport/net_ib/common.cc:32 NCCL WARN communicator "
        "encountered a fatal error (detected in ncclIbIsend)",
        "nccl_transport_error",
        RESTART,
    ),
    "nccl proxy uds": (
        "gpu-node-3:1234:1290 [0] proxy.cc:1275 NCCL WARN ncclProxyCallBlockingUDS call to "
        "tpRank 3(5f2c9a01d3e4b7aa) failed : 3",
        "nccl_transport_error",
        RESTART,
    ),
    # storage, start-up and rendezvous
    "torch.save central directory": (
        "RuntimeError: [enforce fail at inline_container.cc:337] . PytorchStreamWriter failed "
        "writing central directory: file write failed",
        "disk_full",
        NOTIFY,
    ),
    "torch.save central directory 2.x": (
        "RuntimeError: [enforce fail at inline_container.cc:626] . PytorchStreamWriter failed "
        "writing central directory for archive archive: file write failed",
        "disk_full",
        NOTIFY,
    ),
    "cudnn version check": (
        "RuntimeError: cuDNN version incompatibility: PyTorch was compiled  against (8, 9, 2) "
        "but found runtime version (8, 5, 0). PyTorch already comes bundled with cuDNN.",
        "startup_error",
        NOTIFY,
    ),
    "cudnn version check 1.x": (
        "RuntimeError: cuDNN version incompatibility: PyTorch was compiled against (8, 3, 2) "
        "but linked against (8, 2, 1)",
        "startup_error",
        NOTIFY,
    ),
    "accelerate port": (
        "ConnectionError: Tried to launch distributed communication on port `29500`, but "
        "another process is utilizing it. Please specify a different port (such as using the "
        "`--main_process_port` flag or specifying a different `main_process_port` in your "
        "config file) and rerun your script.",
        "rendezvous_error",
        NOTIFY,
    ),
    "ray gcs gone": (
        "[2024-05-01 10:00:00,000 E 3044 30260] gcs_rpc_client.h:552: Failed to connect to GCS "
        "within 60 seconds. GCS may have been killed. It's either GCS is terminated by "
        "`ray stop` or is killed unexpectedly.",
        "rendezvous_error",
        RESTART,
    ),
    "xla coordination rpc": (
        "jax.errors.JaxRuntimeError: UNAVAILABLE: Failed to send RPC to coordination service. "
        "Either the leader task was preempted/died/restarted unexpectedly or this task is "
        "experiencing network issues.",
        "communicator_aborted",
        ESCALATE,
    ),
    # c10d's store error where it is raised (issue 11): the exception line, a C++ what()
    "c10d store error raised": (
        "[rank3]: torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection "
        "was likely closed. Did the remote server shutdown or crash?",
        "rendezvous_error",
        RESTART,
    ),
    "c10d store error uncaught": (
        "  what():  Failed to recv, got 0 bytes. Connection was likely closed. Did the remote "
        "server shutdown or crash?",
        "rendezvous_error",
        RESTART,
    ),
}

HEALTHY = {
    "srun task completed": "srun: gpu-node-3: task 0: Completed",
    "sacct completed": "4410.0           python        gpu    default         16  COMPLETED"
    "      0:0",
    "sacct query": "sacct --state=OUT_OF_MEMORY --starttime=2024-05-01 --format=JobID,State",
    "memcg usage line": "memory: usage 1048576kB, limit 2097152kB, failcnt 0",
    "yarn transition": "Container container_1598507699008_0094_01_000010 transitioned from "
    "RUNNING to KILLING",
    "numpy allocation note": "Allocating 12.0 GiB for an array with shape (50000, 64000) and "
    "data type float32",
    "wrapper progress": "I0501 10:00:00.000000 1234 ProcessGroupWrapper.cpp:565] [Rank 0] "
    "Running collective: CollectiveFingerPrint(SequenceNumber=12, OpType=ALLREDUCE)",
    "monitored barrier call": "dist.monitored_barrier(timeout=timedelta(seconds=30), "
    "wait_all_ranks=True)",
    "nccl socket retry": "gpu-node-3:1234:1290 [0] misc/socket.cc:400 NCCL WARN "
    "ncclSocketConnect: connect returned Connection timed out, retrying (1/20) after sleep for "
    "100 msec",
    "nccl gid notice": "gpu-node-3:1234:1290 [0] NCCL WARN NET/IB : mlx5_0:1 GID table changed",
    "central directory progress": "Writing central directory for checkpoint archive "
    "/checkpoints/step_100.zip",
    "cudnn version print": "torch.backends.cudnn.version(): 8902 (compiled against (8, 9, 2))",
    "accelerate defaults": "The following values were not passed to `accelerate launch` and "
    "had defaults used instead: `--num_processes` was set to a value of `8`",
    "coordination rpc info": "I0926 17:26:30.100000  157988 coordination_service_agent.cc:120] "
    "Sending RPC to coordination service: RegisterTask",
    "nccl heartbeat store check": "[rank8]:[W318 10:00:41.929037914 ProcessGroupNCCL.cpp:1771] "
    '[PG ID 0 PG GUID 0 Rank 8] Failed to check the "should dump" flag on TCPStore, (maybe '
    "TCPStore server has shut down too early), with error: Connection reset by peer",
}

# c10d at teardown (issue 11): the rank hosting the TCPStore exits first, the other ranks'
# store client logs the failed read as a warning and rethrows, and ProcessGroupNCCL's heartbeat
# monitor, whose periodic store check it was, catches it, warns and gives up. In 2.8+ words
# and in the lower-case ones of the releases before.
TEARDOWN = (
    "Training completed. Saved final checkpoint to /checkpoints/final\n"
    + "".join(
        f"[rank{r}]:[W901 07:40:19.96857{r}826 TCPStore.cpp:125] [c10d] recvValue failed on "
        f"SocketImpl(fd=64, addr=[localhost]:3598{r}, remote=[localhost]:45489): Failed to "
        "recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or "
        f"crash?\n[rank{r}]:[W901 07:40:19.97118{r}476 ProcessGroupNCCL.cpp:1826] [PG ID 0 PG "
        f'GUID 0 Rank {r}] Failed to check the "should dump" flag on TCPStore, (maybe TCPStore '
        "server has shut down too early), with error: Failed to recv, got 0 bytes. Connection "
        "was likely closed. Did the remote server shutdown or crash?\n"
        for r in range(1, 4)
    )
    + "[rank1]:[W625 23:35:35.303797152 TCPStore.cpp:125] [c10d] recvValue failed on "
    "SocketImpl(fd=6, addr=[::ffff:127.0.0.1]:37468, remote=[::ffff:127.0.0.1]:6006): failed to "
    "recv, got 0 bytes\n"
    "[rank1]:[W625 23:35:35.311127584 ProcessGroupNCCL.cpp:1662] [PG ID 0 PG GUID "
    '0(default_pg) Rank 1] Failed to check the "should dump" flag on TCPStore, (maybe TCPStore '
    "server has shut down too early), with error: failed to recv, got 0 bytes"
)


@pytest.mark.parametrize(("line", "failure_type", "action"), FAILING.values(), ids=list(FAILING))
def test_each_spelling_gets_its_family_verdict(
    pack: RuleSet, tmp_path: Path, line: str, failure_type: str, action: Action
) -> None:
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, line), failure_type, action)


@pytest.mark.parametrize("text", HEALTHY.values(), ids=list(HEALTHY))
def test_the_harmless_neighbours_stay_healthy(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_a_failed_monitored_barrier_yields_to_the_rank_that_died(
    pack: RuleSet, tmp_path: Path
) -> None:
    """Rank 0's barrier report is a timeout like the watchdog's: the host OOM is the cause."""
    verdict = verdict_of(
        pack,
        tmp_path,
        STEPS,
        "RuntimeError: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1800000 ms",
        "srun: error: gpu-node-4: task 1: Out Of Memory",
    )
    assert_family_verdict(verdict, "host_oom", NOTIFY)


def test_c10d_store_warnings_at_teardown_stay_healthy(pack: RuleSet, tmp_path: Path) -> None:
    """Warnings the store client and the heartbeat monitor log after training ended, from
    several ranks: no rank raised, the run is healthy."""
    assert_healthy(verdict_of(pack, tmp_path, STEPS, TEARDOWN))


def test_the_c10d_store_error_a_rank_raises_is_still_a_rendezvous_failure(
    pack: RuleSet, tmp_path: Path
) -> None:
    """The same read failing in the main thread: warned, then raised, and the rank dies."""
    raised = (
        "[rank1]:[W901 07:40:19.968570826 TCPStore.cpp:125] [c10d] recvValue failed on "
        "SocketImpl(fd=64, addr=[localhost]:35986, remote=[localhost]:45489): Failed to recv, "
        "got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/workspace/train.py", line 120, in <module>\n'
        "[rank1]:     dist.barrier()\n"
        '[rank1]:   File "/usr/lib/python3.12/site-packages/torch/distributed/'
        'distributed_c10d.py", line 4635, in barrier\n'
        "[rank1]:     work = group.barrier(opts=opts)\n"
        "[rank1]: torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection "
        "was likely closed. Did the remote server shutdown or crash?"
    )
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, raised), "rendezvous_error", RESTART)


# c10::Error's what() ends with the error's C++ backtrace, and c10's loggers print what() whole:
# the store client's warning and the heartbeat monitor's carry it at teardown. After a
# warning-level line it is that warning's text; after anything else it still escalates.
BACKTRACE = (
    "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:682 (most "
    "recent call first):\n"
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f3c2a1b4e88 in "
    "/usr/local/lib/python3.11/site-packages/torch/lib/libc10.so)\n"
    "frame #1: <unknown function> + 0x5ba8afe (0x7f3c0e5a8afe in "
    "/usr/local/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so)\n"
    "frame #2: c10d::TCPStore::check(std::vector<std::string, std::allocator<std::string> > "
    "const&) + 0x2a9 (0x7f3c0e5a1f49 in "
    "/usr/local/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so)\n"
    "frame #3: c10d::ProcessGroupNCCL::heartbeatMonitor() + 0x3b5 (0x7f3bd0a5f2c5 in "
    "/usr/local/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)\n"
    "frame #4: <unknown function> + 0x94ac3 (0x7f3c2c094ac3 in "
    "/usr/lib/x86_64-linux-gnu/libc.so.6)\n"
)
STORE_ERROR = (
    "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown "
    "or crash?"
)


def _warned_with_backtrace(r: int) -> str:
    return (
        f"[rank{r}]:[W901 07:40:19.96857{r}826 TCPStore.cpp:125] [c10d] recvValue failed on "
        f"SocketImpl(fd=64, addr=[localhost]:3598{r}, remote=[localhost]:45489): {STORE_ERROR}\n"
        + BACKTRACE
        + f"[rank{r}]:[W901 07:40:19.97118{r}476 ProcessGroupNCCL.cpp:1826] [PG ID 0 PG GUID 0 "
        f'Rank {r}] Failed to check the "should dump" flag on TCPStore, (maybe TCPStore server '
        f"has shut down too early), with error: {STORE_ERROR}\n" + BACKTRACE
    )


TEARDOWN_WITH_BACKTRACES = (
    "Training completed. Saved final checkpoint to /checkpoints/final\n"
    + "".join(_warned_with_backtrace(r) for r in range(1, 4))
    # An older release's logger: no date in the prefix.
    + "[W TCPStore.cpp:138] [c10d] recvVector failed on SocketImpl(fd=6): failed to recv, got 0 "
    "bytes\n" + BACKTRACE
)


def test_c10d_store_warnings_carrying_their_backtrace_stay_healthy(
    pack: RuleSet, pack_regex: RuleSet, tmp_path: Path
) -> None:
    """The teardown warnings with c10::Error's backtrace after each, from several ranks on two
    nodes: the backtraces are the warnings' text, not native failures of their own."""
    for one in (pack, pack_regex):
        assert_healthy(verdict_of(one, tmp_path, STEPS, TEARDOWN_WITH_BACKTRACES))
        assert_healthy(
            verdict_of(one, tmp_path, STEPS, _warned_with_backtrace(1), _warned_with_backtrace(2))
        )


@pytest.mark.parametrize(
    "raised",
    [
        # the warning with its backtrace, then the rank's own traceback
        _warned_with_backtrace(1) + "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/workspace/train.py", line 120, in <module>\n'
        "[rank1]:     dist.barrier()\n"
        f"[rank1]: torch.distributed.DistNetworkError: {STORE_ERROR}",
        # the warning with its backtrace, then the error nobody caught in C++
        _warned_with_backtrace(1)
        + "terminate called after throwing an instance of 'c10::DistNetworkError'\n"
        f"  what():  {STORE_ERROR}\n" + BACKTRACE,
    ],
    ids=["exception line", "terminate what"],
)
def test_the_store_error_raised_after_the_warned_backtrace_is_still_a_rendezvous_failure(
    pack: RuleSet, tmp_path: Path, raised: str
) -> None:
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, raised), "rendezvous_error", RESTART)


@pytest.mark.parametrize(
    "text",
    [
        BACKTRACE,
        "[rank1]:[E901 07:40:19.968570826 ProcessGroupNCCL.cpp:1300] [PG ID 0 PG GUID 0 Rank 1] "
        "Heartbeat monitor saw an error\n" + BACKTRACE,
        # a gap between the warning and the backtrace: nothing says whose it is
        "[rank1]:[W901 07:40:19.968570826 TCPStore.cpp:125] [c10d] recvValue failed on "
        f"SocketImpl(fd=64): {STORE_ERROR}\n[rank2]: loading shard 3 of 8\n" + BACKTRACE,
    ],
    ids=["alone", "after an error-level line", "after a gap"],
)
def test_a_backtrace_no_warning_carries_still_escalates(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_family_verdict(
        verdict_of(pack, tmp_path, STEPS, text), "unexplained_traceback", ESCALATE
    )
