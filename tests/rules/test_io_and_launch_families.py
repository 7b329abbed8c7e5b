"""Storage, rendezvous and launcher families in several ecosystems' spellings, as a verdict.

Each failing log is a few healthy training steps and one report as its upstream code prints it
(botocore, fsspec / gcsfs, Azure Storage, the Lustre client, FUSE mounts, HDF5, TensorFlow, the
kubelet, torch.distributed's rendezvous handlers, JAX's distributed client, Open MPI, MPICH,
Horovod). Each healthy log carries a harmless neighbour of those reports, which must stay silent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import Action, RuleSet
from tests.rules.families import assert_family_verdict, assert_healthy, verdict_of

STEPS = "".join(f"step {i:>5} | loss 2.41 | lr 3.0e-04 | 412 tokens/s\n" for i in range(1, 4))

ESCALATE = Action.ESCALATE
NOTIFY = Action.NOTIFY_USER
RESTART = Action.RESTART_JOB

FAILING: dict[str, tuple[str, str, Action]] = {
    "enospc by number": (
        "OSError: [Errno 28] Auf dem Gerät ist kein Speicherplatz mehr verfügbar: '/ckpt/s300'",
        "disk_full",
        NOTIFY,
    ),
    "aws throttling": (
        "botocore.exceptions.ClientError: An error occurred (ThrottlingException) when calling "
        "the GetObject operation (reached max retries: 4): Rate exceeded",
        "object_store_error",
        RESTART,
    ),
    "fsspec timeout": ("fsspec.exceptions.FSTimeoutError", "object_store_error", RESTART),
    "gcsfs server error": (
        "gcsfs.retry.HttpError: We encountered an internal error. Please try again., 503",
        "object_store_error",
        RESTART,
    ),
    "gcsfs anonymous": (
        "gcsfs.retry.HttpError: Anonymous caller does not have storage.objects.get access to the "
        "Google Cloud Storage object., 401",
        "object_store_error",
        NOTIFY,
    ),
    "azure permission": (
        "azure.core.exceptions.HttpResponseError: This request is not authorized to perform "
        "this operation using this permission. ErrorCode:AuthorizationPermissionMismatch",
        "object_store_error",
        NOTIFY,
    ),
    "lustre operation": (
        "kernel: LustreError: 11-0: scratch-OST0004-osc-ffff9a3e7c6f5000: operation ost_write "
        "to node 10.1.2.14@o2ib failed: rc = -107",
        "nfs_error",
        RESTART,
    ),
    "fuse mount gone": (
        "OSError: [Errno 107] Transport endpoint is not connected: '/mnt/gcs/data/shard-12.tar'",
        "nfs_error",
        RESTART,
    ),
    "hdf5 truncated": (
        "OSError: Unable to synchronously open file (truncated file: eof = 96468992, "
        "sblock->base_addr = 0, stored_eof = 268435456)",
        "storage_io_error",
        ESCALATE,
    ),
    "tf checkpoint": (
        "tensorflow.python.framework.errors_impl.DataLossError: Unable to open table file "
        "/ckpt/model.ckpt-1200: Data loss: not an sstable (bad magic number): perhaps your file "
        "is in a different file format and you need to use a different restore operator?",
        "storage_io_error",
        ESCALATE,
    ),
    "volume mount timeout": (
        "  Warning  FailedMount  2m (x5 over 11m)  kubelet  Unable to attach or mount volumes: "
        "unmounted volumes=[ckpt], unattached volumes=[ckpt dshm]: timed out waiting for the "
        "condition",
        "storage_io_error",
        ESCALATE,
    ),
    "ext4 read-only remount": (
        "kernel: EXT4-fs (sda1): Remounting filesystem read-only",
        "storage_io_error",
        ESCALATE,
    ),
    "xfs metadata": (
        'kernel: XFS (dm-0): metadata I/O error in "xfs_trans_read_buf_map" at daddr 0x1a2b '
        "len 8 error 5",
        "storage_io_error",
        ESCALATE,
    ),
    "scsi failed": (
        "kernel: sd 0:0:0:0: [sda] tag#12 FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_SENSE",
        "storage_io_error",
        ESCALATE,
    ),
    "nfs4 unhandled": (
        "kernel: NFS: nfs4_reclaim_open_state: unhandled error -121",
        "nfs_error",
        RESTART,
    ),
    "torch.save cannot open": (
        "RuntimeError: File /ckpt/run1/model.pt cannot be opened.",
        "storage_io_error",
        ESCALATE,
    ),
    "torch.save parent missing": (
        "RuntimeError: Parent directory /ckpt/run1/step_100 does not exist.",
        "storage_io_error",
        NOTIFY,
    ),
    "master addr unset": (
        "ValueError: Error initializing torch.distributed using env:// rendezvous: environment "
        "variable MASTER_ADDR expected, but not set",
        "rendezvous_error",
        NOTIFY,
    ),
    "jax coordinator unset": (
        "ValueError: coordinator_address should be defined.",
        "rendezvous_error",
        NOTIFY,
    ),
    "store wait": ("RuntimeError: Wait timeout", "rendezvous_error", RESTART),
    "jax controller": (
        "E0101 12:00:00.000000 1234 client.cc:107] Failed to connect to distributed JAX "
        "controller: waited too long for some tasks to show up.",
        "rendezvous_error",
        RESTART,
    ),
    "c10d host lookup": (
        "ValueError: host not found: Name or service not known",
        "rendezvous_error",
        RESTART,
    ),
    "pdsh ssh": (
        "pdsh@gpu-node-1: gpu-node-2: ssh exited with exit code 255",
        "rendezvous_error",
        NOTIFY,
    ),
    "open mpi init": (
        "It looks like MPI_INIT failed for some reason; your parallel process is",
        "rendezvous_error",
        ESCALATE,
    ),
    "mpich init": (
        "Fatal error in PMPI_Init_thread: Other MPI error, error stack:",
        "rendezvous_error",
        ESCALATE,
    ),
    "orte daemon lost": (
        "ORTE has lost communication with a remote daemon.",
        "rendezvous_error",
        RESTART,
    ),
    "horovod start timeout": (
        "Exception: Timed out waiting for tasks to start. Please check connectivity between "
        "servers. You may need to increase the --start-timeout parameter if you have too many "
        "servers.",
        "rendezvous_error",
        RESTART,
    ),
    "jax peer died": (
        "F0926 17:26:32.075587  157988 client.h:77] Terminating process because the JAX "
        "distributed service detected fatal errors. This most likely indicates that another "
        "task died; see the other task logs for more details.",
        "communicator_aborted",
        ESCALATE,
    ),
}

HEALTHY = {
    "socket enotconn": "WARNING: ignoring OSError: [Errno 107] Transport endpoint is not "
    "connected while closing the metrics socket",
    "fuse mounted": "Mounted /mnt/gcs with gcsfuse (implicit dirs: on)",
    "gcsfs range": "gcsfs: read past EOF answered 416, retrying with a shorter range",
    "volume attached": "  Normal   SuccessfulAttachVolume  1m  attachdetach-controller  "
    'AttachVolume.Attach succeeded for volume "pvc-3f1c"',
    "lustre restored": "kernel: Lustre: scratch-OST0004-osc-ffff9a3e7c6f5000: Connection "
    "restored to 10.1.2.14@o2ib (at 10.1.2.14@o2ib)",
    "xfs mount": "kernel: XFS (nvme0n1): Ending clean mount",
    "scsi capacity": "kernel: sd 0:0:0:0: [sda] 7814037168 512-byte logical blocks: (4.00 TB/3.64 "
    "TiB)",
    "ext4 mount": "kernel: EXT4-fs (sda1): mounted filesystem with ordered data mode. Quota mode: "
    "none.",
    "rendezvous info": "Initializing torch.distributed using env:// rendezvous (MASTER_ADDR="
    "10.0.0.1, MASTER_PORT=29500)",
    "jax connected": "I0101 12:00:00.000000 1234 client.cc:101] Connected to distributed JAX "
    "controller",
    "mpi thread level": "MPI_Init_thread returned MPI_THREAD_MULTIPLE",
    "coordination connected": "I0926 17:26:32.075402  157988 coordination_service_agent.cc:332] "
    "Coordination agent has successfully connected.",
}


@pytest.mark.parametrize(("line", "failure_type", "action"), FAILING.values(), ids=list(FAILING))
def test_each_spelling_gets_its_family_verdict(
    pack: RuleSet, tmp_path: Path, line: str, failure_type: str, action: Action
) -> None:
    assert_family_verdict(verdict_of(pack, tmp_path, STEPS, line), failure_type, action)


@pytest.mark.parametrize("text", HEALTHY.values(), ids=list(HEALTHY))
def test_the_harmless_neighbours_stay_healthy(pack: RuleSet, tmp_path: Path, text: str) -> None:
    assert_healthy(verdict_of(pack, tmp_path, STEPS, text))


def test_a_peer_failure_echo_yields_to_the_failure_it_echoes(pack: RuleSet, tmp_path: Path) -> None:
    """Horovod's shutdown on a surviving rank is a symptom: the other rank's error decides."""
    verdict = verdict_of(
        pack,
        tmp_path,
        STEPS,
        "OSError: [Errno 28] No space left on device: '/ckpt/step_300/model.pt'",
        "horovod.common.exceptions.HorovodInternalError: Horovod has been shut down. "
        "This was caused by an exception on one of the ranks or an attempt to allreduce, "
        "allgather or broadcast a tensor after one of the ranks finished execution.",
    )
    assert (verdict.failure_type, verdict.action) == ("disk_full", NOTIFY)
