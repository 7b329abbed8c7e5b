"""Suggested rules: counted per job, built from the root line, mapped to the schema, checked."""

from __future__ import annotations

import regex

from diagnoser.llm.suggestions import Resolution, Suggestion, alone, pattern_of, suggest
from diagnoser.rules.learned import snippet
from diagnoser.rules.registry import scan_lines
from diagnoser.rules.ruleset import RuleSet

FLUX = "[rank0]: FluxCapacitorError: the flux capacitor drifted out of phase by 3 degrees"


def resolved(
    line: str = FLUX,
    jobs: int = 3,
    category: str = "user_code",
    action: str = "notify_user",
    failure_type: str = "flux_capacitor_drift",
    first: int = 0,
    **extra: object,
) -> list[Resolution]:
    return [
        Resolution(
            f"d{first + n}",
            f"job-{first + n}",
            line,
            category,
            action,
            failure_type,
            summary="It drifted.",
            **extra,  # type: ignore[arg-type]
        )
        for n in range(jobs)
    ]


def fires(suggested: Suggestion, line: str) -> bool:
    rule = suggested.rule
    ruleset = RuleSet([("learned.yaml", alone(rule))], "test")
    return any(e.rule_id == rule.id for e in scan_lines(ruleset, [line]))


def test_a_failure_resolved_alike_on_three_jobs_is_suggested_as_a_valid_rule() -> None:
    offered, withheld = suggest(resolved(), after=3, min_share=0.8)
    assert withheld == []
    [suggestion] = offered
    rule = suggestion.rule
    assert suggestion.jobs == 3
    assert rule.failure_type == "{exception}", "flux_capacitor_drift is not in the taxonomy"
    assert (rule.category.value, rule.action.value, rule.scope.value) == (
        "user_code",
        "notify_user",
        "job",
    )
    assert rule.examples.match == (FLUX,)
    assert fires(
        suggestion,
        "[rank7]: FluxCapacitorError: the flux capacitor drifted out of phase by 12 degrees",
    )
    assert fires(
        suggestion, "mod.FluxCapacitorError: the flux capacitor drifted out of phase by 1.5 degrees"
    )
    assert not fires(suggestion, "FluxCapacitorError: the flux capacitor is fine")
    assert "learned_" in snippet(rule)


def test_fewer_jobs_than_the_threshold_suggest_nothing_and_a_job_counts_once() -> None:
    assert suggest(resolved(jobs=2), after=3, min_share=0.8) == ([], [])
    again = [*resolved(jobs=2), Resolution("d9", "job-0", FLUX, "user_code", "notify_user", "x")]
    assert suggest(again, after=3, min_share=0.8) == ([], [])


def test_lines_that_differ_only_in_numbers_and_prefixes_are_one_failure() -> None:
    lines = [
        FLUX,
        "[default3]: FluxCapacitorError: the flux capacitor drifted out of phase by 40 degrees",
        "2026-12-01T10:00:00Z " + FLUX.removeprefix("[rank0]: ").replace("3", "7"),
    ]
    mixed = [
        Resolution(f"d{n}", f"job-{n}", line, "user_code", "notify_user", "x")
        for n, line in enumerate(lines)
    ]
    [suggestion], _ = suggest(mixed, after=3, min_share=0.8)
    assert suggestion.jobs == 3
    assert len(suggestion.rule.examples.match) == 3


def test_a_type_of_the_taxonomy_is_kept_when_its_category_agrees() -> None:
    line = "[rank3]: watchdog found collective 812 stuck for 600000 ms on comm 0x7f3a2c"
    offered, _ = suggest(
        resolved(line, category="network", action="restart_job", failure_type="NCCL_Timeout"),
        after=3,
        min_share=0.8,
    )
    [suggestion] = offered
    assert suggestion.rule.failure_type == "nccl_timeout"
    assert fires(
        suggestion, "[rank9]: watchdog found collective 3 stuck for 1800000 ms on comm 0xdead"
    )


def test_a_type_outside_the_taxonomy_without_an_exception_line_is_withheld() -> None:
    line = "kernel: flux driver lost sync with the capacitor on bus 3"
    offered, [withheld] = suggest(
        resolved(line, category="hardware", action="restart_job", failure_type="flux_desync"),
        after=3,
        min_share=0.8,
    )
    assert offered == []
    assert "not a hardware type of the taxonomy" in withheld.reason
    mismatched = resolved(
        line, category="storage", action="restart_job", failure_type="nccl_timeout"
    )
    assert suggest(mismatched, after=3, min_share=0.8)[0] == [], "nccl_timeout is not storage"


def test_verdicts_that_disagree_are_withheld_and_a_person_counts_against_them() -> None:
    split = resolved(jobs=3) + resolved(
        action="restart_job", category="framework", jobs=2, first=10
    )
    offered, [withheld] = suggest(split, after=3, min_share=0.8)
    assert offered == []
    assert "disagree" in withheld.reason
    person = Resolution("d99", "job-99", FLUX, "framework", "restart_job", "x", by_person=True)
    overridden = [*resolved(jobs=3), person]
    assert suggest(overridden, after=3, min_share=0.8)[0] == [], "3 of 4 is below 0.8"


def test_a_looser_action_than_the_types_default_says_why() -> None:
    line = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus on flux node"
    [suggestion], _ = suggest(
        resolved(
            line, category="hardware", action="restart_job", failure_type="gpu_fallen_off_bus"
        ),
        after=3,
        min_share=0.8,
    )
    assert suggestion.rule.action_reason is not None


def test_a_cordon_is_a_node_scoped_critical_rule() -> None:
    line = "NVRM: flux capacitor uncorrectable fault on GPU 0000:3b:00.0"
    [suggestion], _ = suggest(
        resolved(
            line,
            category="hardware",
            action="cordon_node_and_restart",
            failure_type="gpu_xid_fatal",
            culprit_nodes=("gpu-1",),
        ),
        after=3,
        min_share=0.8,
    )
    assert (suggestion.rule.scope.value, suggestion.rule.severity.value) == ("node", "critical")


def test_log_text_never_becomes_regex_syntax() -> None:
    line = "BadThing happened: (a+)+$ [x]{2} .* | ^ \\d failed"
    found = pattern_of(line)
    assert found is not None
    compiled = regex.compile(found.pattern)
    assert compiled.search(line)
    assert not compiled.search("BadThing happened: aaaa x failed")


def test_a_redacted_secret_becomes_a_slot() -> None:
    found = pattern_of("upload to store failed: auth [REDACTED:openai_key] rejected with 403")
    assert found is not None
    assert regex.search(
        found.pattern, "upload to store failed: auth sk-abcdefghijklmnopqrstuvwx rejected with 401"
    )


def test_a_line_with_too_little_literal_text_yields_no_rule() -> None:
    assert pattern_of("Error: 12 34 56") is None
    assert suggest(resolved("[rank0]: Err 1: 2"), after=3, min_share=0.8) == ([], [])
