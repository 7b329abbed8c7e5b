"""Hang detection: a running job that stopped making progress and printed no reason.

No line says "hung": the evidence is time. A job is stalled when, for longer than its window, it
wrote nothing at all, or kept writing (heartbeats, health checks, NCCL INFO) while its step
counter stood still. The window is the configured timeout or a multiple of the job's own slowest
recent step interval, whichever is longer, so a run that logs a step every 40 minutes is not
called hung at 30.

A stall is a hang only when nothing else explains it: a job whose logs hold a failure is
diagnosed by that failure (which outranks the stall), and a job that finished (an `exited`
event, or a completion line at the end of its log) is not running. A confirmed hang is a
failure with an action: by default `restart_job` from the last checkpoint, with where the job
stopped as evidence (a stuck job makes nothing; bounding restart loops is the action policy's
restart budget, not this module's). `DIAGNOSER_HANG__ACTION=escalate` keeps the conservative
choice: a person reads the stacks of the stuck ranks (py-spy, the NCCL flight recorder) first.
A stall at a known place with a known cause gets that cause's action instead: a job stopped
right after PyTorch's `Using ... as PyTorch extensions root...` is waiting for the build lock
of a JIT extension, which an interrupted build leaves behind; a restart would wait on the same
lock, so the user is told. Nodes that went silent while the others kept writing, and nodes whose
launcher reported a failed exit, are named as suspects, never cordoned.

A stall is only looked at for a job known to be running: its launcher posted `started` (or
heartbeats that are still arriving) and no `exited` for the whole job. Silence alone cannot tell
a hung job from a finished one.

Pure: plain data in, plain data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import regex

from diagnoser.diagnosis.correlate import Source, Status, Verdict
from diagnoser.rules import Action, Category, RuleEvent
from diagnoser.rules.schema import Scope, Severity

DEFAULT_TIMEOUT_S = 1800.0
"""Thirty minutes: the collective timeout of older PyTorch releases; a hang inside a collective
usually ends in a watchdog timeout before this, so what is left is a hang outside of one."""
INTERVAL_FACTOR = 3.0
RULE_ID = "no_progress"
"""The evidence's rule id: not a rule of the pack, the detector itself."""
DEFAULT_ACTION = Action.RESTART_JOB
HANG_ACTIONS = frozenset({Action.RESTART_JOB, Action.ESCALATE})
"""What `DIAGNOSER_HANG__ACTION` may choose for a hang without a known cause."""
EXTENSION_LOCK = "extension_build_lock"
"""The failure type of a stall on a JIT extension's build lock."""
HANG_TYPES = frozenset({"hang", EXTENSION_LOCK})
"""Failure types the hang detector writes: resolved when progress resumes."""

EXTENSION_ROOT = regex.compile(r"\bUsing \S.* as PyTorch extensions root\b")
"""`torch.utils.cpp_extension` prints this (verbose builds, DeepSpeed's op builder) just before
it takes the build directory's lock: when it is a node's newest line, that node waits on it."""

COMPLETION = regex.compile(
    r"(?i)\btraining (?:is )?(?:completed?|finished|done)\b|\bfinished training\b"
    r"|['\"]?train_runtime['\"]?\s*[:=]|WorkerState\.SUCCEEDED|\bafter training is done\b"
    r"|`Trainer\.fit` stopped"
)
"""How training loops say they are done: HF Trainer (`Training completed`, `train_runtime`),
torchrun (`WorkerState.SUCCEEDED`), Megatron (`after training is done`), Lightning."""

_PHASES: tuple[tuple[regex.Pattern[str], str], ...] = (
    (
        regex.compile(
            r"(?i)init_distributed|Initializing TorchBackend|rendezvous|init_process_group"
        ),
        "during distributed initialisation",
    ),
    (regex.compile(r"NCCL INFO"), "while NCCL was setting up its communicators"),
    (
        regex.compile(r"(?i)\bsav(?:e|ed|ing)\b.*checkpoint|checkpoint.*\bsav(?:e|ed|ing)\b"),
        "after a checkpoint save",
    ),
    (regex.compile(r"(?i)\bload(?:ed|ing)?\b.*checkpoint"), "while loading a checkpoint"),
    (regex.compile(r"Running training|^\s*0%\|"), "before the first training step"),
    (regex.compile(r"(?i)\btrain\w*\s+start"), "as a training step started"),
)
"""Where a hang stopped, read from its last lines: the first phrase that matches, newest first."""


