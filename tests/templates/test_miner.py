"""The online template miner: grouping, ids, eviction, state, hostile input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import regex

from diagnoser.templates.miner import MinerConfig, TemplateMiner
from diagnoser.templates.model import Slot


def megatron(step: int, loss: float) -> str:
    return f"iteration {step}/20344 | lm loss {loss:.6f} | lr 3.0E-04 | step:{step}/20344"


def test_lines_differing_only_in_variables_share_one_template() -> None:
    miner = TemplateMiner()
    ids = {miner.add(megatron(step, 2.5 - step / 1e4)) for step in range(1, 500)}
    assert len(ids) == 1
    (view,) = miner.templates()
    assert view.text == "iteration <int>/<int> | lm loss <float> | lr <float> | step:<int>/<int>"
    assert view.slots == (Slot.INT, Slot.INT, Slot.FLOAT, Slot.FLOAT, Slot.INT, Slot.INT)
    assert view.count == 499
    assert (view.first_seen, view.last_seen) == (1, 499)
    assert view.samples == tuple(megatron(s, 2.5 - s / 1e4) for s in range(1, 6))


def test_different_events_get_different_templates() -> None:
    miner = TemplateMiner()
    started = miner.add("[instance: 1] VM Started (Lifecycle Event)")
    stopped = miner.add("[instance: 2] VM Stopped (Lifecycle Event)")
    saved = miner.add("saving checkpoint at iteration 100 to /ckpt/iter_100")
    assert len({started, stopped, saved}) == 3
    assert miner.add("[instance: 3] VM Started (Lifecycle Event)") == started


def test_a_word_that_varies_across_many_lines_becomes_a_slot() -> None:
    miner = TemplateMiner()
    ids = [
        miner.add(f"Invalid user {name} from 10.0.0.{i}")
        for i, name in enumerate(["admin", "test", "oracle", "guest", "webmaster", "postgres"])
    ]
    first = miner.get(ids[0])
    assert first is not None
    assert first.text == "Invalid user <*> from <ip>"
    assert [miner.get(i) for i in ids] == [first] * len(ids)
    assert first.count == 6
    assert miner.match("Invalid user nobody from 10.1.2.3") == first.id


def test_variable_words_glued_to_text_merge_by_similarity() -> None:
    miner = TemplateMiner()
    a = miner.add("Connected to worker host-a.example.org over the fabric link 3")
    b = miner.add("Connected to worker host-b.example.com over the fabric link 4")
    assert miner.get(a) == miner.get(b)
    view = miner.get(a)
    assert view is not None
    assert view.text == "Connected to worker <*> over the fabric link <int>"


def test_a_bracketed_header_field_is_one_value_however_many_words() -> None:
    miner = TemplateMiner()
    head = "2015-10-18 18:01:47,978 INFO"
    a = miner.add(f"{head} [AsyncDispatcher event handler] RackResolver: Resolved h1 to /rack")
    b = miner.add(f"{head} [RMCommunicator Allocator] RackResolver: Resolved h2 to /rack")
    assert miner.get(a) == miner.get(b)
    view = miner.get(a)
    assert view is not None
    assert view.text.endswith(" INFO <*> RackResolver: Resolved <*> to /rack")


def test_match_learns_nothing() -> None:
    miner = TemplateMiner()
    tid = miner.add(megatron(1, 2.0))
    before = miner.templates()
    assert miner.match(megatron(2, 1.9)) == tid
    assert miner.match("a line never seen") is None
    assert miner.templates() == before
    assert miner.lines == 1


def test_templates_are_most_frequent_first() -> None:
    miner = TemplateMiner()
    for i in range(3):
        miner.add(f"rare event {i}")
    for i in range(10):
        miner.add(megatron(i, 1.0))
    assert [v.count for v in miner.templates()] == [10, 3]


def test_the_number_of_templates_is_capped_least_recently_seen_first() -> None:
    miner = TemplateMiner(MinerConfig(max_templates=10))
    keep = miner.add("heartbeat from rank 0")
    gone = miner.add("first event of its kind")
    for i in range(200):
        miner.add("heartbeat from rank 1")
        filler = [f"w{j}x{i}" for j in range(i % 5)]
        miner.add(" ".join(["event", *filler, "kind", "z" * (i + 1)]))
        assert len(miner) <= 10
    assert miner.get(keep) is not None
    assert miner.get(gone) is None
    assert miner.match("first event of its kind") is None


def test_state_round_trips_through_plain_json() -> None:
    miner = TemplateMiner(MinerConfig(max_templates=50, max_samples=2))
    for i in range(300):
        miner.add(megatron(i, 1.0))
        miner.add(f"Invalid user u{'abcdef'[i % 6]}x from 10.0.0.{i % 250}")
        miner.add(f"saving checkpoint {i % 7} took {i}ms")
    state = json.loads(json.dumps(miner.to_json()))
    restored = TemplateMiner.from_json(state)
    assert restored.templates() == miner.templates()
    assert restored.config == miner.config
    assert restored.lines == miner.lines
    for line in (megatron(9999, 0.5), "saving checkpoint 3 took 5ms", "brand new line"):
        assert restored.add(line) == miner.add(line)
    assert restored.to_json() == miner.to_json()


@pytest.mark.parametrize(
    "state",
    [
        {},
        {"version": 99},
        {"version": 1, "config": {"nope": 1}},
        {"version": 1, "config": {}},
        {"version": 1, "config": {"max_templates": -1}},
    ],
)
def test_malformed_state_is_rejected(state: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="state"):
        TemplateMiner.from_json(state)


@pytest.mark.parametrize(
    "bad",
    [{"max_templates": 0}, {"similarity": 0.0}, {"similarity": 1.5}, {"sibling_values": 1}],
)
def test_a_config_that_cannot_work_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        MinerConfig(**bad)


def test_hostile_lines_are_bounded_and_storable() -> None:
    miner = TemplateMiner(MinerConfig(max_line_chars=1000))
    giant = "x " * 500_000
    words = " ".join(f"w{i} a" for i in range(100_000))
    brackets = "[" * 50_000 + "a b" + "]" * 50_000
    lines = [giant, words, brackets, "nul\x00in the middle", "bad \ud800 surrogate \udfff", "", " "]
    for line in lines:
        miner.add(line)
    assert miner.lines == len(lines)
    for view in miner.templates():
        assert all(len(s) <= 1000 for s in view.samples)
        for text in (view.text, *view.samples):
            assert "\x00" not in text
            text.encode("utf-8")
    json.dumps(miner.to_json(), ensure_ascii=False).encode("utf-8")
    assert miner.match("nul\x00in the middle") is not None


def test_ids_are_stable_while_their_template_lives() -> None:
    miner = TemplateMiner()
    tid = miner.add(megatron(1, 1.0))
    for i in range(50):
        miner.add(f"other event number {i} with text")
        assert miner.add(megatron(i + 2, 1.0)) == tid


REAL_LOGS = Path(__file__).resolve().parents[2] / "bench" / "data" / "real-logs"


def test_a_settings_dump_is_one_template_of_name_and_value_slots() -> None:
    """Megatron's argument dump (`  name ..... value`, a different name on each line and dots
    padding it to a column) was one template per setting: 600 novel lines in a first job."""
    text = (REAL_LOGS / "megatron-rl-refit-gloo.log").read_text(encoding="utf-8")
    dump = [line for line in text.splitlines() if regex.fullmatch(r"  \w+ \.{4,} \S+", line)]
    assert len(dump) > 500
    miner = TemplateMiner()
    ids = {miner.add(line) for line in dump}
    assert len(ids) == 1
    view = miner.get(ids.pop())
    assert view is not None
    assert view.text == "  <*> .... <*>"


def test_json_config_pairs_share_templates_by_value_shape() -> None:
    """DeepSpeed prints its JSON config one pair per line: the names are slots; a value with
    its comma is one too; the last pair of an object stays apart (and as it was)."""
    miner = TemplateMiner()
    pairs = ['    "enabled": false, ', '    "profile_step": 1, ', '    "output_file": null, ']
    assert len({miner.add(line) for line in pairs}) == 1
    last = miner.get(miner.add('        "stage": 0'))
    opener = miner.get(miner.add('    "fp16": {'))
    assert last is not None
    assert last.text == '        "stage": <int>'
    assert opener is not None
    assert opener.text == '    "<*>": {'
    view = miner.get(miner.add('    "type": "Adam", '))
    assert view is not None
    assert view.text == '    "<*>": <*>,'


@pytest.mark.parametrize("name", ["Mac", "BGL", "Proxifier"])
def test_the_signature_index_picks_what_comparing_every_template_picks(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large buckets are searched through the signature index; scanning every template of the
    bucket (`_SCAN` past any bucket size) must group every line the same."""
    from diagnoser.templates import miner as miner_module
    from tests.templates.corpus import LOGHUB, read_lines

    lines = read_lines(LOGHUB / name / f"{name}_2k.log")

    def run() -> list[tuple[int, str, int]]:
        miner = TemplateMiner()
        ids = [miner.add(line) for line in lines]
        return [(v.id, v.text, v.count) for tid in ids if (v := miner.get(tid)) is not None]

    indexed = run()
    monkeypatch.setattr(miner_module, "_SCAN", 10**9)
    assert run() == indexed
    monkeypatch.setattr(miner_module, "_SCAN", 0)
    assert run() == indexed
