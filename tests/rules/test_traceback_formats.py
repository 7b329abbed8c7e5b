"""Traceback spellings seen in real training logs, beyond the plain CPython one."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.rules import RuleSet, load_dir, scan_lines

PACK = Path(__file__).resolve().parents[2] / "rules"


@pytest.fixture(scope="module")
def pack() -> RuleSet:
    return load_dir(PACK)


def test_a_module_qualified_lower_case_exception_closes_the_traceback(pack: RuleSet) -> None:
    events = scan_lines(
        pack,
        [
            "Traceback (most recent call last):",
            '  File "/usr/lib/python3.10/socket.py", line 955, in getaddrinfo',
            "    for res in _socket.getaddrinfo(host, port, family, type, proto, flags):",
            "socket.gaierror: [Errno -2] Name or service not known",
        ],
    )
    assert [e.entities.get("exception") for e in events] == ["gaierror"]


def test_rich_boxed_tracebacks_are_assembled(pack: RuleSet) -> None:
    events = scan_lines(
        pack,
        [
            "╭───────────────────── Traceback (most recent call last) ─────────────────────╮",
            "│ /workspace/train.py:91 in train_step                                         │",
            "│                                                                              │",
            "│    90 │   │   │   │   labels = batch['labels']                               │",
            "│ ❱  91 │   │   │   │   mask = batch['attention_mask']                         │",
            "╰──────────────────────────────────────────────────────────────────────────────╯",
            "KeyError: 'attention_mask'",
        ],
    )
    assert [(e.failure_type, e.action.value) for e in events] == [("KeyError", "notify_user")]
    assert any("train.py:91" in line for line in events[0].evidence)
