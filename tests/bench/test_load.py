"""bench/load.py runs end to end on a tiny cluster, and its checks hold.

Four nodes of two ranks on the embedded service, chunked uploads of half a second: every
stream's committed lines and bytes equal what the driver sent, the storm ends in one cordon of
the node with the Xid line, and the healthy job is not diagnosed. No timing is asserted.
"""

from __future__ import annotations

import load


def test_a_tiny_load_run_commits_every_line_once_and_cordons_the_faulty_node() -> None:
    (result,) = load.main(
        ["--modes", "embedded", "--nodes", "6", "--job-nodes", "3", "--ranks", "2",
         "--interval", "0.25", "--request-s", "0.5", "--seconds", "1", "--warmup-s", "0.5",
         "--fault-node", "1", "--storm-delay-s", "0.2", "--settle-s", "0.5"]
    )  # fmt: skip

    assert result.streams == 6
    assert result.sent_lines > 0
    assert result.mismatched == []
    assert result.undrained == 0
    assert result.committed_lines == result.sent_lines
    assert result.cordons == ["gpu-node-0001"]
    assert result.healthy_diagnoses == 0
