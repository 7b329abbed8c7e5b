"""Online template mining: lines stream in, templates with counts, samples and typed slots come out.

One miner per job family. A line is masked (`masking`), split into words, and compared with the
templates that have as many words. The similarity counts only words that carry text: a word made
of slots and punctuation alone (a timestamp, a pid) says nothing about which event a line is, so
headers of raw lines do not glue different events together. The best template at or above
`MinerConfig.similarity` takes the line; the words where they differ become `<*>` (or, when only
the slot types differ, the slot widens to `<*>`). Two templates that end up identical merge; the
younger id then resolves to the older one through `get`.

Two caches keep the common case to one regex pass and a dict lookup: the line's digit skeleton,
then its masked words. Both are bounded, and so is the number of templates: past
`max_templates` the least recently seen template is evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from diagnoser.templates.masking import (
    SENTINEL,
    SLOT_OF_SENTINEL,
    mask_line,
    render_masked,
    skeleton,
    split_words,
)
from diagnoser.templates.model import Slot, TemplateView

_ANY = SENTINEL[Slot.ANY]
_SENTINELS = frozenset(SENTINEL.values())
_GENERIC = str.maketrans(dict.fromkeys(SENTINEL.values(), _ANY))

CONST, VAR, WILD, WORD = 0, 1, 2, 3
"""Word kinds: text that names the event; slots and punctuation only; a position merged to `<*>`;
a plain word (letters with surrounding punctuation), which only `siblings` lines can widen."""
_PUNCT = "()[]{}\"'<>,.;:!?"

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class MinerConfig:
    """One configuration for every log; nothing here is meant to be tuned per source."""

    max_templates: int = 1000
    """Per miner (per family); the least recently seen template is evicted past it."""
    similarity: float = 0.5
    """Share of text words a line must have in common with a template to join it."""
    max_samples: int = 5
    max_line_chars: int = 4096
    """Longer lines are mined (and sampled) on their first `max_line_chars` characters."""
    sibling_values: int = 5
    """Templates that differ only in one plain word: this many make that word a variable."""
    cache_entries: int = 50_000
    """Per cache; a full cache is dropped and refilled, which bounds memory."""


def _kind(word: str) -> int:
    if not any(c in _SENTINELS for c in word):
        return WORD if word.strip(_PUNCT).isalpha() else CONST
    if word == _ANY:
        return WILD
    return CONST if any(c.isalpha() for c in word) else VAR


def _clean(text: str) -> str:
    """Text that encodes as UTF-8 (lone surrogates become U+FFFD), for JSON and databases."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


class _Template:
    __slots__ = (
        "absorbed",
        "count",
        "first_seen",
        "generic",
        "holes",
        "id",
        "key",
        "kinds",
        "last_seen",
        "samples",
        "seps",
        "words",
    )

    def __init__(self, tid: int, words: list[str], seps: list[str], line_no: int) -> None:
        self.id = tid
        self.words = words
        self.seps = seps
        self.generic = [w.translate(_GENERIC) for w in words]
        self.kinds = [_kind(w) for w in words]
        self.key = " ".join(words)
        self.count = 0
        self.first_seen = line_no
        self.last_seen = line_no
        self.samples: list[str] = []
        self.absorbed: list[int] = []
        self.holes: list[tuple[object, ...]] = []

    def set_wild(self, i: int) -> None:
        self.words[i] = _ANY
        self.generic[i] = _ANY
        self.kinds[i] = WILD
        self.key = " ".join(self.words)

    def widen(self, words: list[str], generic: list[str]) -> bool:
        """Generalise where `words` differ; True when the template changed."""
        changed = False
        for i, (mine, theirs) in enumerate(zip(self.words, words, strict=True)):
            if mine in (theirs, _ANY):
                continue
            if self.generic[i] == generic[i]:
                merged = "".join(a if a == b else _ANY for a, b in zip(mine, theirs, strict=True))
            else:
                merged = _ANY
            if merged != mine:
                self.words[i] = merged
                self.generic[i] = merged.translate(_GENERIC)
                self.kinds[i] = _kind(merged)
                changed = True
        if changed:
            self.key = " ".join(self.words)
        return changed

    def view(self) -> TemplateView:
        text = "".join(
            sep + render_masked(word) for sep, word in zip(self.seps, self.words, strict=False)
        )
        slots = tuple(SLOT_OF_SENTINEL[c] for w in self.words for c in w if c in _SENTINELS)
        return TemplateView(
            id=self.id,
            text=_clean(text),
            slots=slots,
            count=self.count,
            first_seen=self.first_seen,
            last_seen=self.last_seen,
            samples=tuple(self.samples),
        )


