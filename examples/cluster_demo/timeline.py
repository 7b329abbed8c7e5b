"""What the demo saw, in order, and its rendering as rich tables.

Every value shown comes from a log line, the service's API or the emulator, so all of it is
untrusted text: cells are `rich.text.Text`, never markup.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

JsonObject = dict[str, Any]

TAINT_KEY = "diagnoser.io/faulty"
DIAGNOSER_PREFIX = "diagnoser.io/"


@dataclass(frozen=True)
class Step:
    at_s: float
    """Seconds since the demo started."""
    actor: str
    what: str


@dataclass
class Timeline:
    """The demo's record: its steps, and the final diagnosis, actions, Nodes and pods."""

    started: float = field(default_factory=time.monotonic)
    steps: list[Step] = field(default_factory=list)
    diagnoses: list[JsonObject] = field(default_factory=list)
    actions: list[JsonObject] = field(default_factory=list)
    nodes: list[JsonObject] = field(default_factory=list)
    pods: list[JsonObject] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    operator_ran: bool = False
    finished: bool = False
    """True when every stage the demo ran reached its expected end before the deadline."""

    def add(self, actor: str, what: str) -> Step:
        step = Step(round(time.monotonic() - self.started, 2), actor, what)
        self.steps.append(step)
        return step

    def first(self, needle: str) -> Step | None:
        return next((step for step in self.steps if needle in step.what), None)

    @property
    def diagnosis(self) -> JsonObject | None:
        """The job's diagnosis; the demo's failure is one incident, so one diagnosis."""
        return self.diagnoses[0] if len(self.diagnoses) == 1 else None

    def node(self, name: str) -> JsonObject | None:
        return next((n for n in self.nodes if n["metadata"]["name"] == name), None)

    @property
    def cordoned_nodes(self) -> list[str]:
        """Nodes marked unschedulable with diagnoser's taint."""
        return [str(n["metadata"]["name"]) for n in self.nodes if is_cordoned_by_diagnoser(n)]


def is_cordoned_by_diagnoser(node: JsonObject) -> bool:
    taints = node.get("spec", {}).get("taints") or []
    tainted = any(t.get("key") == TAINT_KEY and t.get("effect") == "NoSchedule" for t in taints)
    return bool(node.get("spec", {}).get("unschedulable")) and tainted


def _cell(value: object) -> Text:
    return Text("" if value is None else str(value))


def _short(identifier: object) -> str:
    return str(identifier)[:8] if identifier else ""


def _target(action: JsonObject) -> str:
    """The action's subject in a few words: the node, or the workload."""
    target = action.get("target") or {}
    if not isinstance(target, dict):
        return str(target)
    if target.get("node"):
        return str(target["node"])
    if target.get("name"):
        kind = target.get("workload_kind") or "job"
        return f"{kind} {target.get('namespace') or '-'}/{target['name']}"
    return ", ".join(f"{k}={v}" for k, v in target.items() if v not in (None, [], ""))


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold")
    for column in columns:
        table.add_column(column)
    return table


def render(timeline: Timeline, console: Console) -> None:
    """The timeline, then the diagnosis, the actions with their decisions, Nodes and pods."""
    steps = _table("Timeline", "t+s", "who", "what")
    steps.columns[0].justify = "right"
    for step in timeline.steps:
        steps.add_row(_cell(f"{step.at_s:.2f}"), _cell(step.actor), _cell(step.what))
    console.print(steps)

    diagnoses = _table("Diagnosis", "id", "category", "failure type", "culprit", "action")
    for diagnosis in timeline.diagnoses:
        diagnoses.add_row(
            _cell(_short(diagnosis.get("id"))),
            _cell(diagnosis.get("category")),
            _cell(diagnosis.get("failure_type")),
            _cell(", ".join(diagnosis.get("culprit_nodes") or [])),
            _cell(diagnosis.get("action")),
        )
    console.print(diagnoses)
    for diagnosis in timeline.diagnoses:
        console.print(Text(f"  summary: {diagnosis.get('summary')}"))
        console.print(Text(f"  rules: {', '.join(diagnosis.get('rule_ids') or [])}"))

    if timeline.actions:
        actions = _table(
            "Actions (GET /v1/actions)", "id", "kind", "target", "depends on", "state",
            "attempts", "lease owner",
        )  # fmt: skip
        decisions = _table("Policy and operator decisions", "action", "decision", "reason")
        for action in timeline.actions:
            actions.add_row(
                _cell(action.get("id")),
                _cell(action.get("kind")),
                _cell(_target(action)),
                _cell(", ".join(str(d) for d in action.get("depends_on") or [])),
                _cell(action.get("state")),
                _cell(action.get("attempts")),
                _cell(action.get("lease_owner")),
            )
            for decision in action.get("decisions") or []:
                decisions.add_row(
                    _cell(action.get("id")),
                    _cell(decision.get("decision")),
                    _cell(decision.get("reason")),
                )
        console.print(actions)
        console.print(decisions)

    nodes = _table("Nodes (read back from the emulator)", "node", "unschedulable", "taints")
    marks = _table("What diagnoser wrote on the Nodes", "node", "label or annotation", "value")
    for node in timeline.nodes:
        meta = node.get("metadata", {})
        taints = ", ".join(
            f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
            for t in node.get("spec", {}).get("taints") or []
        )
        nodes.add_row(
            _cell(meta.get("name")),
            _cell(bool(node.get("spec", {}).get("unschedulable"))),
            _cell(taints),
        )
        for key, value in {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}.items():
            if key.startswith(DIAGNOSER_PREFIX):
                marks.add_row(_cell(meta.get("name")), _cell(key), _cell(value))
    console.print(nodes)
    if marks.row_count:
        console.print(marks)

    title = "Pods in namespace ml (read back from the emulator)"
    pods = _table(title, "pod", "node", "phase", "uid", "attempt")
    pending: list[str] = []
    for pod in timeline.pods:
        meta = pod.get("metadata", {})
        status = pod.get("status", {})
        pods.add_row(
            _cell(meta.get("name")),
            _cell(pod.get("spec", {}).get("nodeName")),
            _cell(status.get("phase")),
            _cell(_short(meta.get("uid"))),
            _cell((meta.get("annotations") or {}).get("demo.diagnoser.io/attempt")),
        )
        for condition in status.get("conditions") or []:
            if condition.get("status") == "False":
                pending.append(f"  {meta.get('name')}: {condition.get('message')}")
    console.print(pods)
    for line in pending:
        console.print(Text(line))
    for note in timeline.notes:
        console.print(Text(f"note: {note}", style="yellow"))
