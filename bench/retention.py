"""Retention: database growth per million ingested lines, and how fast a pass prunes it.

    python bench/retention.py                       # 3-6 minutes, both backends
    python bench/retention.py --lines 400000 --old-jobs 1000 --backends sqlite

Per backend (the embedded SQLite file; a throwaway PostgreSQL cluster, started as the suite
starts it), a real `diagnoser serve` on a fresh database, and two shapes of the same number of
benign training-log lines (bench/training_log.py), posted over HTTP by 8 concurrent clients in
bodies of ~64 KiB, each job ending with one Xid 79 line on one node (a diagnosis and a cordon):

* `long jobs`: few jobs with long streams (the compressed log keeps a bounded head and tail
  of each stream, so its size follows streams, not lines);
* `short jobs`: 25x as many jobs of 1/25 the lines.

Growth is the database's used size after ingest minus before (after a one-job warm-up that
gives every table its first pages), once every kept line is
flushed (SQLite: (page_count - freelist_count) x page_size; PostgreSQL: `pg_database_size`),
per million lines and per job.

Prune throughput: `--old-jobs` finished jobs seeded 400 days idle (4 streams of 50 kept lines,
4 exit events, compression counts, a diagnosis with a culprit and a done cordon: 212 rows a
job), each way on its own fresh database: one pass of `Pruner` (what the service and
`diagnoser prune` run) with the default batch (1000 rows) and pause (50 ms), the same with no
pause, and the peer: one unbatched DELETE per table in a single transaction (fastest, and what
retention must not do: it holds the write lock, so ingest waits, for the whole of it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
from processes import serve, throwaway_postgres
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, delete, func, insert, select, text
from training_log import benign_text

from diagnoser.config import RetentionSettings
from diagnoser.store.database import (
    DatabaseUrl,
    Sessions,
    create_service_engine,
    create_sync_engine,
    parse_database_url,
)
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import utcnow
from diagnoser.store.retention import (
    ACTIONS,
    COMPRESSION,
    CULPRITS,
    DIAGNOSES,
    EVENTS,
    JOBS,
    KEPT_LINES,
    STREAMS,
    Pruner,
    PruneReport,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
"""The suite's PostgreSQL server lives in tests/servers.py."""

XID79 = "[74889.644138] NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.\n"
NODES = 8
BODY_BYTES = 64 * 1024
CLIENTS = 8
OLD = timedelta(days=400)


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    jobs: int


@dataclass(frozen=True, slots=True)
class Row:
    backend: str
    shape: str
    lines: int
    jobs: int
    growth: int


@dataclass(frozen=True, slots=True)
class PruneRow:
    backend: str
    how: str
    rows: int
    seconds: float
    transactions: int


@contextlib.contextmanager
def service(data: Path, database_url: str | None) -> Iterator[str]:
    """`diagnoser serve` on the embedded SQLite in `data`, or on `database_url`."""
    with serve(data, {"DIAGNOSER_RULES_WATCH": "false"}, database_url, timeout_s=120) as url:
        yield url


def used_bytes(engine: Engine) -> int:
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            pages = conn.execute(text("PRAGMA page_count")).scalar_one()
            free = conn.execute(text("PRAGMA freelist_count")).scalar_one()
            size = conn.execute(text("PRAGMA page_size")).scalar_one()
            return int((pages - free) * size)
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())


def flushed_lines(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(select(func.coalesce(func.sum(COMPRESSION.c.lines_in), 0))).scalar_one()
        )


