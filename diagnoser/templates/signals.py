"""Training signals read from progress lines: step, loss, lr, grad norm, throughput, checkpoints.

The compressor hands over the lines of progress templates (filtered or kept), so the numbers a
filter drops from the log are still watched. From them: a NaN/inf loss or grad norm, a loss
spike (above `spike_factor` times the rolling mean of the last `window` losses, InternEvo's
threshold by default), a throughput drop (below `drop_factor` times its rolling mean), and the
last checkpoint saved before a spike, which is where a restart should resume from. Step and
checkpoint parsing reuse `diagnosis.progress`.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

import regex

from diagnoser.diagnosis.progress import CHECKPOINT_STEP, NOT_A_SAVE, SAVED, STEP, step_search

_NUMBER = r"[-+]?(?:nan|inf(?:inity)?|[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+)"
METRIC = regex.compile(
    r"(?i)(?<![\w/])(?P<key>lm[ _]loss|train[ _]loss|loss|learning[ _]rate|lr|grad[ _]norm"
    r"|tokens/s(?:ec)?|tokens per second|samples/s(?:ec)?|samples per second|tflops|throughput"
    r")(?:\s*\([^)]{0,20}\))?['\"]?\s*[:=]?\s*['\"]?(?P<value>" + _NUMBER + r")(?![\w.])"
)
LOSS = regex.compile(
    r"(?i)(?<![\w/])(?:lm[ _]loss|train[ _]loss|loss)(?:\s*\([^)]{0,20}\))?['\"]?\s*[:=]?\s*['\"]?"
    r"(?P<value>" + _NUMBER + r")(?![\w.])"
)
"""`METRIC`'s loss keys alone: what a diagnosis reads from a progress line, at a third the cost."""
PROGRESS_WORDS = regex.compile(
    r"(?i)\b(?:loss|lr|learning rate|grad[ _]norm|tokens/s|samples/s|throughput|tflops|iteration"
    r"|iter|step|global_step|checkpoint)\b"
)
"""A template whose text has one of these is a progress template: its lines go to `Signals`."""

_KEYS = {
    "lm loss": "loss",
    "lm_loss": "loss",
    "train loss": "loss",
    "train_loss": "loss",
    "loss": "loss",
    "learning rate": "lr",
    "learning_rate": "lr",
    "lr": "lr",
    "grad norm": "grad_norm",
    "grad_norm": "grad_norm",
}


_NAMES = {
    **_KEYS,
    "iteration": "step",
    "iter": "step",
    "step": "step",
    "global_step": "step",
    "tokens/s": "throughput",
    "tokens/sec": "throughput",
    "tokens_per_sec": "throughput",
    "samples/s": "throughput",
    "samples/sec": "throughput",
    "samples_per_sec": "throughput",
    "tflops": "throughput",
    "throughput": "throughput",
}
_SLOT = re.compile(r"<(int|float|hex|ip|path|uuid|duration|\*)>")
_LAST_NAME = re.compile(r"([A-Za-z_/]+(?: [A-Za-z_/]+)?)[ :=]*$")
_VALUE_SLOT = {"int": r"[-+]?[0-9]+", "float": r"[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?"}


