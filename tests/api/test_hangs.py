"""The hang detector in the running service: a running job that stops without a reason gets
a restart (the default `DIAGNOSER_HANG__ACTION`).

A real uvicorn server with a 2-second hang window (checked every 0.2 s), on SQLite and
PostgreSQL. Waiting is polling, bounded by a deadline: nothing here asserts a duration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import backend_env, run_service
from tests.servers import ServiceProcess
from tests.servers import post_text as send

WINDOW_S = 2.0


def steps(first: int, last: int) -> str:
    return "".join(
        f" iteration {i:>6}/  500000 | consumed samples: {i * 128:>10} | lm loss: 2.41E+00 |\n"
        for i in range(first, last + 1)
    )


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    env = backend_env(request, tmp_path_factory.mktemp("data"))
    env["DIAGNOSER_HANG__TIMEOUT_S"] = str(WINDOW_S)
    env["DIAGNOSER_HANG__CHECK_INTERVAL_S"] = "0.2"
    yield from run_service(env)


def event(service: ServiceProcess, job: str, kind: str, **fields: object) -> None:
    response = httpx.post(f"{service.base_url}/v1/jobs/{job}/events", json={"type": kind, **fields})
    assert response.status_code == 201, response.text


def job_diagnoses(service: ServiceProcess, job: str) -> list[dict[str, object]]:
    body = httpx.get(f"{service.base_url}/v1/jobs/{job}/diagnoses").json()
    items: list[dict[str, object]] = body["diagnoses"]
    return items


def wait_for(
    probe: Callable[[], list[dict[str, object]]], ready: Callable[[list[dict[str, object]]], bool]
) -> list[dict[str, object]]:
    deadline = time.monotonic() + 30
    while True:
        found = probe()
        if ready(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_stalled_job_is_restarted_as_a_hang_then_resolved_when_it_resumes(
    service: ServiceProcess,
) -> None:
    event(service, "stuck", "started")
    for node in ("node-0", "node-1"):
        send(service, "stuck", node, steps(1, 20))
    send(service, "stuck", "node-0", "[2024-06-26 04:16:12] Saving model checkpoint to step 20\n")
    found = wait_for(lambda: job_diagnoses(service, "stuck"), bool)
    assert len(found) == 1
    hang = found[0]
    assert (hang["failure_type"], hang["action"], hang["category"], hang["status"]) == (
        "hang",
        "restart_job",
        "framework",
        "open",
    )
    assert hang["culprit_nodes"] == []
    assert "after a checkpoint save" in str(hang["summary"])
    evidence = hang["evidence"]
    assert isinstance(evidence, list)
    assert {e["node"] for e in evidence} == {"node-0", "node-1"}

    send(service, "stuck", "node-0", steps(21, 22))
    resolved = wait_for(
        lambda: job_diagnoses(service, "stuck"), lambda d: d[0]["status"] == "resolved"
    )
    assert resolved[0]["id"] == hang["id"]
    assert resolved[0]["status"] == "resolved"
    assert "progress resumed (step 22)" in str(resolved[0]["summary"])
    metrics = httpx.get(f"{service.base_url}/metrics").text
    assert 'diagnoser_hangs_total{outcome="reported"} 1.0' in metrics
    assert 'diagnoser_hangs_total{outcome="resolved"} 1.0' in metrics


def test_only_a_job_known_to_be_running_can_hang(service: ServiceProcess) -> None:
    event(service, "done", "started")
    send(service, "done", "node-0", steps(1, 5))
    event(service, "done", "exited", exit_code=0)
    event(service, "finished", "started")
    send(service, "finished", "node-0", steps(1, 5) + "***** Training completed *****\n")
    send(service, "no-launcher-events", "node-0", steps(1, 5))
    event(service, "control", "started")
    send(service, "control", "node-0", steps(1, 5))
    wait_for(lambda: job_diagnoses(service, "control"), bool)
    assert job_diagnoses(service, "done") == []
    assert job_diagnoses(service, "finished") == []
    assert job_diagnoses(service, "no-launcher-events") == []


def test_a_node_whose_launcher_failed_is_the_suspect(service: ServiceProcess) -> None:
    event(service, "peer-died", "started")
    for node in ("node-0", "node-1", "node-2"):
        send(service, "peer-died", node, steps(1, 5))
    event(service, "peer-died", "exited", node="node-2", exit_code=-9)
    found = wait_for(lambda: job_diagnoses(service, "peer-died"), bool)
    assert [(d["failure_type"], d["action"], d["culprit_nodes"]) for d in found] == [
        ("hang", "restart_job", ["node-2"])
    ]
    assert "node-2 reported a failed exit" in str(found[0]["summary"])


def test_a_failure_is_diagnosed_as_itself_not_as_a_hang(service: ServiceProcess) -> None:
    event(service, "oom", "started")
    event(service, "oom-control", "started")
    send(
        service,
        "oom",
        "node-0",
        steps(1, 3) + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
    )
    send(service, "oom-control", "node-0", steps(1, 3))
    wait_for(lambda: job_diagnoses(service, "oom-control"), bool)
    found = job_diagnoses(service, "oom")
    assert [(d["failure_type"], d["action"]) for d in found] == [("cuda_oom", "notify_user")]


def test_an_error_after_the_hang_turns_the_same_diagnosis_into_that_failure(
    service: ServiceProcess,
) -> None:
    event(service, "late-timeout", "started")
    send(service, "late-timeout", "node-0", steps(1, 10))
    hang = wait_for(lambda: job_diagnoses(service, "late-timeout"), bool)[0]
    assert hang["failure_type"] == "hang"
    send(
        service,
        "late-timeout",
        "node-0",
        "[rank0]:[E816 01:45:40.183009389 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught "
        "collective operation timeout: WorkNCCL(SeqNum=80078, OpType=ALLREDUCE, NumelIn=5056, "
        "NumelOut=5056, Timeout(ms)=600000) ran for 600026 milliseconds before timing out.\n",
    )
    found = wait_for(
        lambda: job_diagnoses(service, "late-timeout"),
        lambda d: d[0]["failure_type"] != "hang",
    )
    assert [(d["id"], d["failure_type"], d["action"]) for d in found] == [
        (hang["id"], "nccl_timeout", "restart_job")
    ]


def test_a_restarted_attempt_that_hangs_is_a_new_incident(service: ServiceProcess) -> None:
    event(service, "retry", "started")
    send(service, "retry", "node-0", steps(1, 3) + "torch.OutOfMemoryError: CUDA out of memory.\n")
    first = wait_for(lambda: job_diagnoses(service, "retry"), bool)
    event(service, "retry", "started")  # restarted with a smaller batch, from step 2
    send(service, "retry", "node-0", steps(2, 4))
    found = wait_for(lambda: job_diagnoses(service, "retry"), lambda d: len(d) == 2)
    by_type = {d["failure_type"]: d for d in found}
    assert set(by_type) == {"cuda_oom", "hang"}
    assert by_type["cuda_oom"]["id"] == first[0]["id"]
    assert by_type["cuda_oom"]["status"] == "open"
    assert by_type["cuda_oom"]["action"] == "notify_user"


def test_a_restart_resolves_the_open_hang(service: ServiceProcess) -> None:
    event(service, "restarted", "started")
    send(service, "restarted", "node-0", steps(1, 5))
    hang = wait_for(lambda: job_diagnoses(service, "restarted"), bool)[0]
    event(service, "restarted", "started")
    found = wait_for(
        lambda: job_diagnoses(service, "restarted"), lambda d: d[0]["status"] == "resolved"
    )
    assert (found[0]["id"], found[0]["status"]) == (hang["id"], "resolved")
    assert "Resolved: the job was restarted" in str(found[0]["summary"])


def test_event_times_in_milliseconds_are_read_and_absurd_ones_refused(
    service: ServiceProcess,
) -> None:
    url = f"{service.base_url}/v1/jobs/clock/events"
    millis = httpx.post(url, json={"type": "started", "ts": 1_700_000_000_000})
    assert millis.status_code == 201
    assert millis.json()["ts"].startswith("2023-11-14T22:13:20")
    absurd = httpx.post(url, json={"type": "started", "ts": 1e20})
    assert absurd.status_code == 422
    assert absurd.json()["error"]


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    env = backend_env(request, tmp_path)
    env["DIAGNOSER_HANG__TIMEOUT_S"] = str(WINDOW_S)
    env["DIAGNOSER_HANG__CHECK_INTERVAL_S"] = "0.2"
    return env


def test_lifecycle_posted_before_a_service_restart_is_read_back(fresh_env: dict[str, str]) -> None:
    """The `started` went to the previous process: the detector reads it from the database."""
    before = ServiceProcess(env=fresh_env)
    before.start()
    try:
        event(before, "survivor", "started")
    finally:
        before.stop()
    after = ServiceProcess(env=fresh_env)
    after.start()
    try:
        send(after, "survivor", "node-0", steps(1, 5))
        send(after, "no-events", "node-0", steps(1, 5))
        found = wait_for(lambda: job_diagnoses(after, "survivor"), bool)
        assert [d["failure_type"] for d in found] == ["hang"]
        assert job_diagnoses(after, "no-events") == []
    finally:
        after.stop()


def test_a_relaunch_after_a_service_restart_still_resolves_the_old_hang(
    fresh_env: dict[str, str],
) -> None:
    before = ServiceProcess(env=fresh_env)
    before.start()
    try:
        event(before, "relaunched", "started")
        send(before, "relaunched", "node-0", steps(1, 5))
        hang = wait_for(lambda: job_diagnoses(before, "relaunched"), bool)[0]
    finally:
        before.stop()
    after = ServiceProcess(env=fresh_env)
    after.start()
    try:
        send(after, "relaunched", "node-0", steps(1, 2))  # the new attempt's first lines
        event(after, "relaunched", "started")
        found = job_diagnoses(after, "relaunched")
        assert [(d["id"], d["status"]) for d in found] == [(hang["id"], "resolved")]
        assert "Resolved: the job was restarted" in str(found[0]["summary"])
    finally:
        after.stop()