async def ingest(base_url: str, shape: Shape, lines: int, seed: int) -> int:
    """Post `lines` benign lines over `shape.jobs` jobs of NODES streams; lines committed."""
    per_stream = max(1, lines // (shape.jobs * NODES))
    rng = random.Random(seed)
    queue: asyncio.Queue[tuple[str, str, list[str]]] = asyncio.Queue()
    """One stream's bodies, in order: two requests on one stream at once get a 429."""
    for j in range(shape.jobs):
        job = f"{shape.name.replace(' ', '-')}-{j}"
        for node in range(NODES):
            left, start, bodies = per_stream, 0, []
            while left > 0:
                body, _ = benign_text(rng, min(BODY_BYTES, left * 150), start)
                body_lines = body.splitlines(keepends=True)[:left]
                left -= len(body_lines)
                start += len(body_lines)
                if left <= 0 and node == 0:
                    body_lines.append(XID79)
                bodies.append("".join(body_lines))
            queue.put_nowait((job, f"gpu-node-{node:03d}", bodies))
    committed = 0

    async def client() -> None:
        nonlocal committed
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
            while not queue.empty():
                job, node, bodies = queue.get_nowait()
                for body in bodies:
                    response = await http.post(
                        f"/v1/jobs/{job}/logs", params={"node": node}, content=body.encode()
                    )
                    response.raise_for_status()
                    committed += int(response.json()["lines_accepted"])

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return committed


async def prune_all(db: DatabaseUrl, settings: RetentionSettings) -> PruneReport:
    sessions = Sessions(create_service_engine(db), db)
    try:
        return await Pruner(sessions, settings).prune()
    finally:
        await sessions.close()


def seed_old(engine: Engine, jobs: int) -> int:
    """`jobs` finished jobs, 400 days idle: 4 streams of 50 kept lines and one exit event
    each, compression counts, and one diagnosis with a culprit and a done cordon. Rows."""
    past = utcnow() - OLD
    with engine.begin() as conn:
        conn.execute(
            insert(JOBS),
            [{"id": f"old-{j}", "created_at": past, "last_activity_at": past} for j in range(jobs)],
        )
        streams = [(f"old-{j}", f"node-{s}") for j in range(jobs) for s in range(4)]
        conn.execute(
            insert(STREAMS),
            [{"job_id": j, "stream": s, "node": s, "created_at": past, "updated_at": past}
             for j, s in streams],
        )  # fmt: skip
        conn.execute(
            insert(EVENTS),
            [{"job_id": j, "type": "exited", "node": s, "ts": past, "received_at": past}
             for j, s in streams],
        )  # fmt: skip
        conn.execute(
            insert(KEPT_LINES),
            [{"job_id": j, "stream": s, "line_no": n, "kind": "last", "template_id": 1,
              "text": f"[Rank {n % 64}] step={n} loss=2.31{n % 10} lr=3.0e-04 tokens/s=120000"}
             for j, s in streams for n in range(50)],
        )  # fmt: skip
        conn.execute(
            insert(COMPRESSION), [{"job_id": f"old-{j}", "family": "llama"} for j in range(jobs)]
        )
        conn.execute(
            insert(DIAGNOSES),
            [{"id": f"d-{j}", "job_id": f"old-{j}", "status": "diagnosed", "source": "rules",
              "action": "cordon_node_and_restart", "created_at": past, "updated_at": past}
             for j in range(jobs)],
        )  # fmt: skip
        conn.execute(
            insert(CULPRITS), [{"diagnosis_id": f"d-{j}", "node": "node-0"} for j in range(jobs)]
        )
        conn.execute(
            insert(ACTIONS),
            [{"diagnosis_id": f"d-{j}", "job_id": f"old-{j}", "kind": "cordon", "state": "done",
              "idempotency_key": f"k-{j}", "created_at": past, "updated_at": past}
             for j in range(jobs)],
        )  # fmt: skip
    return jobs * (1 + 4 + 4 + 200 + 1 + 1 + 1 + 1)


def one_big_delete(engine: Engine) -> tuple[int, float]:
    """The peer: the same rows, one unbatched DELETE per table in a single transaction (the
    write lock held throughout)."""
    started = time.monotonic()
    idle = select(JOBS.c.id).where(JOBS.c.last_activity_at < utcnow() - timedelta(days=30))
    diagnoses = select(DIAGNOSES.c.id).where(DIAGNOSES.c.job_id.in_(idle))
    rows = 0
    with engine.begin() as conn:
        for table in (KEPT_LINES, EVENTS, STREAMS, COMPRESSION):
            rows += conn.execute(delete(table).where(table.c.job_id.in_(idle))).rowcount
        for table in (CULPRITS, ACTIONS):
            rows += conn.execute(delete(table).where(table.c.diagnosis_id.in_(diagnoses))).rowcount
        rows += conn.execute(delete(DIAGNOSES).where(DIAGNOSES.c.id.in_(diagnoses))).rowcount
        rows += conn.execute(delete(JOBS).where(JOBS.c.id.in_(idle))).rowcount
    return rows, time.monotonic() - started


def run_prune(backend: str, url: str | None, jobs: int) -> list[PruneRow]:
    """Each way of pruning on its own freshly seeded database."""
    out: list[PruneRow] = []
    hows = {
        "Pruner, batch 1000, 50 ms pause (the default)": RetentionSettings(
            days=30, diagnosis_days=90
        ),
        "Pruner, batch 1000, no pause": RetentionSettings(days=30, diagnosis_days=90, pause_s=0),
        "one DELETE per table, one transaction": None,
    }
    for how, settings in hows.items():
        with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
            db = parse_database_url(url_for(url, Path(tmp)))
            upgrade(db)
            engine = create_sync_engine(db)
            seeded = seed_old(engine, jobs)
            if settings is None:
                rows, seconds = one_big_delete(engine)
                out.append(PruneRow(backend, how, rows, seconds, 1))
            else:
                report = asyncio.run(prune_all(db, settings))
                out.append(
                    PruneRow(backend, how, report.total, report.seconds, report.transactions)
                )
            assert out[-1].rows == seeded, (out[-1], seeded)
            engine.dispose()
    return out


def url_for(server: str | None, tmp: Path) -> str:
    """A fresh database: a SQLite file in `tmp`, or a new database on the server."""
    if server is None:
        return f"sqlite:///{tmp / 'diagnoser.db'}"
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server)
    name = f"bench_{os.urandom(6).hex()}"
    with psycopg.connect(
        f"host={url.host} port={url.port} user={url.username} dbname=postgres", autocommit=True
    ) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


