"""The tally gates on the vote share, and early stopping never changes the outcome."""

from __future__ import annotations

import itertools

import pytest

from diagnoser.llm.answer import Abstention, Answer, Fault
from diagnoser.llm.voting import decided, needed, tally
from diagnoser.rules.schema import Action, Category


def vote(category: Category, action: Action, nodes: tuple[str, ...] = ()) -> Answer:
    return Answer(
        failure_type="x",
        category=category,
        fault=Fault.INFRASTRUCTURE,
        culprit_nodes=list(nodes),
        action=action,
        evidence=[1],
        summary="s",
    )


CORDON = vote(Category.HARDWARE, Action.CORDON_NODE_AND_RESTART, ("gpu-3",))
RESTART = vote(Category.NETWORK, Action.RESTART_JOB)
ABSTAIN = Abstention("schema")


def test_unanimous_answers_decide_with_full_confidence() -> None:
    verdict = tally([CORDON] * 5, k=5, min_agreement=0.8)
    assert verdict.decided
    assert verdict.action is Action.CORDON_NODE_AND_RESTART
    assert verdict.culprit_nodes == ("gpu-3",)
    assert verdict.confidence == 1.0


def test_three_to_two_is_below_the_default_threshold() -> None:
    verdict = tally([CORDON] * 3 + [RESTART] * 2, k=5, min_agreement=0.8)
    assert not verdict.decided
    assert verdict.action is Action.ESCALATE
    assert verdict.confidence == pytest.approx(0.6)
    assert verdict.votes == {"hardware/cordon_node_and_restart": 3, "network/restart_job": 2}


def test_abstentions_count_against_the_winner() -> None:
    verdict = tally([RESTART] * 3 + [ABSTAIN] * 2, k=5, min_agreement=0.8)
    assert not verdict.decided
    assert verdict.votes["abstain"] == 2


def test_a_tie_is_inconclusive_even_at_a_low_threshold() -> None:
    verdict = tally([CORDON, RESTART], k=2, min_agreement=0.5)
    assert not verdict.decided


def test_one_outlier_naming_another_node_cordons_nothing_extra() -> None:
    other = vote(Category.HARDWARE, Action.CORDON_NODE_AND_RESTART, ("gpu-3", "gpu-7"))
    verdict = tally([CORDON] * 4 + [other], k=5, min_agreement=0.8)
    assert verdict.culprit_nodes == ("gpu-3",)


def test_cordon_votes_split_over_nodes_do_not_cordon() -> None:
    a = vote(Category.HARDWARE, Action.CORDON_NODE_AND_RESTART, ("gpu-1",))
    b = vote(Category.HARDWARE, Action.CORDON_NODE_AND_RESTART, ("gpu-2",))
    verdict = tally([a, a, b, b], k=4, min_agreement=0.75)
    assert not verdict.decided


def test_needed_rounds_up() -> None:
    assert needed(5, 0.8) == 4
    assert needed(5, 0.7) == 4
    assert needed(3, 0.5) == 2
    assert needed(1, 0.0) == 1


OUTCOMES: list[Answer | Abstention] = [CORDON, RESTART, ABSTAIN]


@pytest.mark.parametrize("min_agreement", [0.5, 0.6, 0.8, 1.0])
def test_early_stop_never_changes_the_outcome(min_agreement: float) -> None:
    k = 5
    for sequence in itertools.product(OUTCOMES, repeat=k):
        full = tally(list(sequence), k, min_agreement)
        for n in range(1, k + 1):
            if decided(list(sequence[:n]), k, min_agreement):
                early = tally(list(sequence[:n]), k, min_agreement)
                assert (early.decided, early.action, early.category) == (
                    full.decided,
                    full.action,
                    full.category,
                ), (sequence, n)
                break


def test_agreeing_first_answers_stop_early() -> None:
    assert decided([CORDON] * 4, k=5, min_agreement=0.8)
    assert not decided([CORDON] * 3, k=5, min_agreement=0.8)
    assert not decided([CORDON, RESTART], k=5, min_agreement=0.8)
    assert decided([CORDON, RESTART, ABSTAIN], k=5, min_agreement=0.8)
