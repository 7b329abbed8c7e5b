"""Training signals through the service: a NaN loss or a loss spike becomes one diagnosis that
names the checkpoint to resume from; a healthy run stays silent."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import backend_env, run_service
from tests.diagnosis.training_logs import training_log
from tests.servers import ServiceProcess
from tests.servers import post_text as send


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServiceProcess]:
    yield from run_service(backend_env(request, tmp_path_factory.mktemp("data")))


def job_diagnoses(service: ServiceProcess, job: str) -> list[dict[str, object]]:
    body = httpx.get(f"{service.base_url}/v1/jobs/{job}/diagnoses").json()
    items: list[dict[str, object]] = body["diagnoses"]
    return items


def send_in_batches(service: ServiceProcess, job: str, log: str, size: int = 40) -> None:
    """The log as a shipper sends it: many small uploads, so signals span batches."""
    lines = log.splitlines(keepends=True)
    for start in range(0, len(lines), size):
        send(service, job, "node-7", "".join(lines[start : start + size]))


@pytest.mark.parametrize(
    ("log", "failure_type"),
    [(training_log(nan_at=170), "nan_loss"), (training_log(spike_at=170), "loss_spike")],
)
def test_a_training_signal_is_one_diagnosis_with_the_step_to_resume_from(
    service: ServiceProcess, log: str, failure_type: str
) -> None:
    job = f"signal-{failure_type}"
    send_in_batches(service, job, log)
    [diagnosis] = job_diagnoses(service, job)
    assert diagnosis["failure_type"] == failure_type
    assert diagnosis["action"] == "notify_user"
    assert diagnosis["category"] == "user_code"
    progress = diagnosis["progress"]
    assert isinstance(progress, dict)
    assert progress["resume_from_step"] == 150
    assert "resume from the checkpoint of step 150" in str(diagnosis["summary"])
    evidence = diagnosis["evidence"]
    assert isinstance(evidence, list)
    assert "iteration      170/" in evidence[0]["text"]


def test_a_healthy_run_with_loss_noise_gets_no_diagnosis(service: ServiceProcess) -> None:
    send_in_batches(service, "signal-healthy", training_log(steps=1000), size=100)
    assert job_diagnoses(service, "signal-healthy") == []
