"""Filters: proposed from templates, validated with recorded reasons, matched as one set."""

from __future__ import annotations

import json
import threading
from functools import cache

import pytest
import regex
from megatron_log import megatron_lines

from diagnoser.rules import hyperscan_db
from diagnoser.templates import filters as filters_module
from diagnoser.templates.compressor import Compressor, CompressorConfig
from diagnoser.templates.filters import (
    SLOT_PATTERNS,
    Filter,
    FilterSet,
    Proposer,
    candidates,
    propose,
)
from diagnoser.templates.matcher import HyperscanMatcher, LiteralChecker, RegexMatcher
from diagnoser.templates.miner import TemplateMiner
from diagnoser.templates.model import Slot, TemplateView
from diagnoser.templates.validation import Validator, digit_blind, hex_blind
from tests.templates.corpus import loghub_datasets, pack, read_lines

MEGATRON = TemplateView(
    id=3,
    text="iteration <int>/<int> | lm loss <float> | lr <float>",
    slots=(Slot.INT, Slot.INT, Slot.FLOAT, Slot.FLOAT),
    count=50,
    first_seen=1,
    last_seen=50,
    samples=(
        "iteration 10/500 | lm loss 2.345 | lr 3.0e-4",
        "iteration 11/500 | lm loss 2.31 | lr 3.0e-4",
    ),
)


def _view(text: str, samples: tuple[str, ...], tid: int = 1) -> TemplateView:
    return TemplateView(tid, text, (), 20, 1, 20, samples)


def test_deterministic_filter_is_anchored_typed_and_fullmatches_its_samples() -> None:
    validator = Validator(pack().rules[0].spec.examples.match)
    pattern = propose(MEGATRON)
    assert pattern.startswith("^")
    assert pattern.endswith("$")
    assert validator.check(pattern, MEGATRON.samples) is None
    matcher = RegexMatcher([pattern])
    assert matcher.match(
        [
            "iteration 12/500 | lm loss 2.2 | lr 2.9e-4",
            "iteration 12/500 | lm loss nan | lr 2.9e-4",  # FLOAT never takes nan
            "iteration x/500 | lm loss 2.2 | lr 2.9e-4",
            "prefix iteration 12/500 | lm loss 2.2 | lr 2.9e-4",
        ]
    ) == [0, None, None, None]


def test_loose_candidate_absorbs_padding_the_template_lost() -> None:
    view = _view("iteration <int>/<int> | loss <float>", ("iteration   100/  500 | loss 2.5",))
    exact, loose = candidates(view)
    validator = Validator()
    assert validator.check(exact, view.samples) is not None
    assert validator.check(loose, view.samples) is None


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"^iteration (", "does not compile"),
        (r"^.*$", "unsupported: `.`"),
        (r"^[^ \t\n]+$", "over-broad"),
        (r"^[a-z]*l[a-z ]*l[a-z ]*o[a-z ]*o[a-z ]*$", "over-broad: matches the generic line"),
        (r"iteration [0-9]+", "not anchored"),
        (r"^(iteration) [0-9]+$", "capturing group"),
        (r"^iteration \d+$", "write the ASCII class out"),
        (r"^iteration[^x]+$", "matches a newline"),
        (r"^iteration (?=[0-9])[0-9]+$", "lookaround"),
        (r"^iteration [0-9]+ done$", "does not fullmatch its sample"),
        (r"^iteration (?:a|aa)+b$", "too slow"),
    ],
)
def test_validation_rejects_with_a_reason(pattern: str, reason: str) -> None:
    samples = ("iteration aab",) if "aa" in pattern else ("iteration 12",)
    found = Validator().check(pattern, samples)
    assert found is not None
    assert reason in found, found


def test_a_filter_that_matches_the_guard_corpus_is_rejected() -> None:
    example = next(
        line
        for rule in pack().rules
        for line in rule.spec.examples.match
        if "No space left on device" in line and "\n" not in line
    )
    miner = TemplateMiner()
    view = miner.get(miner.add(example))
    assert view is not None
    validator = Validator([example])
    problem = validator.check(propose(view), view.samples)
    assert problem is not None
    assert problem.startswith("matches a guarded line")

    seen = Validator()
    seen.remember("worker 3 crashed hard")
    view = _view("worker <int> <*> hard", ("worker 3 idles hard",))
    problem = seen.check(propose(view), view.samples)
    assert problem is not None
    assert "worker 3 crashed hard" in problem


