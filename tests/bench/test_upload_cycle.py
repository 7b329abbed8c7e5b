"""bench/upload_cycle.py runs the writer three ways on their own streams; each way must commit
every line it was sent, round after round, and leave the set-based threshold as it found it.
No timing is asserted."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import upload_cycle
from sqlalchemy import create_engine, text

from diagnoser.ingest import streams


def test_every_way_commits_every_line_and_restores_the_threshold(tmp_path: Path) -> None:
    args = argparse.Namespace(
        streams=12, chunks=2, lines=3, rounds=2, starts_per_s=1e6, chunk_interval_s=0.0
    )
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    spent = asyncio.run(upload_cycle._main(args, url))

    assert set(spent) == {way.name for way in upload_cycle.WAYS}
    assert all(len(rounds) == 2 for rounds in spent.values())
    assert streams.SET_BASED_FROM == upload_cycle.SET_BASED_FROM
    with create_engine(url).connect() as conn:
        lines = conn.execute(text("SELECT sum(lines_received) FROM jobs")).scalar_one()
    # each way: one 3-line chunk per stream to create it, then 2 rounds x 2 chunks x 3 lines
    assert lines == len(upload_cycle.WAYS) * 12 * (3 + 2 * 2 * 3)
