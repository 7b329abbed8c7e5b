"""Job-level diagnosis through the service: many ranks in, one diagnosis out, on-call API."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import backend_env, run_service
from tests.servers import ServiceProcess
from tests.servers import post_text as send

TEXT = {"Content-Type": "text/plain"}
TIMEOUT = (
    "[rank{rank}]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank {rank}] Watchdog "
    "caught collective operation timeout: WorkNCCL(SeqNum=80078, OpType=BROADCAST, NumelIn=5056, "
    "NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out.\n"
)
XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has a total "
    "capacity of 31.47 GiB of which 12.73 GiB is free.\n"
)
NOISE = (
    "Warning: Environment variable NCCL_ASYNC_ERROR_HANDLING is deprecated; use "
    "TORCH_NCCL_ASYNC_ERROR_HANDLING instead (function getCvarInt)\n"
    "iteration 1200/50000 | loss 2.3140 | lr 3.0e-04\n"
)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    yield from run_service(backend_env(request, tmp_path_factory.mktemp("data")))


def send_ranks(service: ServiceProcess, job: str, nodes: int = 8) -> None:
    async def all_nodes() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(
                *(
                    client.post(
                        f"{service.base_url}/v1/jobs/{job}/logs",
                        params={"node": f"node-{n}"},
                        content=(
                            NOISE + "".join(TIMEOUT.format(rank=n * 8 + r) for r in range(8))
                        ).encode(),
                        headers=TEXT,
                    )
                    for n in range(nodes)
                )
            )

    asyncio.run(all_nodes())


def diagnoses(service: ServiceProcess, **params: str) -> list[dict[str, object]]:
    body = httpx.get(f"{service.base_url}/v1/diagnoses", params=params).json()
    items: list[dict[str, object]] = body["diagnoses"]
    return items


def job_diagnoses(service: ServiceProcess, job: str) -> list[dict[str, object]]:
    body = httpx.get(f"{service.base_url}/v1/jobs/{job}/diagnoses").json()
    items: list[dict[str, object]] = body["diagnoses"]
    return items


def test_one_diagnosis_names_the_node_with_the_hardware_error(service: ServiceProcess) -> None:
    send(service, "xid", "node-3", NOISE + XID79)
    send_ranks(service, "xid")
    found = job_diagnoses(service, "xid")
    assert len(found) == 1
    diagnosis = found[0]
    assert diagnosis["action"] == "cordon_node_and_restart"
    assert diagnosis["culprit_nodes"] == ["node-3"]
    assert diagnosis["category"] == "hardware"
    assert diagnosis["status"] == "open"
    assert diagnosis["evidence"][0]["text"] == XID79.strip()  # type: ignore[index]
    assert len(diagnosis["affected_ranks"]) == 64  # type: ignore[arg-type]
    assert len(str(diagnosis["ruleset_digest"])) == 64


def test_a_hardware_error_after_the_timeouts_upgrades_the_diagnosis(
    service: ServiceProcess,
) -> None:
    send_ranks(service, "late")
    [before] = job_diagnoses(service, "late")
    assert (before["action"], before["culprit_nodes"]) == ("restart_job", [])
    response = send(service, "late", "node-5", XID79)
    [after] = job_diagnoses(service, "late")
    assert response["diagnoses"] == [before["id"]]
    assert after["id"] == before["id"]
    assert (after["action"], after["culprit_nodes"]) == ("cordon_node_and_restart", ["node-5"])


def test_cuda_oom_notifies_the_user_and_never_cordons(service: ServiceProcess) -> None:
    send(service, "oom", "node-0", NOISE + OOM)
    [diagnosis] = job_diagnoses(service, "oom")
    assert (diagnosis["failure_type"], diagnosis["action"]) == ("cuda_oom", "notify_user")


def test_a_healthy_noisy_run_gets_no_diagnosis(service: ServiceProcess) -> None:
    response = send(service, "healthy", "node-0", NOISE * 200)
    assert response["diagnoses"] == []
    assert job_diagnoses(service, "healthy") == []


def test_an_unresolved_trace_is_inconclusive_and_escalated(service: ServiceProcess) -> None:
    send(
        service,
        "odd",
        "node-0",
        'Traceback (most recent call last):\n  File "x.py", line 1\nWeirdLibError: odd\n',
    )
    [diagnosis] = job_diagnoses(service, "odd")
    assert diagnosis["action"] == "escalate"


def test_filters_and_cursor_pages(service: ServiceProcess) -> None:
    for n in range(5):
        send(service, f"pages-{n}", "gpu-pages", OOM)
    by_node = diagnoses(service, node="gpu-pages")
    assert sorted(str(d["job_id"]) for d in by_node) == [f"pages-{n}" for n in range(5)]
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"category": "resource", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        body = httpx.get(f"{service.base_url}/v1/diagnoses", params=params).json()
        assert len(body["diagnoses"]) <= 2
        seen.extend(d["job_id"] for d in body["diagnoses"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert {f"pages-{n}" for n in range(5)} <= set(seen)
    assert seen.index("pages-4") < seen.index("pages-0")  # newest first
    assert diagnoses(service, category="hardware", job="pages-1") == []
    bad = httpx.get(f"{service.base_url}/v1/diagnoses", params={"category": "cosmic_rays"})
    assert bad.status_code == 422
    bad = httpx.get(f"{service.base_url}/v1/diagnoses", params={"cursor": "bogus"})
    assert bad.status_code == 422


def test_feedback_override_sticks_and_dismiss_closes(service: ServiceProcess) -> None:
    send(service, "fb", "node-1", OOM)
    [diagnosis] = job_diagnoses(service, "fb")
    url = f"{service.base_url}/v1/diagnoses/{diagnosis['id']}/feedback"
    override = httpx.post(
        url,
        json={"kind": "override", "action": "restart_job", "author": "alice", "comment": "flaky"},
    )
    assert override.status_code == 201
    send(service, "fb", "node-2", XID79)  # later evidence: still the human's action
    [after] = job_diagnoses(service, "fb")
    assert (after["action"], after["source"]) == ("restart_job", "human")
    assert httpx.post(url, json={"kind": "override", "author": "bob"}).status_code == 422
    assert httpx.post(url, json={"kind": "dismiss", "author": "bob"}).status_code == 201
    assert job_diagnoses(service, "fb")[0]["status"] == "dismissed"
    kinds = [f["kind"] for f in httpx.get(url).json()]
    assert kinds == ["override", "dismiss"]
    missing = httpx.post(
        f"{service.base_url}/v1/diagnoses/nope/feedback", json={"kind": "confirm", "author": "x"}
    )
    assert missing.status_code == 404


def test_nodes_show_incidents_and_cordon_recommendations(service: ServiceProcess) -> None:
    nodes = {n["node"]: n for n in httpx.get(f"{service.base_url}/v1/nodes").json()}
    assert nodes["node-3"]["cordon_recommended"] is True
    detail = httpx.get(f"{service.base_url}/v1/nodes/node-3").json()
    assert detail["last_failure_type"] == "gpu_fallen_off_bus"
    assert detail["history"][0]["job_id"] == "xid"
    assert httpx.get(f"{service.base_url}/v1/nodes/never-failed").status_code == 404


def test_the_live_stream_carries_new_diagnoses(service: ServiceProcess) -> None:
    async def watch() -> dict[str, object]:
        async with (
            httpx.AsyncClient(timeout=30) as client,
            client.stream("GET", f"{service.base_url}/v1/diagnoses/stream") as stream,
        ):
            lines = stream.aiter_lines()
            assert (await anext(lines)).startswith(": connected")
            await client.post(
                f"{service.base_url}/v1/jobs/live/logs",
                params={"node": "node-9"},
                content=XID79.encode(),
                headers=TEXT,
            )
            async for line in lines:
                if line.startswith("data: "):
                    event: dict[str, object] = json.loads(line.removeprefix("data: "))
                    return event
        raise AssertionError("stream ended")

    event = asyncio.run(asyncio.wait_for(watch(), 20))
    assert (event["job_id"], event["culprit_nodes"]) == ("live", ["node-9"])


def test_diagnoses_survive_a_restart(tmp_path: Path) -> None:
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(tmp_path)})
    process.start()
    try:
        send(process, "durable", "node-1", XID79)
        process.stop()
        process.start()
        [diagnosis] = job_diagnoses(process, "durable")
        assert diagnosis["culprit_nodes"] == ["node-1"]
    finally:
        process.stop()


def test_the_cli_lists_and_shows_diagnoses(service: ServiceProcess) -> None:
    send(service, "cli", "node-4", XID79)
    [diagnosis] = job_diagnoses(service, "cli")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "diagnoser", "diagnoses", *args, "--server", service.base_url],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    listed = cli("list", "--job", "cli", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [d["id"] for d in json.loads(listed.stdout)["diagnoses"]] == [diagnosis["id"]]
    shown = cli("show", str(diagnosis["id"]))
    assert "gpu_fallen_off_bus on node-4" in shown.stdout
    assert "NVRM: Xid" in shown.stdout
    assert cli("show", "no-such-id").returncode == 1
    unreachable = subprocess.run(
        [sys.executable, "-m", "diagnoser", "diagnoses", "list", "--server", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unreachable.returncode == 2
    assert "cannot reach" in unreachable.stderr


def test_a_diagnosis_says_how_many_steps_a_restart_loses(service: ServiceProcess) -> None:
    send(
        service,
        "progress",
        "node-1",
        "saving checkpoint at iteration    1000 to /ckpt/run7\n"
        + "".join(f" iteration {step:>8}/  500000 | lm loss: 2.41\n" for step in range(1000, 1251))
        + XID79,
    )
    [diagnosis] = job_diagnoses(service, "progress")
    assert diagnosis["progress"] == {
        "last_step": 1250,
        "last_checkpoint_step": 1000,
        "steps_lost": 250,
    }


def metrics(service: ServiceProcess) -> str:
    return httpx.get(f"{service.base_url}/metrics").text


def test_the_cli_watches_diagnoses_live(service: ServiceProcess) -> None:
    command = [
        sys.executable,
        "-m",
        "diagnoser",
        "diagnoses",
        "watch",
        "--server",
        service.base_url,
    ]
    env = {**os.environ, "COLUMNS": "200"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as watcher:
        try:
            # Deadlines, not durations: a loaded machine takes seconds to start the child.
            deadline = time.monotonic() + 90
            while "diagnoser_diagnosis_watchers 1.0" not in metrics(service):
                assert time.monotonic() < deadline, "the watcher never connected"
                time.sleep(0.1)
            send(service, "watched", "node-7", XID79)
            assert watcher.stdout is not None
            seen = ""
            deadline = time.monotonic() + 90
            while "node-7" not in seen and time.monotonic() < deadline:
                seen += watcher.stdout.readline()
            assert "watched" in seen
            assert "cordon_node_and_restart" in seen
        finally:
            watcher.terminate()


def metric(service: ServiceProcess, sample: str) -> float:
    for line in metrics(service).splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_lines_rule_events_and_diagnoses(service: ServiceProcess) -> None:
    samples = (
        "diagnoser_ingest_lines_total",
        "diagnoser_ingest_committed_bytes_total",
        'diagnoser_rule_events_total{rule="xid_fallen_off_bus"}',
        'diagnoser_diagnosis_changes_total{action="cordon_node_and_restart"}',
    )
    before = [metric(service, s) for s in samples]
    body = NOISE + XID79
    send(service, "counted", "node-2", body)
    after = [metric(service, s) for s in samples]
    assert [b - a for a, b in zip(before, after, strict=True)] == [
        body.count("\n"),
        len(body.encode()),
        1,
        1,
    ]
    assert metric(service, "diagnoser_jobs_tracked") >= 1


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """A fresh database on each backend, for tests that start and stop their own service."""
    return backend_env(request, tmp_path)


def incident_fields(diagnosis: dict[str, object]) -> dict[str, Any]:
    """What the on-call engineer reads, without ids and times (receive times differ by run)."""
    fields = ("failure_type", "category", "action", "summary", "culprit_nodes", "rule_ids")
    evidence: list[dict[str, Any]] = diagnosis["evidence"]  # type: ignore[assignment]
    return {
        **{key: diagnosis[key] for key in (*fields, "affected_ranks", "confidence", "source")},
        "evidence": [(e["node"], e["rank"], e["rule_id"], e["text"]) for e in evidence],
        "progress": diagnosis["progress"],
    }


def timeouts_on_gpu_017(service: ServiceProcess, job: str) -> None:
    progress = "saving checkpoint at iteration    1000 to /ckpt/run7\n iteration 1250/50000\n"
    timeouts = "".join(TIMEOUT.format(rank=r) for r in range(8, 12))
    send(service, job, "gpu-017", NOISE + progress + timeouts)


def test_a_service_restart_between_timeouts_and_an_xid_keeps_the_earlier_evidence(
    backend: dict[str, str],
) -> None:
    process = ServiceProcess(env=backend)
    process.start()
    try:
        for job in ("steady", "restarted"):
            timeouts_on_gpu_017(process, job)
        [before] = job_diagnoses(process, "restarted")
        send(process, "steady", "gpu-3", XID79)
        process.stop()
        process.start()  # a new process on the same database: no live state for either job
        response = send(process, "restarted", "gpu-3", XID79)
        [steady] = job_diagnoses(process, "steady")
        [after] = job_diagnoses(process, "restarted")
    finally:
        process.stop()
    assert response["diagnoses"] == [after["id"]] == [before["id"]]
    got = incident_fields(after)
    assert (got["action"], got["culprit_nodes"]) == ("cordon_node_and_restart", ["gpu-3"])
    assert set(got["rule_ids"]) == {"xid_fallen_off_bus", "nccl_watchdog_timeout"}
    assert got["affected_ranks"] == [8, 9, 10, 11]
    texts = [text for *_, text in got["evidence"]]
    assert texts[0] == XID79.strip()  # the hardware fault outranks the timeouts it caused
    assert {text for *_, text in incident_fields(before)["evidence"]} <= set(texts)
    assert got["progress"] == {"last_step": 1250, "last_checkpoint_step": 1000, "steps_lost": 250}
    assert got == incident_fields(steady)


def event(service: ServiceProcess, job: str, kind: str, **fields: object) -> None:
    response = httpx.post(f"{service.base_url}/v1/jobs/{job}/events", json={"type": kind, **fields})
    assert response.status_code == 201, response.text


def test_a_job_restart_across_a_service_restart_judges_the_new_attempt_alone(
    backend: dict[str, str],
) -> None:
    """The old attempt's Xid on gpu-3 stays as evidence, but gpu-3 is not cordoned again for
    the new attempt's out-of-memory error on gpu-5."""
    process = ServiceProcess(env=backend)
    process.start()
    try:
        event(process, "attempts", "started")
        send(process, "attempts", "gpu-3", XID79)
        event(process, "attempts", "exited", exit_code=1)
        process.stop()
        process.start()
        event(process, "attempts", "started")  # the launcher restarts the job
        send(process, "attempts", "gpu-5", OOM)
        [diagnosis] = job_diagnoses(process, "attempts")
    finally:
        process.stop()
    got = incident_fields(diagnosis)
    assert (got["failure_type"], got["action"]) == ("cuda_oom", "notify_user")
    assert [text for *_, text in got["evidence"]] == [OOM.strip(), XID79.strip()]
    assert set(got["rule_ids"]) >= {"xid_fallen_off_bus"}
