"""The compressed log over real HTTP: a real `diagnoser serve` on SQLite and on PostgreSQL.

A synthetic Megatron log goes in; `/log`, `/templates` and `/v1/filters` come back. Filters
learned by one job reach the database, a second job of the family starts with them, and so
does a second replica on the same database, which also serves the first's compressed logs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from megatron_log import megatron_lines
from sqlalchemy.orm import Session

from diagnoser.config import SQLITE_FILE_NAME
from diagnoser.store.database import create_sync_engine, parse_database_url
from diagnoser.store.models import FilterRow
from diagnoser.templates.compressor import CompressorConfig
from tests.conftest import backend_env, run_service
from tests.servers import ServiceProcess, post_text, wait_until

FAMILY = "llama-70b"
FAILURE = "RuntimeError: CUDA error: an illegal memory access was encountered"
FIRST = list(megatron_lines(7, 900))
SECOND = list(megatron_lines(8, 400))
THIRD = list(megatron_lines(9, 400))
FOURTH = list(megatron_lines(10, 400))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return backend_env(request, tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def service(env: dict[str, str]) -> Iterator[ServiceProcess]:
    yield from run_service(env)


def get(service: ServiceProcess, path: str, **params: Any) -> Any:
    response = httpx.get(f"{service.base_url}{path}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def counts(service: ServiceProcess, job_id: str) -> dict[str, Any]:
    compression: dict[str, Any] = get(service, f"/v1/jobs/{job_id}")["compression"]
    return compression


def stored_filters(service: ServiceProcess, **params: Any) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = get(service, "/v1/filters", family=FAMILY, **params)["filters"]
    return filters


@pytest.fixture(scope="module")
def first_job(service: ServiceProcess) -> dict[str, Any]:
    """`llama-70b-run7`: 1,000 lines, a failure line, the rest; its filters stored."""
    post_text(service, "llama-70b-run7", "node-1", "\n".join(FIRST[:1000]) + "\n")
    first_1000 = counts(service, "llama-70b-run7")
    post_text(service, "llama-70b-run7", "node-1", "\n".join([FAILURE, *FIRST[1000:2000]]) + "\n")
    wait_until(lambda: len(stored_filters(service)) >= 3, 30, "stored filters")
    return first_1000


def test_the_log_interleaves_kept_lines_and_filtered_runs(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    assert first_job["lines_in"] == 1000
    assert first_job["lines_kept"] + first_job["lines_filtered"] == 1000
    body = get(service, "/v1/jobs/llama-70b-run7/log", limit=10_000)
    assert body["family"] == FAMILY
    assert body["lines_in"] == 2001
    assert body["lines_kept"] - first_job["lines_kept"] < 1001 / 20  # once warmed up
    runs = [e for e in body["entries"] if e["kind"] == "run"]
    assert runs
    assert all(e["text"].startswith(f"[x {e['count']:,} lines] ") for e in runs)
    assert any("iteration" in e["template"] and "lm loss" in e["template"] for e in runs)
    kept = [e for e in body["entries"] if e["kind"] == "line"]
    assert [e["line_no"] for e in kept] == sorted(e["line_no"] for e in kept)
    assert all(e["node"] == "node-1" for e in kept)
    total = sum(e["count"] for e in runs) + len(kept)
    assert total == body["lines_in"]
    assert body["lines_kept"] + body["lines_filtered"] == body["lines_in"]


def test_a_failure_line_is_never_filtered(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    body = get(service, "/v1/jobs/llama-70b-run7/log", limit=10_000)
    failure = [e for e in body["entries"] if e["kind"] == "line" and e["text"] == FAILURE]
    assert len(failure) == 1
    assert failure[0]["line_no"] == 1001
    assert failure[0]["guarded"] is not None


def test_templates_list_counts_samples_and_filtered(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    body = get(service, "/v1/jobs/llama-70b-run7/templates")
    templates = body["templates"]
    assert body["family"] == FAMILY
    filtered = [t for t in templates if t["filtered"]]
    assert filtered
    assert (
        sum(t["filtered_in_job"] for t in templates)
        == counts(service, "llama-70b-run7")["lines_filtered"]
    )
    assert all(t["samples"] for t in filtered if t["id"] > 0)
    assert not any(t["filtered"] for t in templates if "RuntimeError" in t["text"])


def test_filters_are_stored_with_their_origin(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    filters = stored_filters(service)
    assert all(f["scope"] == "family" and f["family"] == FAMILY for f in filters)
    assert all(f["proposer"] == "deterministic" and f["pattern"].startswith("^") for f in filters)
    wait_until(lambda: stored_filters(service)[0]["hits"] > 0, 30, "hit counts")
    top = stored_filters(service)[0]
    assert top["last_hit_at"] is not None
    assert get(service, "/v1/filters", family="no-such-family")["filters"] == []


def test_a_second_job_of_the_family_starts_compressed(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    post_text(service, "llama-70b-run8", "node-1", "\n".join(SECOND[:1000]) + "\n")
    second = counts(service, "llama-70b-run8")
    assert second["lines_in"] == 1000
    assert second["lines_kept"] * 2 <= first_job["lines_kept"], (second, first_job)


def test_a_second_job_keeps_at_most_a_third_of_the_first(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    second = counts(service, "llama-70b-run8")
    assert second["lines_kept"] * 3 <= first_job["lines_kept"], (second, first_job)


def test_another_replica_starts_with_the_stored_filters(
    env: dict[str, str], service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    replica = ServiceProcess(env=env)
    replica.start()
    try:
        response = httpx.put(f"{replica.base_url}/v1/jobs/llama-70b-run9", json={})
        assert response.status_code == 200, response.text
        post_text(replica, "llama-70b-run9", "node-1", "\n".join(THIRD[:1000]) + "\n")
        third = counts(replica, "llama-70b-run9")
    finally:
        replica.stop()
    # The filters only (the first replica's miner stays there): fewer than the first job,
    # and at most a tenth of the lines (45 measured; the first job keeps 81).
    assert third["lines_kept"] < first_job["lines_kept"], (third, first_job)
    assert third["lines_kept"] <= 100, third


def test_any_replica_serves_a_jobs_compressed_log_and_counts(
    env: dict[str, str], service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    """Two `diagnoser serve` on one database: the replica that did not compress a job answers
    its /log, counts and /templates as the one that did, and the other way round."""
    here = get(service, "/v1/jobs/llama-70b-run7/log", limit=10_000)
    here_counts = counts(service, "llama-70b-run7")
    replica = ServiceProcess(env=env)
    replica.start()
    try:
        there = get(replica, "/v1/jobs/llama-70b-run7/log", limit=10_000)
        there_counts = counts(replica, "llama-70b-run7")
        templates = get(replica, "/v1/jobs/llama-70b-run7/templates")
        post_text(replica, "llama-70b-run13", "node-2", "\n".join([*FOURTH[:300], FAILURE]) + "\n")
        made_there = get(replica, "/v1/jobs/llama-70b-run13/log", limit=10_000)
    finally:
        replica.stop()
    assert there == here
    assert there_counts == here_counts
    assert there_counts["lines_in"] == here["lines_in"] >= 2001
    failure = [e for e in there["entries"] if e["kind"] == "line" and e["text"] == FAILURE]
    assert [e["line_no"] for e in failure] == [1001]
    assert templates["family"] == FAMILY
    assert (
        sum(t["filtered_in_job"] for t in templates["templates"]) == there_counts["lines_filtered"]
    )
    assert any(t["filtered"] for t in templates["templates"])
    # What the stopped replica compressed stays served by the one still running.
    assert get(service, "/v1/jobs/llama-70b-run13/log", limit=10_000) == made_there
    assert counts(service, "llama-70b-run13")["lines_in"] == 301
    assert any(e.get("text") == FAILURE for e in made_there["entries"])


def test_disabling_a_filter_keeps_its_lines_again(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    target = next(f for f in stored_filters(service) if "throughput per GPU" in f["template"])
    url = f"{service.base_url}/v1/filters/{target['id']}"
    response = httpx.patch(url, json={"enabled": False})
    assert response.status_code == 200, response.text
    assert response.json()["enabled"] is False
    assert response.json()["version"] == target["version"] + 1
    assert target["id"] in [f["id"] for f in stored_filters(service, enabled=False)]

    before = counts(service, "llama-70b-run7")["lines_in"]
    post_text(service, "llama-70b-run7", "node-1", "\n".join(FIRST[2000:2090]) + "\n")
    entries = get(service, "/v1/jobs/llama-70b-run7/log", limit=10_000)["entries"]
    again = [
        e
        for e in entries
        if e["kind"] == "line" and e["line_no"] > before and "throughput per GPU" in e["text"]
    ]
    assert len(again) == sum("throughput per GPU" in line for line in FIRST[2000:2090]) > 0

    response = httpx.patch(url, json={"enabled": True})
    assert response.status_code == 200, response.text
    kept = counts(service, "llama-70b-run7")["lines_kept"]
    post_text(service, "llama-70b-run7", "node-1", "\n".join(FIRST[2090:2180]) + "\n")
    assert counts(service, "llama-70b-run7")["lines_kept"] - kept < 10


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/jobs/never-seen/log", 404),
        ("/v1/jobs/never-seen/templates", 404),
        ("/v1/jobs/bad%20id/log", 422),
        ("/v1/filters?family=%00", 422),
    ],
)
def test_unknown_and_invalid_ids(service: ServiceProcess, path: str, status: int) -> None:
    assert httpx.get(f"{service.base_url}{path}").status_code == status


@pytest.mark.parametrize(
    ("filter_id", "body", "status"),
    [
        ("999999", {"enabled": False}, 404),
        ("0", {"enabled": False}, 422),
        ("99999999999999999999", {"enabled": False}, 422),
        ("1", {"enabled": "no"}, 422),
        ("1", {"enabled": True, "pattern": ".*"}, 422),
    ],
)
def test_patch_validates_at_the_edge(
    service: ServiceProcess, filter_id: str, body: dict[str, object], status: int
) -> None:
    response = httpx.patch(f"{service.base_url}/v1/filters/{filter_id}", json=body)
    assert response.status_code == status, response.text


def test_the_family_header_of_a_first_upload_names_the_family(
    service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    """A job whose name says nothing of its family (`nightly-...`) names it in a header."""
    response = httpx.post(
        f"{service.base_url}/v1/jobs/nightly-4f1c2a/logs",
        params={"node": "node-1"},
        content=("\n".join(FOURTH[:1000]) + "\n").encode(),
        headers={"Content-Type": "text/plain", "X-Diagnoser-Job-Family": FAMILY},
    )
    assert response.status_code == 200, response.text
    body = get(service, "/v1/jobs/nightly-4f1c2a/log", limit=1)
    assert body["family"] == FAMILY
    assert body["lines_in"] == 1000
    assert body["lines_kept"] * 2 <= first_job["lines_kept"], (body["lines_kept"], first_job)


def insert_filter(env: dict[str, str], **values: Any) -> int:
    """A row written as another tool (or a person with SQL) would: straight into the table."""
    url = (
        env.get("DIAGNOSER_DB__URL")
        or f"sqlite:///{Path(env['DIAGNOSER_DATA_DIR'])}/{SQLITE_FILE_NAME}"
    )
    engine = create_sync_engine(parse_database_url(url))
    try:
        with Session(engine) as session, session.begin():
            row = FilterRow(proposer="human", names=[], hits=0, enabled=True, version=1, **values)
            session.add(row)
            session.flush()
            return row.id
    finally:
        engine.dispose()


def test_a_job_scope_filter_applies_to_its_job_only(
    env: dict[str, str], service: ServiceProcess, first_job: dict[str, Any]
) -> None:
    heartbeats = [f"elastic agent heartbeat {i} from the launcher is fine" for i in range(30)]
    row_id = insert_filter(
        env,
        scope="job",
        family=None,
        job_id="llama-70b-run11",
        template="elastic agent heartbeat <int> from the launcher is fine",
        pattern=r"^elastic agent heartbeat [0-9]+ from the launcher is fine$",
    )
    for job in ("llama-70b-run11", "llama-70b-run12"):
        response = httpx.put(f"{service.base_url}/v1/jobs/{job}", json={})
        assert response.status_code == 200, response.text
        post_text(service, job, "node-1", "\n".join(heartbeats) + "\n")
    assert counts(service, "llama-70b-run11")["lines_kept"] == 0
    # The other job keeps its heartbeats until the family learns them itself (a template of
    # numbers alone: from its third line).
    other = counts(service, "llama-70b-run12")["lines_kept"]
    assert other >= CompressorConfig().min_count_numeric, "not filtered in another job"
    log = get(service, "/v1/jobs/llama-70b-run11/log")
    runs = [e for e in log["entries"] if e["kind"] == "run"]
    assert [r["count"] for r in runs] == [30]
    assert runs[0]["template"] == "elastic agent heartbeat <int> from the launcher is fine"

    failure = "elastic agent heartbeat 31 from the launcher is fine: RuntimeError: NCCL error"
    post_text(service, "llama-70b-run11", "node-1", failure + "\n")
    kept = get(service, "/v1/jobs/llama-70b-run11/log")["entries"]
    assert [e["text"] for e in kept if e["kind"] == "line"] == [failure]
    wait_until(
        lambda: any(
            f["id"] == row_id and f["hits"] == 30
            for f in get(service, "/v1/filters", limit=5000)["filters"]
        ),
        30,
        "the job filter's hits stored",
    )
