"""Rule families written from upstream sources, measured as a user sees them: a job's verdict.

Each failing log is a few healthy training steps and one report in the spelling its upstream
code prints (NCCL, PyTorch, the CUDA runtime, NVML / nvidia-smi / DCGM, amdgpu, mlx5, the
kubelet, Slurm, argparse, the shell). Each healthy log carries the harmless neighbours of those
reports, which must stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import Action, RuleSet
from tests.rules.families import assert_family_verdict, assert_healthy, verdict_of

STEPS = "".join(
    f" iteration {i:>6}/  500000 | consumed samples: {i * 128:>10} | lm loss: 2.41E+00 |\n"
    for i in range(1, 4)
)

CORDON = Action.CORDON_NODE_AND_RESTART
NOTIFY = Action.NOTIFY_USER
RESTART = Action.RESTART_JOB

FAILING: dict[str, tuple[str, str, Action]] = {
    # start-up: the owner must change the launch, a restart fails the same way
    "argparse": (
        "train.py: error: unrecognized arguments: --lr-sched cosine",
        "startup_error",
        NOTIFY,
    ),
    "missing script": (
        "python3: can't open file '/ws/train.py': [Errno 2] No such file or directory",
        "startup_error",
        NOTIFY,
    ),
    "click option": ("Error: No such option: --lr", "startup_error", NOTIFY),
    "fire argument": ("ERROR: Could not consume arg: --lr", "startup_error", NOTIFY),
    "tpu hbm": (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent "
        "error. Ran out of memory in memory space hbm. Used 20.5G of 15.48G hbm.",
        "cuda_oom",
        NOTIFY,
    ),
    "python -m missing": (
        "/usr/bin/python: No module named torch.distributed.run",
        "startup_error",
        NOTIFY,
    ),
    "slurm execve": (
        "slurmstepd: error: execve(): python: No such file or directory",
        "startup_error",
        NOTIFY,
    ),
    "wrong architecture": (
        "standard_init_linux.go:228: exec user process caused: exec format error",
        "startup_error",
        NOTIFY,
    ),
    "missing launcher": ("bash: line 1: torchrun: command not found", "startup_error", NOTIFY),
    "duplicate gpu": (
        "n1:4121:4121 [0] init.cc:738 NCCL WARN Duplicate GPU detected : rank 2 "
        "and rank 3 both on CUDA device 1b000",
        "startup_error",
        NOTIFY,
    ),
    "nccl versions": (
        "n1:4121:4121 [0] init.cc:612 NCCL WARN Mismatched NCCL version detected "
        ": rank 4 version 22105 rank 0 version 21805",
        "startup_error",
        NOTIFY,
    ),
    "driver too old": (
        "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime version",
        "startup_error",
        NOTIFY,
    ),
    "no kernel image": (
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        "startup_error",
        NOTIFY,
    ),
    # GPU health outside Xid lines: the node is the culprit
    "nvidia-smi reset": (
        "        Reset Required                    : Yes",
        "gpu_health_failure",
        CORDON,
    ),
    "nvml reset": (
        "Unable to determine the device handle for GPU0000:3B:00.0: GPU requires reset",
        "gpu_health_failure",
        CORDON,
    ),
    "dcgm retired pages": (
        "16 or more retired pages have been detected in GPU 1.",
        "gpu_health_failure",
        CORDON,
    ),
    "dcgm nvlink": ("GPU 0's NvLink link 3 is currently down", "nvlink_error", CORDON),
    "amdgpu ras": (
        "amdgpu 0000:1b:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block",
        "gpu_health_failure",
        CORDON,
    ),
    "amdgpu bad pages": (
        "amdgpu 0000:c1:00.0: amdgpu: Saved bad pages(512) reaches threshold value(512).",
        "gpu_row_remap_failure",
        CORDON,
    ),
    # host-level InfiniBand faults
    "mlx5 fatal": (
        "kernel: mlx5_core 0000:3b:00.0: poll_health:816:(pid 0): Fatal error 1 detected",
        "ib_host_fault",
        CORDON,
    ),
    "hca fatal event": (
        "n1:2231:2290 [3] NCCL WARN NET/IB : mlx5_2:1 async fatal event: local catastrophic error",
        "ib_host_fault",
        CORDON,
    ),
    # container and scheduler limits: never a cordon
    "ephemeral storage": (
        "Warning  Evicted  3m  kubelet  Pod ephemeral local storage usage "
        "exceeds the total limit of containers 10Gi.",
        "ephemeral_storage_eviction",
        NOTIFY,
    ),
    "memory pressure": (
        "Warning  Evicted  3m  kubelet  The node was low on resource: memory. "
        "Threshold quantity: 100Mi, available: 65432Ki.",
        "host_oom",
        NOTIFY,
    ),
    "slurm memory": (
        "slurmstepd: error: Step 1234.0 exceeded memory limit (41943040 > 33554432), being killed",
        "host_oom",
        NOTIFY,
    ),
    "dataloader shm": (
        "ERROR: Unexpected bus error encountered in worker. This might be caused "
        "by insufficient shared memory (shm).",
        "shm_exhausted",
        NOTIFY,
    ),
    "torch shm file": (
        "RuntimeError: unable to write to file </torch_18692_1954506130>: No "
        "space left on device (28)",
        "shm_exhausted",
        NOTIFY,
    ),
    "nccl shm sigbus": (
        "[gpu-node-1:3039 :0:3095] Caught signal 7 (Bus error: nonexistent physical address)\n"
        "==== backtrace (tid:   3095) ====\n"
        " 2 0x000000000007587d ncclGroupEnd()  ???:0",
        "nccl_shm_error",
        NOTIFY,
    ),
    "open files": ("OSError: [Errno 24] Too many open files", "too_many_open_files", NOTIFY),
    "slurm time limit": (
        "slurmstepd: error: *** STEP 3223.0 ON nid01934 CANCELLED AT 2020-07-03T02:59:56 DUE TO "
        "TIME LIMIT ***",
        "time_limit",
        NOTIFY,
    ),
    "ray oom": (
        "(raylet) node_manager.cc:3277: 2 Workers (tasks / actors) killed due to memory pressure "
        "(OOM), 0 Workers crashed due to other reasons",
        "host_oom",
        NOTIFY,
    ),
    "image pull": (
        "Warning  Failed  pod/trainer-0  Error: ImagePullBackOff",
        "startup_error",
        NOTIFY,
    ),
    "p2p unsupported": (
        "z-pc:9096:9103 [0] transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 "
        "peer access is not supported between these two devices",
        "startup_error",
        NOTIFY,
    ),
    "nvml mismatch": (
        "Failed to initialize NVML: Driver/library version mismatch",
        "nvml_driver_mismatch",
        CORDON,
    ),
    "pcie aer": (
        "nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)",
        "gpu_fallen_off_bus",
        CORDON,
    ),
    "ucx retry": (
        "[n4:3639:0:3639] ib_mlx5_log.c:171  Transport retry count exceeded on mlx5_0:1/IB (synd "
        "0x15 vend 0x81 hw_synd 0/0)",
        "ib_error",
        RESTART,
    ),
    "jax heartbeat": (
        "E coordination_service.cc:1170] /job:jax_worker/replica:0/task:0 has been set to ERROR in "
        "coordination service: UNAVAILABLE: Task /job:jax_worker/replica:0/task:0 heartbeat "
        "timeout.",
        "rendezvous_error",
        RESTART,
    ),
    "port in use": (
        "[W socket.cpp:464] [c10d] The server socket has failed to bind to 0.0.0.0:29500 (errno: "
        "98 - Address already in use).",
        "rendezvous_error",
        NOTIFY,
    ),
    "slurm gres": (
        "srun: error: Unable to create step for job 1641: Invalid generic resource (gres) "
        "specification",
        "startup_error",
        NOTIFY,
    ),
    "kaldi cuda": (
        'ERROR (nnet3-train[5.4]:CopyToVec():cu-vector.cc:899) cudaError_t 4 : "unspecified '
        "launch failure\" returned from 'cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost)'",
        "gpu_fault",
        Action.ESCALATE,
    ),
    "bare killed": ("Killed", "process_killed", Action.ESCALATE),
    # other ecosystems' device OOM
    "jax oom": (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
        "trying to allocate 17179869184 bytes.",
        "cuda_oom",
        NOTIFY,
    ),
    "rocm oom": (
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB.",
        "cuda_oom",
        NOTIFY,
    ),
    # older NCCL and PyTorch spellings
    "watchdog pre-1.10": (
        "[E ProcessGroupNCCL.cpp:566] [Rank 3] Watchdog caught collective "
        "operation timeout: WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=1800000) ran "
        "for 1800995 milliseconds before timing out.",
        "nccl_timeout",
        RESTART,
    ),
    "ib completion pre-2.12": (
        "n2:5776:5902 [0] transport/net_ib.cc:838 NCCL WARN NET/IB : Got "
        "completion with error 12, opcode 1, len 32768, vendor err 129",
        "ib_error",
        RESTART,
    ),
    "store barrier": (
        "RuntimeError: Timed out initializing process group in store based barrier "
        "on rank: 3, for key: store_based_barrier_key:1 (world_size=8, "
        "worker_count=7, timeout=0:30:00)",
        "rendezvous_error",
        RESTART,
    ),
    # issue 11 families, one spelling per ecosystem
    "go enospc": (
        "Error: failed to register layer: write /var/lib/containerd/snapshots/42/fs/lib.so: "
        "no space left on device",
        "disk_full",
        NOTIFY,
    ),
    "lustre evicted": (
        "kernel: LustreError: 167-0: scratch-MDT0000-mdc-ffff9a3e: This client was evicted by "
        "scratch-MDT0000; in progress operations using this service will fail.",
        "nfs_error",
        RESTART,
    ),
    "old stale handle": (
        "IOError: [Errno 116] Stale NFS file handle: '/nfs/run/events.out'",
        "nfs_error",
        RESTART,
    ),
    "arrow s3 denied": (
        "OSError: When reading information for key 'ckpt/latest' in bucket 'runs': AWS Error "
        "ACCESS_DENIED during HeadObject operation: No response body.",
        "object_store_error",
        NOTIFY,
    ),
    "minio throttled": (
        "minio.error.S3Error: S3 operation failed; code: SlowDown, message: please reduce your "
        "request rate",
        "object_store_error",
        RESTART,
    ),
    "glibcxx": (
        "ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not "
        "found (required by /opt/conda/lib/python3.10/site-packages/torch/lib/libtorch.so)",
        "startup_error",
        NOTIFY,
    ),
    "deepspeed cuda mismatch": (
        "deepspeed.ops.op_builder.builder.CUDAMismatchException: >- DeepSpeed Op Builder: "
        "Installed CUDA version 12.4 does not match the version torch was compiled with 11.8",
        "startup_error",
        NOTIFY,
    ),
    "absl flags": (
        "FATAL Flags parsing error: Unknown command line flag 'num_steps'",
        "startup_error",
        NOTIFY,
    ),
    "mpi slots": (
        "There are not enough slots available in the system to satisfy the 16",
        "startup_error",
        NOTIFY,
    ),
    "pip resolve": (
        "ERROR: No matching distribution found for flash-attn==9.9",
        "startup_error",
        NOTIFY,
    ),
    "jax cudnn": (
        "E0412 10:02:11.000000 1234 cuda_dnn.cc:535] Loaded runtime CuDNN library: 8.6.0 but "
        "source was compiled with: 8.9.4.",
        "startup_error",
        NOTIFY,
    ),
    "hydra key": (
        "omegaconf.errors.ConfigAttributeError: Key 'vocab_file' is not in struct",
        "ConfigAttributeError",
        NOTIFY,
    ),
    "elastic state": (
        "torch.distributed.elastic.rendezvous.api.RendezvousStateError: The node state could "
        "not be retrieved from the rendezvous backend.",
        "rendezvous_error",
        RESTART,
    ),
    "gloo connect": (
        "RuntimeError: [/opt/conda/third_party/gloo/gloo/transport/tcp/pair.cc:799] connect "
        "[10.1.4.22]:28233: Connection refused",
        "rendezvous_error",
        RESTART,
    ),
    "gloo loopback": (
        "  what():  [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:724] connect "
        "[127.0.1.1]:3210: Connection refused",
        "rendezvous_error",
        NOTIFY,
    ),
    "launcher ssh": (
        "node2: ssh: connect to host node2 port 22: Connection refused",
        "rendezvous_error",
        NOTIFY,
    ),
    "fabric manager down": (
        "RuntimeError: CUDA error: system not yet initialized",
        "nvlink_error",
        CORDON,
    ),
    "fabric topology": (
        "[Mar 03 2025 10:12:44] [ERROR] [tid 1201] detected number of NVSwitches don't match "
        "with any supported system topology, aborting fabric manager",
        "nvlink_error",
        CORDON,
    ),
    "host memory ue": (
        "kernel: EDAC MC0: 1 UE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 "
        "slot:0 page:0x1234 offset:0x0 grain:32)",
        "host_hardware_error",
        CORDON,
    ),
    "machine check": (
        "kernel: mce: Uncorrected hardware memory error in user-access at 3c7a8f000",
        "host_hardware_error",
        CORDON,
    ),
    "device plugin xid": (
        "XidCriticalError: Xid=79 on Device=GPU-0b11d014; marking device as unhealthy.",
        "gpu_fallen_off_bus",
        CORDON,
    ),
    "thc oom": (
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/"
        "THCCachingAllocator.cpp:510",
        "cuda_oom",
        NOTIFY,
    ),
    "nccl old invalid argument": (
        "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:514, invalid "
        "argument, NCCL version 2.4.8",
        "startup_error",
        NOTIFY,
    ),
    "ofi request error": (
        "gpu-node-3:1234:1290 [0] nccl_ofi_rdma.cpp:1412 NCCL WARN NET/OFI Request 0x7f3a "
        "completed with error. RC: 12. Error: 113 (No route to host). Completed length: 0",
        "ib_error",
        RESTART,
    ),
    "ofi post failed": (
        "gpu-node-3:1234:1290 [0] nccl_ofi_rdma.cpp:2210 NCCL WARN NET/OFI Unable to post send "
        "buffer, RC: -113",
        "nccl_transport_error",
        RESTART,
    ),
    "oom in words": (
        "ERROR 03-01 10:00:00 engine.py:150] CUDA out of memory while running the model",
        "cuda_oom",
        NOTIFY,
    ),
    "read-only path": (
        "OSError: [Errno 30] Read-only file system: '/media'",
        "storage_io_error",
        NOTIFY,
    ),
    "shm enospc": (
        "OSError: [Errno 28] No space left on device: '/dev/shm/pym-4412-abc1'",
        "shm_exhausted",
        NOTIFY,
    ),
    # device OOM, NCCL / RCCL, gloo and JAX coordination spellings of other releases
    "c10 oom in a c++ thread": (
        "terminate called after throwing an instance of 'c10::OutOfMemoryError'",
        "cuda_oom",
        NOTIFY,
    ),
    "tf graph execution oom": (
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:\n"
        "\nDetected at node 'model/conv2d/Conv2D' defined at (most recent call last):\n"
        "OOM when allocating tensor with shape[64,128,112,112] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
        "cuda_oom",
        NOTIFY,
    ),
    "torch_xla hbm": (
        "RuntimeError: Resource exhausted: Ran out of memory in memory space hbm. Used 17.5G of "
        "15.48G hbm.",
        "cuda_oom",
        NOTIFY,
    ),
    "rccl oom": (
        "gpu-node-2:4411:4470 [0] allocator.cc:76 NCCL WARN HIP failure 'out of memory'",
        "nccl_cuda_oom",
        NOTIFY,
    ),
    "gloo write error": (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:575] Write error "
        "[10.0.0.2]:35112: Broken pipe",
        "socket_closed",
        RESTART,
    ),
    "xla gloo context": (
        "jaxlib.xla_extension.XlaRuntimeError: UNKNOWN: Gloo context initialization failed: "
        "DEADLINE_EXCEEDED: GetKeyValue() timed out with key: cpu:gloo/0,1,2,3/1",
        "rendezvous_error",
        RESTART,
    ),
    "vllm free memory": (
        "ValueError: Free memory on device (10.52/79.15 GiB) on startup is less than desired GPU "
        "memory utilization (0.90, 71.24 GiB).",
        "cuda_oom",
        NOTIFY,
    ),
    "triton driver oom": ("RuntimeError: Triton Error [CUDA]: out of memory", "cuda_oom", NOTIFY),
    "pycuda oom": (
        "pycuda._driver.MemoryError: cuMemAlloc failed: out of memory",
        "cuda_oom",
        NOTIFY,
    ),
    "tensorrt oom": (
        "[TRT] [E] [resizingAllocator.cpp::allocate::78] Error Code 1: Cuda Runtime (out of "
        "memory)",
        "cuda_oom",
        NOTIFY,
    ),
    "ucx rc retry": (
        "[gpu-node-4:3639441:0:3639502] rc_verbs_iface.c:63 send completion with error: transport "
        "retry counter exceeded qpn 0x1a2b wrid 0x3 vendor_err 0x81",
        "ib_error",
        RESTART,
    ),
    "ucx ud timeout": (
        "[1700000000.123456] [gpu-node-4:3639441:0]        ud_ep.c:278  Fatal: UD endpoint "
        "0x5612a4c0 to <no debug data>: unhandled timeout error",
        "ib_error",
        RESTART,
    ),
    "rocm ecc": (
        "RuntimeError: HIP error: hipErrorECCNotCorrectable",
        "gpu_ecc_uncorrectable",
        CORDON,
    ),
    "page retirement failed": (
        "XID 64 Dynamic Page Retirement: Fatal error, unable to retire page (0x00000000003f6b43)",
        "gpu_row_remap_failure",
        CORDON,
    ),
    "tcpstore clients 1.x": (
        "RuntimeError: Timed out after 1800 seconds waiting for clients. 3/4 clients joined.",
        "rendezvous_error",
        RESTART,
    ),
    "store cannot listen": (
        "[E socket.cpp:500] [c10d] The server socket has failed to listen on any local network "
        "address.",
        "rendezvous_error",
        Action.ESCALATE,
    ),
    "horovodrun exit": (
        "Horovod detected that one or more processes exited with non-zero status, thus causing "
        "the job to be terminated. The first process to do so was:",
        "abnormal_exit",
        Action.ESCALATE,
    ),
    "jax missing heartbeats": (
        "F0312 08:14:02.551201   40211 client.cc:183] Terminating process because the "
        "coordinator detected missing heartbeats. This most likely indicates that another task "
        "died; see the other task logs for more details.",
        "communicator_aborted",
        Action.ESCALATE,
    ),
}

HEALTHY = {
    "argparse usage": "usage: train.py [-h] [--lr LR] [--epochs EPOCHS]",
    "nvidia-smi ok": "    GPU Reset Status\n        Reset Required                    : No\n"
    "        Drain and Reset Recommended       : No",
    "remap pending after a correctable error": "    Remapped Rows\n        Correctable Error "
    "                : 1\n        Uncorrectable Error               : 0\n        Pending     "
    "                      : Yes\n        Remapping Failure Occurred        : No",
    "dcgm throttle": "Detected clock throttling due to thermal violation in GPU 2.",
    "amdgpu correctable": "amdgpu 0000:1b:00.0: amdgpu: 3 correctable hardware errors detected "
    "in umc block",
    "amdgpu reset ok": "amdgpu 0000:c1:00.0: amdgpu: GPU reset(2) succeeded!",
    "mlx5 module plugged": "kernel: mlx5_core 0000:3b:00.0: mlx5_port_module_event:1131:(pid 0): "
    "Port module event: module 0, Cable plugged",
    "nccl ib info": "n2:5776:5902 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; "
    "OOB eth0:10.2.0.4<0>",
    "port active": "n2:5776:5902 [0] NCCL WARN NET/IB : mlx5_0:1 Got non-fatal async event: port "
    "active(9)",
    "xla bfc warning": "W external/tsl/tsl/framework/bfc_allocator.cc:296] Allocator (GPU_0_bfc) "
    "ran out of memory trying to allocate 2.17GiB with freed_by_count=0. The caller indicates "
    "that this is not a failure, but this may mean that there could be performance gains if "
    "more memory were available.",
    "kubelet scheduled": "Normal   Scheduled  3m  default-scheduler  Successfully assigned "
    "ml/trainer-0 to gpu-node-4",
    "nccl driver info": "n1:4121:4121 [0] NCCL INFO cudaDriverVersion 12040",
    "aer corrected": "pcieport 0000:00:03.0: AER: Corrected error received: 0000:00:03.0\n"
    "pcieport 0000:00:03.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver "
    "ID)",
    "aer recovered": "pcieport 0000:00:03.0: AER: device recovery successful",
    "edac corrected": "kernel: EDAC MC1: 1 CE memory read error on CPU_SrcID#1_Ha#0_Chan#0_DIMM#0 "
    "(channel:0 slot:0 page:0x4f21 offset:0x0 grain:32)",
    "mce logged": "kernel: mce: [Hardware Error]: Machine check events logged",
    "cper corrected": "kernel: {1}[Hardware Error]:  event severity: corrected",
    "setup probe": "/bin/sh: 1: nvidia-smi: not found",
    "image pulled": 'Normal  Pulled  pod/trainer-0  Successfully pulled image "train:v3" in 41s',
    "ray no kills": "(raylet) node_manager.cc:3277: 0 Workers (tasks / actors) killed due to "
    "memory pressure (OOM), 1 Workers crashed due to other reasons",
    "megatron progress": " iteration      100/  500000 | lm loss: 2.41E+00 | loss scale: 65536.0 "
    "| number of skipped iterations:   0 | number of nan iterations:   0 |",
    "click usage": "Usage: train.py [OPTIONS] CONFIG",
    "optional module": "WARNING: No module named 'apex': fused kernels disabled",
    "optional import": "WARNING: apex not found (ImportError: No module named 'apex'), falling "
    "back to torch.optim",
    "pip satisfied": "Requirement already satisfied: torch in /opt/conda/lib/python3.10 (2.4.0)",
    "nvlink status": "GPU 0: NVIDIA H100 80GB HBM3\n         Link 0: 26.562 GB/s\n         Link 1: "
    "Recovery Errors: 0",
    "shm mount": "Mounted /dev/shm with size=64g",
    "oom retried": "Warning: CUDA out of memory, retrying with smaller batch",
    "oom skipped": "CUDA OOM at step 1200, skipping batch",
    "oom hint": "Tip: if you see CUDA out of memory errors, lower --batch-size",
    "grpc message size": "grpc._channel._InactiveRpcError: status = StatusCode.RESOURCE_EXHAUSTED, "
    'details = "Received message larger than max (5242880 vs. 4194304)"',
    "page retirement recorded": "XID 63 Dynamic Page Retirement: New retired page, reload the "
    "driver to activate. (0x00000000003f6b43)",
    "store listening": "[I socket.cpp:500] [c10d] The server socket has started to listen on "
    "[::]:29500.",
    "tf oom hint": "Hint: If you want to see a list of allocated tensors when OOM happens, add "
    "report_tensor_allocations_upon_oom to RunOptions for current allocation info.",
    "fm non-fatal": "[ERROR] [tid 2311] detected NVSwitch non-fatal error 12028 on fid 0 on "
    "NVSwitch pci bus id 00000000:07:00.0",
}


def test_megatron_nan_iterations_on_several_progress_lines_are_a_nan_loss(
    pack: RuleSet, tmp_path: Path
) -> None:
    lines = "\n".join(
        f" iteration {i:>8}/  500000 | lm loss: 2.38E+00 | number of skipped iterations:   1 | "
        "number of nan iterations:   1 |"
        for i in (100, 110, 120)
    )
    verdict = verdict_of(pack, tmp_path, STEPS, lines)
    assert (verdict.failure_type, verdict.action) == ("nan_loss", NOTIFY)


@pytest.mark.parametrize(("line", "failure_type", "action"), FAILING.values(), ids=list(FAILING))
def test_an_upstream_spelling_gets_its_family_verdict(
    pack: RuleSet, tmp_path: Path, line: str, failure_type: str, action: Action
) -> None:
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, line), failure_type, action)


@pytest.mark.parametrize("text", HEALTHY.values(), ids=list(HEALTHY))
def test_the_harmless_neighbours_of_those_reports_stay_healthy(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def _port_error(pid: int, dev: int) -> str:
    return (
        f"gpu-node-7:{pid}:{pid + 91} [{dev}] transport/net_ib/common.cc:221 NCCL WARN NET/IB : "
        f"mlx5_0:1 Got non-fatal async event: port error(10)"
    )


PEER_ERROR = (
    "gpu-node-3:5776:5902 [0] transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from "
    "peer 10.0.0.7<40554> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV_RDMA_WITH_IMM"
    "(129) vendor_err=129 localGid ::ffff:10.0.0.3 remoteGids::ffff:10.0.0.7 hca mlx5_1"
)


def test_a_port_error_on_every_rank_of_one_host_cordons_that_host(
    pack: RuleSet, tmp_path: Path
) -> None:
    host = "\n".join(_port_error(40211 + i, i) for i in range(4))
    verdict = verdict_of(pack, tmp_path, STEPS, PEER_ERROR, host)
    assert (verdict.failure_type, verdict.action) == ("ib_host_fault", CORDON)
    assert verdict.culprit_nodes == ("node-1",)


def test_a_port_error_of_one_process_is_a_restart_not_a_cordon(
    pack: RuleSet, tmp_path: Path
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, PEER_ERROR, _port_error(40211, 0))
    assert (verdict.failure_type, verdict.action) == ("ib_error", RESTART)


def test_a_lone_non_fatal_port_error_escalates_and_never_cordons(
    pack: RuleSet, tmp_path: Path
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, "\n".join([_port_error(40211, 0)] * 3))
    assert (verdict.failure_type, verdict.action) == ("ib_error", Action.ESCALATE)


def test_a_gpu_that_cannot_initialise_after_an_ecc_error_is_diagnosed_by_the_ecc_error(
    pack: RuleSet, tmp_path: Path
) -> None:
    dmesg = "\n".join(
        [
            "kernel: NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)",
            "kernel: NVRM: Xid (PCI:0000:0a:00): 48, pid=2931, An uncorrectable double bit error "
            "(DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, dmesg)
    assert (verdict.failure_type, verdict.action) == ("gpu_ecc_uncorrectable", CORDON)
    alone = verdict_of(pack, tmp_path, STEPS, dmesg.split("\n")[0])
    assert (alone.failure_type, alone.action) == ("gpu_health_failure", CORDON)


def test_a_lone_bus_error_still_escalates_while_its_window_waits(
    pack: RuleSet, tmp_path: Path
) -> None:
    """A windowed rule that matched without reaching its count did not fire: the catch-all on
    the same line still speaks."""
    line = "[gpu-node-1:3039 :0:3095] Caught signal 7 (Bus error: nonexistent physical address)"
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert (verdict.failure_type, verdict.action) == ("fatal_signal", Action.ESCALATE)
