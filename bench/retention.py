"""Retention: database growth per million ingested lines, and how fast a pass prunes it.

    python bench/retention.py                       # about 2-3 minutes, both backends
    python bench/retention.py --lines 400000 --backends sqlite

Per backend (the embedded SQLite file; a throwaway PostgreSQL cluster, started as the suite
starts it), a real `diagnoser serve` on a fresh database, and two shapes of the same number of
benign training-log lines (bench/training_log.py), posted over HTTP by 8 concurrent clients in
bodies of ~64 KiB, each job ending with one Xid 79 line on one node (a diagnosis and a cordon):

* `long jobs`: few jobs with long streams (the compressed log keeps a bounded head and tail
  of each stream, so its size follows streams, not lines);
* `short jobs`: 25x as many jobs of 1/25 the lines.

Growth is the database's used size after ingest minus before, once every replica's kept
lines are flushed (SQLite: (page_count - freelist_count) x page_size; PostgreSQL:
`pg_database_size`), per million lines and per job. Then every job is made old (its
`last_activity_at` and its diagnoses' `updated_at` moved back 400 days) and one pass of
`Pruner` (what `diagnoser prune` runs) deletes it all, with the service's default batch (1000
rows) and pause (50 ms) and, as the peer, with no pause: rows per second over the pass.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
from processes import free_port, wait_for_health
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine, func, select, text, update
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
from diagnoser.store.retention import COMPRESSION, DIAGNOSES, JOBS, Pruner

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
    prune_rows: int
    prune_s: float
    fast_rows: int
    fast_s: float
    used_after: int


@contextlib.contextmanager
def postgres() -> Iterator[str | None]:
    """A throwaway PostgreSQL cluster's URL, or None without the server binaries."""
    from tests.servers import PostgresServer, find_postgres_bin

    if find_postgres_bin("initdb") is None or find_postgres_bin("pg_ctl") is None:
        yield None
        return
    server = PostgresServer()
    try:
        server.init()
        server.start()
        yield server.create_database()
    finally:
        server.destroy()


