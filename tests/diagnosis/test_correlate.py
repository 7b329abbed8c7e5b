"""Job-level correlation on events from the real engine and the shipped pack.

Every scenario is built from real log lines (public issues, NVIDIA and PyTorch formats, the
fixtures in tests/fixtures/logs) run through `JobScanner`: the verdicts below are what the
pack and `correlate` produce together, not what hand-made events would.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from diagnoser.diagnosis.correlate import Status, Verdict, correlate
from diagnoser.rules import Action, Category, RuleSet, load_dir, make_batch

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "logs"

XID_79 = "kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."


def timeout(rank: int, seq: int = 80078) -> str:
    return (
        f"[rank{rank}]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
        f"caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=BROADCAST, "
        "NumelIn=5056, NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before "
        "timing out."
    )


def progress(rank: int, enqueued: int, completed: int, work: int = 1580) -> str:
    return (
        f"[rank{rank}]:[E321 02:07:08.465150152 ProcessGroupNCCL.cpp:1664] [PG 1 Rank {rank}] "
        f"Exception (either an error or timeout) detected by watchdog at work: {work}, last "
        f"enqueued NCCL work: {enqueued}, last completed NCCL work: {completed}."
    )


CUDA_OOM = (
    "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has "
    "a total capacity of 31.47 GiB of which 12.73 GiB is free. Including non-PyTorch memory, this "
    "process has 18.73 GiB memory in use."
)
SIGKILL = "[ERROR] [launch.py:325:sigkill_handler] exits with return code = -9"
HOST_OOM = (
    "kernel: Out of memory: Killed process 15784 (python3) total-vm:11964kB, anon-rss:4288kB, "
    "file-rss:3028kB, shmem-rss:0kB"
)
WANDB = [
    "wandb: Network error (ConnectTimeout), entering retry loop.",
    "wandb: ERROR Run initialization has timed out after 90.0 sec. Please try increasing the "
    "timeout with the `init_timeout` setting: "
    "`wandb.init(settings=wandb.Settings(init_timeout=120))`.",
    "Traceback (most recent call last):",
    '  File "/date2/zhang_h/anaconda3/envs/myenv/lib/python3.10/asyncio/locks.py", '
    "line 214, in wait",
    "    await fut",
    "asyncio.exceptions.CancelledError",
]


@pytest.fixture(scope="module")
def pack() -> RuleSet:
    return load_dir(ROOT / "rules")


def diagnose(pack: RuleSet, logs: Mapping[str, Sequence[str]]) -> Verdict:
    """One scanner for the job, one stream per node, as `diagnoser diagnose` does."""
    scanner = pack.job_scanner()
    events = []
    for node, lines in logs.items():
        events.extend(scanner.feed(node, None, make_batch(list(lines)), 0.0))
        events.extend(scanner.flush(node, None, 0.0))
    return correlate(events, pack)


def fixture(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def test_xid79_on_one_node_outranks_timeouts_on_every_rank(pack: RuleSet) -> None:
    logs = {f"node-{n}": [timeout(rank) for rank in range(8 * n, 8 * n + 8)] for n in range(8)}
    logs["node-3"] = [XID_79, *logs["node-3"]]
    verdict = diagnose(pack, logs)
    assert verdict.action is Action.CORDON_NODE_AND_RESTART
    assert verdict.failure_type == "gpu_fallen_off_bus"
    assert verdict.culprit_nodes == ("node-3",)
    assert verdict.root is not None
    assert verdict.root.text == XID_79
    assert len(verdict.affected_ranks) == 64


def test_timeouts_everywhere_without_hardware_restart_the_job(pack: RuleSet) -> None:
    logs = {f"node-{n}": [timeout(rank) for rank in range(4 * n, 4 * n + 4)] for n in range(4)}
    verdict = diagnose(pack, logs)
    assert verdict.status is Status.FAILURE
    assert verdict.action is Action.RESTART_JOB
    assert verdict.category is Category.NETWORK
    assert verdict.failure_type == "nccl_timeout"
    assert verdict.culprit_nodes == ()


def test_cuda_oom_on_one_rank_notifies_the_user(pack: RuleSet) -> None:
    logs = {
        "node-0": [timeout(0), timeout(1)],
        "node-1": [CUDA_OOM, timeout(2)],
    }
    verdict = diagnose(pack, logs)
    assert verdict.action is Action.NOTIFY_USER
    assert verdict.failure_type == "cuda_oom"
    assert verdict.culprit_nodes == ("node-1",)


def test_a_healthy_run_with_noisy_warnings_is_healthy(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"node-0": fixture("healthy_with_traps.log")})
    assert verdict.status is Status.HEALTHY
    assert verdict.action is Action.NONE
    assert verdict.culprit_nodes == ()


def test_the_lagging_rank_is_named_among_timeouts(pack: RuleSet) -> None:
    logs = {
        "node-0": [progress(0, 1582, 1579), progress(3, 1582, 1579)],
        "node-1": [progress(9, 1579, 1579)],
        "node-2": [progress(17, 1582, 1579)],
    }
    verdict = diagnose(pack, logs)
    assert verdict.action is Action.RESTART_JOB
    assert verdict.culprit_nodes == ("node-1",)
    assert verdict.root is not None
    assert verdict.root.rank == 9
    assert "inferred" in verdict.summary


def test_torchrun_root_cause_host_is_preferred(pack: RuleSet) -> None:
    logs = {
        "launcher": fixture("torchrun_sigkill_cppo.log"),
        "node-7": [timeout(8), timeout(9)],
    }
    verdict = diagnose(pack, logs)
    assert verdict.failure_type == "process_killed"
    assert verdict.culprit_nodes == ("mlxlab115rp2n7682d40d9-20250521025625-6dyyd3-8nir8b-worker",)
    assert verdict.action is Action.ESCALATE
    assert verdict.status is Status.INCONCLUSIVE


def test_host_oom_evidence_settles_a_bare_sigkill(pack: RuleSet) -> None:
    logs = {"node-0": [timeout(0)], "node-1": [SIGKILL, HOST_OOM]}
    verdict = diagnose(pack, logs)
    assert verdict.failure_type == "host_oom"
    assert verdict.action is Action.NOTIFY_USER
    assert verdict.culprit_nodes == ("node-1",)


def test_a_bare_sigkill_stays_inconclusive(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"node-0": [timeout(0)], "node-1": [SIGKILL]})
    assert verdict.failure_type == "process_killed"
    assert verdict.action is Action.ESCALATE
    assert verdict.culprit_nodes == ("node-1",)


LOADING_SHARDS = "Loading checkpoint shards:  50%|█████     | 1/2 [00:41<00:41, 41.02s/it]"
VLLM_LOADING = (
    "Loading safetensors checkpoint shards:  25% Completed | 1/4 [00:02<00:07,  2.53s/it]"
)
ACCELERATE_SIGKILL = (
    "subprocess.CalledProcessError: Command '['/usr/bin/python3', 'train.py']' died with "
    "<Signals.SIGKILL: 9>."
)


def test_a_sigkill_while_loading_weights_is_a_host_oom(pack: RuleSet) -> None:
    """transformers loads checkpoint shards into host RAM: a SIGKILL there is the OOM killer's."""
    lines = [LOADING_SHARDS, "Traceback (most recent call last):",
             '  File "/usr/local/bin/accelerate", line 8, in <module>',
             "    sys.exit(main())", ACCELERATE_SIGKILL]  # fmt: skip
    verdict = diagnose(pack, {"node-0": ["Downloading shards: 100%", *lines]})
    assert verdict.failure_type == "host_oom"
    assert verdict.action is Action.NOTIFY_USER
    assert verdict.category is Category.RESOURCE
    assert verdict.culprit_nodes == ("node-0",)
    assert "host_memory_phase_loading_weights" in verdict.rule_ids
    assert "loading weights" in verdict.summary


