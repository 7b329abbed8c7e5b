"""The rule pack as the service holds it: listing, reload on request, reload on file change."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import ServiceProcess, wait_until

PACK = Path(__file__).resolve().parents[2] / "rules"
RELOAD_TIMEOUT_S = 60
"""A reload compiles the whole pack (158 rules, the hyperscan prefilter) and, after a file edit,
waits behind the watcher's reload of the same edit: seconds on a loaded machine, longer than
httpx's 5 s default. A deadline for the answer, not a timed assertion."""


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    target = tmp_path / "rules"
    shutil.copytree(PACK, target)
    return target


@pytest.fixture
def service(tmp_path: Path, rules_dir: Path) -> Iterator[ServiceProcess]:
    process = ServiceProcess(
        env={"DIAGNOSER_DATA_DIR": str(tmp_path / "data"), "DIAGNOSER_RULES_DIR": str(rules_dir)}
    )
    process.start()
    yield process
    process.stop()


def rules(service: ServiceProcess) -> dict[str, object]:
    body: dict[str, object] = httpx.get(f"{service.base_url}/v1/rules").json()
    return body


def test_lists_the_active_pack_with_its_digest(service: ServiceProcess) -> None:
    body = rules(service)
    ids = {rule["id"] for rule in body["rules"]}  # type: ignore[attr-defined]
    assert {"xid_fallen_off_bus", "nccl_watchdog_timeout"} <= ids
    assert len(str(body["digest"])) == 64
    assert body["last_reload_errors"] == []


def test_a_broken_file_is_rejected_and_the_old_set_stays(
    service: ServiceProcess, rules_dir: Path
) -> None:
    before = rules(service)["digest"]
    nccl = rules_dir / "nccl.yaml"
    good = nccl.read_text()
    nccl.write_text(good.replace("    scope: job\n", "    scope: job\n    colour: red\n", 1))
    response = httpx.post(f"{service.base_url}/v1/rules/reload", timeout=RELOAD_TIMEOUT_S)
    assert response.status_code == 422
    body = response.json()
    assert body["error"] == "invalid_rules"
    assert any("nccl.yaml" in p and "colour" in p for p in body["problems"])
    assert rules(service)["digest"] == before
    assert rules(service)["last_reload_errors"]

    nccl.write_text(good.replace("NCCL collective timeouts", "NCCL collective time-outs", 1))
    response = httpx.post(f"{service.base_url}/v1/rules/reload", timeout=RELOAD_TIMEOUT_S)
    assert response.status_code == 200
    assert response.json()["digest"] != before
    assert response.json()["last_reload_errors"] == []


def test_an_edited_file_is_picked_up_without_a_request(
    service: ServiceProcess, rules_dir: Path
) -> None:
    before = rules(service)["digest"]
    storage = rules_dir / "storage.yaml"
    storage.write_text(storage.read_text().replace("description: ", "description: Tuned. ", 1))
    wait_until(lambda: rules(service)["digest"] != before, 20, "the watcher's reload")