class Extractor:
    """Reads the numbers of one progress template's lines with one stdlib `re` fullmatch.

    Built from the template text: each INT or FLOAT slot right after a known name (`loss=`,
    `lm loss:`, `iteration`, `grad_norm=`, `tokens/s=`) becomes a named group.

    `loss_read` also gives what `Signals.observe_loss` (the live diagnosis's reader) would
    read from a line the extractor matched, from the same match, where the template proves
    it (`LossPlan`): the line is then read once for both.
    """

    __slots__ = ("_fullmatch", "_metrics", "_rest", "_step_at", "names", "plan")

    def __init__(
        self, fullmatch: re.Pattern[str], names: dict[str, str], plan: LossPlan | None = None
    ) -> None:
        self._fullmatch = fullmatch.fullmatch
        self.names = names
        """Group name -> metric (step, loss, lr, grad_norm, throughput)."""
        self._metrics = tuple(names[group] for group in fullmatch.groupindex)
        """The metrics in group order: the pattern's only groups are these named ones."""
        self.plan = plan
        """Where `observe_loss` would find its step and loss (None: not provable)."""
        metrics = self._metrics
        self._step_at = metrics.index("step") if "step" in metrics else None
        self._rest = tuple((k, name) for k, name in enumerate(metrics) if name != "step")
        """(index, metric) of the groups `Signals.record` reads after the step, in order."""

    @classmethod
    def of(cls, template: str) -> Extractor | None:
        parts: list[str] = []
        names: dict[str, str] = {}
        literals: list[str] = []
        groups: list[int | None] = []
        """Per slot, the index of its group in the match (None: not a named group)."""
        pos = 0
        for m in _SLOT.finditer(template):
            literal = template[pos : m.start()]
            literals.append(literal)
            parts.append(_literal(literal))
            slot = m.group(1)
            name = _LAST_NAME.search(literal)
            metric = _NAMES.get(name.group(1).lower()) if name else None
            if metric is None and name and " " in name.group(1):
                metric = _NAMES.get(name.group(1).split()[-1].lower())
            if metric is not None and slot in _VALUE_SLOT and metric not in names.values():
                group = f"g{len(names)}"
                groups.append(len(names))
                names[group] = metric
                parts.append(f"[ \\t]*(?P<{group}>{_VALUE_SLOT[slot]})[ \\t]*")
            else:
                groups.append(None)
                parts.append("[ \\t]*[^ \\t]+?[ \\t]*" if slot == "*" else "[ \\t]*.+?[ \\t]*")
            pos = m.end()
        literals.append(template[pos:])
        parts.append(_literal(template[pos:]))
        if not names:
            return None
        pattern = re.compile("[ \\t]*" + "".join(parts) + "[ \\t]*")
        return cls(pattern, names, LossPlan.of(literals, groups))

    def read(self, line: str) -> dict[str, float] | None:
        m = self._fullmatch(line)
        if m is None:
            return None
        return dict(zip(self._metrics, map(float, m.groups()), strict=True))

    def record(
        self, line: str, signals: Signals, line_no: int, plan: bool = False
    ) -> LossRead | Literal[False] | None:
        """`signals.record(self.read(line), line_no)` without the dict: False when the line
        does not match; else, with `plan`, the line's `LossRead` where the plan proves it."""
        matched = self._groups(line)
        if matched is None:
            return False
        texts, values = matched
        at = self._step_at
        signals.record_row(values[at] if at is not None else None, self._rest, values, line_no)
        if plan and self.plan is not None:
            return self.plan.read(line, texts, values)
        return None

    def read_both(self, line: str) -> tuple[dict[str, float], LossRead | None] | None:
        """`read`, and the `LossRead` of the line where the plan proves it (else None)."""
        matched = self._groups(line)
        if matched is None:
            return None
        texts, values = matched
        read = self.plan.read(line, texts, values) if self.plan is not None else None
        return dict(zip(self._metrics, values, strict=True)), read

    def _groups(self, line: str) -> tuple[tuple[str, ...], tuple[float, ...]] | None:
        """The texts of the line's named groups and their values (None: no match)."""
        m = self._fullmatch(line)
        if m is None:
            return None
        texts: tuple[str, ...] = m.groups()
        return texts, tuple(map(float, texts))


_LOSS_VALUE = regex.compile(
    r"(?i)(?:\s*\([^)]{0,20}\))?['\"]?\s*[:=]?\s*['\"]?(?P<value>" + _NUMBER + r")(?![\w.])"
)
"""What follows a loss key in `LOSS`, matched where a literal search found the key."""


_PLAIN_VALUE = re.compile(r" *[:=]? *(?P<value>[0-9]+(?:\.[0-9]*)?)(?=[ \t,;|)\]}]|\Z)")
"""The common shapes of `_LOSS_VALUE` (`loss=2.38`, `loss: 2.38`, `loss 2.38 |`) in one stdlib
match at a third of its cost. Where this matches, `_LOSS_VALUE` matches the same text: its
optional parts before the number find nothing else to take, and the character after the number
is neither a word character, a dot nor an exponent. Anything else goes to `_LOSS_VALUE`."""


def _key_start(before: str) -> bool:
    """`LOSS`'s look-behind: a key starts a word and no path."""
    return not before or not (before[-1].isalnum() or before[-1] in "_/")


def _starts_key(lowered: str, at: int) -> bool:
    """Whether the `loss` at `at` ends a key `LOSS` accepts: it, or the `lm_` or `train_`
    before it, starts a word (`lm loss` needs no check of its own: a space starts a word)."""
    if _key_start(lowered[max(0, at - 1) : at]):
        return True
    for prefix in ("lm_", "train_"):
        start = at - len(prefix)
        if start >= 0 and lowered.startswith(prefix, start):
            return _key_start(lowered[max(0, start - 1) : start])
    return False