def test_a_sigkill_after_vllm_weight_loading_is_a_host_oom(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"node-0": [VLLM_LOADING, SIGKILL]})
    assert verdict.failure_type == "host_oom"
    assert verdict.action is Action.NOTIFY_USER


def test_loading_weights_alone_is_healthy(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"node-0": [LOADING_SHARDS, VLLM_LOADING, "step 1: loss 2.31"]})
    assert verdict.status is Status.HEALTHY


def test_a_sigkill_long_after_loading_stays_inconclusive(pack: RuleSet) -> None:
    """Once the job has printed a training epoch since loading, the kill is no longer the
    loader's: who sent it is unknown again."""
    steps = [f"{{'loss': 1.{i:02d}, 'learning_rate': 2e-05, 'epoch': {i}}}" for i in range(60)]
    verdict = diagnose(pack, {"node-0": [LOADING_SHARDS, *steps, SIGKILL]})
    assert verdict.failure_type == "process_killed"
    assert verdict.action is Action.ESCALATE


def test_loading_on_another_node_does_not_explain_a_sigkill(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"node-0": [LOADING_SHARDS], "node-1": [SIGKILL]})
    assert verdict.failure_type == "process_killed"
    assert verdict.culprit_nodes == ("node-1",)


def test_a_sigkill_the_launcher_calls_out_of_memory_is_a_host_oom(pack: RuleSet) -> None:
    verdict = diagnose(
        pack, {"node-0": ["Rank(Worker): 16 caught unknown unhandled exception:",
                          "return code is -9, maybe OUT OF MEMORY, please check kmon"]}
    )  # fmt: skip
    assert verdict.failure_type == "host_oom"
    assert verdict.action is Action.NOTIFY_USER


