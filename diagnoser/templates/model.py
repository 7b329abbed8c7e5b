"""The vocabulary shared by the template miner, the filter set and the compressed log.

A template is a log line with its variable parts replaced by typed slots, written as text:
`iteration <int>/<int> | lm loss <float> | lr <float>`. The miner owns mutable state; everything
it hands out is one of these frozen snapshots, so filters, the API and the CLI never reach into
the miner's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Slot(StrEnum):
    """The type of a variable part, as written between angle brackets in a template's text."""

    INT = "int"
    FLOAT = "float"
    HEX = "hex"
    IP = "ip"
    PATH = "path"
    UUID = "uuid"
    DURATION = "duration"
    ANY = "*"
    """A token that varies but fits no narrower type (a name glued to a number, a word)."""


@dataclass(frozen=True, slots=True)
class TemplateView:
    """A snapshot of one mined template."""

    id: int
    """Stable within its miner: the same template keeps its id while it lives."""
    text: str
    slots: tuple[Slot, ...]
    """The slots of `text`, in order of appearance."""
    count: int
    first_seen: int
    """1-based number of the first input line grouped into it."""
    last_seen: int
    samples: tuple[str, ...]
    """A few raw lines grouped into it, oldest first, as they were given to the miner."""
