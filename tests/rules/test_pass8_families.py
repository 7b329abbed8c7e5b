"""Never silent, pass 8 (issue 11): failure reports in the spellings of the code that prints
them, across launchers, schedulers, native runtimes, GPU libraries and loss scalers.

Each failing line is synthetic, written from the format string of its upstream source (named
next to the pattern in rules/escalation.yaml and rules/training.yaml) and printed after a few
healthy training steps: the job must not end healthy, must escalate (or do what its family
does) and must name that line. Each healthy line is the harmless neighbour of a failing one
(an exit code of 0, a scaler that is still well above its floor, a retry, a warning): it must
stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.diagnosis.correlate import Verdict
from diagnoser.rules import Action, RuleSet
from tests.rules.families import assert_escalates_naming, assert_healthy, verdict_of

STEPS = "".join(
    f"{{'loss': {2.4 - i / 10:.4f}, 'grad_norm': 0.81, 'learning_rate': 1.9e-05, "
    f"'epoch': 0.0{i}}}\n"
    for i in range(1, 4)
)


def assert_notifies_naming(verdict: Verdict, failure_type: str, text: str) -> None:
    assert (verdict.failure_type, verdict.action) == (failure_type, Action.NOTIFY_USER)
    assert verdict.root is not None
    assert verdict.root.text.strip() in text


LAUNCHER_EXITS = {
    # srun's task-exit report names the signal by its strsignal() text (src/srun/launch.c).
    "srun fpe": "srun: error: gpu-node-17: task 3: Floating point exception (core dumped)",
    "srun usr1": "srun: error: gpu-node-04: tasks 0-7: User defined signal 1",
    # Open MPI / PRRTE help texts (help-orterun.txt, help-prterun.txt, help-mpi-api.txt).
    "horovod's mpirun wrapper": "mpirun.real detected that one or more processes exited with "
    "non-zero status, thus causing",
    "split exit report, second half": "a non-zero exit code. Per user-direction, the job has "
    "been aborted.",
    "improper exit": "mpirun has exited due to process rank 3 with PID 0 on",
    "improper exit, second line": "node gpu-node-3 exiting improperly. There are three reasons "
    "this could occur:",
    "prterun abort": "prterun has exited due to process rank 2 with PID 4242 on node gpu-node-3 "
    'calling "abort". This may have caused other processes in the application to be',
    "mpi_abort banner": "MPI_ABORT was invoked on rank 3 in communicator MPI_COMM_WORLD",
    # kubectl's STATUS column (pkg/printers/internalversion/printers.go).
    "kubectl cannot run": "train-worker-1   0/1     ContainerCannotRun   0             10m",
    "kubectl run error": "train-worker-1   0/1     RunContainerError    2 (30s ago)   10m",
    "kubectl exit code": "train-worker-1   0/1     ExitCode:1           0             10m",
    "kubectl signal": "train-worker-1   0/1     Signal:6             0             10m",
    "kubectl init exit code": "train-launcher-0   0/1     Init:ExitCode:2   0          10m",
    # The same state in `kubectl get pod -o yaml / -o json` (ContainerStateTerminated).
    "pod yaml exit code": "        exitCode: 1",
    "pod json exit code": '            "exitCode": 2,',
    "pod yaml reason": "        reason: Error",
    # The Job controller's failed conditions and the Kubeflow training operator.
    "job backoff limit": "  Warning  BackoffLimitExceeded  1m  job-controller  Job has reached "
    "the specified backoff limit",
    "training operator": "  Normal   PyTorchJobFailed  1m  pytorchjob-controller  PyTorchJob "
    "default/llama has failed because 1 Worker replica(s) failed.",
    # GNU time (time.c).
    "gnu time": "Command exited with non-zero status 1",
    # torch elastic's ChildFailedError header with its report cut off.
    "cut elastic report": "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    "============================================================",
}

LAUNCHER_HEALTHY = {
    "kubectl exit code 0": "train-worker-1   0/1     ExitCode:0           0             10m",
    "kubectl init running": "train-worker-1   0/2     Init:0/2             0             10m",
    "kubectl completed": "train-worker-1   0/1     Completed            0             10m",
    "pod yaml exit code 0": "        exitCode: 0",
    "pod yaml completed": "        reason: Completed",
    "pod condition": "    reason: PodCompleted",
    "operator restarting": "  Warning  PyTorchJobRestarting  7m  pytorchjob-controller  PyTorchJob "
    "pt-job-1 is restarting because 1 Master replica(s) failed.",
    "operator continues": "TFJob default/mnist continues regardless 1 Worker replica(s) failed as "
    "enableDynamicWorker is set true.",
    "job succeeded": "  Normal   Completed  1m  job-controller  Job completed",
    "gnu time verbose ok": "\tExit status: 0",
    "mpirun command line": "mpirun --allow-run-as-root -np 16 -H gpu-a:8,gpu-b:8 -x "
    "NCCL_DEBUG=INFO python train.py",
    "srun retry": "srun: Job 4412 step creation temporarily disabled, retrying (Requested nodes "
    "are busy)",
}


@pytest.mark.parametrize("text", LAUNCHER_EXITS.values(), ids=list(LAUNCHER_EXITS))
def test_a_launcher_or_scheduler_reporting_a_failed_process_escalates(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, text), text)


@pytest.mark.parametrize("text", LAUNCHER_HEALTHY.values(), ids=list(LAUNCHER_HEALTHY))
def test_a_launcher_reporting_success_or_a_retry_stays_silent(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_a_complete_elastic_report_is_read_by_its_root_cause_not_its_header(
    pack: RuleSet, tmp_path: Path
) -> None:
    report = "\n".join(
        [
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
            "============================================================",
            "train.py FAILED",
            "------------------------------------------------------------",
            "Root Cause (first observed failure):",
            "[0]:",
            "  time      : 2026-02-18_10:00:00",
            "  host      : worker-3",
            "  rank      : 11 (local_rank: 3)",
            "  exitcode  : 1 (pid: 5277)",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
            "============================================================",
        ]
    )
    verdict = verdict_of(pack, tmp_path, STEPS, report)
    assert (verdict.failure_type, verdict.action) == ("worker_process_failed", Action.ESCALATE)
    assert [e.rule_id for e in verdict.evidence] == ["torchrun_root_cause_failed"]


NATIVE_FATAL = {
    # Abseil's failure signal handler (JAX, XLA, TensorFlow, Ray).
    "absl signal": "*** SIGSEGV received at time=1700000000 on cpu 12 ***",
    "absl signal, older": "*** SIGABRT received at time=1700000000 ***",
    "absl signal number": "*** Signal 7 received at time=1700000000 on cpu 3 ***",
    "absl signal in a ray worker": "(RayWorkerWrapper pid=233, ip=10.20.1.125) *** SIGBUS received "
    "at time=1762945937 on cpu 6 ***",
    # glibc's malloc_printerr() and __fortify_fail().
    "smallbin": "malloc(): smallbin double linked list corrupted",
    "largebin": "malloc(): largebin double linked list corrupted (bk)",
    "mismatching": "malloc(): mismatching next->prev_size (unsorted)",
    "tcache count": "free(): too many chunks detected in tcache",
    "stack protector": "*** stack smashing detected ***: terminated",
    "fortify, older glibc": "*** buffer overflow detected ***: /usr/bin/python3 terminated",
    "libSegFault": "*** Segmentation fault",
    # CPython: subprocess.CalledProcessError's text for a signal, faulthandler's crash dump.
    "subprocess signal": "ERROR: Command '['/usr/bin/python', '-u', 'train.py']' died with "
    "<Signals.SIGABRT: 6>.",
    "subprocess unknown signal": "Command '['python', 'train.py']' died with unknown signal 70.",
    "faulthandler current thread": "Current thread 0x00007f1c2a3fe700 (most recent call first):\n"
    '  File "/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", line 1501 in '
    "_call_impl",
    # backward-cpp's crash report; GNU time and bash reporting a signal.
    "backward-cpp": "Segmentation fault (Address not mapped to object [0x10])",
    "gnu time signal": "Command terminated by signal 6",
    "bash sigterm": "/var/spool/slurmd/job77/slurm_script: line 12: 40511 Terminated"
    "              python train.py",
}

NATIVE_HEALTHY = {
    "faulthandler periodic dump": "Timeout (0:05:00)!\nThread 0x00007f1c2a3fe700 (most recent "
    'call first):\n  File "/opt/conda/lib/python3.10/threading.py", line 320 in wait',
    "stack protector flag": "stack smashing protection enabled (-fstack-protector-strong)",
    "allocator notice": "malloc(): using jemalloc as allocator",
    "signal handler setup": "Signal handlers installed: SIGSEGV, SIGBUS, SIGABRT will print a "
    "stack trace",
    "preemption handler": "Installing SIGTERM handler to checkpoint on preemption",
    "subprocess ok": "Command '['nvidia-smi', '-L']' returned 0",
}


@pytest.mark.parametrize("text", NATIVE_FATAL.values(), ids=list(NATIVE_FATAL))
def test_a_native_crash_or_abort_report_escalates(pack: RuleSet, tmp_path: Path, text: str) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_escalates_naming(verdict, text)
    assert verdict.failure_type in {"fatal_signal", "segfault"}


@pytest.mark.parametrize("text", NATIVE_HEALTHY.values(), ids=list(NATIVE_HEALTHY))
def test_signal_handling_talk_and_periodic_dumps_stay_silent(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


GPU_FAULTS = {
    # Triton's launcher; PyTorch's driver-API check; rocBLAS and MIOpen; nvidia-smi.
    "triton cuda": "RuntimeError: Triton Error [CUDA]: unspecified launch failure",
    "triton cuda, alone": "Triton Error [CUDA]: an illegal instruction was encountered",
    "triton hip": "Triton Error [HIP]: invalid device function",
    "cuda driver api": "torch.AcceleratorError: CUDA driver error: unspecified launch failure",
    "rocblas": "rocBLAS error: Could not initialize Tensile host: No devices found",
    "miopen": "MIOpen Error: /MIOpen/src/ocl/convolutionocl.cpp:835: No suitable algorithm was "
    "found to execute the required convolution",
    "miopen logger": "MIOpen(HIP): Error [Compile] 'hiprtcCompileProgram(prog.get(), "
    "c_options.size(), c_options.data())' naive_conv.cpp: HIPRTC_ERROR_COMPILATION (6)",
    "nvidia-smi": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.",
    # XLA's PJRT client: a program that failed on the device, its Python exception cut off.
    "pjrt internal": "E0101 10:00:00.123456 4242 pjrt_stream_executor_client.cc:2809] Execution "
    "of replica 3 failed: INTERNAL: Failed to complete all kernels launched on stream",
    "pjrt data loss": "2024-01-01 10:00:00.123456: E external/xla/xla/pjrt/"
    "pjrt_stream_executor_client.cc:2716] Execution of replica 0 failed: DATA_LOSS: Detected "
    "corrupted buffer",
}

GPU_HEALTHY = {
    "non-fatal driver error": "Workspace reinit failed (non-fatal): CUDA driver error: device not "
    "ready",
    "miopen warning": "MIOpen(HIP): Warning [SQLiteBase] Missing system database file: "
    "gfx90a68.kdb Performance may degrade.",
    "rocblas warning": "rocBLAS warning: hipBlasLT failed, falling back to tensile.",
    "xla ptxas fallback": "2024-01-01 10:00:00.123456: W external/xla/xla/service/gpu/"
    "nvptx_compiler.cc:679] INTERNAL: ptxas exited with non-zero error code 65280, output: \n"
    "Relying on driver to perform ptx compilation.",
    "pjrt timing": "I0101 10:00:00.123456 4242 pjrt_stream_executor_client.cc:2809] Execution of "
    "replica 0 took 12ms",
}


@pytest.mark.parametrize("text", GPU_FAULTS.values(), ids=list(GPU_FAULTS))
def test_a_gpu_library_or_device_program_failure_escalates(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert_escalates_naming(verdict, text)
    assert verdict.failure_type in {"gpu_fault", "xla_execution_failed"}


@pytest.mark.parametrize("text", GPU_HEALTHY.values(), ids=list(GPU_HEALTHY))
def test_gpu_library_warnings_and_fallbacks_stay_silent(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_a_triton_illegal_access_keeps_its_specific_reading(pack: RuleSet, tmp_path: Path) -> None:
    text = "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered"
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert (verdict.failure_type, verdict.action) == ("illegal_memory_access", Action.NOTIFY_USER)


LOSS_SCALE_FLOOR = {
    # fairseq's AMP optimizer (the word "to" doubled in its source), ParlAI's fairseq-derived
    # optimizer, fairseq2's scaler at its floor: notify, as the other scalers' floors do.
    "fairseq amp": "2023-06-13 17:37:40 | INFO | fairseq.optim.amp_optimizer | AMP: overflow "
    "detected, setting scale to to 0.5",
    "fairseq amp minimum": "FloatingPointError: AMP: Minimum loss scale reached (0.0001). Your "
    "loss is probably exploding. Try restarting training or use fp32. 5e-05",
    "parlai": "2023-06-13 17:37:40 | INFO | Overflow: setting loss scale to 0.25",
    "fairseq2 at minimum": "Overflow detected at step 1200, ignoring gradient, loss scale is "
    "already at minimum (0.0001). Your loss is probably exploding.",
    "fairseq2 reaching minimum": "Overflow detected at step 1200, ignoring gradient, decreasing "
    "loss scale from 0.0002 to 0.0001 (minimum). Your loss is probably exploding.",
}

LOSS_SCALE_HEALTHY = {
    "fairseq amp high": "2023-06-13 17:37:40 | INFO | fairseq.optim.amp_optimizer | AMP: overflow "
    "detected, setting scale to to 64.0",
    "parlai high": "2023-06-13 17:37:40 | INFO | Overflow: setting loss scale to 1024.0",
    "fairseq2 decreasing": "Overflow detected at step 1200, ignoring gradient, decreasing loss "
    "scale from 128 to 64.",
    "fairseq2 increasing": "No overflow detected in the last 2000 step(s) after step 4000, "
    "increasing loss scale from 64 to 128.",
    "deepspeed skip": "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 16, "
    "reducing to 8",
    "megatron bf16 progress": " iteration     1200/  500000 | lm loss: 2.41E+00 | loss scale: 1.0 "
    "| grad norm: 0.412 | number of skipped iterations:   0 |",
    "nan in a word": "Loading nanogpt checkpoint; loss fn: info_nce, dataset: infinity-instruct",
}


@pytest.mark.parametrize("text", LOSS_SCALE_FLOOR.values(), ids=list(LOSS_SCALE_FLOOR))
def test_a_loss_scaler_at_its_floor_is_a_nan_loss(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_notifies_naming(verdict_of(pack, tmp_path, STEPS, text), "nan_loss", text)


def test_deepspeed_at_its_floor_once_escalates_and_twice_notifies(
    pack: RuleSet, tmp_path: Path
) -> None:
    once = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 2, reducing to 1"
    verdict = verdict_of(pack, tmp_path, STEPS, once)
    assert_escalates_naming(verdict, once)
    assert verdict.failure_type == "nan_loss"
    twice = once + "\n" + once.replace("scale: 2,", "scale: 1,")
    verdict = verdict_of(pack, tmp_path, STEPS, twice)
    assert (verdict.failure_type, verdict.action) == ("nan_loss", Action.NOTIFY_USER)


@pytest.mark.parametrize("text", LOSS_SCALE_HEALTHY.values(), ids=list(LOSS_SCALE_HEALTHY))
def test_a_loss_scaler_doing_its_job_stays_silent(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


TIME_LIMITS = {
    "lsf run limit": "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
    # Not a host OOM (memory.yaml reads PBS's memory kills), and not healthy either (it was a
    # harmless neighbour in test_breadth_pass4 before): a job killed at its walltime.
    "pbs walltime": "=>> PBS: job killed: walltime 3610 exceeded limit 3600",
    "sacct timeout": "12345            train.sh   gpu    acct    64    TIMEOUT      0:0",
    "scontrol timeout": "   JobState=TIMEOUT Reason=TimeLimit Dependency=(null)",
    "kubernetes job deadline": "  Warning  DeadlineExceeded  1m  job-controller  Job was active "
    "longer than specified deadline",
}


@pytest.mark.parametrize("text", TIME_LIMITS.values(), ids=list(TIME_LIMITS))
def test_a_scheduler_ending_the_job_at_its_time_limit_notifies(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_notifies_naming(verdict_of(pack, tmp_path, STEPS, text), "time_limit", text)


def test_a_job_completed_in_sacct_stays_silent(pack: RuleSet, tmp_path: Path) -> None:
    text = "12345            train.sh   gpu    acct    64  COMPLETED      0:0"
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


NAN_LOSS_SPELLINGS = {
    # Composer's console logger (a metric path as the key) and Ignite's TerminateOnNan.
    "composer": "[batch=3160/30518]:\n\t Train loss/train/total: nan",
    "composer inf": "[batch=3160/30518]:\n\t Train loss/train/total: inf",
    "ignite": "2024-01-01 10:00:00,000 ignite.handlers.terminate_on_nan.TerminateOnNan WARNING: "
    "TerminateOnNan: Output '(tensor(nan, device='cuda:0'),)' contains NaN or Inf. Stop training",
}


@pytest.mark.parametrize("text", NAN_LOSS_SPELLINGS.values(), ids=list(NAN_LOSS_SPELLINGS))
def test_a_non_finite_loss_in_more_loggers_words_is_a_nan_loss(
    pack: RuleSet, tmp_path: Path, text: str
) -> None:
    assert_notifies_naming(verdict_of(pack, tmp_path, STEPS, text), "nan_loss", text)


def test_a_finite_composer_loss_stays_silent(pack: RuleSet, tmp_path: Path) -> None:
    text = (
        "[batch=1/100]:\n\t Train LanguageCrossEntropy: 10.9736\n\t Train loss/train/total: "
        "10.9736\n\t Train metrics/train/LanguagePerplexity: 58312.0586"
    )
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


MORE_REPORTS = {
    # The kubelet: a container it could not start, one it restarts for a failed probe.
    "kubelet failed event": "  Warning  Failed     3s (x3 over 20s)  kubelet  Error: failed to "
    'start container "trainer": Error response from daemon: failed to create task',
    "kubectl get events": "3s          Warning   Failed      pod/train-0   Error: container "
    "create failed: runc create failed",
    "liveness restart": "  Normal   Killing    1m   kubelet  Container trainer failed liveness "
    "probe, will be restarted",
    # Slurm, LSF, PBS.
    "stepd terminated": "slurmstepd: error: *** STEP 12345.0 STEPD TERMINATED ON gpu-node-3 AT "
    "2024-05-01T10:22:01 DUE TO JOB NOT ENDING WITH SIGNALS ***",
    "srun step timeout": "srun: error: Timed out waiting for job step to complete",
    "sacct failed": "12345.0          python   gpu    acct     8     FAILED      1:0",
    "sacct node fail": "12345        train.sh   gpu    acct    64  NODE_FAIL      0:0",
    "scontrol failed": "   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)",
    "lsf owner": "TERM_OWNER: job killed by owner.",
    "pbs other limit": "=>> PBS: job killed: ncpus 32.5 exceeded limit 32",
    # CUDA and ROCm math libraries by status name.
    "cufft": "cuFFT error: CUFFT_INTERNAL_ERROR",
    "cusolver": "cusolver error: CUSOLVER_STATUS_EXECUTION_FAILED, when calling "
    "`cusolverDnXgeqrf( handle, params, m, n, CUDA_R_32F, A, lda)`",
    "hipblas": "hipblas error: HIPBLAS_STATUS_EXECUTION_FAILED",
    "miopen status": "[rank0]: MIOpen error: miopenStatusUnknownError",
    # A thread's uncaught exception whose traceback was cut off.
    "thread header": "Exception in thread Thread-3 (_pin_memory_loop):",
}

MORE_HEALTHY = {
    "readiness probe": "  Warning  Unhealthy  1m  kubelet  Readiness probe failed: Get "
    '"http://10.0.0.2:8080/health": dial tcp 10.0.0.2:8080: connect: connection refused',
    "image present": '  Normal   Pulled     1m  kubelet  Container image "nvcr.io/nvidia/'
    'pytorch:24.01-py3" already present on machine',
    "sacct running": "12345.batch       batch          acct     8    RUNNING      0:0",
    "scontrol completed": "   JobState=COMPLETED Reason=None Dependency=(null)",
    "test summary": "Checked FAILED tests: 0 of 12",
    "cufft plan cache": "cufft plan cache: max size 4096, CUFFT_SUCCESS",
}


@pytest.mark.parametrize("text", MORE_REPORTS.values(), ids=list(MORE_REPORTS))
def test_more_failure_reports_escalate(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_escalates_naming(verdict_of(pack, tmp_path, STEPS, text), text)


@pytest.mark.parametrize("text", MORE_HEALTHY.values(), ids=list(MORE_HEALTHY))
def test_their_harmless_neighbours_stay_silent(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_a_thread_header_yields_to_its_classified_traceback(pack: RuleSet, tmp_path: Path) -> None:
    text = (
        "Exception in thread Thread-3 (_pin_memory_loop):\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.10/threading.py", line 1016, in _bootstrap_inner\n'
        "    self.run()\n"
        "KeyError: 'labels'"
    )
    verdict = verdict_of(pack, tmp_path, STEPS, text)
    assert (verdict.failure_type, verdict.action) == ("KeyError", Action.NOTIFY_USER)
