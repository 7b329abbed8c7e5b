"""Retention on real SQLite and PostgreSQL: rows made old by their timestamps, then one pass."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from sqlalchemy import Connection, Table, func, insert, select, update

from diagnoser import cli
from diagnoser.config import RetentionSettings
from diagnoser.store.database import (
    Sessions,
    create_sync_engine,
    parse_database_url,
)
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import utcnow
from diagnoser.store.retention import (
    ACTIONS,
    ACTIVITY,
    COMPRESSION,
    CULPRITS,
    DIAGNOSES,
    ESCALATIONS,
    EVENTS,
    FEEDBACK,
    JOBS,
    KEPT_LINES,
    OWNERS,
    STREAMS,
    Pruner,
)
from tests.conftest import backend_env, run_service
from tests.servers import ServiceProcess

DAY = timedelta(days=1)
RETENTION = RetentionSettings(days=30, diagnosis_days=90, batch_size=3, pause_s=0)
"""A batch of 3 makes every table take several transactions."""


def seed_job(
    conn: Connection, job_id: str, idle_since: datetime, *, streams: int = 2, lines: int = 5
) -> None:
    """A job with its streams, kept lines, events and counts, last active at `idle_since`."""
    conn.execute(
        insert(JOBS).values(
            id=job_id, created_at=idle_since - timedelta(days=1), last_activity_at=idle_since
        )
    )
    for s in range(streams):
        conn.execute(
            insert(STREAMS).values(
                job_id=job_id,
                stream=f"node-{s}",
                node=f"node-{s}",
                committed_offset=100,
                created_at=idle_since,
                updated_at=idle_since,
            )
        )
        conn.execute(
            insert(KEPT_LINES),
            [
                {
                    "job_id": job_id,
                    "stream": f"node-{s}",
                    "line_no": n,
                    "kind": "first",
                    "text": f"step {n}",
                    "template_id": 1,
                }
                for n in range(lines)
            ],
        )
        conn.execute(
            insert(EVENTS).values(
                job_id=job_id,
                type="exited",
                node=f"node-{s}",
                ts=idle_since,
                received_at=idle_since,
            )
        )
    conn.execute(insert(COMPRESSION).values(job_id=job_id, family="llama", updated_at=idle_since))
    # The replicas' lease and activity rows of the job (docs/scale-out.md).
    conn.execute(insert(OWNERS).values(job_id=job_id, owner="replica-a", lease_until=idle_since))
    conn.execute(
        insert(ACTIVITY).values(
            job_id=job_id, replica="replica-a", last_line_at=idle_since, updated_at=idle_since
        )
    )


def seed_diagnosis(conn: Connection, job_id: str, updated: datetime, action_state: str) -> str:
    """A diagnosis of `job_id` last updated at `updated`, with a culprit, feedback, a finished
    escalation and one cordon in `action_state`."""
    diagnosis_id = f"d-{job_id}"
    conn.execute(
        insert(DIAGNOSES).values(
            id=diagnosis_id,
            job_id=job_id,
            status="diagnosed",
            source="rules",
            action="cordon_node_and_restart",
            created_at=updated,
            updated_at=updated,
        )
    )
    conn.execute(insert(CULPRITS).values(diagnosis_id=diagnosis_id, node="node-0"))
    conn.execute(insert(FEEDBACK).values(diagnosis_id=diagnosis_id, kind="confirm", author="me"))
    conn.execute(
        insert(ESCALATIONS).values(
            diagnosis_id=diagnosis_id, job_id=job_id, fingerprint="f", state="done", trace={}
        )
    )
    conn.execute(
        insert(ACTIONS).values(
            diagnosis_id=diagnosis_id,
            job_id=job_id,
            kind="cordon",
            state=action_state,
            idempotency_key=f"cordon:{job_id}",
            created_at=updated,
            updated_at=updated,
        )
    )
    return diagnosis_id


def seed(conn: Connection, now: datetime) -> None:
    seed_job(conn, "finished-healthy", now - 40 * DAY)
    seed_job(conn, "finished-diagnosed", now - 40 * DAY)
    seed_diagnosis(conn, "finished-diagnosed", now - 40 * DAY, "done")
    seed_job(conn, "ancient", now - 120 * DAY)
    seed_diagnosis(conn, "ancient", now - 100 * DAY, "done")
    seed_job(conn, "ancient-in-flight", now - 120 * DAY)
    seed_diagnosis(conn, "ancient-in-flight", now - 100 * DAY, "claimed")
    # Started long ago, still streaming: every row of it is old but the job itself is not.
    seed_job(conn, "live", now - timedelta(hours=1))
    seed_diagnosis(conn, "live", now - 100 * DAY, "done")
    conn.execute(
        update(STREAMS).where(STREAMS.c.job_id == "live").values(created_at=now - 200 * DAY)
    )


def left(conn: Connection) -> dict[str, dict[str, int]]:
    """Rows per table, by job (culprits and feedback by their diagnosis' job)."""
    out: dict[str, dict[str, int]] = {}
    by_job: tuple[Table, ...] = (
        KEPT_LINES,
        EVENTS,
        STREAMS,
        COMPRESSION,
        OWNERS,
        ACTIVITY,
        DIAGNOSES,
        ACTIONS,
        ESCALATIONS,
    )
    for table in by_job:
        query = select(table.c.job_id, func.count()).group_by(table.c.job_id)
        out[table.name] = {row[0]: row[1] for row in conn.execute(query)}
    for table in (CULPRITS, FEEDBACK):
        query = (
            select(DIAGNOSES.c.job_id, func.count())
            .join(table, table.c.diagnosis_id == DIAGNOSES.c.id)
            .group_by(DIAGNOSES.c.job_id)
        )
        out[table.name] = {row[0]: row[1] for row in conn.execute(query)}
    out[JOBS.name] = dict.fromkeys(conn.scalars(select(JOBS.c.id)), 1)
    return out


async def test_a_pass_prunes_idle_jobs_and_keeps_diagnoses_live_jobs_and_actions_in_flight(
    sessions: Sessions,
) -> None:
    await sessions.run(lambda conn: seed(conn, utcnow()))

    report = await Pruner(sessions, RETENTION).prune()

    rows = await sessions.run(left)
    lines = {
        "kept_lines": 10,
        "job_events": 2,
        "log_streams": 2,
        "job_compression": 1,
        "job_owners": 1,
        "job_activity": 1,
    }
    diagnosis = {
        "diagnoses": 1,
        "actions": 1,
        "diagnosis_culprits": 1,
        "diagnosis_feedback": 1,
        "escalations": 1,
    }
    # The live job keeps everything; the others lose their lines whatever their diagnoses.
    for table, n in lines.items():
        assert rows[table] == {"live": n}, table
    # A diagnosis outlives its lines; past its own age it goes, unless an action is in flight.
    for table, n in diagnosis.items():
        expected = {"finished-diagnosed": n, "ancient-in-flight": n, "live": n}
        assert rows[table] == expected, table
    # A job row goes once nothing refers to it.
    assert rows["jobs"] == {"finished-diagnosed": 1, "ancient-in-flight": 1, "live": 1}
    assert report.rows == {
        "kept_lines": 40,
        "job_events": 8,
        "log_streams": 8,
        "job_compression": 4,
        "job_owners": 4,
        "job_activity": 4,
        "diagnoses": 1,
        "actions": 1,
        "diagnosis_culprits": 1,
        "diagnosis_feedback": 1,
        "escalations": 1,
        "jobs": 2,
    }
    assert report.transactions > len(report.rows)  # small batches, not one big delete

    # Nothing left to do; once the claimed action completes, its diagnosis may go.
    assert (await Pruner(sessions, RETENTION).prune()).total == 0
    await sessions.run(
        lambda conn: conn.execute(
            update(ACTIONS).where(ACTIONS.c.job_id == "ancient-in-flight").values(state="done")
        )
    )
    again = await Pruner(sessions, RETENTION).prune()
    assert again.rows["diagnoses"] == again.rows["jobs"] == 1
    assert "ancient-in-flight" not in (await sessions.run(left))["jobs"]


async def test_diagnoses_are_kept_forever_unless_an_age_is_given(sessions: Sessions) -> None:
    await sessions.run(lambda conn: seed(conn, utcnow()))

    report = await Pruner(sessions, RetentionSettings(days=30)).prune()

    assert report.rows["diagnoses"] == report.rows["actions"] == 0
    assert report.rows["kept_lines"] == 40
    jobs = (await sessions.run(left))["jobs"]
    assert set(jobs) == {"finished-diagnosed", "ancient", "ancient-in-flight", "live"}


async def test_retention_is_off_by_default(sessions: Sessions) -> None:
    await sessions.run(lambda conn: seed(conn, utcnow()))
    assert (await Pruner(sessions, RetentionSettings()).prune()).total == 0
    assert len((await sessions.run(left))["jobs"]) == 5


@pytest.mark.parametrize(
    ("days", "diagnosis_days"), [(0, 30), (30, 7)], ids=["no-line-age", "shorter-than-lines"]
)
def test_diagnoses_cannot_be_kept_shorter_than_their_lines(
    days: float, diagnosis_days: float
) -> None:
    with pytest.raises(ValidationError, match="diagnosis_days"):
        RetentionSettings(days=days, diagnosis_days=diagnosis_days)


OLD_JOBS = 60
OLD_LINES = 250
"""Per stream, two streams a job: 30,000 kept lines to prune, 200 per transaction."""


@pytest.fixture(params=["sqlite", "postgres"])
def service_with_old_jobs(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[ServiceProcess]:
    """A service whose database holds many old jobs, pruning them one second after start."""
    env = backend_env(request, tmp_path)
    db = parse_database_url(env.get("DIAGNOSER_DB__URL", f"sqlite:///{tmp_path / 'diagnoser.db'}"))
    upgrade(db)
    engine = create_sync_engine(db)
    with engine.begin() as conn:
        for n in range(OLD_JOBS):
            seed_job(conn, f"old-{n}", utcnow() - 40 * DAY, lines=OLD_LINES)
    engine.dispose()
    env |= {
        "DIAGNOSER_RETENTION__DAYS": "30",
        "DIAGNOSER_RETENTION__INTERVAL_S": "1",
        "DIAGNOSER_RETENTION__BATCH_SIZE": "200",
        "DIAGNOSER_RETENTION__PAUSE_S": "0.01",
    }
    yield from run_service(env)


def samples(service: ServiceProcess) -> dict[str, float]:
    text = httpx.get(f"{service.base_url}/metrics").text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("diagnoser_retention_")
    }


def test_ingest_keeps_answering_while_a_large_prune_runs(
    service_with_old_jobs: ServiceProcess,
) -> None:
    service = service_with_old_jobs
    passes = 'diagnoser_retention_passes_total{outcome="ok"}'
    pruned = 'diagnoser_retention_pruned_rows_total{table="kept_lines"}'
    accepted: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    mid_pass = 0
    deadline = time.monotonic() + 120
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        for n in range(10**6):
            for node in ("node-a", "node-b", "node-c"):
                body = "".join(f"step {n * 100 + i} loss 1.25 on {node}\n" for i in range(100))
                response = client.post(
                    "/v1/jobs/live/logs", params={"node": node}, content=body.encode()
                )
                assert response.status_code == 200, response.text
                assert response.json()["lines_accepted"] == 100
                accepted[node] += 100
                sent[node] += len(body.encode())
            seen = samples(service)
            if seen.get(passes, 0) >= 1:
                break
            mid_pass += seen.get(pruned, 0) > 0
            assert time.monotonic() < deadline, "the retention pass never completed"
    assert mid_pass > 0  # some uploads were acknowledged while the pass was deleting

    # Every old row went; every acknowledged line is committed.
    assert samples(service)[pruned] == OLD_JOBS * 2 * OLD_LINES
    with httpx.Client(base_url=service.base_url, timeout=30) as client:
        streams = client.get("/v1/jobs/live").json()["streams"]
    assert {s["stream"]: s["lines"] for s in streams} == dict(accepted)
    assert {s["stream"]: s["committed_offset"] for s in streams} == dict(sent)


def test_the_cli_prunes_once_and_says_what_went(tmp_path: Path) -> None:
    db = parse_database_url(f"sqlite:///{tmp_path / 'diagnoser.db'}")
    upgrade(db)
    engine = create_sync_engine(db)
    with engine.begin() as conn:
        seed(conn, utcnow())
    engine.dispose()
    runner = CliRunner()
    prune = ["prune", "--data-dir", str(tmp_path)]

    off = runner.invoke(cli.command(), prune, prog_name="diagnoser")
    assert off.exit_code == 2
    assert "retention is off" in off.output

    done = runner.invoke(
        cli.command(), [*prune, "--days", "30", "--diagnosis-days", "90", "--json"]
    )
    assert done.exit_code == 0, done.output
    counts = json.loads(done.output)
    assert counts["rows"]["kept_lines"] == 40
    assert counts["rows"]["diagnoses"] == 1
    assert counts["total"] == sum(counts["rows"].values())
