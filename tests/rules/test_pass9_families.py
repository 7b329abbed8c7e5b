"""Pass 9 (issue 11): NCCL's own WARN lines, TensorFlow-era XLA status spellings, the distributed
client's error callback, DeepSpeed's ssh check, an out-of-memory error wrapped by Ray, and the
order of two escalations in correlation.

Each failing line is synthetic, written from the format string of its upstream source (named
next to the pattern in rules/*.yaml) and printed after a few healthy training steps. Each
healthy line is the harmless neighbour of a failing one (a notice NCCL prints at WARN level and
carries on after, a status that is not a failure): it must stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import Action, Category, RuleSet
from tests.rules.families import (
    assert_escalates_naming,
    assert_family_verdict,
    assert_healthy,
    verdict_of,
)

STEPS = "".join(
    f"[2026-01-05 10:0{i}:00] step {100 * i}: loss {3.1 - i / 10:.3f}, lr 2.0e-05\n"
    for i in range(1, 4)
)


NCCL_WARN_ERRORS = {
    # src/graph/rings.cc, search.cc, paths.cc: a topology NCCL cannot build, then an error return.
    "ring": "gpu-a:811:902 [3] graph/rings.cc:51 NCCL WARN Error : ring 2 does not loop back to "
    "start (5 != 3)",
    "gpu rank": "gpu-a:811:902 [3] graph/search.cc:229 NCCL WARN Could not find gpu rank 9",
    "p2p disabled on nvlink": "gpu-a:811:902 [3] graph/paths.cc:396 NCCL WARN P2P is disabled "
    "between NVLINK connected GPUs 1 and 2. This should not be the case given their connectivity, "
    "and is probably due to a hardware issue. If you still want to proceed, you can set "
    "NCCL_IGNORE_DISABLED_P2P=1.",
    # src/enqueue.cc / init.cc argument and state checks.
    "invalid root": "gpu-a:811:811 [0] enqueue.cc:1940 NCCL WARN Broadcast : invalid root 12 "
    "(root should be in the 0..7 range)",
    "comm misuse": "gpu-a:811:811 [0] init.cc:1720 NCCL WARN Attempt to use communicator before "
    "the previous operation returned ncclSuccess",
    # src/mnnvl.cc and graph/topo.cc: they read like hints but return ncclSystemError and
    # ncclInvalidUsage.
    "mnnvl": "gpu-a:811:902 [3] mnnvl.cc:86 NCCL WARN MNNVL (cliqueSize 4) is available but not "
    "working on this system. Check the IMEX configuration (nvidia-imex-ctl -N). Set "
    "NCCL_MNNVL_ENABLE=0 to ignore this issue.",
    "fused nic": "gpu-a:811:902 [3] graph/topo.cc:1341 NCCL WARN TOPO/NET : Only matched 1 "
    "devices, 2 requested from mlx5_0+mlx5_1",
    # The same line without its header (NCCL_DEBUG_FILE, an excerpt that kept only the message).
    "bare": "NCCL WARN Error : ring 0 does not contain rank 4",
}

NCCL_WARN_NOTICES = {
    # WARN() notices NCCL carries on after (src/, RCCL's init hints).
    "real path": "gpu-a:811:902 [3] misc/utils.cc:30 NCCL WARN Could not find real path of "
    "/sys/class/net/eth0/device",
    "collnet": "gpu-a:811:902 [3] transport.cc:200 NCCL WARN Cannot initialize CollNet, using "
    "point-to-point network instead",
    "ignored value": "gpu-a:811:902 [3] NCCL WARN NCCL_WORK_FIFO_BYTES=3000 is being ignored "
    "because it is not a power of 2.",
    "defaulted value": "gpu-a:811:902 [3] NCCL WARN NCCL_NET_MERGE_POLICY: unknown value 'x', "
    "defaulting to ALL",
    "unset": "gpu-a:811:902 [3] NCCL WARN Both NCCL_CTA_POLICY_ZERO and NCCL_CTA_POLICY_EFFICIENCY"
    " are set in CTAPolicy (3). Unsetting NCCL_CTA_POLICY_ZERO.",
    "memory manager": "gpu-a:811:902 [3] NCCL WARN MemManager: Suspend not supported, memory "
    "manager is disabled",
    "rccl numa": "gpu-a:811:902 [3] init.cc:151 NCCL WARN NUMA auto balancing enabled which can "
    'lead to variability in the RCCL performance! Disable by "sudo sysctl kernel.numa_balancing=0"',
    "rccl iommu": 'gpu-a:811:902 [3] init.cc:160 NCCL WARN Missing "iommu=pt" from kernel command '
    "line which can lead to system instablity or hang!",
    # The network transport's probes at start-up belong to its own rule, which knows them.
    "no ip interface": "gpu-a:811:902 [3] transport/net_ib.cc:170 NCCL WARN NET/IB : No IP "
    "interface found.",
    "libibverbs": "gpu-a:811:902 [3] NCCL WARN Failed to open libibverbs.so[.1]",
    "plugin": "gpu-a:811:902 [3] NCCL WARN NET/Plugin : Plugin load returned 2 : libnccl-net.so: "
    "cannot open shared object file: No such file or directory.",
    "a net plugin's own notice": "gpu-a:811:902 [3] net_myplugin.cc:210 NCCL WARN Could not read "
    "the NUMA node of the NIC",
}


@pytest.mark.parametrize("text", NCCL_WARN_ERRORS.values(), ids=list(NCCL_WARN_ERRORS))
def test_a_nccl_warn_line_no_rule_reads_escalates(pack: RuleSet, tmp_path: Path, text: str) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_escalates_naming(verdict, text)
    assert verdict.root is not None
    assert verdict.root.rule_id == "nccl_warn_unexplained"


@pytest.mark.parametrize("text", NCCL_WARN_NOTICES.values(), ids=list(NCCL_WARN_NOTICES))
def test_a_nccl_warn_notice_stays_silent(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_a_transport_warn_is_still_read_by_the_transport_rule(
    pack: RuleSet, tmp_path: Path
) -> None:
    line = (
        "gpu-a:811:902 [3] misc/socket.cc:503 NCCL WARN Net : Call to recv from 10.0.0.2<41011> "
        "failed : Connection timed out"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert_family_verdict(verdict, "nccl_transport_error", Action.RESTART_JOB)


def test_a_specific_nccl_rule_outranks_the_warn_catch_all(pack: RuleSet, tmp_path: Path) -> None:
    lines = "\n".join(
        [
            "gpu-a:811:902 [3] graph/rings.cc:51 NCCL WARN Error : ring 2 does not loop back to "
            "start (5 != 3)",
            "gpu-a:811:902 [3] enqueue.cc:1085 NCCL WARN Cuda failure 'out of memory'",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, lines)
    assert_family_verdict(verdict, "nccl_cuda_oom", Action.NOTIFY_USER)


XLA_STATUS_WORDS = {
    # tensorflow::Status::ToString before absl: error_name() in words, then the message.
    "internal": "2019-06-01 10:00:00.123456: E tensorflow/compiler/xla/python/"
    "local_computation_builder.cc:312] Execution of replica 2 failed: Internal: Failed to launch "
    "CUDA kernel",
    "invalid argument": "E0101 10:00:00.123456 4242 local_client.cc:180] Execution of replica 1 "
    "failed: Invalid argument: Argument does not match host shape or layout of computation "
    "parameter 0",
    "data loss": "E0101 10:00:00.123456 4242 local_client.cc:180] Execution of replica 0 failed: "
    "Data loss: Detected corrupted buffer",
}


@pytest.mark.parametrize("text", XLA_STATUS_WORDS.values(), ids=list(XLA_STATUS_WORDS))
def test_an_xla_execution_failure_in_tensorflow_status_words_escalates(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_escalates_naming(verdict, text)
    assert verdict.failure_type == "xla_execution_failed"


def test_an_out_of_memory_status_in_words_is_read_as_device_oom(
    pack: RuleSet, tmp_path: Path
) -> None:
    line = (
        "E0101 10:00:00.123456 4242 local_client.cc:180] Execution of replica 0 failed: Resource "
        "exhausted: Out of memory while trying to allocate 8589934592 bytes."
    )
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert_family_verdict(verdict, "cuda_oom", Action.NOTIFY_USER)


def test_the_distributed_clients_error_callback_escalates_as_an_echo(
    pack: RuleSet, tmp_path: Path
) -> None:
    line = (
        "E0312 08:14:02.551190   40211 client.cc:118] Coordination service agent in error status: "
        "DEADLINE_EXCEEDED: Deadline Exceeded"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert_escalates_naming(verdict, line)
    assert (verdict.failure_type, verdict.category) == ("communicator_aborted", Category.NETWORK)


def test_the_echo_yields_to_the_task_that_failed(pack: RuleSet, tmp_path: Path) -> None:
    echo = (
        "E0312 08:14:02.551190   40211 client.cc:118] Coordination service agent in error status: "
        "INTERNAL: another task reported an error"
    )
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    verdict = verdict_of(pack, tmp_path, STEPS, echo, oom)
    assert_family_verdict(verdict, "cuda_oom", Action.NOTIFY_USER)


def test_deepspeeds_ssh_check_needs_the_owner(pack: RuleSet, tmp_path: Path) -> None:
    traceback = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/deepspeed", line 6, in <module>',
            "    main()",
            '  File "/usr/local/lib/python3.10/site-packages/deepspeed/launcher/runner.py", '
            "line 459, in main",
            "    raise RuntimeError(",
            "RuntimeError: Using hostfile at /job/hostfile but host=worker-1 was not reachable via "
            "ssh. If you are running with a single node please remove /job/hostfile or setup "
            "passwordless ssh.",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, traceback)
    assert verdict.root is not None
    assert verdict.root.rule_id == "launcher_ssh_failure"
    assert verdict.action is Action.NOTIFY_USER


def test_an_out_of_memory_error_raised_in_a_ray_task_needs_the_owner(
    pack: RuleSet, tmp_path: Path
) -> None:
    lines = "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "/workspace/main.py", line 40, in <module>',
            "    ray.get(runner.run.remote(config))",
            "ray.exceptions.RayTaskError(OutOfMemoryError): ray::TaskRunner.run() (pid=4411, "
            "ip=10.0.0.2, actor_id=9f1c)",
            '  File "/workspace/trainer.py", line 210, in fit',
            "    loss.backward()",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, lines)
    assert (verdict.category, verdict.action) == (Category.RESOURCE, Action.NOTIFY_USER)


def test_another_error_raised_in_a_ray_task_still_escalates(pack: RuleSet, tmp_path: Path) -> None:
    line = "ray.exceptions.RayTaskError(RuntimeError): ray::train_fn() (pid=4411, ip=10.0.0.2)"
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert verdict.action is Action.ESCALATE


def test_an_aborted_communicator_outranks_orphan_frames(pack: RuleSet, tmp_path: Path) -> None:
    """Both escalate; the one that read an error report names the category, not the frames."""
    lines = "\n".join(
        [
            '  File "/workspace/train.py", line 88, in train_step',
            "    dist.all_reduce(grad)",
            '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/c10d_logger.py", '
            "line 75, in wrapper",
            "    return func(*args, **kwargs)",
            "RuntimeError: NCCL communicator was aborted on rank 3.",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, lines)
    assert verdict.action is Action.ESCALATE
    assert (verdict.failure_type, verdict.category) == ("communicator_aborted", Category.NETWORK)


QUERY_TABLES_CORDON = {
    "recovery reset": "index, name, gpu_recovery_action\n0, NVIDIA H100 80GB HBM3, None\n"
    "1, NVIDIA H100 80GB HBM3, Reset",
    "recovery reboot": "index, gpu_recovery_action\n0, Reboot",
    "reset required": "index, reset_status.reset_required, reset_status.drain_and_reset_recommended"
    "\n0, No, No\n3, Yes, No",
    "drain and reset recommended": "index, reset_status.reset_required, "
    "reset_status.drain_and_reset_recommended\n0, No, Yes",
    "remap failed": "index, remapped_rows.pending, remapped_rows.failure\n0, No, No\n5, Yes, Yes",
    "volatile uncorrectable": "index, ecc.errors.uncorrected.volatile.total [count], "
    "ecc.errors.uncorrected.aggregate.total [count]\n0, 0, 0\n2, 4, 4",
}

QUERY_TABLES_HEALTHY = {
    "no recovery needed": "index, gpu_recovery_action\n0, None\n1, None",
    "remap pending alone": "index, remapped_rows.pending, remapped_rows.failure\n0, Yes, No",
    "lifetime count only": "index, ecc.errors.uncorrected.volatile.total, "
    "ecc.errors.uncorrected.aggregate.total\n0, 0, 12",
    "not supported": "index, ecc.errors.uncorrected.volatile.total\n0, [N/A]",
    "the command line alone": "nvidia-smi --query-gpu=index,gpu_recovery_action --format=csv",
    # Without a header a value has no column; nothing says what `Reset` is a value of.
    "noheader": "0, None\n1, Reset",
}


@pytest.mark.parametrize("text", QUERY_TABLES_CORDON.values(), ids=list(QUERY_TABLES_CORDON))
def test_a_query_gpu_table_that_needs_a_reset_cordons_its_node(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert verdict.action is Action.CORDON_NODE_AND_RESTART, verdict.failure_type
    assert verdict.culprit_nodes == ("node-0",)
    assert verdict.category is Category.HARDWARE


@pytest.mark.parametrize("text", QUERY_TABLES_HEALTHY.values(), ids=list(QUERY_TABLES_HEALTHY))
def test_a_query_gpu_table_with_nothing_to_do_stays_silent(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_a_drain_p2p_recovery_is_for_a_person(pack: RuleSet, tmp_path: Path) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, "index, gpu_recovery_action\n0, Drain P2P")
    assert_family_verdict(verdict, "gpu_recovery_action", Action.ESCALATE)


def test_only_the_node_that_printed_the_table_is_cordoned(pack: RuleSet, tmp_path: Path) -> None:
    bad = "index, gpu_recovery_action\n0, None\n1, Reset"
    good = "index, gpu_recovery_action\n0, None\n1, None"
    verdict = verdict_of(pack, tmp_path, STEPS, good, bad, good)
    assert verdict.culprit_nodes == ("node-1",)


def test_a_bus_error_under_gdb_in_nccls_shared_memory_needs_a_bigger_shm(
    pack: RuleSet, tmp_path: Path
) -> None:
    lines = "\n".join(
        [
            'Thread 412 "python3" received signal SIGBUS, Bus error.',
            "(gdb) bt",
            "#0  0x00007f2a1c0e4f3b in ncclShmOpen(char*, unsigned long, void**, void**, int, "
            "void**) () from /usr/lib/x86_64-linux-gnu/libnccl.so.2",
            "#1  0x00007f2a1c0e36d7 in ncclProxyService(void*) () from "
            "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, lines)
    assert_family_verdict(verdict, "nccl_shm_error", Action.NOTIFY_USER)


def test_a_crash_gdb_reports_elsewhere_escalates(pack: RuleSet, tmp_path: Path) -> None:
    line = 'Thread 87 "python3" received signal SIGSEGV, Segmentation fault.'
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, line), line)


def test_ctrl_c_under_gdb_stays_silent(pack: RuleSet, tmp_path: Path) -> None:
    line = 'Thread 1 "python3" received signal SIGINT, Interrupt.'
    assert_healthy(verdict_of(pack, tmp_path, STEPS, line))


def test_open_mpis_peer_hangup_escalates(pack: RuleSet, tmp_path: Path) -> None:
    text = "\n".join(
        [
            "-" * 74,
            "An MPI communication peer process has unexpectedly disconnected.  This",
            "usually indicates a failure in the peer process (e.g., a crash or",
            "otherwise exiting without calling MPI_FINALIZE first).",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_escalates_naming(verdict, text)
    assert verdict.failure_type == "abnormal_exit"


def test_torch_loads_weights_only_refusal_needs_the_owner(pack: RuleSet, tmp_path: Path) -> None:
    line = (
        "_pickle.UnpicklingError: Weights only load failed. This file can still be loaded, to do "
        "so you have two options, do those steps only if you trust the source of the checkpoint."
    )
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert (verdict.category, verdict.action) == (Category.USER_CODE, Action.NOTIFY_USER)


def test_another_unpickling_error_still_escalates(pack: RuleSet, tmp_path: Path) -> None:
    line = "_pickle.UnpicklingError: invalid load key, '\\x00'."
    assert verdict_of(pack, tmp_path, STEPS, line).action is Action.ESCALATE


STARTUP_9C = {
    # torch/amp/autocast_mode.py
    "bf16 autocast": "RuntimeError: Current CUDA Device does not support bfloat16. Please switch "
    "dtype to float16.",
    # paddle's dynamic loader, cuDNN 8's loader, JAX's CUDA library version check
    "paddle dynload": "W0101 10:00:00.000000 4242 dynamic_loader.cc:305] The third-party dynamic "
    "library (libnccl.so) that Paddle depends on is not configured correctly. (error code is "
    "libnccl.so: cannot open shared object file: No such file or directory)",
    "cudnn loader": "Could not load library libcudnn_ops_infer.so.8. Error: "
    "libcudnn_ops_infer.so.8: cannot open shared object file: No such file or directory",
    "jax version check": "CUDA backend failed to initialize: Found cuDNN version 8600, but JAX was "
    "built against version 8800, which is newer. The copy of cuDNN that is installed must be at "
    "least as new as the version against which JAX was built.",
    # horovod's NCCLContext::ErrorCheck
    "horovod nccl invalid usage": "horovod.common.exceptions.HorovodInternalError: "
    "ncclCommInitRank failed: invalid usage",
    # ATen/Dispatch.h
    "dtype without a kernel": "RuntimeError: \"addmm_impl_cpu_\" not implemented for 'Half'",
}


@pytest.mark.parametrize("text", STARTUP_9C.values(), ids=list(STARTUP_9C))
def test_a_start_up_or_configuration_failure_needs_the_owner(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert (verdict.category, verdict.action) == (Category.USER_CODE, Action.NOTIFY_USER)
    assert verdict.root is not None
    assert verdict.root.text.strip() in text


def test_an_optional_paddle_library_that_is_missing_stays_silent(
    pack: RuleSet, tmp_path: Path
) -> None:
    line = (
        "W0101 10:00:00.000000 4242 dynamic_loader.cc:305] The third-party dynamic library "
        "(libcupti.so.11.2) that Paddle depends on is not configured correctly. (error code is "
        "libcupti.so.11.2: cannot open shared object file: No such file or directory)"
    )
    assert_healthy(verdict_of(pack, tmp_path, STEPS, line))


def test_a_fabric_manager_that_is_not_running_is_read_when_torch_raises_it(
    pack: RuleSet, tmp_path: Path
) -> None:
    line = (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
        "before calling NumCudaDevices() that might have already set an error? Error 802: system "
        "not yet initialized"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert verdict.root is not None
    assert verdict.root.rule_id == "fabric_not_ready"


@pytest.mark.parametrize(
    "text",
    [
        "MemoryError: std::bad_alloc",
        'Traceback (most recent call last):\n  File "/workspace/data.py", line 41, in load\n'
        "    buf = f.read()\nMemoryError",
    ],
    ids=["bad_alloc", "bare"],
)
def test_pythons_own_memory_error_is_the_hosts(pack: RuleSet, tmp_path: Path, text: str) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_family_verdict(verdict, "host_oom", Action.NOTIFY_USER)


def test_a_memory_error_the_job_retries_past_stays_silent(pack: RuleSet, tmp_path: Path) -> None:
    line = "Caught MemoryError, retrying with a smaller batch"
    assert_healthy(verdict_of(pack, tmp_path, STEPS, line))


PREEMPTED = {
    "slurm": "slurmstepd: error: *** JOB 4412 ON gpu-node-09 CANCELLED AT 2024-05-01T10:22:01 "
    "DUE TO PREEMPTION ***",
    "scontrol": "JobId=4412 JobName=train UserId=alice(1000) JobState=PREEMPTED Reason=None",
    "kubelet": "  Warning  Preempting  1m  kubelet  Preempted in order to admit critical pod",
    "kube-scheduler": "    reason: PreemptionByScheduler",
}


@pytest.mark.parametrize("text", PREEMPTED.values(), ids=list(PREEMPTED))
def test_a_preempted_job_resumes_from_its_checkpoint(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_family_verdict(verdict, "preempted", Action.RESTART_JOB)


def test_a_newer_xla_barrier_timeout_is_a_rendezvous_failure(pack: RuleSet, tmp_path: Path) -> None:
    line = (
        "jax.errors.JaxRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: "
        "PjRT_Client_Connect. This usually happens because a task triggered the barrier too "
        "early or too slowly."
    )
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert_family_verdict(verdict, "rendezvous_error", Action.RESTART_JOB)


@pytest.mark.parametrize(
    "text",
    [
        "  Warning  NodeNotReady  1m  node-controller  Node is not ready",
        "Status: Failed, Reason: NodeLost",
    ],
    ids=["node not ready", "node lost"],
)
def test_a_pod_that_lost_its_node_escalates(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, text), text)


def test_retries_that_ran_out_are_a_failure_not_a_retry(pack: RuleSet, tmp_path: Path) -> None:
    line = (
        "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='hub.example', port=443): "
        "Max retries exceeded with url: /model/config.json (Caused by NewConnectionError('Failed "
        "to establish a new connection: [Errno 101] Network is unreachable'))"
    )
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, line), line)
    assert_healthy(verdict_of(pack, tmp_path, STEPS, "ConnectionError: retrying in 5s"))


def test_an_elastic_report_cut_above_its_root_cause_still_names_the_failed_rank(
    pack: RuleSet, tmp_path: Path
) -> None:
    """torch elastic's summary with its `ChildFailedError` header and `FAILED` line cut off."""
    report = "\n".join(
        [
            "Root Cause (first observed failure):",
            "[0]:",
            "  time      : 2026-02-18_10:00:00",
            "  host      : worker-3",
            "  rank      : 11 (local_rank: 3)",
            "  exitcode  : 1 (pid: 5277)",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, report)
    assert_family_verdict(verdict, "worker_process_failed", Action.ESCALATE)
    assert verdict.culprit_nodes == ("worker-3",)


def test_a_cuda_check_macros_capitalised_oom_needs_the_owner(pack: RuleSet, tmp_path: Path) -> None:
    line = "RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62"
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert_family_verdict(verdict, "cuda_oom", Action.NOTIFY_USER)


TRUNCATED_DATA = {
    "parquet footer": "pyarrow.lib.ArrowInvalid: Parquet magic bytes not found in footer. Either "
    "the file is corrupted or this is not a parquet file.",
    "zip": "zipfile.BadZipFile: File is not a zip file",
    "zip header": "zipfile.BadZipFile: Truncated file header",
    "tar shard": "tarfile.ReadError: unexpected end of data",
}


@pytest.mark.parametrize("text", TRUNCATED_DATA.values(), ids=list(TRUNCATED_DATA))
def test_a_data_or_archive_file_cut_short_is_a_storage_question(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_escalates_naming(verdict, text)
    assert (verdict.failure_type, verdict.category) == ("storage_io_error", Category.STORAGE)


def test_an_arrow_data_error_is_never_silent(pack: RuleSet, tmp_path: Path) -> None:
    line = (
        "pyarrow.lib.ArrowInvalid: Column 2 named input_ids expected length 1000 but got length 999"
    )
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, line), line)


