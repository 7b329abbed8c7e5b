"""Database work per upload of the ingest writer: the position read at its start and its
commits, as thousands of shippers' uploads make them, in one process with no HTTP and no stages.

    python bench/upload_cycle.py                       # SQLite, 1,000 streams, 5 rounds
    python bench/upload_cycle.py --database-url postgresql+psycopg://...

Each round, every stream gets one upload of a few ten-line chunks, the uploads opened at a
steady rate (`--starts-per-s`; 2,000 nodes with 10-second uploads open 200 a second), so
their position reads and commits meet in `PositionGroup` and `CommitGroup` in the groups that
rate makes, with the default one-second commit grid. Three ways are run alternately in the
same process, each on its own streams:

- `per statement`: a stream's compare-and-set as its own UPDATE (how a group was written before
  `streams.SET_BASED_FROM`), every upload reading its position;
- `set-based`: a group's commits as one locking read and one executemany (several replicas);
- `set-based, sole writer`: and no position read for a stream this process committed last
  (the embedded SQLite default, `StreamWriter.sole_writer`).

Reported: CPU microseconds per upload (process time: the event loop and the database thread
together), best and median of the rounds, and the ratio to `per statement`. Then one group of
`--streams` commits in one transaction (`commit_many`, as `CommitGroup` writes a full group),
per statement and set-based alternated: CPU microseconds per commit.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from diagnoser.config import IngestSettings
from diagnoser.ingest import streams
from diagnoser.ingest.streams import Progress, StreamCommit, commit_many, open_stream
from diagnoser.ingest.writer import StreamLocks, StreamWriter
from diagnoser.pipeline import Pipeline, StreamKey
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.migrate import upgrade

LINE = b"[rank3]: step 1200 | loss 2.3412 | lr 3.0e-04 | grad_norm 0.812 | tokens/s 48211\n"


@dataclass(frozen=True)
class Way:
    name: str
    set_based_from: int
    sole_writer: bool


SET_BASED_FROM = streams.SET_BASED_FROM
WAYS = (
    Way("per statement", 10**9, sole_writer=False),
    Way("set-based", SET_BASED_FROM, sole_writer=False),
    Way("set-based, sole writer", SET_BASED_FROM, sole_writer=True),
)


async def _body(chunk: bytes, count: int, interval_s: float) -> AsyncIterator[bytes]:
    for _ in range(count):
        await asyncio.sleep(interval_s)
        yield chunk


async def _round(writer: StreamWriter, keys: list[StreamKey], args: argparse.Namespace) -> float:
    """Uploads start at `--starts-per-s`, as a fleet's shippers open them; CPU of the round."""
    chunk = LINE * args.lines
    loop = asyncio.get_running_loop()
    start, began = time.process_time(), loop.time()
    uploads = []
    for n, key in enumerate(keys):
        due = began + n / args.starts_per_s
        if (wait := due - loop.time()) > 0:
            await asyncio.sleep(wait)
        body = _body(chunk, args.chunks, args.chunk_interval_s)
        uploads.append(asyncio.create_task(writer.write(key, body, offset=None, job_metadata={})))
    outcomes = await asyncio.gather(*uploads)
    spent = time.process_time() - start
    assert all(o.lines_accepted == args.chunks * args.lines for o in outcomes), "a line was lost"
    return spent


async def _main(args: argparse.Namespace, url: str) -> dict[str, list[float]]:
    db = parse_database_url(url)
    upgrade(db)
    sessions = Sessions(create_service_engine(db, pool_size=4), db)
    settings = IngestSettings()
    spent: dict[str, list[float]] = {way.name: [] for way in WAYS}
    try:
        writers, keys = {}, {}
        for n, way in enumerate(WAYS):
            writers[way.name] = StreamWriter(
                sessions, Pipeline([]), settings, StreamLocks(), sole_writer=way.sole_writer
            )
            keys[way.name] = [
                StreamKey(f"job-{n}-{j % 50}", f"node-{j:04d}", f"node-{j:04d}", None)
                for j in range(args.streams)
            ]
            first = argparse.Namespace(**{**vars(args), "chunks": 1, "starts_per_s": 1e9})
            await _round(writers[way.name], keys[way.name], first)  # the streams exist
        for _ in range(args.rounds):
            for way in WAYS:
                streams.SET_BASED_FROM = way.set_based_from
                spent[way.name].append(await _round(writers[way.name], keys[way.name], args))
        return spent
    finally:
        streams.SET_BASED_FROM = SET_BASED_FROM
        await sessions.close()


async def _group_commits(url: str, count: int, rounds: int) -> dict[str, list[float]]:
    """CPU per commit of one full group, per statement and set-based, alternated."""
    db = parse_database_url(url)
    sessions = Sessions(create_service_engine(db, pool_size=4), db)
    ways = {"per statement": 10**9, "set-based": SET_BASED_FROM}
    spent: dict[str, list[float]] = {name: [] for name in ways}
    try:
        ids = await sessions.run(
            lambda conn: [
                open_stream(conn, "job-group", f"g-{n:05d}", f"g-{n:05d}", None, {}).stream_id
                for n in range(count)
            ]
        )
        offset = 0
        for _ in range(rounds):
            for name, threshold in ways.items():
                batch = [
                    StreamCommit("job-group", i, Progress(offset, offset + 800, 10, 0)) for i in ids
                ]
                streams.SET_BASED_FROM = threshold
                start = time.process_time()
                won = await sessions.run(functools.partial(commit_many, commits=batch))
                spent[name].append((time.process_time() - start) / count)
                assert all(won), "a commit was refused"
                offset += 800
        return spent
    finally:
        streams.SET_BASED_FROM = SET_BASED_FROM
        await sessions.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000, help="uploads per round")
    parser.add_argument("--chunks", type=int, default=3, help="chunks per upload")
    parser.add_argument("--lines", type=int, default=10, help="lines per chunk")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--starts-per-s", type=float, default=200.0, help="uploads opened per second"
    )
    parser.add_argument("--chunk-interval-s", type=float, default=0.2)
    parser.add_argument("--database-url", help="default: a new SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        spent = asyncio.run(_main(args, url))
        grouped = asyncio.run(_group_commits(url, args.streams, args.rounds))
    base = statistics.median(spent[WAYS[0].name])
    print(
        f"{args.streams} uploads a round, {args.starts_per_s:g} opened per s, each "
        f"{args.chunks} chunks of {args.lines} lines {args.chunk_interval_s:g} s apart; "
        f"{args.rounds} rounds, {url.split(':', 1)[0]}"
    )
    print("| way | CPU us per upload, best | median | vs per statement |")
    print("|---|---:|---:|---:|")
    for way in WAYS:
        per = [s * 1e6 / args.streams for s in spent[way.name]]
        median = statistics.median(spent[way.name])
        print(
            f"| {way.name} | {min(per):,.1f} | {statistics.median(per):,.1f} | "
            f"{median / base:.2f}x |"
        )

    print(f"\none group of {args.streams} commits in one transaction, {args.rounds} rounds")
    print("| way | CPU us per commit, best | median | vs per statement |")
    print("|---|---:|---:|---:|")
    base = statistics.median(grouped["per statement"])
    for name, each in grouped.items():
        print(
            f"| {name} | {min(each) * 1e6:,.1f} | {statistics.median(each) * 1e6:,.1f} | "
            f"{statistics.median(each) / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