def _similarity(t: _Template, generic: list[str], kinds: list[int]) -> float:
    match = total = 0
    for a, k, b, lk in zip(t.generic, t.kinds, generic, kinds, strict=True):
        if k == WILD:
            continue
        if a == b:
            if k != VAR:
                match += 1
                total += 1
        elif k == WORD and lk == WORD:
            return -1.0
        elif k != VAR or lk != VAR:
            total += 1
    return match / total if total else 1.0


class TemplateMiner:
    """Groups lines into templates as they stream (one instance per job family; not thread-safe)."""

    def __init__(self, config: MinerConfig | None = None) -> None:
        self.config = config or MinerConfig()
        self._templates: OrderedDict[int, _Template] = OrderedDict()
        """Least recently seen first."""
        self._buckets: dict[int, dict[str, _Template]] = {}
        """Word count -> template key -> template."""
        self._alias: dict[int, int] = {}
        self._holes: dict[tuple[object, ...], dict[int, _Template]] = {}
        """(position, the other words) -> templates equal but for a plain word there."""
        self._by_skeleton: dict[str, int] = {}
        self._by_masked: dict[str, int] = {}
        self._next_id = 1
        self._lines = 0

    # -- public API -------------------------------------------------------------------------

    def add(self, line: str) -> int:
        """Group one line, learning from it; returns its template's id."""
        self._lines += 1
        line = line[: self.config.max_line_chars]
        skel = skeleton(line)
        t = self._cached(self._by_skeleton, skel)
        if t is None:
            masked = mask_line(line)
            words = masked.split()
            mkey = " ".join(words)
            t = self._cached(self._by_masked, mkey)
            if t is None:
                t = self._learn(masked, words)
                self._remember(self._by_masked, mkey, t.id)
            self._remember(self._by_skeleton, skel, t.id)
        t.count += 1
        t.last_seen = self._lines
        if len(t.samples) < self.config.max_samples:
            t.samples.append(_clean(line))
        self._templates.move_to_end(t.id)
        return t.id

    def match(self, line: str) -> int | None:
        """The id of the template `line` would join, without learning anything from it."""
        line = line[: self.config.max_line_chars]
        t = self._cached(self._by_skeleton, skeleton(line))
        if t is not None:
            return t.id
        words = mask_line(line).split()
        t = self._cached(self._by_masked, " ".join(words))
        if t is None:
            t = self._best(words)[0]
        return None if t is None else t.id

    def get(self, template_id: int) -> TemplateView | None:
        """A snapshot of the template, following merges; None once evicted."""
        t = self._resolve(template_id)
        return None if t is None else t.view()

    def templates(self) -> list[TemplateView]:
        """Snapshots of every live template, most frequent first."""
        live = sorted(self._templates.values(), key=lambda t: (-t.count, t.id))
        return [t.view() for t in live]

    def __len__(self) -> int:
        return len(self._templates)

    @property
    def lines(self) -> int:
        """How many lines `add` has seen."""
        return self._lines

    # -- learning ---------------------------------------------------------------------------

    def _learn(self, masked: str, words: list[str]) -> _Template:
        generic = [w.translate(_GENERIC) for w in words]
        kinds = [_kind(w) for w in words]
        best, _ = self._best(words, generic, kinds)
        if best is None:
            _, seps = split_words(masked)
            return self._create(words, seps)
        if best.key != " ".join(words):
            self._unindex(best)
            best.widen(words, generic)
            best = self._index(best)
        return best

    def _best(
        self,
        words: list[str],
        generic: list[str] | None = None,
        kinds: list[int] | None = None,
    ) -> tuple[_Template | None, float]:
        bucket = self._buckets.get(len(words))
        if not bucket:
            return None, 0.0
        exact = bucket.get(" ".join(words))
        if exact is not None:
            return exact, 1.0
        if generic is None or kinds is None:
            generic = [w.translate(_GENERIC) for w in words]
            kinds = [_kind(w) for w in words]
        best: _Template | None = None
        best_sim = -1.0
        for t in bucket.values():
            sim = _similarity(t, generic, kinds)
            if sim > best_sim or (sim == best_sim and best is not None and t.count > best.count):
                best, best_sim = t, sim
        if best is None or best_sim < self.config.similarity:
            return None, best_sim
        return best, best_sim

    def _create(self, words: list[str], seps: list[str]) -> _Template:
        t = _Template(self._next_id, list(words), seps, self._lines)
        self._next_id += 1
        self._templates[t.id] = t
        t = self._index(t)
        self._templates.move_to_end(t.id)
        while len(self._templates) > self.config.max_templates:
            self._evict()
        return t

    def _index(self, t: _Template) -> _Template:
        """Put an unindexed template in its bucket; returns what it became after merges."""
        bucket = self._buckets.setdefault(len(t.words), {})
        twin = bucket.get(t.key)
        if twin is not None:
            if twin.id < t.id:
                self._fold(keep=twin, gone=t)
                return twin
            self._unindex(twin)
            self._fold(keep=t, gone=twin)
        bucket[t.key] = t
        for i, kind in enumerate(t.kinds):
            if kind != WORD:
                continue
            hole = (i, *t.words[:i], *t.words[i + 1 :])
            group = self._holes.setdefault(hole, {})
            group[t.id] = t
            t.holes.append(hole)
            if len(group) >= self.config.sibling_values:
                return self._collapse(list(group.values()), i)
        return t

    def _unindex(self, t: _Template) -> None:
        bucket = self._buckets[len(t.words)]
        if bucket.get(t.key) is t:
            del bucket[t.key]
            if not bucket:
                del self._buckets[len(t.words)]
        for hole in t.holes:
            group = self._holes[hole]
            del group[t.id]
            if not group:
                del self._holes[hole]
        t.holes.clear()

    def _collapse(self, siblings: list[_Template], position: int) -> _Template:
        """Templates equal but for one plain word: that word is a variable after all."""
        keep = min(siblings, key=lambda t: t.id)
        for t in siblings:
            self._unindex(t)
            if t is not keep:
                self._fold(keep=keep, gone=t)
        keep.set_wild(position)
        return self._index(keep)

    def _fold(self, keep: _Template, gone: _Template) -> None:
        """Count `gone` (unindexed) into `keep`; `gone`'s id now resolves to `keep`."""
        del self._templates[gone.id]
        keep.count += gone.count
        keep.first_seen = min(keep.first_seen, gone.first_seen)
        keep.last_seen = max(keep.last_seen, gone.last_seen)
        keep.samples = (keep.samples + gone.samples)[: self.config.max_samples]
        self._alias[gone.id] = keep.id
        keep.absorbed.append(gone.id)
        keep.absorbed.extend(gone.absorbed)
        for old in gone.absorbed:
            self._alias[old] = keep.id
        gone.absorbed = []

    def _evict(self) -> None:
        _, t = self._templates.popitem(last=False)
        self._unindex(t)
        for old in t.absorbed:
            self._alias.pop(old, None)

    # -- caches -----------------------------------------------------------------------------

    def _resolve(self, tid: int) -> _Template | None:
        t = self._templates.get(tid)
        if t is None and tid in self._alias:
            t = self._templates.get(self._alias[tid])
        return t

    def _cached(self, cache: dict[str, int], key: str) -> _Template | None:
        tid = cache.get(key)
        if tid is None:
            return None
        t = self._resolve(tid)
        if t is None:
            del cache[key]
        return t

    def _remember(self, cache: dict[str, int], key: str, tid: int) -> None:
        if len(cache) >= self.config.cache_entries:
            cache.clear()
        cache[key] = tid

    # -- state ------------------------------------------------------------------------------

    def to_json(self) -> dict[str, object]:
        """Plain JSON state (no caches: they refill from the templates)."""
        return {
            "version": STATE_VERSION,
            "config": asdict(self.config),
            "next_id": self._next_id,
            "lines": self._lines,
            "templates": [
                {
                    "id": t.id,
                    "words": t.words,
                    "seps": t.seps,
                    "count": t.count,
                    "first_seen": t.first_seen,
                    "last_seen": t.last_seen,
                    "samples": t.samples,
                    "absorbed": t.absorbed,
                }
                for t in self._templates.values()
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TemplateMiner:
        """Restore `to_json` output; raises ValueError on anything else."""
        try:
            if data["version"] != STATE_VERSION:
                raise ValueError(f"unsupported miner state version {data['version']!r}")
            miner = cls(MinerConfig(**data["config"]))
            miner._next_id = int(data["next_id"])
            miner._lines = int(data["lines"])
            for raw in data["templates"]:
                words = [str(w) for w in raw["words"]]
                t = _Template(int(raw["id"]), words, [str(s) for s in raw["seps"]], 0)
                t.count = int(raw["count"])
                t.first_seen = int(raw["first_seen"])
                t.last_seen = int(raw["last_seen"])
                t.samples = [str(s) for s in raw["samples"]]
                t.absorbed = [int(i) for i in raw["absorbed"]]
                miner._templates[t.id] = t
                for old in t.absorbed:
                    miner._alias[old] = t.id
                miner._index(t)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed miner state: {exc}") from exc
        return miner
