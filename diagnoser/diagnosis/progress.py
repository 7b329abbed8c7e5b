"""Training progress read from the log: the last step, the last saved checkpoint, steps at risk.

A restart resumes from the last checkpoint, so `steps_lost` is what a failure costs. Formats
seen in the wild: Megatron (`iteration 1200/500000`, `saving checkpoint at iteration 1000`),
DeepSpeed (`global_step500`), Hugging Face (`Saving model checkpoint to out/checkpoint-500`),
torchtitan and nanoGPT (`step: 10`, `iter 100:`).

Cheap by construction: the last step comes from the last progress line of a batch (searched
from the end), and checkpoint lines are looked for only when the batch's text contains
"checkpoint" at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import regex

from diagnoser.ingest.framing import LineBatch

if TYPE_CHECKING:  # templates.signals imports this module's patterns
    from diagnoser.templates.signals import LossRead

STEP = regex.compile(r"(?i)\b(?:iteration|iter|global_step|step)\s*[:=#]?\s*(\d{1,10})\b")
CHECKPOINT_STEP = regex.compile(
    r"(?i)checkpoint[-_](\d{1,10})\b|\b(?:iteration|iter|global_step|step)[\s:=_#-]*(\d{1,10})\b"
)
SAVED = regex.compile(r"(?i)\b(?:sav(?:ed|ing|e)|wr(?:ote|iting)|stor(?:ed|ing))\b")
NOT_A_SAVE = regex.compile(r"(?i)\b(?:load(?:ed|ing)?|resum(?:ed|ing|e)|restor(?:ed|ing)|fail)")
TAIL_LINES = 64
"""How far back from a batch's end to look for its last progress line."""


def may_step(line: str) -> bool:
    """A literal prefilter for `STEP`: every word it matches contains `iter` or `step`, and
    two substring searches cost a tenth of the regex on the lines that have neither."""
    lowered = line.lower()
    return "step" in lowered or "iter" in lowered


def step_search(line: str) -> regex.Match[str] | None:
    """`STEP.search(line)` for a line `may_step` lets through, None for the others.

    On an ASCII line the search starts where the first `step` or `iter` could begin a match
    (`global_step` puts it 7 characters in), not at the line's start: each match holds one of
    them, and `\\b` still sees the character before the start. A progress line's launcher and
    logger prefixes are most of it: skipping them takes about 40 % off the search."""
    lowered = line.lower()
    at_step, at_iter = lowered.find("step"), lowered.find("iter")
    if at_step < 0 and at_iter < 0:
        return None
    if not line.isascii():  # case folding may match other letters, at other offsets
        return STEP.search(line)
    first = at_iter if at_step < 0 else at_step if at_iter < 0 else min(at_step, at_iter)
    return STEP.search(line, max(0, first - 7))


@dataclass(slots=True)
class Progress:
    last_step: int | None = None
    last_checkpoint_step: int | None = None

    def observe(self, batch: LineBatch, reads: Mapping[int, LossRead] | None = None) -> None:
        """`reads`: lines whose step an earlier stage read already (batch index -> `LossRead`,
        whose step is `step_search`'s), not searched again."""
        lines = batch.lines
        for i in range(len(lines) - 1, max(0, len(lines) - TAIL_LINES) - 1, -1):
            read = reads.get(i) if reads else None
            if read is not None:
                if read[0] is None:
                    continue
                step = read[0]
            elif (match := step_search(lines[i])) is not None:
                step = int(match.group(1))
            else:
                continue
            self.last_step = max(step, self.last_step or 0)
            break
        if "heckpoint" not in "\n".join(lines):
            return
        for line in lines:
            if "heckpoint" in line and SAVED.search(line) and not NOT_A_SAVE.search(line):
                match = CHECKPOINT_STEP.search(line)
                if match is not None:
                    step = int(match.group(1) or match.group(2))
                    self.last_checkpoint_step = max(step, self.last_checkpoint_step or 0)

    def as_record(self) -> dict[str, int] | None:
        if self.last_step is None and self.last_checkpoint_step is None:
            return None
        record: dict[str, int] = {}
        if self.last_step is not None:
            record["last_step"] = self.last_step
        if self.last_checkpoint_step is not None:
            record["last_checkpoint_step"] = self.last_checkpoint_step
        if self.last_step is not None and self.last_checkpoint_step is not None:
            record["steps_lost"] = max(0, self.last_step - self.last_checkpoint_step)
        return record