@dataclass(frozen=True, slots=True)
class TailLine:
    text: str
    line_no: int
    offset: int


@dataclass(frozen=True, slots=True)
class NodeTail:
    """The last lines one node wrote, and when (epoch seconds; 0 when unknown)."""

    node: str
    lines: Sequence[TailLine]
    last_at: float = 0.0


def window(timeout_s: float, step_intervals: Iterable[float]) -> float:
    """The stall that counts as a hang for this job: the timeout, or 3x its slowest step."""
    return max(timeout_s, INTERVAL_FACTOR * max(step_intervals, default=0.0))


def finished(tails: Iterable[NodeTail]) -> bool:
    """A completion line among any node's last lines: the job ended, it did not hang."""
    return any(COMPLETION.search(line.text) for tail in tails for line in tail.lines)


def stopped_at(tails: Sequence[NodeTail], last_step: int | None, first: Sequence[str] = ()) -> str:
    """A phrase for where the job stopped, for the summary an on-call engineer reads first.

    Read from the nodes named in `first` (the suspects), then from the newest lines backwards.
    """
    order = sorted(tails, key=lambda t: (t.node not in first, -t.last_at, t.node))
    for tail in order:
        for line in reversed(tail.lines):
            for pattern, phrase in _PHASES:
                if pattern.search(line.text):
                    return phrase
    if last_step is not None:
        return f"after step {last_step}"
    return "after its last line"


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One `POST /v1/jobs/{job}/events`: `started`, `heartbeat` or `exited`; node None = job.

    `at` is when the service received it: a launcher's clock may be skewed or wrong, and the
    order of events and the freshness of heartbeats must not depend on it.
    """

    kind: str
    node: str | None
    at: float
    exit_code: int | None = None
    signal: str | None = None

    @property
    def failed(self) -> bool:
        return self.kind == "exited" and (bool(self.exit_code) or self.signal is not None)


@dataclass(slots=True)
class Lifecycle:
    """The newest lifecycle event per node (None: the whole job), as the launcher reported it."""

    latest: dict[str | None, LifecycleEvent] = field(default_factory=dict)

    def record(self, event: LifecycleEvent) -> None:
        current = self.latest.get(event.node)
        if current is None or event.at >= current.at:
            self.latest[event.node] = event

    def running(self, now: float, window_s: float, nodes: Iterable[str] = ()) -> bool:
        """Started and not exited, on at least one node.

        A node's own newest word counts when it is newer than the job-level one; otherwise the
        node has the job's state (`nodes` are the nodes seen in the logs, which may never
        report for themselves). `started` stands until `exited`; a `heartbeat` only while less
        than a window old (a launcher that stopped beating may be gone with its node).
        """

        def alive(event: LifecycleEvent | None) -> bool:
            if event is None:
                return False
            return event.kind == "started" or (
                event.kind == "heartbeat" and now - event.at < window_s
            )

        job = self.latest.get(None)
        names = {n for n in self.latest if n is not None} | set(nodes)
        if not names:
            return alive(job)
        for name in names:
            own = self.latest.get(name)
            if own is not None and (job is None or own.at >= job.at):
                if alive(own):
                    return True
            elif alive(job):
                return True
        return False

    def failed_nodes(self) -> tuple[str, ...]:
        """Nodes whose launcher reported a non-zero exit or a signal."""
        return tuple(sorted(n for n, e in self.latest.items() if n is not None and e.failed))

    def is_restart(self, event: LifecycleEvent) -> bool:
        """A `started` after an earlier word for the whole job, or for a node whose newest word
        was `exited`. A job's first `started` is not one, however late it arrives."""
        if event.kind != "started":
            return False
        previous = self.latest.get(event.node)
        return previous is not None and (event.node is None or previous.kind == "exited")