def test_rejections_are_recorded_with_template_and_proposer() -> None:
    filters = FilterSet()
    view = _view("<*> <*>", ("a b", "c d"), tid=9)
    assert filters.propose(view, Validator()) is False
    assert [(r.template_id, r.proposer) for r in filters.rejections] == [
        (9, Proposer.DETERMINISTIC)
    ]
    assert "over-broad" in filters.rejections[0].reason
    assert len(filters) == 0


@cache
def _mined_filters() -> tuple[list[str], list[str]]:
    """Filters proposed from every loghub dataset's templates, and the lines they came from."""
    lines: list[str] = []
    patterns: list[str] = []
    validator = Validator()
    for path in loghub_datasets():
        data = read_lines(path)
        lines += data
        miner = TemplateMiner()
        for line in data:
            miner.add(line)
        for view in miner.templates():
            if view.count < 5:
                continue
            for pattern in candidates(view):
                if validator.check(pattern, view.samples) is None:
                    patterns.append(pattern)
                    break
    return patterns, lines


def test_hyperscan_and_regex_matchers_agree_on_loghub() -> None:
    patterns, every = _mined_filters()
    assert len(patterns) > 200
    lines = every[::3]  # the pure-regex path is slow with hundreds of filters
    lines += ["ünïcode iteration 3", "日本語 " + lines[0], lines[0] + " ü", ""]
    fast = HyperscanMatcher(patterns)
    plain = RegexMatcher(patterns)
    alone = [regex.compile(p) for p in patterns]
    matched = 0
    for start in range(0, len(lines), 2048):
        chunk = lines[start : start + 2048]
        a, b = fast.match(chunk), plain.match(chunk)
        # Overlapping filters may each claim a line: the engines agree on which lines match,
        # and whichever filter each names does fullmatch the line.
        assert [x is None for x in a] == [x is None for x in b]
        for line, x in zip(chunk, a, strict=True):
            if x is not None:
                assert alone[x].fullmatch(line) is not None
        matched += sum(x is not None for x in a)
    assert matched > len(lines) // 3


ITERATION = r"^[ \t]+global[ \t]+batch[ \t]+size:[ \t]+[0-9]+$"
RULER = r"^[ \t]*-{22}[ \t]*$"
"""Two filters of the synthetic Megatron log (shortened): hyperscan 0.9.1 misses the first on
a line that starts 17 bytes or more into the chunk when the second shares its database."""


def test_a_filter_matches_whatever_other_filters_share_the_database() -> None:
    lines = ["x" * 30, " global batch size:  1024"]
    assert HyperscanMatcher([ITERATION]).match(lines) == [None, 0]
    assert HyperscanMatcher([ITERATION, RULER]).match(lines) == [None, 0]
    assert HyperscanMatcher([RULER, ITERATION]).match([*lines, "-" * 22]) == [None, 1, 0]


def test_hyperscan_alone_misses_that_match() -> None:
    """The library behaviour the matcher works around; when a hyperscan release fixes it,
    this fails and the `regex` re-check in `HyperscanMatcher` can go."""
    scanner = hyperscan_db.PatternScanner([(ITERATION.encode(), False), (RULER.encode(), False)])
    data = b"x" * 30 + b"\n global batch size:  1024"
    assert hyperscan_db.PatternScanner([(ITERATION.encode(), False)]).scan(data) == [(56, 0)]
    assert scanner.scan(data) == []


def test_a_second_job_keeps_a_third_of_the_first_with_promotion_on_hyperscan() -> None:
    first_lines = list(megatron_lines(7, 900))
    second_lines = list(megatron_lines(8, 400))[:1000]
    kept: dict[str, tuple[int, int]] = {}
    for engine in ("hyperscan", "regex"):
        compressor = Compressor(pack(), CompressorConfig(promote=True, engine=engine))
        first = compressor.job()
        first_kept = len(first.feed(first_lines[:1000]))
        first.feed(first_lines[1000:2000])
        kept[engine] = (first_kept, len(compressor.job().feed(second_lines)))
    assert kept["hyperscan"] == kept["regex"]
    first_kept, second_kept = kept["hyperscan"]
    assert second_kept * 3 <= first_kept, kept


def test_filter_set_round_trips_through_plain_json() -> None:
    filters = FilterSet()
    assert filters.propose(MEGATRON, Validator(), line_no=120)
    filters.propose(_view("<*> <*>", ("a b",), tid=4), Validator())
    [f] = filters.filters
    filters.disable(f, 130, "iteration 1/2 | lm loss nan | lr 1", "matched a guarded line")
    data = json.loads(json.dumps(filters.to_json()))
    again = FilterSet.from_json(data)
    assert again.to_json() == filters.to_json()
    assert again.filters[0].created_line == 120
    assert not again.filters[0].enabled
    assert again.disabled[0].line_no == 130


