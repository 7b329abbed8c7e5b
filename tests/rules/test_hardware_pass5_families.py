"""Hardware faults that cordon, and launcher exits that must not end healthy, as a verdict.

Each failing log is a few healthy training steps and one report as its upstream code prints it:
DCGM's messages (dcgm_errors.h) and dcgm-exporter's last-Xid gauge, read by NVIDIA's Xid
catalog buckets; the NVIDIA driver's GSP RPC timeout and adapter-init lines of several
releases; the kernel's PCIe AER severities before and after the Linux 6.x rename; amdgpu init
failures and RAS poison reports; mlx5 health syndromes; MPICH / Intel MPI Hydra, kubectl, Ray,
torch.multiprocessing and srun exit reports. Each healthy log carries a harmless neighbour of
those reports (a zero count, a corrected error, a success), which must stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import Action, RuleSet
from tests.rules.families import assert_family_verdict, assert_healthy, verdict_of

STEPS = "".join(
    f"[2024-05-01 10:0{i}:00] iteration {i * 100:>6} | lm loss 2.41 | grad norm 0.91\n"
    for i in range(1, 4)
)

CORDON = Action.CORDON_NODE_AND_RESTART
ESCALATE = Action.ESCALATE
RESTART = Action.RESTART_JOB

FAILING: dict[str, tuple[str, str, Action]] = {
    "dcgm xid off the bus": ("Detected XID 79 for GPU 3", "gpu_fallen_off_bus", CORDON),
    "dcgm xid double-bit": ("Detected XID 48 for GPU 0", "gpu_ecc_uncorrectable", CORDON),
    "dcgm xid nvlink": ("Detected XID 74 for GPU 6", "nvlink_error", CORDON),
    "dcgm xid application": ("Detected XID 13 for GPU 0", "gpu_xid_application", RESTART),
    "dcgm xid unknown": ("Detected XID 61 for GPU 2", "gpu_xid_unknown", ESCALATE),
    "dcgm-exporter last xid": (
        'DCGM_FI_DEV_XID_ERRORS{gpu="5",UUID="GPU-1234",device="nvidia5",'
        'Hostname="gpu-node-2"} 119',
        "gsp_error",
        CORDON,
    ),
    "dcgm sxid": ("Detected fatal NvSwitch SXID 12028", "nvlink_error", CORDON),
    "dcgm nan memory": (
        "Found 12 NaN-value memory elements on GPU 2",
        "gpu_health_failure",
        CORDON,
    ),
    "dcgm pcie replays": (
        "Detected more than 8 PCIe replays per minute for GPU 1 : 112",
        "gpu_health_failure",
        ESCALATE,
    ),
    "dcgm p2p miscompare": (
        "GPU 3 was unsuccessfully written to in a peer-to-peer test: memcpy",
        "gpu_health_failure",
        ESCALATE,
    ),
    "gsp banner": (
        "kernel: NVRM: _kgspLogXid119: ********************************* GSP Timeout "
        "**********************************",
        "gsp_error",
        CORDON,
    ),
    "gsp rpc 53x text": (
        "kernel: NVRM: Timeout waiting for RPC from GSP0! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20800a4c 0x4).",
        "gsp_error",
        CORDON,
    ),
    "gsp rpc 56x text": (
        "Timeout after 45s of waiting for RPC response from GPU1 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) sequence 1321 (0x20802a02 0x8).",
        "gsp_error",
        CORDON,
    ),
    "gsp back to back": (
        "NVRM: nvAssertFailedNoLog: Assertion failed: Back to back GSP RPC timeout detected! "
        "GPU marked for reset @ kernel_gsp.c:2459",
        "gsp_error",
        CORDON,
    ),
    "rm_init_adapter new": (
        "kernel: NVRM: GPU 0000:39:00.0: rm_init_adapter failed, device minor number 2",
        "gpu_health_failure",
        CORDON,
    ),
    "rm_init_adapter old": (
        "kernel: [351621.701735] NVRM: rm_init_adapter failed for device bearing minor number 0",
        "gpu_health_failure",
        CORDON,
    ),
    "aer gpu fatal old kernel": (
        "kernel: nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, (Receiver ID)",
        "gpu_health_failure",
        CORDON,
    ),
    "aer gpu fatal new kernel": (
        "kernel: nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), "
        "type=Inaccessible, (Unregistered Agent ID)",
        "gpu_health_failure",
        CORDON,
    ),
    "aer root port fatal": (
        "kernel: pcieport 0000:00:03.0: AER: Uncorrectable (Fatal) error message received "
        "from 0000:3b:00.0",
        "pcie_fatal_error",
        ESCALATE,
    ),
    "aer gpu non-fatal": (
        "kernel: nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
        "type=Transaction Layer, (Requester ID)",
        "pcie_fatal_error",
        ESCALATE,
    ),
    "amdgpu poison reset": (
        "kernel: amdgpu 0000:68:00.0: {14}poison is consumed by client 12, kick off gpu reset flow",
        "gpu_health_failure",
        CORDON,
    ),
    "amdgpu poison contained": (
        "kernel: amdgpu 0000:68:00.0: amdgpu: RAS poison consumption, unmap queue flow "
        "succeeded: client id 12",
        "gpu_ecc_contained",
        RESTART,
    ),
    "amdgpu poison created": (
        "kernel: amdgpu 0000:68:00.0: {15}Poison is created",
        "gpu_health_failure",
        ESCALATE,
    ),
    "amdgpu init": (
        "kernel: amdgpu 0000:03:00.0: amdgpu: Fatal error during GPU init",
        "gpu_health_failure",
        CORDON,
    ),
    "mlx5 health syndrome": (
        "kernel: mlx5_core 0000:3b:00.0: print_health_info:431:(pid 0): Health issue "
        "observed, firmware internal error, severity(3) ERROR:",
        "ib_host_fault",
        CORDON,
    ),
    "mlx5 recovery aborted": (
        "kernel: mlx5_core 0000:3b:00.0: mlx5_health_try_recover:327:(pid 813): health "
        "recovery flow aborted, PCI reads still not working",
        "ib_host_fault",
        CORDON,
    ),
    "mlx5 cable unplugged": (
        "kernel: mlx5_core 0000:3b:00.0: mlx5_port_module_event:1131:(pid 0): Port module "
        "event: module 0, Cable unplugged",
        "ib_host_fault",
        ESCALATE,
    ),
    "pynvml gpu lost": ("pynvml.nvml.NVMLError_GPUIsLost: GPU is lost", "gpu_lost", CORDON),
    "container toolkit gpu lost": (
        "stderr: nvidia-container-cli: detection error: nvml error: gpu is lost: unknown.",
        "gpu_lost",
        CORDON,
    ),
    "off the bus without nvrm": (
        "XID 79 GPU has fallen off the bus (PCI:0000:3b:00)",
        "gpu_fallen_off_bus",
        CORDON,
    ),
    "hydra exit string": (
        "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Segmentation fault (signal 11)",
        "abnormal_exit",
        ESCALATE,
    ),
    "hydra banner exit code": ("=   EXIT CODE: 9", "abnormal_exit", ESCALATE),
    "hydra internal error": (
        "[mpiexec@gpu-node-2] HYDU_sock_write (utils/sock/sock.c:256): write error (Bad file "
        "descriptor)",
        "abnormal_exit",
        ESCALATE,
    ),
    "kubectl describe exit": (
        "    State:          Terminated\n      Reason:       Error\n      Exit Code:    1",
        "abnormal_exit",
        ESCALATE,
    ),
    "kubectl job gave up": ("  Reason:       BackoffLimitExceeded", "abnormal_exit", ESCALATE),
    "kubectl evicted": (
        "train-0   0/1     Evicted            0          10m",
        "abnormal_exit",
        ESCALATE,
    ),
    "spawn raised": (
        "-- Process 0 terminated with the following error:",
        "abnormal_exit",
        ESCALATE,
    ),
    "ray task error": (
        "ray.exceptions.RayTaskError(RuntimeError): ray::train_func() (pid=4411, ip=10.0.0.2)",
        "abnormal_exit",
        ESCALATE,
    ),
    "ray job cli": ("Job 'raysubmit_3Fq9XnB2' failed", "abnormal_exit", ESCALATE),
    "srun node failure": ("srun: error: Node failure on gpu-node-3", "abnormal_exit", ESCALATE),
}

HEALTHY = {
    "dcgm-exporter no xid": 'DCGM_FI_DEV_XID_ERRORS{gpu="5",UUID="GPU-1234",device="nvidia5",'
    'Hostname="gpu-node-2"} 0',
    "dcgm sbe below limit": "More than 10 single-bit ECC error(s) detected in GPU 3 "
    "Volatile SBEs: 12",
    "dcgm p2p skipped": "Skipping peer-to-peer test: fewer than 2 GPUs",
    "aer corrected": "kernel: nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Corrected, "
    "type=Physical Layer, (Receiver ID)",
    "aer port corrected": "kernel: pcieport 0000:00:03.0: AER: Corrected error received: "
    "0000:3b:00.0",
    "aer nvme non-fatal": "kernel: pcieport 0000:00:03.0: AER: Uncorrected (Non-Fatal) error "
    "received: 0000:05:00.0",
    "amdgpu reset succeeded": "kernel: amdgpu 0000:c1:00.0: amdgpu: GPU reset(2) succeeded!",
    "mlx5 recovery start": "kernel: mlx5_core 0000:3b:00.0: mlx5_health_try_recover:332:"
    "(pid 813): starting health recovery flow",
    "mlx5 cable plugged": "kernel: mlx5_core 0000:3b:00.0: mlx5_port_module_event:1131:(pid 0): "
    "Port module event: module 0, Cable plugged",
    "hydra zero exit": "=   EXIT CODE: 0",
    "kubectl completed": "    State:          Terminated\n      Reason:       Completed\n"
    "      Exit Code:    0",
    "ray job succeeded": "Status for job 'raysubmit_3Fq9XnB2': SUCCEEDED",
    "nvml found gpus": "NVML initialised: 8 GPUs found, none lost since boot",
    "nvrm driver load": "kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03",
}


@pytest.mark.parametrize(("line", "failure_type", "action"), FAILING.values(), ids=list(FAILING))
def test_each_spelling_gets_its_family_verdict(
    pack: RuleSet, tmp_path: Path, line: str, failure_type: str, action: Action
) -> None:
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, line), failure_type, action)


@pytest.mark.parametrize("text", HEALTHY.values(), ids=list(HEALTHY))
def test_the_harmless_neighbours_stay_healthy(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_an_application_xid_in_dcgm_words_never_cordons(pack: RuleSet, tmp_path: Path) -> None:
    """NVIDIA's catalog buckets Xid 13, 31, 43 and 137 RESTART_APP / IGNORE, whoever reports."""
    for xid in (13, 31, 43, 137):
        (tmp_path / str(xid)).mkdir()
        verdict = verdict_of(pack, tmp_path / str(xid), STEPS, f"Detected XID {xid} for GPU 1")
        assert verdict.action is not CORDON, xid


def test_a_root_port_fatal_report_yields_to_the_gpu_it_names(pack: RuleSet, tmp_path: Path) -> None:
    """The root port's escalating summary is a symptom of the GPU's own fatal AER line."""
    verdict = verdict_of(
        pack,
        tmp_path,
        STEPS,
        "kernel: pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0\n"
        "kernel: nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
        "type=Transaction Layer, (Receiver ID)",
    )
    assert_family_verdict(verdict, "gpu_health_failure", CORDON)