def last_loss(line: str) -> float | None:
    """The last value `LOSS` finds in the line, at a literal search's cost where it has none:
    each `loss` is found with `str.find`, its key's start checked as `LOSS` checks it, and only
    the value after it is matched."""
    lowered = line.lower()
    if len(lowered) != len(line):  # lower-casing moved the offsets (rare letters): the regex
        found = [float(m["value"]) for m in LOSS.finditer(line)]
        return found[-1] if found else None
    value = None
    at = lowered.find("loss")
    while at >= 0:
        if _starts_key(lowered, at):
            m = _PLAIN_VALUE.match(line, at + 4) or _LOSS_VALUE.match(line, at + 4)
            if m is not None:
                value = float(m["value"])  # the last one wins, as in `observe`'s dict
                at = lowered.find("loss", m.end())
                continue
        at = lowered.find("loss", at + 4)
    return value


def _literal(text: str) -> str:
    return "[ \\t]+".join(re.escape(p) for p in re.split(r"[ \t]+", text))


LossRead = tuple[int | None, float | None]
"""What `Signals.observe_loss` reads from a line that is no checkpoint save: its step and its
loss (None: the line has none)."""

_STEP_KEY = regex.compile(r"(?i)(?:iteration|iter|global_step|step)[ \t]*[:=#]?[ \t]*")
"""A literal that ends in a step key and its separator: `STEP`'s number is the next slot."""
_LOSS_KEY = regex.compile(r"(?i)(?:lm[ _]loss|train[ _]loss|loss)['\"]?[ \t]*[:=]?[ \t]*")
"""Likewise for `LOSS` (no parenthesis: whitespace in one could outgrow its 20 characters)."""
_LOSS_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+)")
"""A slot's text that `LOSS`'s number takes whole (it is followed by no word character)."""
_WORDS = ("step", "iter", "loss")
"""Every `STEP` match holds `step` or `iter`, every `LOSS` match `loss`."""


class LossPlan:
    """Where `Signals.observe_loss` finds the step and the loss in the lines of one template,
    proved from the template's literal text (`of`), so that the extractor's match gives them.

    On every line the template matches whose `step`, `iter` and `loss` all lie in its literal
    text (their counts in the line are the literal text's, checked per line), `STEP` and
    `LOSS` can only match where that text says: the key and its separator end a literal and
    the number is the named slot right after it, followed by no word character. A template
    with a key whose match the literal text alone cannot decide (a key at the edge of a slot,
    a number in the literal, two places either could match) has no plan: its lines are read
    as before. `read` answers None where a line is not proved (a checkpoint word, non-ASCII
    text, a keyword in a slot, a slot's number `STEP` or `LOSS` would read otherwise).
    """

    __slots__ = ("counts", "loss", "step")

    def __init__(self, counts: tuple[int, int, int], step: int | None, loss: int | None) -> None:
        self.counts = counts
        """Occurrences of `_WORDS` in the template's literal text."""
        self.step = step
        """Index in the match's groups of the slot `STEP` reads (None: no `STEP` match)."""
        self.loss = loss
        """Likewise for `LOSS`."""

    @classmethod
    def of(cls, literals: list[str], groups: list[int | None]) -> LossPlan | None:
        """The plan of a template: its literal texts (one more than its slots) and, per slot,
        its group's index in the extractor's match (None: not a group). None: not provable."""
        if not all(text.isascii() for text in literals):
            return None
        found: dict[str, set[int]] = {"step": set(), "loss": set()}
        for j, text in enumerate(literals):
            lowered = text.lower()
            for word in _WORDS:
                kind = "loss" if word == "loss" else "step"
                at = lowered.find(word)
                while at >= 0:
                    outcome = _site(literals, groups, j, at, word)
                    if outcome is False:
                        return None
                    if outcome is not None:
                        found[kind].add(outcome)
                    at = lowered.find(word, at + len(word))
        if len(found["step"]) > 1 or len(found["loss"]) > 1:
            return None
        counts = tuple(sum(text.lower().count(word) for text in literals) for word in _WORDS)
        step = next(iter(found["step"]), None)
        loss = next(iter(found["loss"]), None)
        return cls((counts[0], counts[1], counts[2]), step, loss)

    def read(self, line: str, texts: tuple[str, ...], values: tuple[float, ...]) -> LossRead | None:
        """What `Signals.observe_loss` reads from `line`, given the extractor's group texts
        of it and their values; None where the plan does not prove it."""
        if not line.isascii() or "heckpoint" in line:
            return None
        lowered = line.lower()
        steps, iters, losses = self.counts
        if (
            lowered.count("loss") != losses
            or lowered.count("step") != steps
            or lowered.count("iter") != iters
        ):
            return None
        step = loss = None
        if self.step is not None:
            text = texts[self.step]
            if not text.isdigit() or len(text) > 10:
                return None
            step = int(values[self.step])  # ten digits at most: the float is exact
        if self.loss is not None:
            text = texts[self.loss]
            # Digits with at most one dot, the common case, need no regex.
            if not text.replace(".", "", 1).isdigit() and _LOSS_NUMBER.fullmatch(text) is None:
                return None
            loss = values[self.loss]
        return step, loss