@contextlib.contextmanager
def service(data: Path, database_url: str | None) -> Iterator[str]:
    """`diagnoser serve` on the embedded SQLite in `data`, or on `database_url`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIAGNOSER_")}
    env |= {"DIAGNOSER_DATA_DIR": str(data), "DIAGNOSER_RULES_WATCH": "false"}
    if database_url is not None:
        env["DIAGNOSER_DB__URL"] = database_url
    log = data / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "diagnoser", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(process, base_url, log, timeout_s=120)
        yield base_url
    finally:
        process.terminate()
        process.wait(30)


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
    queue: asyncio.Queue[tuple[str, str, str]] = asyncio.Queue()
    for j in range(shape.jobs):
        job = f"{shape.name.replace(' ', '-')}-{j}"
        for node in range(NODES):
            left, start = per_stream, 0
            while left > 0:
                body, _ = benign_text(rng, min(BODY_BYTES, left * 150), start)
                body_lines = body.splitlines(keepends=True)[:left]
                left -= len(body_lines)
                start += len(body_lines)
                if left <= 0 and node == 0:
                    body_lines.append(XID79)
                queue.put_nowait((job, f"gpu-node-{node:03d}", "".join(body_lines)))
    committed = 0

    async def client() -> None:
        nonlocal committed
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
            while not queue.empty():
                job, node, body = queue.get_nowait()
                response = await http.post(
                    f"/v1/jobs/{job}/logs", params={"node": node}, content=body.encode()
                )
                response.raise_for_status()
                committed += int(response.json()["lines_accepted"])

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return committed


async def prune_all(db: DatabaseUrl, settings: RetentionSettings) -> tuple[int, float]:
    sessions = Sessions(create_service_engine(db), db)
    try:
        report = await Pruner(sessions, settings).prune()
    finally:
        await sessions.close()
    return report.total, report.seconds


def age(engine: Engine, job_ids: list[str], by: timedelta) -> None:
    """Move these jobs' last activity, and their diagnoses' last update, `by` into the past."""
    past = utcnow() - by
    with engine.begin() as conn:
        conn.execute(update(JOBS).where(JOBS.c.id.in_(job_ids)).values(last_activity_at=past))
        conn.execute(
            update(DIAGNOSES).where(DIAGNOSES.c.job_id.in_(job_ids)).values(updated_at=past)
        )


def run_backend(backend: str, url: str | None, lines: int, shapes: list[Shape]) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
        data = Path(tmp)
        db = parse_database_url(url or f"sqlite:///{data / 'diagnoser.db'}")
        upgrade(db)
        engine = create_sync_engine(db)
        # Pruned data of one shape must not hide in the next shape's growth: one pass each.
        for i, shape in enumerate(shapes):
            with service(data, url) as base_url:
                before = used_bytes(engine)
                flushed_before = flushed_lines(engine)
                committed = asyncio.run(ingest(base_url, shape, lines, seed=i))
                deadline = time.monotonic() + 60
                while flushed_lines(engine) - flushed_before < committed:
                    if time.monotonic() > deadline:
                        raise TimeoutError("kept lines were not flushed within 60 s")
                    time.sleep(0.2)
                growth = used_bytes(engine) - before
            ids = [f"{shape.name.replace(' ', '-')}-{j}" for j in range(shape.jobs)]
            # Half of the jobs pruned with the defaults, the other half with no pause (the peer).
            age(engine, ids[: len(ids) // 2], 2 * OLD)
            age(engine, ids[len(ids) // 2 :], OLD)
            defaults = RetentionSettings(days=1.5 * OLD.days, diagnosis_days=1.5 * OLD.days)
            pruned, seconds = asyncio.run(prune_all(db, defaults))
            fast = RetentionSettings(days=1, diagnosis_days=1, pause_s=0)
            fast_rows, fast_s = asyncio.run(prune_all(db, fast))
            rows.append(
                Row(
                    backend,
                    shape.name,
                    committed,
                    shape.jobs,
                    growth,
                    pruned,
                    seconds,
                    fast_rows,
                    fast_s,
                    used_bytes(engine),
                )
            )
        engine.dispose()
    return rows


def render(console: Console, rows: list[Row]) -> None:
    columns = [
        "backend", "shape", "lines", "jobs", "growth MB / M lines", "growth KB / job",
        "vs SQLite", "prune rows", "rows/s (batch 1000, 50 ms pause)", "rows/s (no pause)",
    ]  # fmt: skip
    sqlite = {r.shape: r.growth for r in rows if r.backend == "sqlite"}
    cells = []
    for r in rows:
        base = sqlite.get(r.shape)
        ratio = f"{r.growth / base:.2f}x" if base else "-"
        cells.append(
            [
                r.backend,
                r.shape,
                f"{r.lines:,}",
                f"{r.jobs:,}",
                f"{r.growth / 1e6 / (r.lines / 1e6):.1f}",
                f"{r.growth / 1e3 / r.jobs:.0f}",
                ratio,
                f"{r.prune_rows + r.fast_rows:,}",
                f"{r.prune_rows / r.prune_s:,.0f}" if r.prune_s else "-",
                f"{r.fast_rows / r.fast_s:,.0f}" if r.fast_s else "-",
            ]
        )
    table = Table(*columns, title="Retention: growth and prune throughput")
    for row in cells:
        table.add_row(*row)
    console.print(table)
    console.print("| " + " | ".join(columns) + " |", markup=False)
    console.print("|" + "|".join("---" if i < 2 else "---:" for i in range(len(columns))) + "|")
    for row in cells:
        console.print("| " + " | ".join(row) + " |", markup=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--lines", type=int, default=200_000, help="lines per shape")
    parser.add_argument("--jobs", type=int, default=4, help="jobs of the long shape")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    shapes = [Shape("long jobs", args.jobs), Shape("short jobs", args.jobs * 25)]
    rows: list[Row] = []
    backends = args.backends.split(",")
    if "sqlite" in backends:
        rows += run_backend("sqlite", None, args.lines, shapes)
    if "postgres" in backends:
        with postgres() as url:
            if url is None:
                console.print("no PostgreSQL binaries: SQLite only", markup=False)
            else:
                rows += run_backend("postgres", url, args.lines, shapes)
    render(console, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
