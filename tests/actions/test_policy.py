"""The action policy, table-tested: pure functions of (history, plan, config, now)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from diagnoser.actions.kinds import ActionKind, ActionState, Audience
from diagnoser.actions.plans import DiagnosisFacts, plan
from diagnoser.actions.policy import (
    History,
    Judged,
    PastAction,
    PolicyConfig,
    Rule,
    evaluate,
    judge,
)
from diagnoser.config import ActionSettings

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LIVE = PolicyConfig(dry_run=False, verify_failure_types=("nccl_timeout",))


def facts(
    job: str = "train-1",
    action: str = "cordon_node_and_restart",
    culprits: tuple[str, ...] = ("node-3",),
    **more: object,
) -> DiagnosisFacts:
    return DiagnosisFacts(
        id=f"d-{job}",
        job_id=job,
        action=action,
        failure_type=str(more.pop("failure_type", "gpu_fallen_off_bus")),
        culprit_nodes=culprits,
        summary="GPU fell off the bus",
        **more,  # type: ignore[arg-type]
    )


def past(
    kind: ActionKind,
    minutes_ago: float,
    node: str | None = None,
    job: str = "train-1",
    state: ActionState = ActionState.DONE,
    escalation: str | None = None,
) -> PastAction:
    return PastAction(
        kind, job, state, NOW - timedelta(minutes=minutes_ago), node, escalation, id=7
    )


def rules(judged: list[Judged]) -> list[tuple[str, str]]:
    return [(j.action.kind.value, j.verdict.rule.value) for j in judged]


def test_the_plan_cordons_each_culprit_then_restarts_after_them() -> None:
    planned = plan(facts(culprits=("node-3", "node-5", "node-3")))
    assert [(p.kind, p.node) for p in planned] == [
        (ActionKind.CORDON_NODE, "node-3"),
        (ActionKind.CORDON_NODE, "node-5"),
        (ActionKind.RESTART_JOB, None),
    ]
    assert planned[2].depends_on == (planned[0].key, planned[1].key)
    assert planned[0].target["taint_key"] == "diagnoser.io/faulty"
    assert planned[0].target["taint_value"] == "gpu_fallen_off_bus"
    assert planned[0].key == "cordon_node:node-3:d-train-1"


@pytest.mark.parametrize(
    ("action", "audience"), [("notify_user", Audience.USER), ("escalate", Audience.ONCALL)]
)
def test_people_are_notified_with_their_audience(action: str, audience: Audience) -> None:
    (planned,) = plan(facts(action=action, evidence=("line 1", "line 2")))
    assert planned.kind is ActionKind.NOTIFY
    assert planned.target["audience"] == audience.value
    assert planned.target["evidence"] == ["line 1", "line 2"]


def test_a_page_carries_what_the_notifier_routes_by() -> None:
    """Destinations match on the job's family and namespace (docs/notify.md)."""
    (planned,) = plan(
        facts(action="notify_user", culprits=(), namespace="ml", family="llama", checkpoint_step=7)
    )
    assert planned.target["family"] == "llama"
    assert planned.target["namespace"] == "ml"
    assert planned.target["action"] == "notify_user"
    assert planned.target["resume_from_step"] == 7


def test_an_interconnect_failure_without_culprit_verifies_the_nodes_first() -> None:
    suspicion = facts(
        culprits=(), failure_type="nccl_timeout", job_nodes=("n1", "n0", "n2"), namespace="ml"
    )
    check, again = plan(suspicion, ["nccl_timeout"])
    assert check.kind is ActionKind.VERIFY_NODES
    assert check.target == {"nodes": ["n0", "n1", "n2"], "namespace": "ml"}
    assert again.kind is ActionKind.RESTART_JOB
    assert again.depends_on == (check.key,)
    (only,) = plan(replace(suspicion, failure_type="cuda_oom"), ["nccl_timeout"])
    assert only.kind is ActionKind.RESTART_JOB


def test_a_restart_carries_the_job_metadata_and_the_checkpoint() -> None:
    (planned,) = plan(
        facts(
            action="restart_job",
            culprits=(),
            namespace="ml",
            workload_kind="PyTorchJob",
            workload_name="train-1",
            checkpoint_step=1200,
        )
    )
    assert planned.target == {
        "namespace": "ml",
        "workload_kind": "PyTorchJob",
        "name": "train-1",
        "resume_from_step": 1200,
    }


