"""Correlation: many rule events from many ranks and nodes -> one job-level verdict.

The rules say what each line means; this module says which of them is the incident. The order
of evidence, strongest first:

1. hardware errors name their node outright (an Xid 79 outranks every timeout it caused);
2. other root-cause classes (process death, memory, storage, user code, framework faults),
   with torchrun's `Root Cause (first observed failure)` host and rank preferred; a specific
   rule's verdict outranks a fallback rule's "some exception happened" (an unclassified
   traceback does not hide the wandb or rendezvous error that raised it);
3. collective timeouts and remote errors, which are symptoms when anything above exists; alone,
   the rank whose last enqueued / completed NCCL work is behind the others is the likely culprit;
4. otherwise the earliest failure by time.

Culprits: every node with the root's strength of hardware evidence; the lagging rank's node for
timeouts; torchrun's root-cause host; otherwise, for failures local to a process (resource,
user code, framework), the node where the root event happened. Network and storage failures of
shared services name no node. A cordon is never issued without a culprit.

Pure: plain data in, plain data out; no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from diagnoser.rules import Action, Category, RuleEvent, RuleSet, Scope, relate
from diagnoser.rules.schema import Severity


class Status(StrEnum):
    FAILURE = "failure"
    HEALTHY = "healthy"
    INCONCLUSIVE = "inconclusive"


class Source(StrEnum):
    RULE = "rule"
    CORRELATION = "correlation"
    LLM = "llm"
    HUMAN = "human"


SYMPTOM_TYPES = frozenset(
    {"nccl_timeout", "nccl_remote_error", "nccl_system_error", "socket_closed", "ib_error"}
)
"""Failure types a surviving rank reports when another rank or node failed first."""

LOCAL_CATEGORIES = frozenset({Category.RESOURCE, Category.USER_CODE, Category.FRAMEWORK})
"""Failures that happen inside one process: the node it ran on is where to look first."""

CLASS_RANK: dict[Category, int] = {
    Category.HARDWARE: 0,
    Category.RESOURCE: 1,
    Category.STORAGE: 1,
    Category.USER_CODE: 1,
    Category.FRAMEWORK: 2,
    Category.NETWORK: 3,
}
"""Lower is stronger root-cause evidence; symptoms sort after all of these."""

KILL_CONTEXT_LINES = 40
"""How many lines after a host-memory phase (loading weights) a SIGKILL on the same node is
still read as that phase's: a traceback and a launcher's report fit, a training epoch does not."""

SIGNAL_RULE_PREFIX = "signal."
"""Events read from training numbers (diagnosis/signals.py), not from a rule. They rank with
fallback rules, a warning (a loss spike) after an error (a NaN loss): a rule that names a
failure explains more than the loss curve does."""


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    action: Action
    failure_type: str | None = None
    category: Category | None = None
    culprit_nodes: tuple[str, ...] = ()
    affected_ranks: tuple[int, ...] = ()
    confidence: float = 0.0
    source: Source = Source.RULE
    rule_ids: tuple[str, ...] = ()
    summary: str = ""
    root: RuleEvent | None = None
    evidence: tuple[RuleEvent, ...] = field(default=())
    """The root event first, then corroborating and symptom events, deduplicated."""


HEALTHY = Verdict(
    Status.HEALTHY, Action.NONE, confidence=0.8, summary="no failure found in the logs"
)


def _is_symptom(event: RuleEvent) -> bool:
    return event.failure_type in SYMPTOM_TYPES


def _strength(event: RuleEvent, fallbacks: frozenset[str]) -> tuple[int, int, int, int, float]:
    """Sort key: symptoms last; hardware first; specific rules before fallback rules, and among
    fallbacks an error report before warning-level evidence (orphan traceback frames, an
    exception type nobody classified), as for training signals; then root-cause class, real
    verdicts before escalations, and time."""
    symptom = 1 if _is_symptom(event) else 0
    rank = CLASS_RANK[event.category]
    if event.rule_id.startswith(SIGNAL_RULE_PREFIX) or (
        event.rule_id in fallbacks and event.category is not Category.HARDWARE
    ):
        fallback = 2 if event.severity is Severity.WARNING else 1
    else:
        fallback = 0
    escalates = 1 if event.action is Action.ESCALATE else 0
    return (symptom, fallback, rank, escalates, event.time)


def _culprit_node(event: RuleEvent) -> str:
    """torchrun's root-cause block names the failed host; elsewhere the emitting node."""
    return event.entities.get("host") or event.node


