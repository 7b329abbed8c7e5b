"""Generalisation pass 4 (issue 11): families written from upstream spellings, as a job's verdict.

Each failing log is a few healthy training steps and one report as its upstream code prints it
(the kernel's OOM summary, systemd and systemd-oomd, LSF and PBS, torch's zip writer, Rust's
io::ErrorKind, Ray, Lustre's ptlrpc, NCCL's bootstrap and ibvwrap, UCX, dcgm-exporter, older
nvidia-smi). Each healthy log holds the harmless neighbours of those reports. The kill-context
principle (a SIGKILL while loading weights is a host OOM) is checked through the offline
pipeline, the path `diagnoser diagnose` and the evaluation take.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.diagnosis.correlate import Status
from diagnoser.rules import Action, RuleSet
from tests.rules.families import assert_family_verdict, assert_healthy, verdict_of

STEPS = "".join(
    f"{{'loss': 2.{i:02d}, 'grad_norm': 1.3, 'learning_rate': 2e-05, 'epoch': 0.0{i}}}\n"
    for i in range(1, 4)
)

CORDON = Action.CORDON_NODE_AND_RESTART
NOTIFY = Action.NOTIFY_USER
ESCALATE = Action.ESCALATE

FAILING: dict[str, tuple[str, str, Action]] = {
    # host memory: the kill as the kernel, systemd and batch schedulers report it
    "kernel oom summary": (
        "kernel: oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=a1b2,mems_allowed=0,"
        "oom_memcg=/kubepods/burstable/pod7,task_memcg=/kubepods/burstable/pod7/c9,task=python,"
        "pid=4242,uid=0",
        "host_oom",
        NOTIFY,
    ),
    "systemd unit oom": (
        "systemd[1]: train.service: A process of this unit has been killed by the OOM killer.",
        "host_oom",
        NOTIFY,
    ),
    "systemd-oomd": (
        "systemd-oomd[581]: Killed /system.slice/train.service due to memory pressure for "
        "/system.slice being 81.20% > 80.00% for > 20s with reclaim activity",
        "host_oom",
        NOTIFY,
    ),
    "lsf memlimit": (
        "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.\n"
        "Exited with exit code 137.",
        "host_oom",
        NOTIFY,
    ),
    "pbs mem": (
        "=>> PBS: job killed: mem job total 4323312 kb exceeded limit 3145728 kb",
        "host_oom",
        NOTIFY,
    ),
    "kill report naming memory": (
        "worker-3: exit code 137 (OOM)",
        "host_oom",
        NOTIFY,
    ),
    "colab ram": ("Your session crashed after using all available RAM.", "host_oom", NOTIFY),
    # storage: a full disk or quota, whichever layer reports it
    "torch zip writer position": (
        "RuntimeError: [enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598",
        "disk_full",
        NOTIFY,
    ),
    "rust storage full": (
        "safetensors_rust.SafetensorError: Error while serializing: IoError(Os { code: 28, kind: "
        'StorageFull, message: "Plus d\'espace disponible sur le périphérique" })',
        "disk_full",
        NOTIFY,
    ),
    "ray out of disk": ("ray.exceptions.OutOfDiskError: Local disk is full", "disk_full", NOTIFY),
    "lustre quota": (
        "kernel: LustreError: 11-0: scratch-OST0004-osc-ffff9a3e7c6f5000: operation ost_write to "
        "node 10.1.2.14@o2ib failed: rc = -122",
        "disk_full",
        NOTIFY,
    ),
    "lustre enospc": (
        "kernel: LustreError: 11-0: scratch-OST0002-osc-ffff9a3e7c6f5000: operation ost_write to "
        "node 10.1.2.12@o2ib failed: rc = -28",
        "disk_full",
        NOTIFY,
    ),
    # start-up / launch configuration
    "nccl rank count mismatch": (
        "node-1:4121:4150 [0] bootstrap.cc:240 NCCL WARN Bootstrap Root : mismatch in rank count "
        "from procs 8 : 16",
        "startup_error",
        NOTIFY,
    ),
    "nccl memlock": (
        "gpu-node-2:1234:1300 [0] misc/ibvwrap.cc:159 NCCL WARN Call to ibv_reg_mr failed with "
        "error Cannot allocate memory",
        "memlock_limit",
        NOTIFY,
    ),
    "ucx memlock": (
        "[1700000000.123] [gpu-node-2:1234:0] ib_md.c:349 UCX ERROR ibv_reg_mr(address=0x7f00, "
        "length=4194304, access=0xf) failed: Cannot allocate memory",
        "memlock_limit",
        NOTIFY,
    ),
    # device memory caught by the framework, which raises its own error
    "accelerate batch search": (
        "RuntimeError: No executable batch size found, reached zero.",
        "cuda_oom",
        NOTIFY,
    ),
    "sglang memory pool": (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
        "cuda_oom",
        NOTIFY,
    ),
    # rendezvous and coordination across runtimes
    "c10d recv 2.x": (
        "torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
        "rendezvous_error",
        Action.RESTART_JOB,
    ),
    "jax grpc unavailable": (
        "jax.errors.JaxRuntimeError: UNAVAILABLE: Failed to connect to remote host: Connection "
        "refused",
        "rendezvous_error",
        Action.RESTART_JOB,
    ),
    "tf grpc socket closed": (
        "tensorflow.python.framework.errors_impl.UnavailableError: Socket closed",
        "rendezvous_error",
        Action.RESTART_JOB,
    ),
    "coordination service stopped": (
        "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Coordination service has stopped. "
        "RecordHeartbeat() from task: /job:jax_worker/replica:0/task:2 failed.",
        "communicator_aborted",
        ESCALATE,
    ),
    "ompi without slurm pmi": (
        'The application appears to have been direct launched using "srun",\n'
        "but OMPI was not built with SLURM's PMI support and therefore cannot\nexecute.",
        "startup_error",
        NOTIFY,
    ),
    # start-up and code the owner must change
    "mkl threading layer": (
        "Error: mkl-service + Intel(R) MKL: MKL_THREADING_LAYER=INTEL is incompatible with "
        "libgomp.so.1 library.",
        "startup_error",
        NOTIFY,
    ),
    "flash-attention arch": (
        "RuntimeError: FlashAttention only supports Ampere GPUs or newer.",
        "startup_error",
        NOTIFY,
    ),
    "ddp unused parameters": (
        'Traceback (most recent call last):\n  File "/ws/train.py", line 88, in step\n    out = '
        "model(batch)\nRuntimeError: Expected to have finished reduction in the prior iteration "
        "before starting a new one.",
        "RuntimeError",
        NOTIFY,
    ),
    "no process group": (
        "RuntimeError: Default process group has not been initialized, please make sure to call "
        "init_process_group.",
        "RuntimeError",
        NOTIFY,
    ),
    "backward twice": (
        "RuntimeError: Trying to backward through the graph a second time (or directly access "
        "saved tensors after they have already been freed).",
        "RuntimeError",
        NOTIFY,
    ),
    # GPU memory outside Xid lines
    "dcgm-exporter volatile dbe": (
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="3",UUID="GPU-5fd4",device="nvidia3",modelName="NVIDIA '
        'H100 80GB HBM3",Hostname="gpu-node-2"} 2',
        "gpu_ecc_uncorrectable",
        CORDON,
    ),
    "dcgm-exporter remap failure": (
        'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="0",UUID="GPU-1234",device="nvidia0"} 1',
        "gpu_ecc_uncorrectable",
        CORDON,
    ),
    "retired page pending (older nvidia-smi)": (
        "    Retired Pages\n        Single Bit ECC                : 0\n        Double Bit ECC"
        "                : 0\n        Pending Page Blacklist        : Yes",
        "gpu_health_failure",
        ESCALATE,
    ),
    "dcgm-exporter retirement pending": (
        'DCGM_FI_DEV_RETIRED_PENDING{gpu="1",UUID="GPU-1234",device="nvidia1"} 3',
        "gpu_health_failure",
        ESCALATE,
    ),
}


def _ecc_section(header: str, count: int) -> str:
    rows = ("Device Memory", "Register File", "L1 Cache", "L2 Cache", "CBU", "Total")
    counted = ("Device Memory", "Total")
    fields = "\n".join(
        f"                {row:<26}: {count if row in counted else 0}" for row in rows
    )
    return f"            {header}            \n{fields}"


def _ecc_report(volatile_dbe: int, aggregate_sbe: int, aggregate_dbe: int) -> str:
    """The pre-R450 `nvidia-smi -q` ECC Errors section, as drivers for Kepler to Volta print it."""
    return "\n".join(
        [
            "    ECC Errors",
            "        Volatile",
            _ecc_section("Single Bit", 0),
            _ecc_section("Double Bit", volatile_dbe),
            "        Aggregate",
            _ecc_section("Single Bit", aggregate_sbe),
            _ecc_section("Double Bit", aggregate_dbe),
            "    Retired Pages",
            "        Single Bit ECC                    : 0",
            "        Double Bit ECC                    : 0",
            "    Temperature",
            "        GPU Current Temp                  : 34 C",
        ]
    )


FAILING["pre-R450 nvidia-smi double-bit count"] = (
    _ecc_report(2, 0, 2),
    "gpu_ecc_uncorrectable",
    CORDON,
)

HEALTHY = {
    "pre-R450 nvidia-smi single-bit only": _ecc_report(0, 5, 0),
    "pre-R450 nvidia-smi clean": _ecc_report(0, 0, 0),
    "oomd candidates": "systemd-oomd[581]: Considered 12 cgroups for killing, top candidates were:",
    "loading shards": "Loading checkpoint shards:  50%|#####     | 1/2 [00:41<00:41, 41.02s/it]\n"
    "Loading checkpoint shards: 100%|##########| 2/2 [01:20<00:00, 40.10s/it]",
    "vllm loading": "Loading safetensors checkpoint shards:  25% Completed | 1/4 [00:02<00:07,  "
    "2.53s/it]",
    "dcgm zeros": 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{gpu="3",UUID="GPU-1234"} 0\n'
    'DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="3",UUID="GPU-1234"} 0\n'
    'DCGM_FI_DEV_RETIRED_PENDING{gpu="3",UUID="GPU-1234"} 0',
    "dcgm lifetime aggregate": 'DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{gpu="3",UUID="GPU-1234"} 4',
    "dcgm help line": "# HELP DCGM_FI_DEV_ROW_REMAP_FAILURE Whether remapping of rows has failed",
    "retired pages clean": "        Pending Page Blacklist        : No",
    "gdr probe": "gpu-node-2:1234:1300 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 "
    "(ibv_reg_dmabuf_mr supported)",
    "ray spilling": "INFO: object spilling to local disk enabled (utilization threshold 95%)",
    "ddp unused warning": "[W reducer.cpp:1360] Warning: find_unused_parameters=True was "
    "specified in DDP constructor, but did not find any unused parameters in the forward pass.",
    "jax connected": "I0101 12:00:00.000000 1234 client.cc:101] Connected to distributed JAX "
    "controller",
    "lustre restored": "kernel: Lustre: scratch-OST0004-osc-ffff9a3e7c6f5000: Connection restored "
    "to 10.1.2.14@o2ib (at 10.1.2.14@o2ib)",
}


@pytest.mark.parametrize(("text", "failure_type", "action"), FAILING.values(), ids=list(FAILING))
def test_an_upstream_spelling_gets_its_family_verdict(
    pack: RuleSet, tmp_path: Path, text: str, failure_type: str, action: Action
) -> None:
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, text), failure_type, action)


@pytest.mark.parametrize("text", HEALTHY.values(), ids=list(HEALTHY))
def test_the_harmless_neighbours_of_those_reports_stay_healthy(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


LOADING = (
    "Loading checkpoint shards:   0%|          | 0/4 [00:00<?, ?it/s]\n"
    "Loading checkpoint shards:  25%|##5       | 1/4 [00:31<01:33, 31.20s/it]"
)


def test_a_sigkill_while_loading_shards_is_a_host_oom(pack: RuleSet, tmp_path: Path) -> None:
    """The DeepSpeed launcher's -9 right after transformers' shard bar: the OOM killer's work."""
    text = LOADING + "\n[ERROR] [launch.py:325:sigkill_handler] exits with return code = -9"
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert (verdict.failure_type, verdict.action) == ("host_oom", NOTIFY)
    assert verdict.status is Status.FAILURE
    assert verdict.culprit_nodes == ("node-0",)


def test_a_torchrun_sigkill_while_vllm_loads_weights_is_a_host_oom(
    pack: RuleSet, tmp_path: Path
) -> None:
    text = (
        "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:09<00:09,  4.61s/it]\n"
        "E0325 20:57:27.620000 2606 torch/distributed/elastic/multiprocessing/api.py:869] failed "
        "(exitcode: -9) local_rank: 0 (pid: 2630) of binary: /usr/bin/python3"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert (verdict.failure_type, verdict.action) == ("host_oom", NOTIFY)


def test_a_sigkill_mid_training_after_loading_stays_an_escalation(
    pack: RuleSet, tmp_path: Path
) -> None:
    """An epoch of training between the loader and the kill: nothing says who killed it."""
    steps = "\n".join(
        f"{{'loss': 1.{i:02d}, 'learning_rate': 2e-05, 'epoch': {i}}}" for i in range(80)
    )
    text = (
        LOADING
        + "\n"
        + steps
        + "\n[ERROR] [launch.py:325:sigkill_handler] exits with return code = -9"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert (verdict.failure_type, verdict.action) == ("process_killed", ESCALATE)
