"""One action, one Kubernetes change: dispatch by kind to cordon, restart or verify.

Runs in a worker thread (the official client is synchronous). Kubernetes API errors propagate
to the loop, which retries the transient ones and reports the rest; anything the operator decides
itself (a spent budget, a disabled kind, an invalid target) comes back as a failed Outcome."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from diagnoser.operator.cluster import Cluster
from diagnoser.operator.cordon import cordon, uncordon
from diagnoser.operator.outcome import Outcome
from diagnoser.operator.restart import RestartSettings, restart
from diagnoser.operator.verify import VerifySettings, verify
from diagnoser.operator.wire import (
    ActionKind,
    ActionView,
    CordonTarget,
    RestartTarget,
    UncordonTarget,
    VerifyTarget,
)

OPERATOR_KINDS = (
    ActionKind.CORDON_NODE,
    ActionKind.UNCORDON_NODE,
    ActionKind.RESTART_JOB,
    ActionKind.VERIFY_NODES,
)
"""What this operator claims by default; `notify` is delivered by the service's notifier."""


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Executor:
    cluster: Cluster
    restart: RestartSettings = field(default_factory=RestartSettings)
    verify: VerifySettings = field(default_factory=VerifySettings)
    dry_run: bool = False
    clock: Callable[[], datetime] = utc_now

    def execute(self, action: ActionView, stop: threading.Event) -> Outcome:
        try:
            return self._dispatch(action, stop)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
                for error in exc.errors()
            )
            return Outcome.failed(f"invalid {action.kind} target: {problems}")

    def _dispatch(self, action: ActionView, stop: threading.Event) -> Outcome:
        if action.kind is ActionKind.CORDON_NODE:
            return cordon(
                self.cluster,
                action,
                CordonTarget.model_validate(action.target),
                now=self.clock(),
                dry_run=self.dry_run,
            )
        if action.kind is ActionKind.UNCORDON_NODE:
            return uncordon(
                self.cluster,
                action,
                UncordonTarget.model_validate(action.target),
                dry_run=self.dry_run,
            )
        if action.kind is ActionKind.RESTART_JOB:
            return restart(
                self.cluster,
                action,
                RestartTarget.model_validate(action.target),
                settings=self.restart,
                dry_run=self.dry_run,
            )
        if action.kind is ActionKind.VERIFY_NODES:
            return verify(
                self.cluster,
                action,
                VerifyTarget.model_validate(action.target),
                settings=self.verify,
                stop=stop,
                dry_run=self.dry_run,
            )
        return Outcome.failed(f"{action.kind} actions are not carried out by this operator")
