"""`ship` and `run` send `--token` / DIAGNOSER_TOKEN, and the service checks it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.auth.issuing import Token, create_token
from tests.servers import ServiceProcess, run_diagnoser


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Token]:
    data_dir = tmp_path_factory.mktemp("clients")
    return {
        "dir": Token("", str(data_dir)),
        "read": create_token(data_dir, "read"),
        "ingest": create_token(data_dir, "ingest", "--node", "n1"),
    }


@pytest.fixture(scope="module")
def service(tokens: dict[str, Token]) -> Iterator[ServiceProcess]:
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": tokens["dir"].raw})
    process.start()
    yield process
    process.stop()


def test_ship_sends_the_token_and_a_wrong_one_exits_3(
    service: ServiceProcess, tokens: dict[str, Token], tmp_path: Path
) -> None:
    log = tmp_path / "train.log"
    log.write_text("step 1 loss 2.5\nstep 2 loss 2.4\n")
    args = ["ship", str(log), "--server", service.base_url, "--job", "j1", "--node", "n1"]
    refused = run_diagnoser(*args, env={"DIAGNOSER_TOKEN": tokens["read"].raw}, child=True)
    assert refused.returncode == 3, refused.stderr
    assert "check --token" in refused.stderr
    accepted = run_diagnoser(*args, "--token", tokens["ingest"].raw, child=True)
    assert accepted.returncode == 0, accepted.stderr
    assert "2 lines accepted" in accepted.stderr


def test_run_posts_its_events_with_the_token(
    service: ServiceProcess, tokens: dict[str, Token], tmp_path: Path
) -> None:
    result = run_diagnoser(
        "run", "--server", service.base_url, "--job", "j2", "--node", "n1",
        "--", sys.executable, "-c", "print('step 1 loss 2.5')",
        env={"DIAGNOSER_TOKEN": tokens["ingest"].raw}, cwd=tmp_path, child=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    job = httpx.get(f"{service.base_url}/v1/jobs/j2", headers=tokens["read"].headers)
    assert job.status_code == 200, job.text
    assert job.json()["nodes"] == ["n1"]
    assert [e["node"] for e in job.json()["exits"]] == ["n1"]
