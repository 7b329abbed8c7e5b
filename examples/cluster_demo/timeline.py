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
    target = action.get("target") or {}
    if not isinstance(target, dict):
        return str(target)
    parts = [f"{key}={value}" for key, value in target.items() if value not in (None, [], "")]
    return ", ".join(parts)


def render(timeline: Timeline, console: Console) -> None:
    steps = Table(title="Timeline", title_justify="left", expand=False)
    steps.add_column("t+s", justify="right")
    steps.add_column("who")
    steps.add_column("what")
    for step in timeline.steps:
        steps.add_row(_cell(f"{step.at_s:.2f}"), _cell(step.actor), _cell(step.what))
    console.print(steps)

    diagnoses = Table(title="Diagnosis", title_justify="left")
    for column in ("id", "category", "failure_type", "culprit", "action", "status", "rules"):
        diagnoses.add_column(column)
    for diagnosis in timeline.diagnoses:
        diagnoses.add_row(
            _cell(_short(diagnosis.get("id"))),
            _cell(diagnosis.get("category")),
            _cell(diagnosis.get("failure_type")),
            _cell(", ".join(diagnosis.get("culprit_nodes") or [])),
            _cell(diagnosis.get("action")),
            _cell(diagnosis.get("status")),
            _cell(", ".join(diagnosis.get("rule_ids") or [])),
        )
    console.print(diagnoses)

    if timeline.actions:
        actions = Table(title="Actions (GET /v1/actions)", title_justify="left")
        for column in ("id", "kind", "target", "state", "attempts", "lease owner", "decisions"):
            actions.add_column(column)
        for action in timeline.actions:
            decisions = "; ".join(
                f"{d.get('decision')}: {d.get('reason')}" for d in action.get("decisions") or []
            )
            actions.add_row(
                _cell(action.get("id")),
                _cell(action.get("kind")),
                _cell(_target(action)),
                _cell(action.get("state")),
                _cell(action.get("attempts")),
                _cell(action.get("lease_owner")),
                _cell(decisions),
            )
        console.print(actions)

    nodes = Table(title="Nodes (read back from the emulator)", title_justify="left")
    for column in ("node", "unschedulable", "taints", "diagnoser labels and annotations"):
        nodes.add_column(column)
    for node in timeline.nodes:
        meta = node.get("metadata", {})
        marks = {
            **(meta.get("labels") or {}),
            **(meta.get("annotations") or {}),
        }
        ours = ", ".join(f"{k}={v}" for k, v in marks.items() if k.startswith(DIAGNOSER_PREFIX))
        taints = ", ".join(
            f"{t.get('key')}={t.get('value', '')}:{t.get('effect')}"
            for t in node.get("spec", {}).get("taints") or []
        )
        nodes.add_row(
            _cell(meta.get("name")),
            _cell(bool(node.get("spec", {}).get("unschedulable"))),
            _cell(taints),
            _cell(ours),
        )
    console.print(nodes)

    pods = Table(title="Pods in namespace ml (read back from the emulator)", title_justify="left")
    for column in ("pod", "node", "phase", "uid", "attempt", "why pending"):
        pods.add_column(column)
    for pod in timeline.pods:
        meta = pod.get("metadata", {})
        status = pod.get("status", {})
        conditions = status.get("conditions") or []
        pending = next((c.get("message") for c in conditions if c.get("status") == "False"), None)
        pods.add_row(
            _cell(meta.get("name")),
            _cell(pod.get("spec", {}).get("nodeName")),
            _cell(status.get("phase")),
            _cell(_short(meta.get("uid"))),
            _cell((meta.get("annotations") or {}).get("demo.diagnoser.io/attempt")),
            _cell(pending),
        )
    console.print(pods)
    for note in timeline.notes:
        console.print(Text(f"note: {note}", style="yellow"))