def test_storm_of_100_faulty_nodes_of_200_cordons_the_cap_and_pages_once() -> None:
    """100 jobs, each on its own node, report hardware faults within a minute."""
    config = LIVE
    history = History(known_nodes=200)
    outcomes: list[tuple[str, str]] = []
    for i in range(100):
        at = NOW + timedelta(seconds=i * 0.6)
        one = facts(job=f"job-{i}", culprits=(f"node-{i}",))
        judged = judge(plan(one), one, history, config, at)
        outcomes += rules(judged)
        for j in judged:
            state = ActionState.PENDING if j.verdict.allowed else ActionState.SUPPRESSED
            history = history.adding(
                PastAction(
                    j.action.kind, j.action.job_id, state, at, j.action.node, j.action.escalation
                )
            )
    cordons = [rule for kind, rule in outcomes if kind == "cordon_node"]
    assert cordons.count("released") == 20  # 10% of 200
    assert cordons.count("blast_radius") == 80
    escalations = [a for a in history.actions if a.escalation == Rule.BLAST_RADIUS]
    assert len(escalations) == 1
    # Restarts are not node actions: each job still restarts (away from cordoned nodes).
    assert [rule for kind, rule in outcomes if kind == "restart_job"] == ["released"] * 100


def test_the_cap_is_at_least_one_node() -> None:
    history = History(known_nodes=3, actions=(past(ActionKind.CORDON_NODE, 5, "node-1"),))
    one = facts(culprits=("node-2",))
    assert evaluate(plan(one)[0], history, LIVE, NOW).rule is Rule.BLAST_RADIUS
    assert evaluate(plan(one)[0], History(known_nodes=3), LIVE, NOW).rule is Rule.RELEASED


def test_the_blast_radius_window_slides() -> None:
    older = tuple(past(ActionKind.CORDON_NODE, 61, f"node-{i}") for i in range(20))
    cordon = plan(facts(culprits=("node-99",)))[0]
    slid = evaluate(cordon, History(actions=older, known_nodes=200), LIVE, NOW)
    assert slid.rule is Rule.RELEASED
    inside = tuple(replace(a, created_at=NOW - timedelta(minutes=59)) for a in older)
    held = evaluate(cordon, History(actions=inside, known_nodes=200), LIVE, NOW)
    assert held.rule is Rule.BLAST_RADIUS


def test_a_tripped_breaker_pages_once_per_trip_not_per_diagnosis() -> None:
    full = tuple(past(ActionKind.CORDON_NODE, 1, f"node-{i}") for i in range(20))
    paged = (*full, past(ActionKind.NOTIFY, 2, escalation=Rule.BLAST_RADIUS))
    one = facts(culprits=("node-50",))
    first = judge(plan(one), one, History(actions=full, known_nodes=200), LIVE, NOW)
    again = judge(plan(one), one, History(actions=paged, known_nodes=200), LIVE, NOW)
    assert [j.action.escalation for j in first].count(Rule.BLAST_RADIUS) == 1
    assert [j.action.escalation for j in again].count(Rule.BLAST_RADIUS) == 0


@pytest.mark.parametrize(
    ("earlier", "rule"),
    [
        (past(ActionKind.CORDON_NODE, 60 * 24, "node-3", state=ActionState.PENDING), "duplicate"),
        (past(ActionKind.CORDON_NODE, 5, "node-3", state=ActionState.CLAIMED), "duplicate"),
        (past(ActionKind.CORDON_NODE, 5, "node-3"), "duplicate"),
        (past(ActionKind.CORDON_NODE, 30, "node-3"), "cooldown"),
        (past(ActionKind.UNCORDON_NODE, 30, "node-3"), "cooldown"),
        (past(ActionKind.CORDON_NODE, 90, "node-3"), "released"),
        (past(ActionKind.CORDON_NODE, 5, "node-3", state=ActionState.CANCELLED), "released"),
        (past(ActionKind.CORDON_NODE, 5, "node-4"), "released"),
    ],
)
def test_dedupe_and_cooldown_per_node(earlier: PastAction, rule: str) -> None:
    cordon = plan(facts())[0]
    verdict = evaluate(cordon, History(actions=(earlier,), known_nodes=100), LIVE, NOW)
    assert verdict.rule.value == rule