def extension_lock(tails: Sequence[NodeTail]) -> tuple[NodeTail, ...]:
    """Nodes whose newest line is the JIT-extension root line: waiting for its build lock."""
    return tuple(t for t in tails if t.lines and EXTENSION_ROOT.search(t.lines[-1].text))


def hang_verdict(
    stalled_for: float,
    tails: Sequence[NodeTail],
    progress: Mapping[str, int] | None = None,
    silent_nodes: Sequence[str] = (),
    failed_nodes: Sequence[str] = (),
    action: Action = DEFAULT_ACTION,
) -> Verdict:
    """The verdict for a job stalled `stalled_for` seconds with no failure in its logs:
    `action` (restart_job or escalate), or notify_user for a stale extension-build lock."""
    if action not in HANG_ACTIONS:
        raise ValueError(f"a hang's action is restart_job or escalate, not {action.value}")
    last_step = (progress or {}).get("last_step")
    locked = extension_lock(tails)
    suspects = tuple(sorted({*silent_nodes, *failed_nodes}))
    if locked:
        action, failure_type = Action.NOTIFY_USER, EXTENSION_LOCK
        first: Sequence[str] = [t.node for t in locked]
    else:
        failure_type, first = "hang", suspects
    evidence = tuple(
        RuleEvent(
            rule_id=RULE_ID,
            failure_type=failure_type,
            category=Category.FRAMEWORK,
            action=action,
            severity=Severity.ERROR,
            scope=Scope.JOB,
            entities={"stalled_for_s": str(int(stalled_for))},
            text=tail.lines[-1].text,
            offset=tail.lines[-1].offset,
            line_no=tail.lines[-1].line_no,
            node=tail.node,
            rank=None,
            time=tail.last_at,
            evidence=tuple(line.text for line in tail.lines[:-1]),
        )
        for tail in sorted(tails, key=lambda t: (t.node not in first, t.last_at, t.node))
        if tail.lines
    )
    if locked:
        where = "right after `Using ... as PyTorch extensions root...`"
    else:
        where = stopped_at(tails, last_step, suspects)
    summary = f"no progress for {_duration(stalled_for)} {where}"
    if failed_nodes:
        summary += f"; the launcher on {', '.join(failed_nodes)} reported a failed exit"
    if silent_nodes:
        summary += f"; {', '.join(silent_nodes)} went silent first"
    if locked:
        summary += (
            ", and no error line: the JIT build of a PyTorch extension is waiting for its build "
            "lock, which an interrupted build leaves behind. A restart would wait on it again: "
            "remove the stale `lock` file in the extension's directory under the extensions "
            "root (TORCH_EXTENSIONS_DIR), then restart."
        )
    elif action is Action.RESTART_JOB:
        summary += (
            ", and no error line: a hang. Restart from the last checkpoint; if the ranks are "
            "still stuck, dump their stacks first (py-spy dump)."
        )
    else:
        summary += ", and no error line: a hang. Dump the stuck ranks' stacks (py-spy dump)."
    escalated = action is Action.ESCALATE
    return Verdict(
        status=Status.INCONCLUSIVE if escalated else Status.FAILURE,
        action=action,
        failure_type=failure_type,
        category=Category.FRAMEWORK,
        culprit_nodes=suspects,
        confidence=0.3 if escalated else 0.6,
        source=Source.CORRELATION,
        summary=summary,
        root=evidence[0] if evidence else None,
        evidence=evidence,
    )


def silent_nodes(tails: Sequence[NodeTail], now: float, window_s: float) -> tuple[str, ...]:
    """Nodes quiet for the whole window while at least two others kept writing (at most a
    quarter of the job): the likely stuck ones, as in correlation's silent-node suspicion."""
    quiet = [t.node for t in tails if now - t.last_at >= window_s]
    talking = len(tails) - len(quiet)
    if quiet and talking >= 2 and len(quiet) * 4 <= len(tails):
        return tuple(sorted(quiet))
    return ()


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)} s"
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"