IB_RETRY_EXCEEDED = (
    "gpu-node-2:1234:1300 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from "
    "peer 10.0.0.2<59402> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) reqSize=0 "
    "vendor_err=129 req_type=Send localGid ::ffff:10.0.0.1 remoteGids ::ffff:10.0.0.2 hca mlx5_3"
)


def child_failed(exitcode: str, traceback: str) -> list[str]:
    return [
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
        "============================================================",
        "train.py FAILED",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2024-08-01_13:23:20",
        "  host      : gpu-node-2",
        "  rank      : 3 (local_rank: 3)",
        f"  exitcode  : {exitcode} (pid: 33054)",
        "  error_file: <N/A>",
        f"  traceback : {traceback}",
        "============================================================",
    ]


def test_the_launchers_failure_summary_is_explained_by_the_workers_network_error(
    pack: RuleSet,
) -> None:
    """torchrun's root-cause block says which worker failed first, not why: the IB completion
    error that worker printed is the verdict (a restart), not an escalation of the summary."""
    lines = [IB_RETRY_EXCEEDED, *child_failed("-6", "Signal 6 (SIGABRT) received by PID 33054")]
    verdict = diagnose(pack, {"node-0": lines})
    assert (verdict.failure_type, verdict.action) == ("ib_error", Action.RESTART_JOB)
    assert "torchrun_root_cause_failed" in verdict.rule_ids


REMOTE_ERROR = [
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "NCCLUtils.hpp:317, remote process exited or there was a network error, NCCL version 2.20.5",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
    "prematurely.",
    "Last error:",
    "socketProgressOpt: Call to recv from 10.0.0.2<45678> failed : Connection reset by peer",
]


def test_a_workers_own_nccl_error_is_not_an_echo_of_its_exit(pack: RuleSet) -> None:
    """The NCCL rules call a timeout or remote error a symptom of a failed worker, which holds
    for the other ranks; the failed worker's own error, in its own log, is why it exited."""
    lines = [*REMOTE_ERROR, *child_failed("1", "To enable traceback see: docs")]
    verdict = diagnose(pack, {"node-0": lines})
    assert (verdict.failure_type, verdict.action) == ("nccl_remote_error", Action.RESTART_JOB)
    assert verdict.category is Category.NETWORK


def test_timeouts_elsewhere_stay_echoes_of_the_failed_worker(pack: RuleSet) -> None:
    logs = {"launcher": child_failed("1", "To enable traceback see: docs"),
            "gpu-node-5": [timeout(40), timeout(41)]}  # fmt: skip
    verdict = diagnose(pack, logs)
    assert (verdict.failure_type, verdict.action) == ("worker_process_failed", Action.ESCALATE)
    assert verdict.culprit_nodes == ("gpu-node-2",)


