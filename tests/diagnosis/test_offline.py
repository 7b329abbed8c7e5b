"""`diagnoser diagnose`: the offline report and its scripted `--json` contract."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.servers import run_diagnoser

CONTRACT_KEYS = {
    "status", "category", "failure_type", "action", "culprit_nodes", "confidence", "source",
    "rule_ids", "summary", "evidence",
}  # fmt: skip
ADDED_KEYS = {"culprit_reason", "xid", "pci", "votes", "resume_from_step"}
"""Keys added after the contract was first published; the contract keys never go away."""

TIMEOUT = (
    "[rank{rank}]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=80078, OpType=BROADCAST, NumelIn=5056, "
    "NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out."
)
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
NOISE = (
    "Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function getCvarInt)\n"
    "gpu-node:1234:1234 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
    "iteration 1200/50000 | loss 2.3140 | lr 3.0e-04 | grad norm 0.912\n"
)


def write_job(directory: Path, *, xid_on: int | None) -> list[Path]:
    paths = []
    for node in range(8):
        lines = [NOISE]
        if node == xid_on:
            lines.append(XID79 + "\n")
        lines.extend(TIMEOUT.format(rank=node * 8 + local) + "\n" for local in range(8))
        path = directory / f"node-{node}.log"
        path.write_text("".join(lines))
        paths.append(path)
    return paths


def diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return run_diagnoser("diagnose", *args)


def test_the_node_with_the_hardware_error_is_the_culprit(tmp_path: Path) -> None:
    result = diagnose(*map(str, write_job(tmp_path, xid_on=3)), "--json")
    assert result.returncode == 0, result.stderr
    verdict = json.loads(result.stdout)
    assert set(verdict) == CONTRACT_KEYS | ADDED_KEYS
    assert verdict["status"] == "failure"
    assert verdict["action"] == "cordon_node_and_restart"
    assert verdict["culprit_nodes"] == ["node-3"]
    assert verdict["category"] == "hardware"
    assert verdict["evidence"][0] == {
        "file": str(tmp_path / "node-3.log"),
        "line_no": 4,
        "text": XID79,
        "node": "node-3",
        "rule_id": "xid_fallen_off_bus",
        "entities": {"xid": "79", "pci": "0000:2b:00"},
    }
    assert (verdict["xid"], verdict["pci"]) == ("79", "0000:2b:00")
    assert "named after its file" in verdict["culprit_reason"]


def test_timeouts_everywhere_without_hardware_evidence_restart_the_job(tmp_path: Path) -> None:
    verdict = json.loads(diagnose(*map(str, write_job(tmp_path, xid_on=None)), "--json").stdout)
    assert verdict["action"] == "restart_job"
    assert verdict["failure_type"] == "nccl_timeout"
    assert verdict["culprit_nodes"] == []


def test_a_healthy_noisy_log_is_healthy(tmp_path: Path) -> None:
    log = tmp_path / "gpu-1.log"
    log.write_text(NOISE * 50)
    verdict = json.loads(diagnose(str(log), "--json").stdout)
    assert (verdict["status"], verdict["action"], verdict["evidence"]) == ("healthy", "none", [])


def test_node_map_renames_a_file(tmp_path: Path) -> None:
    paths = write_job(tmp_path, xid_on=3)
    result = diagnose(*map(str, paths), "--json", "--node-map", "node-3.log=gpu-a17")
    assert json.loads(result.stdout)["culprit_nodes"] == ["gpu-a17"]


def test_readable_report_and_usage_errors(tmp_path: Path) -> None:
    report = diagnose(*map(str, write_job(tmp_path, xid_on=3)))
    assert report.returncode == 0
    assert "FAILURE" in report.stdout
    assert "node-3" in report.stdout
    missing = diagnose(str(tmp_path / "nope.log"))
    assert missing.returncode == 2
    assert "no such file" in missing.stderr


def test_the_one_node_that_never_timed_out_is_suspected_not_cordoned(tmp_path: Path) -> None:
    paths = write_job(tmp_path, xid_on=None)
    (tmp_path / "node-5.log").write_text(NOISE * 3)  # stuck or dead: no watchdog line at all
    verdict = json.loads(diagnose(*map(str, paths), "--json").stdout)
    assert verdict["action"] == "restart_job"
    assert verdict["culprit_nodes"] == ["node-5"]
    assert "no timeout reported" in verdict["summary"]
    assert verdict["source"] == "correlation"


def test_many_silent_nodes_are_not_blamed(tmp_path: Path) -> None:
    paths = write_job(tmp_path, xid_on=None)
    for node in (1, 2, 5):
        (tmp_path / f"node-{node}.log").write_text(NOISE)
    verdict = json.loads(diagnose(*map(str, paths), "--json").stdout)
    assert (verdict["action"], verdict["culprit_nodes"]) == ("restart_job", [])


def test_stalled_for_turns_a_quiet_log_into_a_hang_with_the_same_json_keys(
    tmp_path: Path,
) -> None:
    log = tmp_path / "node-0.log"
    log.write_text(NOISE)
    quiet = json.loads(diagnose(str(log), "--json").stdout)
    hung = json.loads(diagnose(str(log), "--json", "--stalled-for", "45m").stdout)
    early = json.loads(
        diagnose(str(log), "--json", "--stalled-for", "45m", "--hang-timeout", "1h").stdout
    )
    assert quiet["status"] == early["status"] == "healthy"
    assert set(hung) == CONTRACT_KEYS | ADDED_KEYS
    assert (hung["status"], hung["failure_type"], hung["action"]) == (
        "failure",
        "hang",
        "restart_job",
    )
    assert hung["summary"].startswith("no progress for 45 min")
    assert hung["evidence"][0]["line_no"] == 3
    conservative = run_diagnoser(
        "diagnose", str(log), "--json", "--stalled-for", "45m",
        env={"DIAGNOSER_HANG__ACTION": "escalate"},
    )  # fmt: skip
    escalated = json.loads(conservative.stdout)
    assert (escalated["status"], escalated["action"]) == ("inconclusive", "escalate")


def test_stalled_for_mtime_reads_the_files_age(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text(NOISE)
    fresh = json.loads(diagnose(str(log), "--json", "--stalled-for", "mtime").stdout)
    two_hours_ago = time.time() - 7200
    os.utime(log, (two_hours_ago, two_hours_ago))
    old = json.loads(diagnose(str(log), "--json", "--stalled-for", "mtime").stdout)
    assert fresh["status"] == "healthy"
    assert old["failure_type"] == "hang"
    assert "no progress for 2 h" in old["summary"]


def test_a_bad_duration_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    log.write_text(NOISE)
    for bad in ("soon", "-5m", "nan"):
        result = diagnose(str(log), "--stalled-for", bad)
        assert result.returncode == 2, bad
        assert "--stalled-for takes a duration" in result.stderr
        assert "Traceback" not in result.stderr


SYSLOG_XID = "Dec  1 08:00:01 gpu-3 kernel: [74889.644138] " + XID79.removeprefix("[74889.644138] ")
SYSLOG_NOISE = (
    "Dec  1 08:00:00 gpu-1 kernel: usb 1-1: new high-speed USB device number 2\n"
    "Dec  1 08:00:00 gpu-2 systemd[1]: Started Session 4 of user train.\n"
)


def test_a_combined_file_names_the_host_its_line_names(tmp_path: Path) -> None:
    combined = tmp_path / "combined.log"
    timeouts = "".join(
        f"Dec  1 08:00:02 gpu-{n} python3[4242]: " + TIMEOUT.format(rank=n) + "\n" for n in (1, 2)
    )
    combined.write_text(SYSLOG_NOISE + SYSLOG_XID + "\n" + timeouts)
    verdict = json.loads(diagnose(str(combined), "--json").stdout)
    assert verdict["culprit_nodes"] == ["gpu-3"]
    assert verdict["action"] == "cordon_node_and_restart"
    assert "combined" not in verdict["summary"]
    assert (verdict["xid"], verdict["pci"]) == ("79", "0000:2b:00")
    root = verdict["evidence"][0]
    assert (root["node"], root["file"], root["line_no"]) == ("gpu-3", str(combined), 3)
    assert root["entities"] == {"xid": "79", "pci": "0000:2b:00"}
    assert {row["node"] for row in verdict["evidence"][1:]} == {"gpu-1", "gpu-2"}
    assert verdict["culprit_reason"].startswith("gpu-3: its hardware error")
    assert "syslog header names host gpu-3" in verdict["culprit_reason"]
    report = diagnose(str(combined))
    assert "culprit node(s): gpu-3" in report.stdout


@pytest.mark.parametrize(
    ("line", "how"),
    [
        ("2026-12-01T08:00:01+0000 gpu-3 kernel: " + XID79, "syslog header"),
        ("2026-12-01T08:00:01.123456+00:00 gpu-3 kernel: " + XID79, "syslog header"),
        ("Tue 2026-12-01 08:00:01 UTC gpu-3 kernel: " + XID79, "syslog header"),
        ("1796112001.123456 gpu-3 kernel: " + XID79, "syslog header"),
        ("<4>1 2026-12-01T08:00:01.000Z gpu-3 kernel - - - " + XID79, "RFC 5424 syslog header"),
    ],
)
def test_syslog_and_journald_headers_name_the_node(tmp_path: Path, line: str, how: str) -> None:
    log = tmp_path / "journal.log"
    log.write_text(line + "\n")
    verdict = json.loads(diagnose(str(log), "--json").stdout)
    assert verdict["culprit_nodes"] == ["gpu-3"]
    assert f"{how} names host gpu-3" in verdict["culprit_reason"]


def test_pdsh_output_names_each_host(tmp_path: Path) -> None:
    log = tmp_path / "deepspeed.log"
    log.write_text(
        "gpu-1: [2026-12-01 08:00:00,000] [INFO] [launch.py:100:main] WORLD INFO\n"
        "gpu-3: [2026-12-01 08:00:00,000] [INFO] [launch.py:100:main] WORLD INFO\n"
        "gpu-3: " + XID79 + "gpu-1: iteration 1200/50000 | loss 2.3140\n"
    )
    verdict = json.loads(diagnose(str(log), "--json").stdout)
    assert verdict["culprit_nodes"] == ["gpu-3"]
    assert "pdsh host prefix names host gpu-3" in verdict["culprit_reason"]


def test_ordinary_text_invents_no_node(tmp_path: Path) -> None:
    log = tmp_path / "node-7.log"
    log.write_text(
        "2026-12-01T08:00:00Z INFO trainer: step 100\n"
        "Dec 01 08:00:00 WARNING torch.distributed: rendezvous slow\n"
        "c10d: store timeout, retrying\n"
        "RuntimeError: retrying in 5s\n" + XID79
    )
    verdict = json.loads(diagnose(str(log), "--json").stdout)
    assert verdict["culprit_nodes"] == ["node-7"]
    assert {row["node"] for row in verdict["evidence"]} == {"node-7"}


def test_node_map_beats_the_lines_hosts(tmp_path: Path) -> None:
    log = tmp_path / "combined.log"
    log.write_text(SYSLOG_XID + "\n")
    result = diagnose(str(log), "--json", "--node-map", "combined.log=rack4-gpu3")
    verdict = json.loads(result.stdout)
    assert verdict["culprit_nodes"] == ["rack4-gpu3"]
    assert "--node-map" in verdict["culprit_reason"]


def test_a_merged_file_is_never_a_silent_node(tmp_path: Path) -> None:
    combined = tmp_path / "merged.log"
    combined.write_text(
        "-- Boot 1f2e3d --\n"
        + "".join(
            f"Dec  1 08:00:02 gpu-{n} python3[7]: " + TIMEOUT.format(rank=n) + "\n"
            for n in range(8)
        )
    )
    verdict = json.loads(diagnose(str(combined), "--json").stdout)
    assert (verdict["action"], verdict["culprit_nodes"]) == ("restart_job", [])


def test_the_report_prints_log_text_as_written(tmp_path: Path) -> None:
    log = tmp_path / "node-[2].log"
    line = (
        "[default0]:[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "22.78 GiB. [c10d] [/data/shards/x.bin]"
    )
    log.write_text(line + "\n")
    report = run_diagnoser("diagnose", str(log), "--job", "run-[7]", env={"COLUMNS": "400"})
    assert report.returncode == 0, report.stderr
    assert line in report.stdout
    assert "job run-[7]" in report.stdout
    assert "node-[2]" in report.stdout
