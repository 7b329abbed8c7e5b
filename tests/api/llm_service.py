"""A real `diagnoser serve` wired to a scripted LLM, and the reads the LLM-stage tests share."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from tests.llm.scripted_llm import ScriptedLlm
from tests.servers import ServiceProcess, post_text

StartService = Callable[..., ServiceProcess]
"""`start(llm, **env)`: a service on the test's data directory answering to `llm`."""


@contextmanager
def llm_services(data_dir: Path) -> Iterator[StartService]:
    """Services started in a test, all stopped at its end; extra keyword args are env vars."""
    started: list[ServiceProcess] = []

    def start(llm: ScriptedLlm, **extra: str) -> ServiceProcess:
        service = ServiceProcess(
            env={
                "DIAGNOSER_DATA_DIR": str(data_dir),
                "DIAGNOSER_RULES_WATCH": "false",
                "DIAGNOSER_LLM__BASE_URL": llm.base_url,
                "DIAGNOSER_LLM__MODEL": "scripted",
                "DIAGNOSER_LLM__QUIET_S": "0",
                "DIAGNOSER_LLM__TIMEOUT_S": "5",
                "DIAGNOSER_LLM__MAX_RETRIES": "0",
                **extra,
            }
        )
        service.start()
        started.append(service)
        return service

    try:
        yield start
    finally:
        for service in started:
            service.stop()


def diagnose(service: ServiceProcess, job: str, node: str, text: str) -> str:
    """Post `text` for `node` of `job`; the one diagnosis it created or changed."""
    diagnoses = post_text(service, job, node, text)["diagnoses"]
    assert isinstance(diagnoses, list)
    assert len(diagnoses) == 1, diagnoses
    return str(diagnoses[0])


def diagnosis(
    service: ServiceProcess, diagnosis_id: str, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(
        f"{service.base_url}/v1/diagnoses/{diagnosis_id}", timeout=5, headers=headers
    ).json()
    return body


def wait_for_llm(
    service: ServiceProcess,
    diagnosis_id: str,
    timeout: float = 30,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The diagnosis once the LLM stage has recorded its vote on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = diagnosis(service, diagnosis_id, headers)
        if body.get("llm"):
            return body
        time.sleep(0.2)
    raise AssertionError(f"no LLM verdict on {diagnosis_id} after {timeout}s")
