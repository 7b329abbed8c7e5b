"""The LLM Log Agent: a second filter proposer, asked k times per template, off the ingest path.

For a stable template the deterministic proposer could not filter, the agent shows the model the
template and its samples (redacted, defused, between `<log>` delimiters) and asks k times with
distinct seeds for a regex with capturing groups on the numeric slots and a name for each slot
(`SlotName`). Every answer is held to the same `Validator` the deterministic proposer uses, after
its capturing groups are made non-capturing (filters capture nothing; the names are kept in
group order). The valid answers vote: two agree when they accept exactly the same lines among
the samples and variants of them (digits, words and spacing changed), which also makes
textually equal patterns agree. The winner becomes a filter with proposer `llm` only when its
share of all k answers reaches `min_agreement` and no other group ties it; rejected answers are
recorded as `Rejection`s with their reason.

`submit` never waits: a bounded queue takes the work and drops (and counts) what does not fit;
`run` is the worker. The agent talks to the model through `JsonModel`, the shape of
`diagnoser.llm.client.LlmClient.complete_json`, so this module imports no HTTP client and stays
in the pure core.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import jinja2
import regex
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from diagnoser.config import default_prompts_dir
from diagnoser.llm.prompt import defuse
from diagnoser.llm.redaction import Redactor
from diagnoser.templates.compressor import Compressor
from diagnoser.templates.filters import Filter, FilterSet, Proposer, Rejection
from diagnoser.templates.model import TemplateView
from diagnoser.templates.validation import Validator

LOG_AGENT_PROMPT = "log_agent.v1"
MAX_REGEX_CHARS = 2000
MAX_SLOTS = 16
MAX_PROBES = 400
"""Lines each valid candidate is run on to decide which candidates agree."""

logger = logging.getLogger(__name__)


class SlotName(StrEnum):
    """What a numeric slot of a progress line measures (closed: the model picks one)."""

    STEP = "step"
    LOSS = "loss"
    LR = "lr"
    GRAD_NORM = "grad_norm"
    TOKENS_PER_S = "tokens_per_s"
    SAMPLES_PER_S = "samples_per_s"
    EPOCH = "epoch"
    ITERATION_TIME = "iteration_time"
    OTHER = "other"


class SlotRef(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: SlotName
    group: int | str = Field(description="capturing group: 1-based number or group name")


class AgentAnswer(BaseModel):
    """The JSON object one sample must produce."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    regex: str = Field(min_length=1, max_length=MAX_REGEX_CHARS)
    slots: list[SlotRef] = Field(default_factory=list, max_length=MAX_SLOTS)


def answer_schema() -> dict[str, Any]:
    """The wire schema: references inlined, every field required, no extra keys anywhere."""
    full = AgentAnswer.model_json_schema()
    definitions = full.get("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[-1]])
            out = {
                key: inline(value)
                for key, value in node.items()
                if key not in {"title", "description", "default", "pattern", "$defs"}
            }
            if out.get("type") == "object":
                out["required"] = list(out.get("properties", {}))
                out["additionalProperties"] = False
            return out
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    schema: dict[str, Any] = inline(full)
    return schema


class Completed(Protocol):
    @property
    def payload(self) -> object | None: ...
    @property
    def error(self) -> str | None: ...


class JsonModel(Protocol):
    """What the agent needs of an LLM client (`LlmClient` fits)."""

    async def complete_json(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        *,
        seed: int,
        temperature: float,
        max_tokens: int = ...,
    ) -> Completed: ...


class LogAgentPrompt:
    """Renders `prompts/<version>.j2` (macros `system(schema, slot_names)`, `user(template,
    samples)`) with StrictUndefined; every piece of log text is redacted and defused first."""

    def __init__(
        self,
        directory: Path | None = None,
        version: str = LOG_AGENT_PROMPT,
        redactor: Redactor | None = None,
    ) -> None:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(directory or default_prompts_dir()),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
        )
        self._module = env.get_template(f"{version}.j2").module
        self.version = version
        self._redactor = redactor or Redactor()

    def _safe(self, text: str) -> str:
        return defuse(self._redactor.redact(text).text)

    def messages(self, template: TemplateView) -> list[dict[str, str]]:
        render_system = getattr(self._module, "system")  # noqa: B009 - macros are dynamic
        render_user = getattr(self._module, "user")  # noqa: B009
        system = render_system(
            schema=json.dumps(answer_schema(), separators=(",", ":")),
            slot_names=", ".join(s.value for s in SlotName),
        )
        user = render_user(
            template=self._safe(template.text),
            samples=[self._safe(s) for s in template.samples],
        )
        return [{"role": "system", "content": str(system)}, {"role": "user", "content": str(user)}]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One sample's answer: the filter form of its regex, the slot names, or why it failed."""

    seed: int
    answered: str
    """The regex as the model wrote it (capturing groups and all), cut to `MAX_REGEX_CHARS`."""
    pattern: str | None
    """The filter form (capturing groups made non-capturing); None when there was none."""
    names: tuple[str, ...] = ()
    """One name per capturing group of `answered`, in group order."""
    reason: str | None = None
    """None when the candidate passed validation."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one template's round of k samples came to."""

    template_id: int
    candidates: tuple[Candidate, ...]
    votes: tuple[int, ...]
    """Sizes of the groups of agreeing valid candidates, largest first."""
    share: float
    """Largest group / k."""
    filter: Filter | None
    reason: str | None
    """Why no filter was added (None when one was)."""