def test_disabled_filter_stops_matching_at_once() -> None:
    filters = FilterSet()
    assert filters.propose(MEGATRON, Validator())
    line = "iteration 12/500 | lm loss 2.2 | lr 2.9e-4"
    [f] = filters.match([line])
    assert f is not None
    filters.disable(f, 1, line, "test")
    assert filters.match([line]) == [None]


def test_one_matcher_serves_hundreds_of_filters() -> None:
    filters = FilterSet()
    validator = Validator()
    for i in range(200):
        view = _view(f"worker{i} heartbeat <int> ok", (f"worker{i} heartbeat 12 ok",), tid=i)
        assert filters.propose(view, validator)
    hits = filters.match(["worker7 heartbeat 99 ok", "worker199 heartbeat 1 ok", "other"])
    assert [f.template_id if f else None for f in hits] == [7, 199, None]


def test_skeleton_memo_is_exact_for_filters_with_digits_in_their_text() -> None:
    filters = FilterSet()
    validator = Validator()
    assert filters.propose(_view("python3 worker <int> ok", ("python3 worker 12 ok",)), validator)
    assert filters.propose(_view("comm <hex> nRanks <int>", ("comm 0x1f nRanks 8",), 2), validator)
    lines = [
        "python3 worker 12 ok",
        "python4 worker 12 ok",
        "comm 0x1f nRanks 8",
        "comm 5x1f nRanks 8",
    ]
    for _ in range(3):  # the second and third rounds are served from the memo
        hits = filters.match(lines)
        assert [f.template_id if f else None for f in hits] == [1, None, 2, 2]
    assert digit_blind(filters.filters[1].pattern)
    assert not digit_blind(filters.filters[0].pattern)


def test_skeleton_memo_serves_hex_runs_only_to_filters_blind_to_them() -> None:
    """NCCL lines carry a fresh `comm 0x...` each: the memo looks them up with the run
    blanked, but only for a filter that takes any run in its place; `<int>x<int>` takes
    `0x12` and not `0xab`, which share that key."""
    filters = FilterSet()
    validator = Validator()
    assert filters.propose(_view("size <int>x<int> ok", ("size 1024x768 ok",)), validator)
    assert filters.propose(_view("comm <hex> nRanks <int>", ("comm 0x1f nRanks 8",), 2), validator)
    lines = ["size 0x12 ok", "size 0xab ok", "comm 0x1f nRanks 8", "comm 0xdeadbeef nRanks 8"]
    for _ in range(3):
        hits = filters.match(lines)
        assert [f.template_id if f else None for f in hits] == [1, None, 2, 2]
        lines = [*lines[:2], "comm 0x7f3a00 nRanks 16", "comm 0xface nRanks 8"]
    assert not hex_blind(filters.filters[0].pattern, _ABSORBING)
    assert hex_blind(filters.filters[1].pattern, _ABSORBING)


_ABSORBING = [SLOT_PATTERNS[s] for s in (Slot.HEX, Slot.ANY, Slot.PATH, Slot.DURATION)]


@pytest.mark.parametrize(
    ("template", "blind"),
    [
        ("comm <hex> nRanks <int>", True),
        ("rank<int> at <*> took <duration>", True),
        ("face <hex>", True),  # a word of hex letters alone, apart from the slot
        ("dead<*>", False),  # `dead` may be the tail of a run the slot starts
        ("<*><hex>", False),  # two slots may split one run
        ("<int>x<int>", False),
        ("P2P via <hex>", False),  # a digit in the text: not even digit-blind
    ],
)
def test_hex_blindness_of_proposed_filters(template: str, blind: bool) -> None:
    assert all(hex_blind(p, _ABSORBING) is blind for p in candidates(_view(template, ())))


_RUN = regex.compile(r"(?<![A-Za-z0-9])([0-9])x([0-9a-fA-F]+)(?![A-Za-z0-9])")


def _rehex(line: str) -> str:
    """Every hex run swapped for another of a different length and letters."""
    return _RUN.sub(lambda m: f"{m.group(1)}xa{m.group(2)[::-1]}0", line)


def test_filter_set_with_memo_agrees_with_each_pattern_alone() -> None:
    patterns, every = _mined_filters()
    lines = every[::4]
    lines += [line for line in every if "0x" in line]
    shifted = [line.translate(str.maketrans("0123456789", "1234567890")) for line in lines]
    rehexed = [_rehex(line) for line in lines]
    assert sum(a != b for a, b in zip(lines, rehexed, strict=True)) > 100
    filters = FilterSet()
    filters.filters = [Filter(i + 1, i, "", p) for i, p in enumerate(patterns)]
    alone = [regex.compile(p) for p in patterns]
    unmatched: dict[str, bool] = {}  # each line asked of every pattern once, not every round

    def no_pattern_matches(line: str) -> bool:
        if line not in unmatched:
            unmatched[line] = not any(p.fullmatch(line) for p in alone)
        return unmatched[line]

    for _ in range(2):
        for chunk in (lines, shifted, rehexed):
            for line, f in zip(chunk, filters.match(chunk), strict=True):
                if f is None:
                    assert no_pattern_matches(line), line
                else:
                    assert alone[f.template_id].fullmatch(line), line