def _site(
    literals: list[str], groups: list[int | None], j: int, at: int, word: str
) -> int | bool | None:
    """The keyword `word` at `at` in literal `j`: None when no `STEP` / `LOSS` match can start
    there, the group index of the slot whose number it reads, False when the literal text
    cannot decide."""
    text = literals[j]
    lowered = text.lower()
    if j and at < 8:
        # A key with a prefix (`global_step`, `lm_loss`) could begin in the slot before: only
        # a character no key or look-behind takes (a space, punctuation) rules that out.
        before = text[at - 1] if at else ""
        if not before or before.isalnum() or before in "_/":
            return False
        starts = [at]
    else:
        prefixes = ("global_",) if word == "step" else ("lm_", "lm ", "train_", "train ")
        starts = [at - len(p) for p in prefixes if lowered[max(0, at - len(p)) : at] == p]
        starts.append(at)
    pattern = STEP if word in ("step", "iter") else LOSS
    key = _STEP_KEY if pattern is STEP else _LOSS_KEY
    site: int | None = None
    for start in starts:
        m = pattern.match(text, start, partial=True)
        if m is None:
            continue
        if not m.partial or key.fullmatch(text, start) is None:
            return False  # a number in the literal, or a separator the key does not take
        if j + 1 >= len(literals) or groups[j] is None:
            return False
        after = literals[j + 1]
        if after:
            if after[0].isalnum() or after[0] in "_.":
                return False
        elif j + 2 < len(literals):
            return False  # two slots in a row: the number's end is not the literal's
        site = groups[j]
    return site


class SignalKind(StrEnum):
    NAN_LOSS = "nan_loss"
    NAN_GRAD_NORM = "nan_grad_norm"
    LOSS_SPIKE = "loss_spike"
    THROUGHPUT_DROP = "throughput_drop"


@dataclass(frozen=True, slots=True)
class Signal:
    kind: SignalKind
    line_no: int
    step: int | None
    value: float
    baseline: float | None
    """The rolling mean the value was compared with (spikes and drops)."""
    resume_from: int | None
    """Step of the last checkpoint saved before the signal: where a restart should resume."""


@dataclass(frozen=True, slots=True)
class SignalConfig:
    spike_factor: float = 1.5
    window: int = 20
    """Losses (and throughputs) in the rolling mean."""
    min_window: int = 10
    """No spike or drop is called before this many values are in the mean (at most `window`)."""
    drop_factor: float = 0.5
    max_signals: int = 100