def filter_form(pattern: str) -> tuple[str, list[str | None]]:
    """`pattern` with every capturing group made `(?:`; the groups' names (None if unnamed).

    A scan, not a parse: escapes and character classes are skipped. `(?P<n>`, `(?<n>` and `(`
    become `(?:`; other `(?...` constructs are left for the validator to judge.
    """
    out: list[str] = []
    names: list[str | None] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
            out.append(ch)
            i += 1
            continue
        if ch == "[":
            in_class = True
            out.append(ch)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("]")
                i += 1
            continue
        if ch == "(":
            named = regex.match(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>", pattern[i:])
            if named is not None:
                names.append(named.group(1))
                out.append("(?:")
                i += named.end()
                continue
            if not pattern.startswith("(?", i) and not pattern.startswith("(*", i):
                names.append(None)
                out.append("(?:")
                i += 1
                continue
        out.append(ch)
        i += 1
    return "".join(out), names


_NUMBER = regex.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?[a-zA-Z/%]*")


def slot_names(
    answer: AgentAnswer, groups: Sequence[str | None], samples: Sequence[str], compiled: Any
) -> tuple[tuple[str, ...], str | None]:
    """Names per group (unnamed groups are `other`), or why the slots do not fit the regex.

    A named slot must refer to an existing group, once, and hold a number in every sample."""
    names = [SlotName.OTHER.value] * len(groups)
    for ref in answer.slots:
        if isinstance(ref.group, int):
            index = ref.group
        elif ref.group.isdigit():
            index = int(ref.group)
        elif ref.group in groups:
            index = groups.index(ref.group) + 1
        else:
            return (), f"slot {ref.name.value} names no group {ref.group[:40]!r}"
        if not 1 <= index <= len(groups):
            return (), f"slot {ref.name.value} names group {index} of {len(groups)}"
        if names[index - 1] != SlotName.OTHER.value:
            return (), f"group {index} is named twice"
        names[index - 1] = ref.name.value
        if ref.name is SlotName.OTHER:
            continue
        for sample in samples:
            m = compiled.fullmatch(sample, timeout=0.05)
            value = m.group(index) if m is not None else None
            if value is not None and _NUMBER.fullmatch(value) is None:
                return (), f"slot {ref.name.value} holds {value[:40]!r}, not a number"
    return tuple(names), None


def judge(answer: object, seed: int, template: TemplateView, validator: Validator) -> Candidate:
    """One raw answer as a candidate: parsed, its slots checked, its filter form validated."""
    if not isinstance(answer, dict):
        return Candidate(seed, "", None, reason="no JSON object in the answer")
    try:
        parsed = AgentAnswer.model_validate(answer)
    except ValidationError as exc:
        raw = answer.get("regex")
        text = raw[:MAX_REGEX_CHARS] if isinstance(raw, str) else ""
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return Candidate(seed, text, None, reason=f"answer out of schema: {where}: {first['msg']}")
    pattern, groups = filter_form(parsed.regex)
    try:
        compiled = regex.compile(parsed.regex)
    except (regex.error, OverflowError, RecursionError) as exc:
        return Candidate(seed, parsed.regex, pattern, reason=f"does not compile: {exc}")
    if compiled.groups != len(groups):
        return Candidate(seed, parsed.regex, pattern, reason="unsupported: group syntax")
    reason = validator.check(pattern, template.samples)
    if reason is not None:
        return Candidate(seed, parsed.regex, pattern, reason=reason)
    try:
        names, reason = slot_names(parsed, groups, template.samples, compiled)
    except TimeoutError:
        names, reason = (), "too slow: reading the slots"
    return Candidate(seed, parsed.regex, pattern, names, reason)


_DIGITS = regex.compile(r"[0-9]+")
_WORD = regex.compile(r"[A-Za-z]+")
_BLANKS = regex.compile(r"[ \t]+")


def probes(samples: Sequence[str]) -> list[str]:
    """The samples and variants of them on which agreeing candidates must accept the same lines:
    each number changed (other digits, a sign, a decimal, a letter), each word changed, a token
    dropped, spacing widened, text added at either end."""
    out: dict[str, None] = {}
    for sample in samples[:5]:
        out[sample] = None
        for m in _DIGITS.finditer(sample):
            for new in ("7", "123456", "-" + m.group(0), m.group(0) + ".5", "1e5", "x"):
                out[sample[: m.start()] + new + sample[m.end() :]] = None
        for m in _WORD.finditer(sample):
            for new in ("zz", m.group(0).upper(), m.group(0) + "7"):
                out[sample[: m.start()] + new + sample[m.end() :]] = None
        tokens = _BLANKS.split(sample)
        for i in range(len(tokens)):
            out[" ".join(tokens[:i] + tokens[i + 1 :])] = None
        out[_BLANKS.sub("  ", sample)] = None
        out[sample + " x"] = None
        out["x " + sample] = None
    return list(out)[:MAX_PROBES]


def behaviour(pattern: str, lines: Sequence[str], timeout: float) -> tuple[bool, ...]:
    compiled = regex.compile(pattern)
    accepted: list[bool] = []
    for line in lines:
        try:
            accepted.append(compiled.fullmatch(line, timeout=timeout) is not None)
        except TimeoutError:
            accepted.append(False)
    return tuple(accepted)


def vote(
    candidates: Sequence[Candidate],
    template: TemplateView,
    k: int,
    min_agreement: float,
    timeout: float,
) -> tuple[Candidate | None, tuple[int, ...], float, str | None]:
    """The winning candidate (or None and why), group sizes and the winner's share of k."""
    valid = [c for c in candidates if c.reason is None and c.pattern is not None]
    if not valid:
        return None, (), 0.0, f"no valid candidate among {len(candidates)} of {k}"
    lines = probes(template.samples)
    groups: dict[tuple[bool, ...], list[Candidate]] = {}
    for c in valid:
        assert c.pattern is not None
        groups.setdefault(behaviour(c.pattern, lines, timeout), []).append(c)
    ranked = sorted(groups.values(), key=len, reverse=True)
    sizes = tuple(len(g) for g in ranked)
    share = sizes[0] / k
    if len(sizes) > 1 and sizes[0] == sizes[1]:
        return None, sizes, share, f"split vote {list(sizes)} of {k}"
    if share + 1e-9 < min_agreement:
        return None, sizes, share, f"agreement {sizes[0]}/{k} below {min_agreement:g}"
    winners = ranked[0]
    names = Counter(c.names for c in winners).most_common(1)[0][0]
    pattern = Counter(c.pattern for c in winners if c.names == names).most_common(1)[0][0]
    winner = next(c for c in winners if c.pattern == pattern and c.names == names)
    return winner, sizes, share, None


def pending(compressor: Compressor) -> list[TemplateView]:
    """Templates stable enough to filter (seen `Compressor.threshold` times, no guarded line, no
    failure word in text or samples) that no enabled or disabled filter covers yet."""
    covered = compressor.filters.by_template()
    out: list[TemplateView] = []
    for view in compressor.templates():
        if view.count < compressor.threshold(view):
            continue
        if view.id in covered or view.id in compressor.tainted:
            continue
        if compressor.guard.single([view.text, *view.samples]):
            continue
        out.append(view)
    return out


def _record(filters: FilterSet, rejection: Rejection) -> None:
    filters.rejections.append(rejection)
    del filters.rejections[: -FilterSet.MAX_RECORDS]


@dataclass
class AgentCounts:
    submitted: int = 0
    dropped: int = 0
    """Templates refused because the queue was full (offered again on a later sweep)."""
    asked: int = 0
    calls: int = 0
    failed_calls: int = 0
    accepted: int = 0
    rejected: int = 0
    """Rounds that ended without a filter."""
    errors: int = 0


@dataclass(frozen=True, slots=True)
class _Work:
    template: TemplateView
    family: Compressor


@dataclass
class LogAgent:
    """The Log Agent of one process: a bounded queue of templates and the worker that asks.

    Filters are added to the family's `FilterSet` from `run`, on the event loop that also runs
    ingest (the compressor is not thread-safe); only validation runs in a thread, against a
    snapshot of the family's guard corpus, and the winner is validated again before it is added.
    """

    client: JsonModel
    prompt: LogAgentPrompt = field(default_factory=LogAgentPrompt)
    k: int = 5
    min_agreement: float = 0.6
    temperature: float = 0.7
    seed: int = 0
    queue_size: int = 64
    max_tokens: int = 600
    counts: AgentCounts = field(default_factory=AgentCounts)
    outcomes: deque[Outcome] = field(default_factory=lambda: deque(maxlen=100))
    _queue: asyncio.Queue[_Work] = field(init=False, repr=False)
    _asked: weakref.WeakKeyDictionary[Compressor, dict[int, str]] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False
    )

    def __post_init__(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.queue_size)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def submit(self, template: TemplateView, family: Compressor) -> bool:
        """Queue `template` of `family` for the worker; never waits. False when the queue is
        full (counted in `counts.dropped`) or when this very template text was already taken."""
        asked = self._asked.setdefault(family, {})
        if asked.get(template.id) == template.text:
            return False
        try:
            self._queue.put_nowait(_Work(template, family))
        except asyncio.QueueFull:
            self.counts.dropped += 1
            return False
        asked[template.id] = template.text
        self.counts.submitted += 1
        return True

    def offer(self, family: Compressor) -> int:
        """Submit every `pending` template of `family` not yet taken; how many went in."""
        return sum(self.submit(view, family) for view in pending(family))

    async def watch(
        self, families: Callable[[], Iterable[Compressor]], interval_s: float = 5.0
    ) -> None:
        """Offer every family's pending templates every `interval_s` seconds, forever."""
        while True:
            for family in list(families()):
                self.offer(family)
            await asyncio.sleep(interval_s)

    async def run(self) -> None:
        """The worker: one template at a time, forever. A failed round is logged and counted."""
        while True:
            work = await self._queue.get()
            try:
                await self.propose(work.template, work.family)
            except Exception:
                self.counts.errors += 1
                logger.exception("log agent round failed for template %d", work.template.id)
            finally:
                self._queue.task_done()

    async def drain(self) -> None:
        """Wait until every queued template has been handled (for tests and shutdown)."""
        await self._queue.join()

    async def propose(self, template: TemplateView, family: Compressor) -> Outcome:
        """Ask k times, validate, vote; add the winner to `family.filters` when it is agreed."""
        self.counts.asked += 1
        messages = self.prompt.messages(template)
        schema = answer_schema()
        completions = await asyncio.gather(
            *(
                self.client.complete_json(
                    messages,
                    schema,
                    seed=self.seed + i,
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                )
                for i in range(self.k)
            ),
            return_exceptions=True,
        )
        self.counts.calls += len(completions)
        validator = Validator(family.validator.corpus, timeout=family.validator.timeout)
        answers: list[tuple[int, object | None, str | None]] = []
        for i, c in enumerate(completions):
            if isinstance(c, BaseException):
                if not isinstance(c, Exception):
                    raise c
                self.counts.failed_calls += 1
                answers.append((self.seed + i, None, f"call failed: {type(c).__name__}"))
            else:
                if c.payload is None:
                    self.counts.failed_calls += 1
                answers.append((self.seed + i, c.payload, c.error))
        if all(payload is None and "JSON" not in (error or "") for _, payload, error in answers):
            # The endpoint failed (breaker open, HTTP errors): a later sweep may ask again.
            self._asked.get(family, {}).pop(template.id, None)
        candidates, winner, sizes, share, reason = await asyncio.to_thread(
            self._judge_all, answers, template, validator
        )
        for cand in candidates:
            if cand.reason is not None and cand.pattern is not None:
                rejection = Rejection(template.id, cand.pattern, Proposer.LLM, cand.reason)
                _record(family.filters, rejection)
        added: Filter | None = None
        if winner is not None:
            added, reason = self._add(template, family, winner)
        outcome = Outcome(template.id, tuple(candidates), sizes, share, added, reason)
        if added is None:
            self.counts.rejected += 1
        else:
            self.counts.accepted += 1
        self.outcomes.append(outcome)
        return outcome

    def _judge_all(
        self,
        answers: Sequence[tuple[int, object | None, str | None]],
        template: TemplateView,
        validator: Validator,
    ) -> tuple[list[Candidate], Candidate | None, tuple[int, ...], float, str | None]:
        candidates = [
            judge(payload, seed, template, validator)
            if payload is not None
            else Candidate(seed, "", None, reason=error or "no answer")
            for seed, payload, error in answers
        ]
        winner, sizes, share, reason = vote(
            candidates, template, self.k, self.min_agreement, validator.timeout
        )
        return candidates, winner, sizes, share, reason

    @staticmethod
    def _add(
        template: TemplateView, family: Compressor, winner: Candidate
    ) -> tuple[Filter | None, str | None]:
        assert winner.pattern is not None
        live = family.miner.get(template.id)
        if live is None or live.id != template.id:
            return None, "the template was merged or evicted meanwhile"
        if template.id in family.filters.by_template():
            return None, "the template was filtered meanwhile"
        added = family.filters.add(
            template,
            winner.pattern,
            family.validator,
            proposer=Proposer.LLM,
            line_no=family.lines_in,
            names=winner.names,
        )
        if added is None:
            last = family.filters.rejections[-1]
            return None, f"rejected on re-validation: {last.reason}"
        return added, None
