"""CPU per chunk of `StreamWriter.write`'s read loop, in one process, no HTTP, no stages.

    python bench/writer_loop.py                # 500 uploads x 400 chunks of 10 lines, best of 5

`bench/chunk_cost.py` replays the framer and the pipeline; this one replays what an upload's
chunk meets before them and around them: the writer's loop (idle timeout, offsets, the commit
checks, the commit timer) over an embedded SQLite database, with an empty pipeline. Many
uploads stay open at once, each chunk a turn of the event loop apart, as at `bench/load.py`'s
shape; the commit interval is longer than a run, so the loop is measured without the
per-interval commits (one commit per upload at its end). It reports the CPU microseconds per
chunk of each run (process time), best and median, and the floor: the same bodies read by
tasks that do nothing with them. Run it for two trees in turn
(`PYTHONPATH=<tree>`) for a ratio that the machine's load does not move.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from diagnoser.config import IngestSettings
from diagnoser.ingest.writer import StreamLocks, StreamWriter
from diagnoser.pipeline import Pipeline, StreamKey
from diagnoser.store.database import Sessions, create_service_engine, parse_database_url
from diagnoser.store.migrate import upgrade

LINE = b"[rank3]: step 1200 | loss 2.3412 | lr 3.0e-04 | grad_norm 0.812 | tokens/s 48211\n"


async def _body(chunk: bytes, count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        await asyncio.sleep(0)  # the next chunk arrives in a later turn of the loop
        yield chunk


async def _drain(chunks: AsyncIterator[bytes]) -> int:
    return sum([len(chunk) async for chunk in chunks])


async def _floor(uploads: int, chunks: int, lines: int) -> float:
    """The same bodies read by as many tasks that do nothing with them."""
    chunk = LINE * lines
    start = time.process_time()
    await asyncio.gather(*(_drain(_body(chunk, chunks)) for _ in range(uploads)))
    return time.process_time() - start


async def _run(sessions: Sessions, uploads: int, chunks: int, lines: int, run: int) -> float:
    settings = IngestSettings(commit_every_s=3600.0)
    writer = StreamWriter(sessions, Pipeline([]), settings, StreamLocks())
    chunk = LINE * lines
    keys = [StreamKey(f"job-{run}", f"node-{n:04d}", f"node-{n:04d}", None) for n in range(uploads)]
    for key in keys:  # the streams exist, as for a reconnecting shipper
        await writer.write(key, _body(chunk, 0), offset=None, job_metadata={})
    start = time.process_time()
    outcomes = await asyncio.gather(
        *(writer.write(key, _body(chunk, chunks), offset=None, job_metadata={}) for key in keys)
    )
    spent = time.process_time() - start
    assert all(o.lines_accepted == chunks * lines for o in outcomes), "a line was lost"
    return spent


async def _main(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        db = parse_database_url(f"sqlite:///{Path(tmp) / 'bench.db'}")
        upgrade(db)
        sessions = Sessions(create_service_engine(db), db)
        try:
            floors = [await _floor(args.uploads, args.chunks, args.lines) for _ in range(args.runs)]
            runs = [
                await _run(sessions, args.uploads, args.chunks, args.lines, run)
                for run in range(args.runs)
            ]
            return runs, floors
        finally:
            await sessions.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploads", type=int, default=500)
    parser.add_argument("--chunks", type=int, default=400, help="chunks per upload")
    parser.add_argument("--lines", type=int, default=10, help="lines per chunk")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs, floors = asyncio.run(_main(args))
    for name, spent in (("writer loop", runs), ("floor (read only)", floors)):
        per_chunk = [s * 1e6 / (args.uploads * args.chunks) for s in spent]
        each = " ".join(f"{us:.2f}" for us in per_chunk)
        print(
            f"{name}: {min(per_chunk):.2f} us/chunk best, {statistics.median(per_chunk):.2f} "
            f"median ({each}); {args.uploads} uploads x {args.chunks} chunks of {args.lines} lines"
        )


if __name__ == "__main__":
    main()
