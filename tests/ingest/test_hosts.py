"""Host headers: which machine a line names, and no machine where the line names none."""

from __future__ import annotations

import pytest

from diagnoser.ingest.prefixes import LineHosts, host_of


@pytest.mark.parametrize(
    ("line", "host", "kind"),
    [
        ("Dec  1 08:00:00 gpu-3 kernel: NVRM: Xid", "gpu-3", "syslog header"),
        ("May 01 10:00:00.123456 gpu-3 kernel: x", "gpu-3", "syslog header"),
        ("<4>Dec 11 08:00:00 node017 nvidia-persistenced[812]: x", "node017", "syslog header"),
        ("2024-05-01T10:00:00+0000 gpu-5 kernel: x", "gpu-5", "syslog header"),
        (
            "2024-05-01T10:00:00.123456+00:00 ip-10-0-0-1.ec2.internal python3[1234]: x",
            "ip-10-0-0-1.ec2.internal",
            "syslog header",
        ),
        ("Wed 2024-05-01 10:00:00 UTC gpu-4 kernel: x", "gpu-4", "syslog header"),
        ("1714557600.123456 gpu-6 systemd[1]: x", "gpu-6", "syslog header"),
        ("<34>1 2024-05-01T10:00:00.000Z gpu-7 kernel - - - x", "gpu-7", "RFC 5424 syslog header"),
        ("srun: error: gpu-017: task 5: Exited with exit code 1", "gpu-017", "srun error line"),
        ("3: srun: error: gpu-017: tasks 0-7: Killed", "gpu-017", "srun error line"),
        (
            "slurmstepd: error: *** JOB 1234 ON gpu-9 CANCELLED AT 2024-05-01T10:00:00 ***",
            "gpu-9",
            "slurmstepd notice",
        ),
        ("(RayTrainWorker pid=2273, ip=172.24.21.66) x", "172.24.21.66", "Ray worker prefix"),
    ],
)
def test_a_header_names_its_host(line: str, host: str, kind: str) -> None:
    assert host_of(line) == (host, kind)


@pytest.mark.parametrize(
    "line",
    [
        "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "Traceback (most recent call last):",
        "2024-05-01 10:00:00,123 - INFO - root: step 10",
        "2024-05-01T10:00:00Z INFO trainer: step 10",
        "2024-05-01T10:00:00 gpu-3 kernel: no zone, an application's own format",
        "May 01 10:00:00 ERROR torch.distributed: failed",
        "<34>1 2024-05-01T10:00:00.000Z - kernel - - - nil host",
        "[2024-05-01 10:00:00,000] [INFO] [launch.py:100:main] WORLD INFO",
        "gpu-3: a pdsh prefix is read only in pdsh output",
        "node-1:1234:1234 [0] NCCL INFO Bootstrap : Using eth0",
    ],
)
def test_ordinary_text_names_no_host(line: str) -> None:
    assert host_of(line) is None


def test_pdsh_prefixes_count_only_in_a_file_that_mostly_has_them() -> None:
    pdsh = LineHosts()
    lines = ["gpu-1: a", "gpu-2: b", "  continued", "plain", "gpu-1: c", "RuntimeError: x"]
    assert pdsh.parse(lines) == ["gpu-1", "gpu-2", "gpu-2", None, "gpu-1", None]
    assert pdsh.pdsh is True
    prose = LineHosts()
    assert prose.parse(["c10d: store timeout", "step 10", "step 11"]) is None
    assert prose.pdsh is False


def test_a_continuation_keeps_its_host_across_batches() -> None:
    hosts = LineHosts()
    assert hosts.parse(["Dec  1 08:00:00 gpu-3 python3[9]: Traceback (most recent call last):"])
    assert hosts.parse(['  File "train.py", line 3', "next"]) == ["gpu-3", None]