def test_the_launchers_failure_summary_alone_still_escalates(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"launcher": child_failed("1", "To enable traceback see: docs")})
    assert (verdict.failure_type, verdict.action) == ("worker_process_failed", Action.ESCALATE)
    assert verdict.culprit_nodes == ("gpu-node-2",)


def test_a_specific_rule_outranks_an_unclassified_traceback(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"node-0": WANDB})
    assert verdict.failure_type == "auxiliary_service_error"
    assert verdict.action is Action.NOTIFY_USER
    assert "python_unclassified_exception" in verdict.rule_ids


def test_never_cordon_without_a_named_node(pack: RuleSet) -> None:
    verdict = diagnose(pack, {"node-0": [XID_79]})
    assert verdict.culprit_nodes == ("node-0",)
    for node_logs in ({"n": [timeout(0)]}, {"n": [CUDA_OOM]}, {"n": WANDB}):
        other = diagnose(pack, node_logs)
        assert other.action is not Action.CORDON_NODE_AND_RESTART


def test_shared_service_failures_name_no_node(pack: RuleSet) -> None:
    verdict = diagnose(
        pack, {"node-0": ["kernel: nfs: server fs01.cluster.local not responding, still trying"]}
    )
    assert verdict.failure_type == "nfs_error"
    assert verdict.culprit_nodes == ()


def test_contained_ecc_restarts_without_cordon(pack: RuleSet) -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 94, pid=2931, Contained: SM (0x1). RST: No, D-RST: No"
    verdict = diagnose(pack, {"node-0": [line], "node-1": [timeout(3)]})
    assert verdict.action is Action.RESTART_JOB
    assert verdict.category is Category.HARDWARE
    assert verdict.culprit_nodes == ("node-0",)


def test_a_headless_exception_is_diagnosed_with_less_confidence(pack: RuleSet) -> None:
    frames = [
        "Traceback (most recent call last):",
        '  File "/workspace/train.py", line 171, in main',
        '    label = sample["labels"]',
    ]
    whole = diagnose(pack, {"node-0": [*frames, "KeyError: 'labels'"]})
    cut = diagnose(pack, {"node-0": ["KeyError: 'labels'"]})
    assert (cut.status, cut.action, cut.failure_type) == (
        whole.status,
        whole.action,
        whole.failure_type,
    )
    assert cut.culprit_nodes == ("node-0",)
    assert cut.confidence < whole.confidence


ABSL_SIGBUS = "*** SIGBUS received at time=1700000000 on cpu 6 ***"
CUT_ELASTIC_REPORT = [
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "============================================================",
]
POD_EXIT = "train-worker-1   0/1     ExitCode:1           0             10m"


def test_pass8_catch_alls_never_hide_the_cause_printed_on_another_node(pack: RuleSet) -> None:
    """A cut elastic report on the launcher, kubectl's exit status and Abseil's signal banner
    on a worker are echoes of the CUDA OOM another node printed (issue 11)."""
    logs = {
        "launcher": CUT_ELASTIC_REPORT,
        "node-0": [ABSL_SIGBUS, POD_EXIT],
        "node-1": [CUDA_OOM],
    }
    verdict = diagnose(pack, logs)
    assert (verdict.failure_type, verdict.action) == ("cuda_oom", Action.NOTIFY_USER)


def test_pass8_catch_alls_alone_escalate_naming_their_lines(pack: RuleSet) -> None:
    """With no cause anywhere, the job is inconclusive and escalated (never a cordon), and every
    node's report is evidence."""
    logs = {"launcher": CUT_ELASTIC_REPORT, "node-0": [ABSL_SIGBUS, POD_EXIT]}
    verdict = diagnose(pack, logs)
    assert (verdict.status, verdict.action) == (Status.INCONCLUSIVE, Action.ESCALATE)
    texts = {event.text for event in verdict.evidence}
    assert {CUT_ELASTIC_REPORT[0], ABSL_SIGBUS, POD_EXIT} <= texts