@pytest.mark.parametrize(
    ("minutes_ago", "rule", "wait_minutes"),
    [
        ((), "released", None),
        ((30,), "released", None),  # one minute after a restart 30 minutes ago: no wait
        ((0.5,), "released", 0.5),  # the second restart waits out the first backoff
        ((10, 0.5), "released", 1.5),  # the third waits twice as long
        ((50, 40, 30), "restart_budget", None),
        ((70, 40, 1), "released", 1.0),  # the first fell out of the hour: the third waits 2
    ],
)
def test_restart_budget_and_backoff_per_job(
    minutes_ago: tuple[float, ...], rule: str, wait_minutes: float | None
) -> None:
    history = History(actions=tuple(past(ActionKind.RESTART_JOB, m) for m in minutes_ago))
    again = plan(facts(action="restart_job", culprits=()))[0]
    verdict = evaluate(again, history, LIVE, NOW)
    assert verdict.rule.value == rule
    expected = NOW + timedelta(minutes=wait_minutes) if wait_minutes else None
    assert verdict.not_before == expected


def test_an_open_restart_of_the_job_is_a_duplicate() -> None:
    history = History(actions=(past(ActionKind.RESTART_JOB, 1, state=ActionState.PENDING),))
    again = plan(facts(action="restart_job", culprits=()))[0]
    assert evaluate(again, history, LIVE, NOW).rule is Rule.DUPLICATE


def test_past_the_restart_budget_on_call_is_paged_once_per_job_and_hour() -> None:
    spent = tuple(past(ActionKind.RESTART_JOB, m) for m in (50, 40, 30))
    one = facts(action="restart_job", culprits=())
    judged = judge(plan(one), one, History(actions=spent), LIVE, NOW)
    assert rules(judged) == [("restart_job", "restart_budget"), ("notify", "released")]
    assert judged[1].action.target["audience"] == "oncall"
    paged = (*spent, past(ActionKind.NOTIFY, 10, escalation=Rule.RESTART_BUDGET))
    assert rules(judge(plan(one), one, History(actions=paged), LIVE, NOW)) == [
        ("restart_job", "restart_budget")
    ]


def test_dry_run_records_what_would_run_without_releasing_it() -> None:
    one = facts()
    judged = judge(plan(one), one, History(known_nodes=100), PolicyConfig(), NOW)
    assert rules(judged) == [("cordon_node", "dry_run"), ("restart_job", "dry_run")]
    assert all(j.verdict.allowed and not j.verdict.released for j in judged)


@pytest.mark.parametrize(
    ("config", "history", "expected"),
    [
        (replace(LIVE, opt_out_nodes=frozenset({"node-3"})), History(), "opt_out"),
        (LIVE, History(opted_out_nodes=frozenset({"node-3"})), "opt_out"),
        (replace(LIVE, opt_out_jobs=frozenset({"train-1"})), History(), "opt_out"),
        (LIVE, History(opted_out_jobs=frozenset({"train-1"})), "opt_out"),
        (LIVE, History(opted_out_nodes=frozenset({"node-9"})), "released"),
    ],
)
def test_opt_outs_by_setting_and_by_api(
    config: PolicyConfig, history: History, expected: str
) -> None:
    cordon = plan(facts())[0]
    assert evaluate(cordon, replace(history, known_nodes=100), config, NOW).rule.value == expected


def test_a_job_opt_out_still_lets_people_be_told() -> None:
    config = replace(LIVE, opt_out_jobs=frozenset({"train-1"}))
    note = plan(facts(action="notify_user"))[0]
    assert evaluate(note, History(), config, NOW).rule is Rule.RELEASED


@pytest.mark.parametrize(
    ("confidence", "cordon_rule"), [(0.6, "low_agreement"), (0.8, "released"), (1.0, "released")]
)
def test_llm_node_actions_need_the_agreement_threshold(confidence: float, cordon_rule: str) -> None:
    one = facts(source="llm", confidence=confidence)
    judged = judge(plan(one), one, History(known_nodes=100), LIVE, NOW)
    assert rules(judged) == [("cordon_node", cordon_rule), ("restart_job", "released")]


def test_the_config_reads_the_settings_and_the_llm_threshold() -> None:
    settings = ActionSettings(
        dry_run=False, blast_radius_percent=50, opt_out_nodes=["n1"], cooldown_s=60
    )
    config = PolicyConfig.from_settings(settings, min_agreement=0.9)
    assert not config.dry_run
    assert config.cap(10) == 5
    assert config.opt_out_nodes == {"n1"}
    assert config.cooldown == timedelta(minutes=1)
    assert config.min_agreement == 0.9
