"""Apply rules' declared relations (`symptom_of`, `overrides`) to a job's events.

The diagnosis stage decides culprits; this only answers, from the pack's own declarations,
which events are symptoms of which others and which actions are superseded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from diagnoser.rules.events import RuleEvent
from diagnoser.rules.ruleset import RuleSet
from diagnoser.rules.schema import Relation


@dataclass(frozen=True, slots=True)
class Relations:
    symptom_of: dict[int, int] = field(default_factory=dict)
    """Event index -> index of an event it is a symptom of (e.g. a timeout of an Xid 79)."""
    overridden_by: dict[int, int] = field(default_factory=dict)
    """Event index -> index of the event whose stated action replaces its own (Xid 154)."""


def _names(relation: Relation, event: RuleEvent) -> bool:
    return (
        event.rule_id in relation.rules
        or event.failure_type in relation.failure_types
        or event.category in relation.categories
    )


def relate(events: Sequence[RuleEvent], ruleset: RuleSet) -> Relations:
    """Symptoms point at the first other event their rule names; overrides need the same node
    (and the same GPU when both events name a `pci`)."""
    result = Relations()
    for i, event in enumerate(events):
        rule = ruleset.by_id.get(event.rule_id)
        if rule is None:
            continue
        symptom_of, overrides = rule.spec.symptom_of, rule.spec.overrides
        for j, other in enumerate(events):
            if j == i:
                continue
            if symptom_of and i not in result.symptom_of and _names(symptom_of, other):
                result.symptom_of[i] = j
            if (
                overrides
                and j not in result.overridden_by
                and other.node == event.node
                and other.entities.get("pci", "") in ("", event.entities.get("pci", ""))
                and _names(overrides, other)
            ):
                result.overridden_by[j] = i
    return result