def test_a_checkpoint_that_is_still_an_lfs_pointer_needs_the_owner(
    pack: RuleSet, tmp_path: Path
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, "_pickle.UnpicklingError: invalid load key, 'v'.")
    assert_family_verdict(verdict, "startup_error", Action.NOTIFY_USER)


def test_enomem_from_the_kernel_is_a_host_oom(pack: RuleSet, tmp_path: Path) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, "OSError: [Errno 12] Cannot allocate memory")
    assert_family_verdict(verdict, "host_oom", Action.NOTIFY_USER)


def test_an_exception_that_points_at_a_warning_above_is_still_an_exception(
    pack: RuleSet, tmp_path: Path
) -> None:
    line = (
        "tensorflow.python.framework.errors_impl.UnknownError: Failed to get convolution "
        "algorithm. This is probably because cuDNN failed to initialize, so try looking to see if "
        "a warning log message was printed above."
    )
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, line), line)


def test_one_megatron_interval_with_nan_iterations_escalates(pack: RuleSet, tmp_path: Path) -> None:
    bad = (
        " iteration      500/  100000 | consumed samples:       256000 | loss scale: 1.0 | "
        "number of skipped iterations:  10 | number of nan iterations:  10 |"
    )
    good = bad.replace("nan iterations:  10", "nan iterations:   0").replace(
        "skipped iterations:  10", "skipped iterations:   0"
    )
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, bad), bad)
    assert_healthy(verdict_of(pack, tmp_path, STEPS, good))


def test_a_hub_server_error_is_a_passing_object_store_fault(pack: RuleSet, tmp_path: Path) -> None:
    line = (
        "huggingface_hub.utils._errors.HfHubHTTPError: 502 Server Error: Bad Gateway for url: "
        "https://huggingface.co/datasets/org/corpus/resolve/main/train-00017-of-01024.parquet"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert_family_verdict(verdict, "object_store_error", Action.RESTART_JOB)


def test_an_ipython_traceback_cut_before_its_last_line_escalates(
    pack: RuleSet, tmp_path: Path
) -> None:
    text = "\n".join(
        [
            "-" * 75,
            "ArrowInvalid                              Traceback (most recent call last)",
            "Input In [22], in <cell line: 7>()",
            "----> 7 data = load_dataset('parquet', data_files=url, split='train')",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert verdict.action is Action.ESCALATE
    assert verdict.failure_type == "unexplained_traceback"
