"""Never silent on a failing log, never noisy on a healthy one (rules/escalation.yaml).

Each log is a training run's last lines with one failure report in a spelling no specific rule
reads: the job must end escalated (or better), naming that line. The healthy logs carry the
warnings, retries and skipped steps that runs print while they keep training: they must stay
healthy. And a catch-all never hides a specific diagnosis printed in the same job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.diagnosis.correlate import Status
from diagnoser.rules import Action, RuleSet
from tests.rules.families import verdict_of

STEPS = "".join(
    f" iteration {i:>6}/  500000 | consumed samples: {i * 128:>10} | lm loss: 2.41E+00 |\n"
    for i in range(1, 4)
)

FAILING = {
    "faulthandler": "Fatal Python error: Bus error",
    "glog handler": "*** SIGBUS (@0x7f3a2c000000) received by PID 51234 (TID 0x7f3b6) from PID 0",
    "elastic signal": "Signal 6 (SIGABRT) received by PID 2981",
    "c++ terminate": "terminate called after throwing an instance of 'c10::Error'",
    "shell core dump": "line 12: 40511 Aborted                 (core dumped) python train.py",
    "ucx handler": "[node-3:41234:0:41234] Caught signal 7 (Bus error: nonexistent physical "
    "address)",
    "slurm task exit": "srun: error: gpu-node-17: task 3: Exited with exit code 1",
    "slurm cancel": "slurmstepd: error: *** STEP 4412.0 ON gpu-node-9 CANCELLED AT "
    "2024-05-01T10:22:01 ***",
    "open mpi signal": "mpirun noticed that process rank 5 with PID 0 on node n4 exited on "
    "signal 9 (Killed).",
    "mpich": "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES",
    "deepspeed launcher": "[launch.py:347:main] Process 4471 exits with return code = 1",
    "elastic exit": "failed (exitcode: 1) local_rank: 0 (pid: 5121) of binary: /usr/bin/python3",
    "generic exit": "Process finished with exit code 139",
    "driver api": "XlaRuntimeError: INTERNAL: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure",
    "cublas": "RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm`",
    "cudnn": "RuntimeError: cuDNN error: CUDNN_STATUS_INTERNAL_ERROR",
    "thc": "THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=405 error=4 : "
    "unspecified",
    "hip": "RuntimeError: HIP error: hipErrorIllegalAddress",
    "hsa": "Memory access fault by GPU node-2 (Agent handle: 0x55d1c8a0) on address "
    "0x7f1c00000000.",
    "amdgpu reset": "amdgpu 0000:c1:00.0: amdgpu: GPU reset begin!",
    "nvrm": "NVRM: GPU 0000:3b:00.0: GPU reset is required",
    "nvml": "Failed to initialize NVML: Driver Not Loaded",
    "comm aborted": "NCCL communicator was aborted on rank 3.",
    "watchdog exc": "[PG 0 Rank 1] Process group watchdog thread terminated with exception: boom",
    "nan word": "Epoch 3 Batch 1200 loss = Infinity",
    "keras": "Batch 512: Invalid loss, terminating training",
    "lightning": "ValueError: The loss returned in `training_step` is nan.",
    "clip": "RuntimeError: The total norm of order 2.0 for gradients from `parameters` is "
    "non-finite, so it cannot be clipped.",
    "megatron nan": "ValueError: Rank 5: found NaN in local forward loss calculation. Device: 5",
    "apex scale": "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.0",
    "fairseq scale": "| INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: "
    "0.0005",
    "fairseq min": "FloatingPointError: Minimum loss scale reached (0.0001).",
    "deepspeed min": "Current loss scale already at minimum - cannot decrease scale anymore. "
    "Exiting",
    "headless exception": "safetensors_rust.SafetensorError: Error while deserializing header",
    "frames only": '  File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line '
    "2087, in step",
    "glog check": "F0412 10:02:11.123456  4242 cuda_executor.cc:1120] Check failed: "
    "stream->parent() == this",
    "tf fatal": "2024-04-12 10:02:11.123456: F tensorflow/core/common_runtime/device/"
    "device_event_mgr.cc:223] Unexpected Event status: 1",
    "spawn signal": "torch.multiprocessing.spawn.ProcessExitedException: process 3 terminated "
    "with signal SIGSEGV",
    "open mpi handler": "[gpu-node-3:41234] *** Process received signal ***",
    "open mpi signal name": "[gpu-node-3:41234] Signal: Segmentation fault (11)",
    "mpi fatal handler": "*** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,",
    "mpi exit split": "Primary job  terminated normally, but 1 process returned",
    "prterun exit": "prterun detected that one or more processes exited with non-zero status,",
    "orte daemon": "An ORTE daemon has unexpectedly failed after launch and before",
    "ecc in words": "GPU 2: Uncorrectable ECC error detected, GPU needs attention",
    "nccl unknown result": "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1269, unknown result code, NCCL version 2.14.3",
    "nccl old internal": "RuntimeError: NCCL error in: /opt/pytorch/torch/lib/c10d/"
    "ProcessGroupNCCL.cpp:825, internal error, NCCL version 2.7.8",
    "dynamo backend": "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
    "triton resources": "triton.runtime.errors.OutOfResources: out of resource: shared memory, "
    "Required: 131072, Hardware limit: 101376.",
    "grpc private class": "grpc._channel._InactiveRpcError: <_InactiveRpcError of RPC that "
    "terminated with:",
    "container not started": "  Warning  Failed  3s  kubelet  Error: failed to create "
    "containerd task: failed to create shim task: OCI runtime create failed: runc create failed",
    "kernel oops": "kernel: BUG: unable to handle page fault for address: ffffb0c2",
    "soft lockup": "kernel: watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python:1234]",
    "hung task": "kernel: INFO: task python:1234 blocked for more than 120 seconds.",
    "c10 backtrace": "Exception raised from c10_cuda_check_implementation at "
    "../c10/cuda/CUDAException.cpp:43 (most recent call first):",
    "no gpus": "No devices were found",
    "bare traceback header": "Traceback (most recent call last):",
    "dcgm pending retirement": "A pending retired page has been detected in GPU 3.",
    "dcgm nvlink rate": "12.5 CRC FLIT NvLink errors found occuring per second on GPU 4, "
    "exceeding the limit of 100 per second.",
    "dcgm nvlink counter": "Detected 12 CRC NvLink errors on GPU 3's link 2 which exceeds "
    "threshold of 0",
    "hf grad norm once": "{'loss': 1.7018, 'grad_norm': nan, 'learning_rate': 1.35e-06, "
    "'epoch': 0.01}",
    "lightning grad norm": "Epoch 0:  12%|#2        | 120/1000 [00:40<04:53,  3.00it/s, v_num=0, "
    "train_loss=2.31, grad_norm=inf]",
    "megatron grad norm once": " iteration      120/  500000 | lm loss: 2.41E+00 | loss scale: 1.0 "
    "| grad norm: nan | number of skipped iterations:   0 |",
    "fairseq gnorm": "epoch 001:    100 / 1000 loss=7.1, nll_loss=6.2, num_updates=100, "
    "lr=1e-04, gnorm=nan, loss_scale=1",
    "fairseq json gnorm": '{"epoch": 1, "update": 0.1, "loss": "7.1", "gnorm": "inf"}',
    "horovod rank exit": "Process 3 exit with status code 1.",
    "make target": "make: *** [Makefile:12: train] Error 1",
}

HEALTHY = {
    "nccl info": "NCCL INFO Channel 00/02 :    0   1   2   3\nNCCL INFO comm 0x55 rank 0 - Init "
    "COMPLETE",
    "deepspeed skip": "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, "
    "reducing to 32768",
    "apex skip": "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0",
    "fairseq skip": "| INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: "
    "64.0",
    "tensorboardx": "Warning: NaN or Inf found in input tensor.",
    "retry": "ConnectionError: retrying in 5s",
    "urllib3 retry": "WARNING:urllib3.connectionpool:Retrying (Retry(total=4, connect=None, "
    "read=None, redirect=None, status=None)) after connection broken by 'ReadTimeoutError()'",
    "hub retry": "huggingface_hub.utils._http: HTTPError: 502 Bad Gateway. Retrying in 1s [Retry "
    "1/5].",
    "metric": "MeanSquaredError: 0.0132",
    "user warning": "/ws/train.py:88: UserWarning: torch.cuda.amp.GradScaler(args...) is "
    "deprecated",
    "future warning": "FutureWarning: `resume_download` is deprecated and will be removed in "
    "1.0.0.",
    "launcher ok": "[launch.py:347:main] Process 4471 exits with return code = 0",
    "exit ok": "Process finished with exit code 0",
    "slurm queued": "srun: job 4412 queued and waiting for resources",
    "signal setup": "Installing signal handlers for SIGTERM and SIGINT",
    "extension": "Using /root/.cache/torch_extensions/py310_cu121 as PyTorch extensions root...\n"
    "Loading extension module fused_adam...",
    "nvrm load": "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03",
    "amdgpu ok": "amdgpu 0000:c1:00.0: amdgpu: GPU reset succeeded, trying to resume",
    "loss line": "Epoch 1: 40%|####      | 400/1000 [01:12<01:48, 5.5it/s, loss=0.231, v_num=3]",
    "keras progress": "1200/1200 [==============================] - 41s 34ms/step - loss: 0.2310",
    "cudnn info": "Using cuDNN 8.9.2, CUBLAS_WORKSPACE_CONFIG=:4096:8",
    "glog info": "I0412 10:02:11.123456  4242 cuda_executor.cc:1120] Checking stream placement",
    "c10d ipv6 retry": "[W socket.cpp:663] [c10d] The client socket has failed to connect to "
    "[localhost]:29500 (errno: 97 - Address family not supported by protocol).",
    "lustre restored": "kernel: Lustre: scratch-OST0004-osc-ffff9a3e: Connection restored to "
    "10.1.2.14@o2ib (at 10.1.2.14@o2ib)",
    "nvlink up": "         Link 3: 26.562 GB/s",
    "dynamo fallback": "torch._dynamo.exc.BackendCompilerFailed: retrying with backend=eager",
    "metric timeout value": "metrics.step.TimeToFirstTokenTimeout: 0",
    "nmi watchdog on": "kernel: NMI watchdog: Enabled. Permanently consumes one hw-PMU counter.",
    "rcu setup": "kernel: rcu: Hierarchical RCU implementation.",
    "hung task hint": 'kernel: "echo 0 > /proc/sys/kernel/hung_task_timeout_secs" disables this '
    "message.",
    "ecc zero": "ECC summary: 0 uncorrectable ECC errors, 12 correctable",
    "ecc field zero": "    Uncorrectable ECC errors: 0",
    "mpi thread level": "MPI_Init_thread returned MPI_THREAD_MULTIPLE",
    "fabric manager absent": "Mar 03 10:12:45 gpu-node-4 systemd[1]: nvidia-fabricmanager.service"
    ": Failed with result 'exit-code'.",
    "fabric manager nothing to do": "[ERROR] [tid 12345] request to query NVSwitch device "
    "information from NVSwitch driver failed with error:WARNING Nothing to do "
    "[NV_WARN_NOTHING_TO_DO]",
    "graceful exit": "INFO:torch.distributed.elastic.agent.server.api:[default] worker group "
    "successfully finished. Waiting 300 seconds for other agents to finish.",
    "hf grad norm finite": "{'loss': 2.0491, 'grad_norm': 0.8125, 'learning_rate': 1.96e-04, "
    "'epoch': 0.28}",
    "grad norm skipped step": "Skipping step: grad_norm=inf after unscaling, reducing loss scale "
    "to 32768",
    "grad norm config": "grad_norm_clip: 1.0, max_grad_norm: 1.0, skip_nan_inf: True",
    "make ignored": "make: [Makefile:12: clean] Error 1 (ignored)",
    "tensor loss finite": "step 120 loss tensor(2.3104, device='cuda:0', "
    "grad_fn=<NllLossBackward0>)",
}


@pytest.mark.parametrize("line", FAILING.values(), ids=list(FAILING))
def test_a_failure_report_no_rule_explains_is_never_healthy(
    pack: RuleSet, tmp_path: Path, line: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert verdict.status is not Status.HEALTHY
    assert verdict.action is not Action.NONE
    assert verdict.action is not Action.CORDON_NODE_AND_RESTART
    assert verdict.root is not None
    assert verdict.root.text.strip() in line


@pytest.mark.parametrize("text", HEALTHY.values(), ids=list(HEALTHY))
def test_a_healthy_run_printing_warnings_and_retries_stays_healthy(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert verdict_of(pack, tmp_path, STEPS, text).status is Status.HEALTHY


@pytest.mark.parametrize(
    "line",
    [
        "step 120 loss tensor(nan, device='cuda:0', grad_fn=<NllLossBackward0>)",
        "train_loss: tensor(inf, device='cuda:1')",
    ],
)
def test_a_loss_printed_as_a_non_finite_tensor_is_a_nan_loss(
    pack: RuleSet, tmp_path: Path, line: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, line)
    assert (verdict.failure_type, verdict.action) == ("nan_loss", Action.NOTIFY_USER)


def test_a_single_non_finite_grad_norm_yields_to_a_repeated_one(
    pack: RuleSet, tmp_path: Path
) -> None:
    repeated = "\n".join(
        f"{{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 9.9e-05, 'epoch': 0.0{i}}}"
        for i in range(3)
    )
    verdict = verdict_of(pack, tmp_path, STEPS, repeated)
    assert (verdict.failure_type, verdict.action) == ("nan_loss", Action.NOTIFY_USER)


WATCHDOG = (
    "[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=71, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600321 milliseconds before timing out."
)


def test_a_catch_all_never_hides_the_specific_diagnosis(pack: RuleSet, tmp_path: Path) -> None:
    aborted = "\n".join(
        [
            WATCHDOG,
            "[rank1]:[E ProcessGroupNCCL.cpp:1182] [PG 0 Rank 1] Process group watchdog thread "
            "terminated with exception: NCCL communicator was aborted",
            "terminate called after throwing an instance of 'c10::DistBackendError'",
            "Fatal Python error: Aborted",
            "srun: error: gpu-node-1: task 1: Aborted",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, aborted)
    assert (verdict.failure_type, verdict.action) == ("nccl_timeout", Action.RESTART_JOB)
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    verdict = verdict_of(pack, tmp_path, STEPS, oom, "srun: error: gpu-node-2: task 0: Killed")
    assert (verdict.failure_type, verdict.action) == ("cuda_oom", Action.NOTIFY_USER)


def test_a_complete_traceback_keeps_its_classification(pack: RuleSet, tmp_path: Path) -> None:
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/workspace/train.py", line 212, in <module>\n'
        "    main()\n"
        "KeyError: 'labels'"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, traceback)
    assert (verdict.failure_type, verdict.action) == ("KeyError", Action.NOTIFY_USER)


def test_the_escalation_names_its_lines(pack: RuleSet, tmp_path: Path) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, FAILING["faulthandler"], FAILING["slurm task exit"])
    assert verdict.action is Action.ESCALATE
    texts = {event.text for event in verdict.evidence}
    assert {FAILING["faulthandler"], FAILING["slurm task exit"]} <= texts


CUT_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 212, in <module>\n'
    "    main()\n"
    '  File "/usr/lib/python3/dist-packages/deepspeed/runtime/engine.py", line 2087, in step\n'
    "    self._take_model_step(lr_kwargs)"
)


def test_a_traceback_cut_before_its_exception_line_escalates(pack: RuleSet, tmp_path: Path) -> None:
    """The excerpt (or the stream) ends inside the traceback: its frames are nobody's evidence,
    so the catch-all names them instead of calling the log healthy."""
    verdict = verdict_of(pack, tmp_path, STEPS, CUT_TRACEBACK)
    assert (verdict.status, verdict.action) == (Status.INCONCLUSIVE, Action.ESCALATE)
    assert verdict.failure_type == "unexplained_traceback"
    assert verdict.root is not None
    assert verdict.root.text.strip() in CUT_TRACEBACK


def test_a_traceback_buried_in_other_output_escalates(pack: RuleSet, tmp_path: Path) -> None:
    """Ranks writing over a traceback until the assembler gives up on it, then the run goes on
    printing progress: the header and frames still show that something raised."""
    chatter = "\n".join(f"step {i} | throughput 812 samples/s" for i in range(30))
    verdict = verdict_of(pack, tmp_path, STEPS, CUT_TRACEBACK + "\n" + chatter)
    assert verdict.action is Action.ESCALATE
    assert verdict.failure_type == "unexplained_traceback"


def test_a_traceback_header_nothing_followed_escalates(pack: RuleSet, tmp_path: Path) -> None:
    """Training goes on printing after the header, no frame and no exception came: Python
    printed it for an exception all the same, so the log is not healthy."""
    verdict = verdict_of(pack, tmp_path, STEPS, "Traceback (most recent call last):\n" + STEPS)
    assert (verdict.status, verdict.action) == (Status.INCONCLUSIVE, Action.ESCALATE)
    assert verdict.root is not None
    assert verdict.root.text == "Traceback (most recent call last):"