def test_a_settings_dump_filter_takes_any_leader_length_and_is_not_broad() -> None:
    miner = TemplateMiner()
    dump = ["  lr ........................ 0.0001", "  seed .......... 1234", "  fp16 .... False"]
    ids = {miner.add(line) for line in dump}
    view = miner.get(ids.pop())
    assert view is not None
    assert not ids
    pattern = propose(view)
    assert Validator().check(pattern, view.samples) is None
    assert regex.fullmatch(pattern, "  bf16 ............................................ True")
    # The leader is what makes it a dump line: no dots, or three, is no match.
    assert not regex.fullmatch(pattern, "  worker killed 9")
    assert not regex.fullmatch(pattern, "  loading ... done")


def test_a_filter_without_a_variable_part_may_have_few_literals() -> None:
    """A lone `}` (JSON config dumps close every object on a line of its own) is one text:
    exact, so not over-broad; a slot with as few literals still is."""
    assert Validator().check(r"^[ \t]*\}[ \t]*$", ("}", "        }")) is None
    assert Validator().check(r"^[ \t]*\},[ \t]*$", ("    }, ",)) is None
    found = Validator().check(r"^[ \t]*\}(?:[^ \t\n]+)[ \t]*$", ("}x",))
    assert found is not None
    assert found.startswith("over-broad")
    # Blank lines stay kept: the empty filter matches a generic probe line.
    assert Validator().check(r"^[ \t]*$", ("",)) is not None


def test_the_literal_checker_answers_as_the_alternation() -> None:
    """Hyperscan's misses are re-checked by `LiteralChecker`, which tries a pattern only on
    lines holding its longest literal text: same answers as the one `regex` alternation."""
    patterns = [
        r"^[ \t]*worker[ \t]+(?:[0-9]+)[ \t]+ready[ \t]*$",
        r"^[ \t]*(?:[^ \t\n]+)[ \t]+ready[ \t]*$",  # overlaps the first: order decides
        r"^(?:[0-9]+)[ \t]+(?:[0-9]+)[ \t]+done$",  # literal text last
        r"(?i)^[ \t]*LOADING[ \t]+(?:[0-9]+)$",  # caseless: tried on every line
        r"^[ \t]*(?:[^ \t\n]+)[ \t]+\.{4,}[ \t]+(?:[^ \t\n]+)[ \t]*$",  # no literal run
    ]
    lines = [
        "worker 3 ready",
        "  worker 12 ready ",
        "gpu ready",
        "1 2 done",
        "loading 5",
        "Loading 7",
        "  lr ......... 0.1",
        "nothing here",
        "",
    ]
    assert LiteralChecker(patterns).match(lines) == RegexMatcher(patterns).match(lines)
    assert LiteralChecker(patterns).match(lines) == [0, 0, 1, 2, 3, 3, 4, None, None]


def test_the_main_tier_is_built_off_the_caller_and_changes_no_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hundreds of filters arrive at once (a family's stored set): the first match does not
    wait for their main tier (a hyperscan compile of up to seconds, which used to stop the
    event loop); the second tier answers meanwhile, and the built tier, once it takes over,
    gives the same answers."""
    patterns, every = _mined_filters()
    held = threading.Event()
    build = filters_module._build

    def held_build(patterns: list[str], engine: str) -> object:
        held.wait(30)
        return build(patterns, engine)

    monkeypatch.setattr(filters_module, "_build", held_build)
    filters = FilterSet(background=True)
    filters.filters = [Filter(i + 1, i, "", p) for i, p in enumerate(patterns)]
    lines = every[::4]
    try:
        while_building = filters.match(lines)  # returns although the build cannot finish
        building = filters._building
        assert building is not None
        assert not building[0].done()
    finally:
        held.set()
    building[0].result(timeout=60)
    built = filters.match(lines)
    assert filters._building is None
    assert len(filters._active) == len(patterns)
    # Filtered or not is the same line for line; of two filters that match one line, the
    # tier that answered decides which is credited.
    assert [f is None for f in while_building] == [f is None for f in built]
    assert sum(f is not None for f in built) > len(lines) // 2
