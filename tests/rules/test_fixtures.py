"""The pack over realistic multi-line logs from public issues (tests/fixtures/logs/README.md)."""

from __future__ import annotations

import pytest

from diagnoser.rules import Action, RuleSet, scan_lines
from tests.rules.conftest import FIXTURES_DIR


def _table() -> list[tuple[str, str, str, bool]]:
    rows = []
    for line in (FIXTURES_DIR / "README.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].endswith(".log"):
            rows.append((cells[0], cells[2], cells[3], cells[4] == "yes"))
    return rows


ROWS = _table()


def test_every_fixture_is_documented() -> None:
    documented = {row[0] for row in ROWS}
    on_disk = {p.name for p in FIXTURES_DIR.glob("*.log")}
    assert documented == on_disk
    assert len(on_disk) >= 15


@pytest.mark.parametrize(
    ("name", "failure_type", "action", "cordon"), ROWS, ids=[r[0] for r in ROWS]
)
def test_fixture_diagnosis(
    pack: RuleSet, name: str, failure_type: str, action: str, cordon: bool
) -> None:
    lines = (FIXTURES_DIR / name).read_text(encoding="utf-8").splitlines()
    events = scan_lines(pack, lines)
    if failure_type == "healthy":
        assert events == []
        return
    found = {(e.failure_type, e.action.value) for e in events}
    assert (failure_type, action) in found, found
    cordons = [e for e in events if e.action is Action.CORDON_NODE_AND_RESTART]
    assert bool(cordons) is cordon, [e.rule_id for e in cordons]
