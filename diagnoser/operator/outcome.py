"""What carrying out one action came to: the completion the operator reports to the service."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnoser.operator.wire import CompletionStatus


@dataclass(frozen=True)
class Outcome:
    status: CompletionStatus
    message: str
    result: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def done(cls, message: str, **result: Any) -> Outcome:
        return cls(CompletionStatus.DONE, message, result)

    @classmethod
    def failed(cls, message: str, **result: Any) -> Outcome:
        return cls(CompletionStatus.FAILED, message, result)
