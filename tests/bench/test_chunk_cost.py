"""bench/chunk_cost.py replays load.py's streams through the app's pipeline: every line sent
is framed and reaches the stages once, in chunks of the rate's size. No timing is asserted."""

from __future__ import annotations

import chunk_cost

from diagnoser.rules import RuleRegistry


def test_the_replay_frames_every_line_once_in_chunks_of_the_rate() -> None:
    work = chunk_cost.chunks(nodes=3, seconds=4, rate=10, seed=1)
    assert len(work) == 12
    assert all(chunk.count(b"\n") == 10 for _, chunk in work)
    assert [node for node, _ in work[:3]] == [0, 1, 2]
    cpu, lines = chunk_cost.run(work, 3, RuleRegistry(chunk_cost.ROOT / "rules"))
    assert lines == 120
    assert cpu > 0