def _lagging_ranks(timeouts: Sequence[RuleEvent]) -> tuple[RuleEvent, ...]:
    """Among watchdog timeouts, the ranks whose last enqueued (else completed) work is lowest."""
    for key in ("last_enqueued", "last_completed"):
        progress = [
            (int(value), event)
            for event in timeouts
            if (value := event.entities.get(key)) is not None and value.lstrip("-").isdigit()
        ]
        values = {value for value, _ in progress}
        if len(values) > 1:
            lowest = min(values)
            return tuple(event for value, event in progress if value == lowest)
    return ()


def _dedupe(events: Sequence[RuleEvent]) -> tuple[RuleEvent, ...]:
    """One piece of evidence per (rule, node, rank): 1,024 identical timeouts are one line."""
    seen: set[tuple[str, str, int | None]] = set()
    kept = []
    for event in events:
        key = (event.rule_id, event.node, event.rank)
        if key not in seen:
            seen.add(key)
            kept.append(event)
    return tuple(kept)


def _silent_nodes(nodes: Collection[str], events: Sequence[RuleEvent]) -> tuple[str, ...]:
    """Nodes of the job that said nothing while the others timed out: likely stuck or dead.

    Only a few may be silent (at most a quarter of the job, and at least two nodes reporting):
    when most nodes are silent, their logs are probably just not shipped.
    """
    timed_out = {e.node for e in events if e.failure_type == "nccl_timeout"}
    silent = set(nodes) - {e.node for e in events}
    if len(timed_out) < 2 or not silent or len(silent) > max(1, len(set(nodes)) // 4):
        return ()
    return tuple(sorted(silent))


def _summary(root: RuleEvent, culprits: tuple[str, ...], action: Action, how: str) -> str:
    where = f" on {', '.join(culprits)}" if culprits else ""
    because = f" ({how})" if how else ""
    return f"{root.failure_type}{where}{because}: {action.value.replace('_', ' ')}"


def correlate(
    events: Sequence[RuleEvent], ruleset: RuleSet, nodes: Collection[str] = ()
) -> Verdict:
    """The job's verdict from every rule event seen so far (order does not matter).

    `nodes` are all the nodes the job's logs come from, so that a node that stayed silent
    while the others timed out can be suspected.
    """
    relevant = [e for e in events if not (e.action is Action.NONE and e.severity is Severity.INFO)]
    if not relevant:
        return HEALTHY
    relevant.sort(key=lambda e: (e.time, e.node, e.offset))
    relations = relate(relevant, ruleset)
    _own_errors_are_not_echoes(relevant, relations.symptom_of)
    overridden = relations.overridden_by
    roots = [e for i, e in enumerate(relevant) if i not in relations.symptom_of]
    fallbacks = frozenset(rule.id for rule in ruleset.rules if rule.spec.fallback)
    ordered = sorted(roots or relevant, key=lambda e: _strength(e, fallbacks))
    root = ordered[0]
    how = ""
    culprits: tuple[str, ...]
    if root.category is Category.HARDWARE:
        # Every node with the same strength of hardware evidence is a culprit.
        culprits = tuple(
            sorted({e.node for e in ordered if e.category is Category.HARDWARE and not
                    _is_symptom(e) and e.action is root.action})
        )  # fmt: skip
    elif _is_symptom(root):
        lagging = _lagging_ranks([e for e in relevant if e.failure_type == "nccl_timeout"])
        culprits = tuple(sorted({e.node for e in lagging}))
        if lagging:
            root = lagging[0]
            how = "inferred from the ranks' progress"
        elif silent := _silent_nodes(nodes, relevant):
            culprits = silent
            how = "inferred: no timeout reported from there while the others timed out"
    elif "host" in root.entities or root.scope is Scope.NODE or root.category in LOCAL_CATEGORIES:
        culprits = (_culprit_node(root),)
    else:
        culprits = ()
    action = root.action
    if (phase := _memory_phase_before(root, events)) is not None:
        # A SIGKILL is ambiguous (OOM killer, kill -9, eviction) except where the job was
        # doing nothing but filling host memory: loading weights, before any other output.
        return _killed_in_memory_phase(root, phase, relevant)
    index = relevant.index(root)
    if index in overridden:
        override = relevant[overridden[index]]
        action = override.action
    if action is Action.CORDON_NODE_AND_RESTART and not culprits:
        action = Action.RESTART_JOB  # never cordon without naming the node
    in_ordered = {id(e) for e in ordered}  # identity: `in` on the list compared every field
    symptoms = [e for e in relevant if id(e) not in in_ordered]
    evidence = _dedupe([root, *(e for e in ordered if e is not root), *symptoms])
    ranks = tuple(sorted({e.rank for e in relevant if e.rank is not None}))
    status = Status.INCONCLUSIVE if action is Action.ESCALATE else Status.FAILURE
    if action is Action.NONE:
        status = Status.HEALTHY
    return Verdict(
        status=status,
        action=action,
        failure_type=root.failure_type,
        category=root.category,
        culprit_nodes=culprits,
        affected_ranks=ranks,
        confidence=_confidence(root, relevant, bool(how)),
        source=Source.CORRELATION if (how or len({e.node for e in relevant}) > 1) else Source.RULE,
        rule_ids=tuple(dict.fromkeys(e.rule_id for e in evidence)),
        summary=_summary(root, culprits, action, how),
        root=root,
        evidence=evidence,
    )


LAUNCHER_SUMMARY = "worker_process_failed"
"""torchrun's root-cause block for a worker that exited non-zero: it names the failed host."""


def _own_errors_are_not_echoes(events: Sequence[RuleEvent], symptom_of: dict[int, int]) -> None:
    """A NCCL timeout or network error is declared a symptom of a failed worker (the rank that
    died first takes the others' collectives down), but not of its own worker: an error printed
    on the host the launcher's summary names, or in the same log, is why that worker exited.
    Those links are dropped, so the worker's own error is the root and the summary its echo."""
    for i, target in list(symptom_of.items()):
        summary = events[target]
        if summary.failure_type != LAUNCHER_SUMMARY:
            continue
        event = events[i]
        if event.node in (summary.node, summary.entities.get("host")):
            del symptom_of[i]


def _memory_phase_before(root: RuleEvent, events: Sequence[RuleEvent]) -> RuleEvent | None:
    """The latest host-memory phase (rules: `host_memory_phase`) shortly before a SIGKILL root
    on the same node, if there is one."""
    if root.failure_type != "process_killed":
        return None
    phases = [
        e
        for e in events
        if e.failure_type == "host_memory_phase"
        and e.node == root.node
        and 0 <= root.line_no - e.line_no <= KILL_CONTEXT_LINES
    ]
    return max(phases, key=lambda e: e.line_no) if phases else None


def _killed_in_memory_phase(
    root: RuleEvent, phase: RuleEvent, relevant: Sequence[RuleEvent]
) -> Verdict:
    """A SIGKILL while loading weights into host memory: the host (or container) ran out of
    RAM, which the job owner fixes (a larger machine or limit, lower-memory loading)."""
    culprits = (_culprit_node(root),)
    how = "inferred: killed while loading weights into host memory"
    others = [e for e in relevant if e is not root]
    evidence = _dedupe([root, phase, *others])
    return Verdict(
        status=Status.FAILURE,
        action=Action.NOTIFY_USER,
        failure_type="host_oom",
        category=Category.RESOURCE,
        culprit_nodes=culprits,
        affected_ranks=tuple(sorted({e.rank for e in relevant if e.rank is not None})),
        confidence=0.6,
        source=Source.CORRELATION,
        rule_ids=tuple(dict.fromkeys(e.rule_id for e in evidence)),
        summary=f"host_oom on {culprits[0]} ({how}): notify user",
        root=root,
        evidence=evidence,
    )


def _confidence(root: RuleEvent, events: Sequence[RuleEvent], inferred: bool) -> float:
    """A calibrated-looking number is a lie; this is an ordinal: direct > inferred > escalated."""
    if root.action is Action.ESCALATE:
        return 0.3
    if inferred:
        return 0.6
    corroborated = sum(1 for e in events if e.failure_type == root.failure_type) > 1
    base = 0.9 if root.severity in (Severity.CRITICAL, Severity.ERROR) else 0.7
    if root.entities.get("headless"):
        base -= 0.2  # an exception line without its traceback: the type is known, little else
    return min(0.99, base + (0.05 if corroborated else 0.0))
