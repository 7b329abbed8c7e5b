"""Pass 10 (issue 11): spellings from probes of upstream sources, written before the sixth
corpus round was read.

Each failing text is synthetic, written from the format string of its upstream source (named
next to the pattern in rules/*.yaml) and printed after a few healthy training steps. Each
healthy text is the harmless neighbour of a failing one: it must stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import Action, RuleSet
from tests.rules.families import (
    assert_escalates_naming,
    assert_family_verdict,
    assert_healthy,
    verdict_of,
)

STEPS = "".join(
    f"2026-02-11 08:1{i}:00 | iteration {50 * i} | lm loss {2.9 - i / 10:.3f} | grad norm 1.02\n"
    for i in range(1, 4)
)

NOTIFY = Action.NOTIFY_USER


def traceback(exception_line: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 212, in <module>\n'
        "    main()\n"
        f"{exception_line}"
    )


RESOURCE_FAILURES = {
    # NCCL src/include/alloc.h: device allocations are the GPU's memory, host ones the host's.
    "nccl cuda calloc": (
        "node-3:2211:2290 [1] NCCL WARN Failed to CUDA calloc 33554432 bytes",
        "cuda_oom",
    ),
    "nccl cuda calloc async under torch": (
        "torch.distributed.DistBackendError: NCCL error in: NCCLUtils.hpp:317, unhandled cuda "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nFailed to CUDA calloc async 2432 bytes",
        "cuda_oom",
    ),
    "nccl cuda malloc": (
        "node-3:2211:2290 [1] NCCL WARN Failed to CUDA malloc 4194304 bytes",
        "cuda_oom",
    ),
    "nccl host alloc": (
        "node-3:2211:2290 [1] NCCL WARN Failed to CUDA host alloc 8388608 bytes",
        "host_oom",
    ),
    "nccl malloc": ("node-3:2211:2290 [1] NCCL WARN Failed to malloc 1073741824 bytes", "host_oom"),
    "nccl syscall enomem": (
        "node-3:2211:2290 [1] misc/shmutils.cc:60 NCCL WARN Call to mmap failed: Cannot "
        "allocate memory",
        "host_oom",
    ),
    # MindSpore's device allocator, DeepSpeed's inference workspace and v2 KV cache.
    "mindspore device": (
        traceback(
            "RuntimeError: Device(id:0) memory isn't enough and alloc failed, kernel name: "
            "Default/network-WithLossCell/Conv2D-op128, alloc size: 2147483648B."
        ),
        "cuda_oom",
    ),
    "deepspeed workspace": (
        "terminate called after throwing an instance of 'std::runtime_error'\n"
        "  what():  Workspace can't be allocated, not enough memory\nAborted (core dumped)",
        "cuda_oom",
    ),
    "deepspeed kv cache": (
        traceback(
            "ValueError: Insufficient memory to allocate KV-caches. Required: 1073741824, "
            "Available: 536870912"
        ),
        "cuda_oom",
    ),
    # bitsandbytes' CUDA_CHECK_RETURN and cuBLAS status 3 (CUBLAS_STATUS_ALLOC_FAILED).
    "bitsandbytes cuda check": (
        "Error out of memory at line 380 in file /src/csrc/ops.cu",
        "cuda_oom",
    ),
    "bitsandbytes cublas alloc": ("cuBLAS API failed with status 3\nerror detected", "cuda_oom"),
    # libstdc++'s terminate handler on an uncaught std::bad_alloc.
    "bad_alloc": (
        "terminate called after throwing an instance of 'std::bad_alloc'\n"
        "  what():  std::bad_alloc\nAborted (core dumped)",
        "host_oom",
    ),
    # mm/oom_kill.c: the reaper runs for OOM victims only.
    "oom reaper": (
        "[183452.305512] oom_reaper: reaped process 48213 (python), now anon-rss:0kB, "
        "file-rss:0kB, shmem-rss:0kB",
        "host_oom",
    ),
    "slurm job memory limit": ("slurmstepd: error: Exceeded job memory limit", "host_oom"),
    # Process and thread limits.
    "pids controller": (
        "[ 5667.545996] cgroup: fork rejected by pids controller in "
        "/kubepods.slice/kubepods-burstable.slice/cri-containerd-3f2a.scope",
        "process_limit",
    ),
    "python thread": (traceback("RuntimeError: can't start new thread"), "process_limit"),
    "openblas": (
        "OpenBLAS blas_thread_init: pthread_create failed for thread 52 of 64: Resource "
        "temporarily unavailable\nOpenBLAS blas_thread_init: RLIMIT_NPROC 256 current, 256 max",
        "process_limit",
    ),
    # NCCL before 2.19 sized its /dev/shm segments with posix_fallocate.
    "nccl posix_fallocate": (
        "gpu-node-1:4411:4490 [0] misc/shmutils.cc:60 NCCL WARN Call to posix_fallocate "
        "failed : No space left on device",
        "shm_exhausted",
    ),
    # Triton's per-block limits: the kernel's configuration, not device memory.
    "triton shared memory": (
        traceback(
            "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: "
            "229376, Hardware limit: 101376. Reducing block sizes or `num_stages` may help."
        ),
        "OutOfResources",
    ),
}

RESOURCE_NEIGHBOURS = {
    # TensorFlow logs a failed cuMemAlloc at INFO and its BFC allocator retries smaller.
    "tensorflow info allocation": "2019-03-01 10:02:11.123456: I tensorflow/stream_executor/"
    "cuda/cuda_driver.cc:806] failed to allocate 128.00M (134217728 bytes) from device: "
    "CUDA_ERROR_OUT_OF_MEMORY: out of memory",
    "oom reaper start": "[    0.912345] oom_reaper: started",
    "seccomp clone3": "OpenBLAS blas_thread_init: pthread_create failed for thread 52 of 64: "
    "Operation not permitted",
}

ESCALATIONS = {
    # bitsandbytes' other CUDA and cuBLAS statuses: a device fault nobody named, never silent.
    "cublas status": "cuBLAS API failed with status 13",
    "cuda check": "Error invalid argument at line 380 in file /src/csrc/ops.cu",
}


@pytest.mark.parametrize("name", sorted(RESOURCE_FAILURES))
def test_resource_exhaustion_spellings_name_their_resource(
    pack: RuleSet, tmp_path: Path, name: str
) -> None:
    text, failure_type = RESOURCE_FAILURES[name]
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, text), failure_type, NOTIFY)


@pytest.mark.parametrize("name", sorted(RESOURCE_NEIGHBOURS))
def test_their_harmless_neighbours_stay_healthy(pack: RuleSet, tmp_path: Path, name: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, RESOURCE_NEIGHBOURS[name]))


STARTUP_FAILURES = {
    # Kernel libraries and compilers refusing the settings on this GPU or runtime.
    "flash-attn dtype": "RuntimeError: FlashAttention only support fp16 and bf16 data type",
    "flash-attn head dim": "RuntimeError: FlashAttention forward only supports head dimension "
    "at most 256",
    "transformer engine fp8": "[rank0]: RuntimeError: Device compute capability 8.9 or higher "
    "required for FP8 execution.",
    "inductor gpu too old": "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\n"
    "GPUTooOldForTriton: Found Tesla P100-PCIE-16GB which is too old to be supported by the "
    "triton GPU compiler, which is used as the backend.",
    # The environment cannot run the job.
    "bitsandbytes missing dependency": "RuntimeError: \n"
    "\N{POLICE CARS REVOLVING LIGHT} CUDA SETUP ERROR: Missing dependency: libcusparse.so.12 "
    "\N{POLICE CARS REVOLVING LIGHT}",
    "deepspeed op builder": "RuntimeError: Unable to JIT load the cpu_adam op due to ninja not "
    "being installed.",
    "cpp_extension spelling": "RuntimeError: The detected CUDA version (12.2) mismatches the "
    "version that was used to compilePyTorch (12.8). Please make sure to use the same CUDA "
    "versions.",
    "triton missing": "torch._inductor.exc.InductorError: TritonMissing: Cannot find a working "
    "triton installation. Either the package is not installed or it is too old.",
    "jaxlib version": "RuntimeError: jaxlib is version 0.4.30, but this version of jax requires "
    "version >= 0.6.0.",
    "jax outdated cudnn": "RuntimeError: Outdated cuDNN installation found.\n"
    "Version JAX was built against: 90800\nMinimum supported: 90100\nInstalled version: 90000",
    # The launch does not fit where it runs.
    "torch.load mapping": "RuntimeError: Attempting to deserialize object on CUDA device 3 but "
    "torch.cuda.device_count() is 1. Please use torch.load with map_location to map your "
    "storages to an existing device.",
    "cuda in fork": "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA "
    "with multiprocessing, you must use the 'spawn' start method",
    "jax init order": "RuntimeError: jax.distributed.initialize() must be called before any JAX "
    "calls that might initialise the XLA backend.",
    "megatron world size": "RuntimeError: world_size (12) is not divisible by 8",
    "nemo resume": "nemo.utils.exceptions.NotFoundError: There were no checkpoints found in "
    "checkpoint_dir or no checkpoint folder at checkpoint_dir :/results/ckpt. Cannot resume.",
    "nccl comm id": "gpu-node-03:4121:4121 [0] bootstrap.cc:114 (bootstrapNetInit) NCCL WARN "
    "Invalid NCCL_COMM_ID, please use format: <ipv4>:<port> or [<ipv6>]:<port> or "
    "<hostname>:<port>",
    "kubelet secret key": "  Warning  Failed     8s (x4 over 41s)  kubelet            Error: "
    "couldn't find key HF_TOKEN in Secret ml-team/hf-credentials",
    "hydra short form": "In 'train': Could not find 'model/llama3_70b'\n\n"
    "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.",
    "paddle cpu build": "E1206 20:31:04.118220  4410 place.cc:389] Cannot use GPU because you "
    "have installed CPU version PaddlePaddle.",
    "hub revision": "OSError: v2.1 is not a valid git identifier (branch name, tag name or "
    "commit id) that exists for this model name. Check the model page for available revisions.",
}

STARTUP_NEIGHBOURS = {
    # DeepSpeed goes on when DS_SKIP_CUDA_CHECK=1 allows the mismatch.
    "deepspeed skip check": " [WARNING]  DeepSpeed Op Builder: Installed CUDA version 12.4 does "
    "not match the version torch was compiled with 12.8.Detected `DS_SKIP_CUDA_CHECK=1`: "
    "Allowing this combination of CUDA, but it may result in unexpected behavior.",
    "deprecated flag warning": "WARNING: --fp16 is deprecated, use --precision fp16 instead",
    "flash attention available": "INFO: FlashAttention 2 is available, using it for attention",
}


@pytest.mark.parametrize("name", sorted(STARTUP_FAILURES))
def test_startup_spellings_need_the_owner(pack: RuleSet, tmp_path: Path, name: str) -> None:
    text = STARTUP_FAILURES[name]
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, text), "startup_error", NOTIFY)


@pytest.mark.parametrize("name", sorted(STARTUP_NEIGHBOURS))
def test_startup_notices_stay_healthy(pack: RuleSet, tmp_path: Path, name: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, STARTUP_NEIGHBOURS[name]))


def test_ray_train_without_the_resources_it_asked_for_is_unschedulable(
    pack: RuleSet, tmp_path: Path
) -> None:
    text = (
        "ray.train.v2._internal.exceptions.InsufficientClusterResourcesError: Insufficient "
        "cluster resources to launch training workers."
    )
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, text), "unschedulable", NOTIFY)


CORDON = Action.CORDON_NODE_AND_RESTART
HARDWARE = {
    # The driver's attribution on a MIG-partitioned GPU (kernel_rc.c: "PCI:%s GPU-I:%02u
    # GPU-CI:%02u"): every Xid is read as on a whole GPU.
    "mig xid 48": (
        "[ 1234.5] NVRM: Xid (PCI:0000:01:00 GPU-I:05): 48, pid=7194, name=python3, An "
        "uncorrectable double bit error (DBE) has been detected on GPU (0000:01:00).",
        "gpu_ecc_uncorrectable",
        CORDON,
    ),
    "mig xid 95 compute instance": (
        "[ 1234.5] NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 95, pid=7194, name=python3, "
        "Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
        "gpu_ecc_uncorrectable",
        CORDON,
    ),
    "mig xid 13": (
        "[ 1234.5] NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 13, pid=7194, name=python3, "
        "Graphics Engine Exception",
        "gpu_xid_application",
        Action.RESTART_JOB,
    ),
    # Xid 45 names the Xid that caused it: act on that one.
    "xid 45 after 79": (
        "NVRM: Xid (PCI:0000:3b:00): 45, pid=48211, name=python3, Ch 00000010 caused by "
        "previous Xid 79",
        "gpu_fallen_off_bus",
        CORDON,
    ),
    "xid 45 after 94": (
        "NVRM: Xid (PCI:0000:3b:00): 45, pid=48211, name=python3, Ch 00000010 caused by "
        "previous Xid 94",
        "gpu_ecc_contained",
        Action.RESTART_JOB,
    ),
    "gsp rate limit": (
        "NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:3b:00 (printing 1 of "
        "every 30).  The GPU likely needs to be reset.",
        "gsp_error",
        CORDON,
    ),
    "dcgm health reset": (
        "| Overall Health     | Failure                                               |\n"
        "|                    | Driver:  Failure                                      |\n"
        "|                    |   GPU 3 requires a reset to recover from a fault.     |\n"
        "|                    |   Recovery action: 1 (GPU_RESET).                     |",
        "gpu_recovery_action",
        CORDON,
    ),
    "nccl nvml gpu lost": (
        "gpu-a:811:902 [3] misc/nvmlwrap.cc:166 NCCL WARN nvmlDeviceGetHandleByIndex(3) "
        "failed: GPU is lost",
        "gpu_lost",
        CORDON,
    ),
    "nccl nvml driver mismatch": (
        "gpu-a:811:902 [3] misc/nvmlwrap.cc:142 NCCL WARN nvmlInit_v2() failed: Driver/library "
        "version mismatch",
        "nvml_driver_mismatch",
        CORDON,
    ),
    "rocm dram ecc": (
        "Memory access fault by GPU node-2 (Agent handle: 0x55d0c2a0f2d0) on address "
        "0x7f3c5e000000. Reason: DRAM ECC failure.",
        "gpu_ecc_uncorrectable",
        CORDON,
    ),
}

HARDWARE_ESCALATIONS = {
    "dcgm drain p2p": "GPU 0 requires peer-to-peer traffic to be quiesced. Recovery "
    "action: 3 (DRAIN_P2P).",
    "rocm page fault": "Memory access fault by GPU node-2 (Agent handle: 0x55d0c2a0f2d0) on "
    "address 0x7f3c5e000000. Reason: Page not present or supervisor privilege.",
    "amdgpu iommu fault": "[ 99.1] amdgpu 0000:c1:00.0: AMD-Vi: Event logged "
    "[IO_PAGE_FAULT domain=0x0000 address=0x10b4a0100 flags=0x0070]",
}


def test_a_recovery_action_of_none_stays_healthy(pack: RuleSet, tmp_path: Path) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, "|   Recovery action: 0 (NONE).   |"))


RESTART = Action.RESTART_JOB
NETWORK_AND_STORAGE = {
    # NCCL's socket set-up in newer releases, and NICs of two link types selected together.
    "nccl no listening interface": (
        "gpu-node-07:48213:48577 [0] bootstrap.cc:120 NCCL WARN NET/Socket : No usable "
        "listening interface found",
        "startup_error",
        NOTIFY,
    ),
    "nccl oob interface": (
        "gpu-node-07:48213:48577 [0] bootstrap.cc:577 NCCL WARN no device found matching "
        "ens9f0, verify NCCL_OOB_NET_IFNAME",
        "startup_error",
        NOTIFY,
    ),
    "nccl incompatible nics": (
        "gpu-node-07:48213:48577 [0] transport/net_ib/connect.cc:987 NCCL WARN NET/IB : "
        "Attempted to connect incompatible devices: [0]mlx5_0:1/IB and [0]mlx5_4:1/RoCE. Try "
        "selecting NICs of only one link type using NCCL_IB_HCA",
        "startup_error",
        NOTIFY,
    ),
    "ib catastrophic with its device": (
        "gpu-node-07:48213:48577 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_2:1 Got "
        "async event : local catastrophic error",
        "ib_host_fault",
        CORDON,
    ),
    "open mpi readv": (
        "[gpu-node-07][[41233,1],3][btl_tcp_frag.c:247:mca_btl_tcp_frag_recv] "
        "mca_btl_tcp_frag_recv: readv failed: Connection timed out (110)",
        "socket_closed",
        RESTART,
    ),
    "xla heartbeat": (
        "E1206 19:20:55.000123  48213 coordination_service.cc:472] Task "
        "/job:jax_worker/replica:0/task:8 heartbeat timeout. This indicates that the remote "
        "task has failed, got preempted, or crashed unexpectedly.",
        "rendezvous_error",
        RESTART,
    ),
    # Reads that stopped part way or came back damaged: reading again works.
    "aiohttp payload": (
        "aiohttp.client_exceptions.ClientPayloadError: Response payload is not completed: "
        "<TransferEncodingError: 400, message='Not enough data to satisfy transfer length "
        "header.'>",
        "object_store_error",
        RESTART,
    ),
    "hub consistency check": (
        "OSError: Consistency check failed: file should be of size 4976698672 but has size "
        "2147483648 (model-00001-of-00002.safetensors).",
        "object_store_error",
        RESTART,
    ),
    "s3fs slow down": (
        "OSError: [Errno 16] Please reduce your request rate.",
        "object_store_error",
        RESTART,
    ),
    "megatron missing checkpoint": (
        ">> '--exit-on-missing-checkpoint' is set but no checkpoint was found under load "
        "directory '/ckpt/run1' (missing metadata/tracker file "
        "'/ckpt/run1/latest_checkpointed_iteration.txt'). Exiting with a non-zero status. <<",
        "startup_error",
        NOTIFY,
    ),
}

STORAGE_ESCALATIONS = {
    "zip crc": "[rank0]: RuntimeError: PytorchStreamReader failed reading file data/104: "
    "CRC-32 check failed",
    "zip not an archive": "RuntimeError: PytorchStreamReader failed reading zip archive: not "
    "a ZIP archive",
    "safetensors old spelling": "safetensors_rust.SafetensorError: Error while deserializing "
    "header: HeaderTooLarge",
    "safetensors new spelling": "safetensors_rust.SafetensorError: Error while deserializing "
    "header: incomplete metadata, file not fully covered",
    "zero-filled pickle": "_pickle.UnpicklingError: invalid load key, '\\x00'.",
    "hdf5 signature": "OSError: Unable to open file (file signature not found)",
    "megatron tracker": "ERROR: Invalid metadata file "
    "/ckpt/run1/latest_checkpointed_iteration.txt. Exiting",
    "xfs log": "[Sun Dec  6 20:41:07 2026] XFS (md0): Filesystem has been shut down due to log "
    "error (0x2).",
    "nvme timeout": "[Sun Dec  6 20:41:07 2026] nvme nvme1: I/O tag 712 (d2c8) opcode 0x2 (I/O "
    "Cmd) QID 17 timeout, aborting req_op:READ(0) size:131072",
    "nccl comm abort state": "gpu-node-07:48213:48577 [2] proxy.cc:1371 NCCL WARN Comm "
    "0x55d1c3a0 is in abort state",
}

RETRIES_THAT_SUCCEED = {
    "nccl ibv_modify_qp retry": "gpu-node-07:48213:48577 [0] NCCL INFO Call to ibv_modify_qp "
    "failed with 110 Connection timed out, on dev mlx5_1:1, curr state INIT, next state RTR, "
    "retrying 1/5 after 500 msec of sleep\n"
    "gpu-node-07:48213:48577 [0] NCCL INFO comm 0x55d1c3a0 rank 0 nranks 16 - Init COMPLETE",
    "tcpstore retry": "[W1206 19:45:43.892069000 TCPStore.cpp:347] [c10d] TCP client failed to "
    "connect/validate to host 10.42.7.1:29500 - retrying (try=0, timeout=1800000ms, "
    "delay=487ms): Connection reset by peer",
}


@pytest.mark.parametrize("name", sorted(RETRIES_THAT_SUCCEED))
def test_retries_that_succeed_stay_healthy(pack: RuleSet, tmp_path: Path, name: str) -> None:
    text = RETRIES_THAT_SUCCEED[name] + "\nstep 4: loss 2.58"
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_an_unreachable_hub_that_did_not_time_out_is_not_a_passing_read(
    pack: RuleSet, tmp_path: Path
) -> None:
    # An air-gapped node prints the same sentence with (ConnectionError): a restart fails again.
    text = "ConnectionError: Couldn't reach 'allenai/c4' on the Hub (ConnectionError)"
    assert verdict_of(pack, tmp_path, STEPS, text).failure_type != "object_store_error"


FAMILY_ACTIONS = {**HARDWARE, **NETWORK_AND_STORAGE}
"""Hardware, network and storage spellings whose source states an action."""
ALL_ESCALATIONS = {**ESCALATIONS, **HARDWARE_ESCALATIONS, **STORAGE_ESCALATIONS}
"""Failures whose source names no action a rule may take: a person reads them."""


@pytest.mark.parametrize("name", sorted(FAMILY_ACTIONS))
def test_each_spelling_gets_the_action_its_source_states(
    pack: RuleSet, tmp_path: Path, name: str
) -> None:
    text, failure_type, action = FAMILY_ACTIONS[name]
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, text), failure_type, action)


@pytest.mark.parametrize("name", sorted(ALL_ESCALATIONS))
def test_failures_without_a_stated_action_escalate_naming_their_line(
    pack: RuleSet, tmp_path: Path, name: str
) -> None:
    line = ALL_ESCALATIONS[name]
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, line), line)