def run_backend(backend: str, url: str | None, lines: int, shapes: list[Shape]) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        data = Path(tmp)
        db = parse_database_url(url or f"sqlite:///{data / 'diagnoser.db'}")
        upgrade(db)
        engine = create_sync_engine(db)
        with service(data, url) as base_url:
            # Every table's first pages (PostgreSQL: 8 KiB per table and index) are not growth.
            asyncio.run(ingest(base_url, Shape("warm up", 1), NODES * 100, seed=99))
            for i, shape in enumerate(shapes):
                before = used_bytes(engine)
                flushed_before = flushed_lines(engine)
                committed = asyncio.run(ingest(base_url, shape, lines, seed=i))
                deadline = time.monotonic() + 60
                while flushed_lines(engine) - flushed_before < committed:
                    if time.monotonic() > deadline:
                        raise TimeoutError("kept lines were not flushed within 60 s")
                    time.sleep(0.2)
                growth = used_bytes(engine) - before
                rows.append(Row(backend, shape.name, committed, shape.jobs, growth))
        engine.dispose()
    return rows


def markdown(console: Console, title: str, columns: list[str], cells: list[list[str]]) -> None:
    table = Table(*columns, title=title)
    for row in cells:
        table.add_row(*row)
    console.print(table)
    console.print("| " + " | ".join(columns) + " |", markup=False)
    console.print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(columns))) + "|")
    for row in cells:
        console.print("| " + " | ".join(row) + " |", markup=False)
    console.print()


def render(console: Console, rows: list[Row], prunes: list[PruneRow]) -> None:
    sqlite = {r.shape: r.growth for r in rows if r.backend == "sqlite"}
    markdown(
        console,
        "Growth per million ingested lines",
        ["backend", "shape", "lines", "jobs", "MB / M lines", "KB / job", "vs SQLite"],
        [
            [
                r.backend,
                r.shape,
                f"{r.lines:,}",
                f"{r.jobs:,}",
                f"{r.growth / 1e6 / (r.lines / 1e6):.1f}",
                f"{r.growth / 1e3 / r.jobs:.1f}",
                f"{r.growth / sqlite[r.shape]:.2f}x" if sqlite.get(r.shape) else "-",
            ]
            for r in rows
        ],
    )
    peer = {p.backend: p.rows / p.seconds for p in prunes if p.transactions == 1 and p.seconds}
    markdown(
        console,
        "Prune throughput",
        ["backend", "how", "rows", "transactions", "seconds", "rows/s", "vs one DELETE"],
        [
            [
                p.backend,
                p.how,
                f"{p.rows:,}",
                f"{p.transactions:,}",
                f"{p.seconds:.2f}",
                f"{p.rows / p.seconds:,.0f}" if p.seconds else "-",
                f"{p.rows / p.seconds / peer[p.backend]:.2f}x" if peer.get(p.backend) else "-",
            ]
            for p in prunes
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lines", type=int, default=100_000, help="lines per shape")
    parser.add_argument("--jobs", type=int, default=4, help="jobs of the long shape")
    parser.add_argument("--old-jobs", type=int, default=400, help="jobs seeded for the prune")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    shapes = [Shape("long jobs", args.jobs), Shape("short jobs", args.jobs * 25)]
    rows: list[Row] = []
    prunes: list[PruneRow] = []
    backends = args.backends.split(",")
    if "sqlite" in backends:
        rows += run_backend("sqlite", None, args.lines, shapes)
        prunes += run_prune("sqlite", None, args.old_jobs)
    if "postgres" in backends:
        with throwaway_postgres(own_database=True) as url:
            if url is None:
                console.print("no PostgreSQL binaries: SQLite only", markup=False)
            else:
                rows += run_backend("postgres", url, args.lines, shapes)
                prunes += run_prune("postgres", url, args.old_jobs)
    render(console, rows, prunes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