@dataclass(slots=True)
class Signals:
    """Per job: the last values seen and the signals raised, in line order."""

    config: SignalConfig = field(default_factory=SignalConfig)
    step: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    throughput: float | None = None
    last_checkpoint_step: int | None = None
    raised: list[Signal] = field(default_factory=list)
    _losses: deque[float] = field(default_factory=deque)
    _rates: deque[float] = field(default_factory=deque)
    _min_window: int = field(default=1, init=False, repr=False)
    """Values in a rolling mean before a spike or a drop is called (`SignalConfig`)."""

    def __post_init__(self) -> None:
        config = self.config
        self._min_window = max(1, min(config.min_window, config.window))
        # Bounded to the window: an append drops the oldest value, as a popleft past it did.
        size = max(0, config.window)
        self._losses = deque(self._losses, maxlen=size)
        self._rates = deque(self._rates, maxlen=size)

    def observe(self, line: str, line_no: int) -> None:
        """Read one progress line."""
        if "heckpoint" in line and SAVED.search(line) and not NOT_A_SAVE.search(line):
            m = CHECKPOINT_STEP.search(line)
            if m is not None:
                self.last_checkpoint_step = int(m.group(1) or m.group(2))
            return
        if (m := STEP.search(line)) is not None:
            self.step = int(m.group(1))
        values = {
            _KEYS.get(m["key"].lower(), "throughput"): float(m["value"])
            for m in METRIC.finditer(line)
        }
        self.record(values, line_no)

    def observe_loss(self, line: str, line_no: int) -> None:
        """Read one progress line for the losses alone (NaN and spikes), as `observe` reads
        them: its steps and checkpoints too, none of the other metrics. The live diagnosis
        needs no more, and the full metric scan is most of the cost of a progress line."""
        if "heckpoint" in line and SAVED.search(line) and not NOT_A_SAVE.search(line):
            m = CHECKPOINT_STEP.search(line)
            if m is not None:
                self.last_checkpoint_step = int(m.group(1) or m.group(2))
            return
        if (m := step_search(line)) is not None:
            self.step = int(m.group(1))
        value = last_loss(line)
        if value is not None:
            self._loss(value, line_no)

    def take_loss(self, read: LossRead, line_no: int) -> None:
        """`observe_loss` of a line whose step and loss were read already (`LossPlan`)."""
        step, loss = read
        if step is not None:
            self.step = step
        if loss is not None:
            self._loss(loss, line_no)

    def record(self, values: dict[str, float], line_no: int) -> None:
        """Numbers read from one progress line (by `observe` or a template's `Extractor`)."""
        names = [name for name in values if name != "step"]
        row = tuple(values[name] for name in names)
        self.record_row(values.get("step"), tuple(enumerate(names)), row, line_no)

    def record_row(
        self,
        step: float | None,
        rest: Sequence[tuple[int, str]],
        values: Sequence[float],
        line_no: int,
    ) -> None:
        """`record` of a line's step, then of each (index, metric) of `rest` (`values[index]`),
        in that order."""
        if step is not None and math.isfinite(step):
            self.step = int(step)
        for key, name in rest:
            value = values[key]
            if name == "loss":
                self._loss(value, line_no)
            elif name == "lr":
                self.lr = value
            elif name == "grad_norm":
                self.grad_norm = value
                if not math.isfinite(value):
                    self._raise(SignalKind.NAN_GRAD_NORM, line_no, value, None)
            else:
                self._rate(value, line_no)

    def _loss(self, value: float, line_no: int) -> None:
        self.loss = value
        if not math.isfinite(value):
            self._raise(SignalKind.NAN_LOSS, line_no, value, None)
            return
        window = self._losses
        if len(window) >= self._min_window:
            mean = sum(window) / len(window)
            if mean > 0 and value > self.config.spike_factor * mean:
                self._raise(SignalKind.LOSS_SPIKE, line_no, value, mean)
                return  # a spike does not join the baseline it is measured against
        window.append(value)

    def _rate(self, value: float, line_no: int) -> None:
        self.throughput = value
        window = self._rates
        if len(window) >= self._min_window:
            mean = sum(window) / len(window)
            if mean > 0 and value < self.config.drop_factor * mean:
                self._raise(SignalKind.THROUGHPUT_DROP, line_no, value, mean)
        window.append(value)

    def _raise(self, kind: SignalKind, line_no: int, value: float, baseline: float | None) -> None:
        if len(self.raised) >= self.config.max_signals:
            return
        self.raised.append(
            Signal(kind, line_no, self.step, value, baseline, self.last_checkpoint_step)
        )

    def as_record(self) -> dict[str, object]:
        """JSON for the CLI and the API: last values and every signal."""
        last = {
            "step": self.step,
            "loss": _finite(self.loss),
            "lr": _finite(self.lr),
            "grad_norm": _finite(self.grad_norm),
            "throughput": _finite(self.throughput),
            "last_checkpoint_step": self.last_checkpoint_step,
        }
        return {
            "last": {k: v for k, v in last.items() if v is not None},
            "signals": [
                {
                    "kind": s.kind.value,
                    "line_no": s.line_no,
                    "step": s.step,
                    "value": _finite(s.value) if math.isfinite(s.value) else str(s.value),
                    "baseline": s.baseline,
                    "resume_from_checkpoint_step": s.resume_from,
                }
                for s in self.raised
            ],
        }


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
