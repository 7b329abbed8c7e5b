"""Online template mining: lines stream in, templates with counts, samples and typed slots come out.

One miner per job family. A line is masked (`masking`), split into words, and compared with the
templates that have as many words. The similarity counts only words that carry text: a word made
of slots and punctuation alone (a timestamp, a pid) says nothing about which event a line is, so
headers of raw lines do not glue different events together. The best template at or above
`MinerConfig.similarity` takes the line; the words where they differ become `<*>` (or, when only
the slot types differ, the slot widens to `<*>`). Two templates that end up identical merge; the
younger id then resolves to the older one through `get`.

Caches keep the common case to one `bytes.translate` and a dict lookup: the line's digit
skeleton, then its flat one (every digit a 1, but the 0 of `0x`), then a coarser one, then its
masked words. A new
masked line is compared only with the templates a signature index names (`_sign`), which are
all those it could join. All are bounded, and so is the number of
templates: past `max_templates` the least recently seen template is evicted.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from operator import attrgetter
from typing import Any, Final, TypeVar

from diagnoser.templates.masking import (
    SENTINEL,
    SLOT_OF_SENTINEL,
    coarse_words,
    collapse_digits,
    flat_skeleton,
    mask_coarse_word,
    mask_word,
    render_masked,
    skeleton,
    split_words,
)
from diagnoser.templates.masking import (
    words as words_of,
)
from diagnoser.templates.model import Slot, TemplateView

_W = TypeVar("_W", str, bytes)
"""A word as a line holds it (str) or as the coarse skeleton holds it (bytes)."""

_ANY: Final = SENTINEL[Slot.ANY]
_FINE: Final = bytes.maketrans(b"123456789", b"111111111")
"""`masking.skeleton`, inlined in `add`."""
_ZERO: Final = bytes.maketrans(b"0", b"1")
_SENTINELS: Final = frozenset(SENTINEL.values())
_SLOTS: Final = re.compile("[" + "".join(SENTINEL.values()) + "]")
"""Any sentinel. `str.translate` with a dict costs a raised KeyError per character of a
non-ASCII string (every masked word with a slot): a `sub` of this is ten times cheaper."""

CONST: Final = 0
VAR: Final = 1
WILD: Final = 2
WORD: Final = 3
"""Word kinds: text that names the event; slots and punctuation only; a position merged to `<*>`;
a plain word (letters with surrounding punctuation), which only `siblings` lines can widen."""
_PUNCT: Final = "()[]{}\"'<>,.;:!?"
_UNITS: Final = frozenset(("B", "KB", "MB", "GB", "TB", "PB", "KiB", "MiB", "GiB", "TiB", "PiB"))
"""A size unit after a number varies with it (`3.2 KB`, `1.1 MB`): a slot, not text."""

_bucket_order: Final = attrgetter("seq")
_TEXT: Final = (CONST, WORD)
STATE_VERSION: Final = 1
_MAX_ALIASES: Final = 1000
"""Per template: how many ids merged into it keep resolving to it."""
_MAX_SIBLING_WORDS: Final = 64
"""Longer templates skip the sibling index, whose cost grows with the square of the length."""


@dataclass(frozen=True, slots=True)
class MinerConfig:
    """One configuration for every log; nothing here is meant to be tuned per source."""

    max_templates: int = 1000
    """Per miner (per family); the least recently seen template is evicted past it."""
    similarity: float = 0.7
    """Share of text words a line must have in common with a template to join it."""
    max_samples: int = 5
    max_line_chars: int = 4096
    """Longer lines are mined (and sampled) on their first `max_line_chars` characters."""
    sibling_values: int = 4
    """Templates that differ only in one plain word: this many make that word a variable."""
    sibling_context: int = 2
    """...and only when the other words hold at least this many text words."""
    cache_entries: int = 50_000
    """Per cache; a full cache is dropped and refilled, which bounds memory."""

    def __post_init__(self) -> None:
        if min(self.max_templates, self.max_samples, self.max_line_chars, self.cache_entries) < 1:
            raise ValueError(
                "max_templates, max_samples, max_line_chars, cache_entries must be >= 1"
            )
        if not 0.0 < self.similarity <= 1.0:
            raise ValueError("similarity must be in (0, 1]")
        if self.sibling_values < 2 or self.sibling_context < 0:
            raise ValueError("sibling_values must be >= 2 and sibling_context >= 0")


def _shape(word: str) -> tuple[str, int]:
    """A masked word's generic form (every slot as `<*>`) and its kind (uncached: the miner
    caches shapes per instance, `TemplateMiner._shapes_of`)."""
    core = word.strip(_PUNCT)
    if word.isascii():  # no slot: sentinels are not ASCII
        if core in _UNITS:
            return word, VAR
        return word, WORD if core.isalpha() else CONST
    generic = _SLOTS.sub(_ANY, word)
    if core in _UNITS:
        return generic, VAR
    if _ANY not in generic:  # no slot
        return generic, WORD if core.isalpha() else CONST
    if word == _ANY:
        return generic, WILD
    rest = _SLOTS.sub("", word)
    # An ASCII letter is an ASCII character with two cases.
    text = rest.lower() != rest.upper() if rest.isascii() else any(c.isalpha() for c in rest)
    return generic, CONST if text else VAR


LEADER: Final = "...."
"""A dot leader: a word of four or more dots between a name and its value, as argument and
config dumps print them (`  lr ........ 0.0001`). Every leader is written as this one word, so
a dump's lines differ only in their name and value."""


def _key_value(words: list[str]) -> None:
    """`name .... value`: the name before a dot leader is a slot, and so is a one-word value
    that ends the line; a dump of hundreds of settings is then one template, not hundreds."""
    last = len(words) - 1
    for i in range(1, last):
        word = words[i]
        if len(word) >= len(LEADER) and not word.strip("."):
            words[i] = LEADER
            words[i - 1] = _ANY
            if i + 1 == last:
                words[last] = _ANY


_JSON_KEY: Final = '"' + _ANY + '":'


def _json_pair(words: list[str]) -> None:
    """`"name": value,` (a JSON config printed one pair per line): the name is a slot, and so is
    a one-word value followed by its comma, so the pairs of a dump share one template; an
    opening `{` or `[` stays text. The last pair of an object (no comma) stays as it is:
    `"<*>": <*>` would have too few literals to be a filter (`validation.MIN_LITERAL`), and,
    slots and punctuation alone, it would take every comma-ended pair too."""
    if len(words) != 2:
        return
    key, value = words
    if len(key) > 3 and key[0] == '"' and key.endswith('":') and '"' not in key[1:-2]:
        if value[:1] in ("{", "["):
            words[0] = _JSON_KEY
        elif value.endswith(",") and len(value) > 1:
            words[0] = _JSON_KEY
            words[1] = _ANY + ","


def _clean(text: str) -> str:
    """Text fit for JSON and databases: NUL and lone surrogates become U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if 0xD800 <= ord(c) < 0xE000 else c for c in text)
    return text.replace("\x00", "\ufffd")


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
        "line",
        "samples",
        "seps",
        "seq",
        "signature",
        "words",
    )

    def __init__(
        self,
        tid: int,
        words: list[str],
        seps: list[str] | None,
        line_no: int,
        generic: list[str],
        kinds: list[int],
        line: str = "",
        key: str | None = None,
    ) -> None:
        self.id = tid
        self.words = words
        self.seps = seps
        """The whitespace before each word (and after the last), split from `line` when first
        asked for (`separators`): most templates of a cold run are never rendered."""
        self.line = line
        self.generic = generic
        self.kinds = kinds
        self.key = " ".join(words) if key is None else key
        self.seq = 0
        """When it joined its bucket: bucket order, which breaks ties between templates."""
        self.signature: list[tuple[int, str]] = []
        """Its entries in the bucket's signature index (`TemplateMiner._sign`)."""
        self.count = 0
        self.first_seen = line_no
        self.last_seen = line_no
        self.samples: list[str] = []
        self.absorbed: list[int] = []
        self.holes: list[tuple[int, int]] = []

    def set_wild(self, i: int) -> None:
        self.words[i] = _ANY
        self.generic[i] = _ANY
        self.kinds[i] = WILD
        self.key = " ".join(self.words)

    def widening(self, words: list[str], generic: list[str]) -> list[tuple[int, str]]:
        """The (position, new word) changes that make this template cover `words`."""
        changes = []
        for i, (mine, theirs) in enumerate(zip(self.words, words, strict=True)):
            if mine in (theirs, _ANY):
                continue
            if self.generic[i] == generic[i]:
                merged = "".join(a if a == b else _ANY for a, b in zip(mine, theirs, strict=True))
            else:
                merged = _ANY
            if merged != mine:
                changes.append((i, merged))
        return changes

    def widen(
        self, changes: list[tuple[int, str]], shape: Callable[[str], tuple[str, int]]
    ) -> None:
        for i, merged in changes:
            self.words[i] = merged
            self.generic[i], self.kinds[i] = shape(merged)
        self.key = " ".join(self.words)

    def separators(self) -> list[str]:
        if self.seps is None:
            self.seps = split_words(self.line)[1]
            self.line = ""
        return self.seps

    def view(self) -> TemplateView:
        text = "".join(
            sep + render_masked(word)
            for sep, word in zip(self.separators(), self.words, strict=False)
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
    match = 0
    total = 0.0
    mine, my_kinds = t.generic, t.kinds
    if len(mine) != len(generic) or len(kinds) != len(generic):
        raise ValueError("a line is compared only with templates of its word count")
    for i in range(len(mine)):  # indexes, not zip: the compiled miner reads lists natively
        k = my_kinds[i]
        if k == WILD:
            continue
        a, b, lk = mine[i], generic[i], kinds[i]
        if a == b:
            if k != VAR:
                match += 1
                total += 1
        elif k == WORD and lk == WORD:
            return -1.0
        elif k != VAR or lk != VAR:
            total += 1
    if match == 0 and total:
        return 0.0
    return match / total if total else 1.0


_SCAN = 8
"""A bucket of at most this many templates is compared whole; a larger one only with the
templates its signature index names (`TemplateMiner._candidates`), which picks the same best."""


class TemplateMiner:
    """Groups lines into templates as they stream (one instance per job family; not thread-safe)."""

    def __init__(self, config: MinerConfig | None = None) -> None:
        self.config = config or MinerConfig()
        self._templates: OrderedDict[int, _Template] = OrderedDict()
        """Least recently seen first."""
        self._buckets: dict[int, dict[str, _Template]] = {}
        """Word count -> template key -> template."""
        self._signatures: dict[int, list[dict[str, dict[int, _Template]]]] = {}
        """Word count -> position -> generic word -> templates with that word in their signature
        (see `_sign`)."""
        self._unsigned: dict[int, dict[int, _Template]] = {}
        """Word count -> templates with no text word, which any line of that count may join."""
        self._seq = 0
        self._alias: dict[int, int] = {}
        self._holes: dict[int, dict[int, _Template]] = {}
        """hash(position, the other words) -> templates equal but for a plain word there."""
        self._by_skeleton: dict[bytes, int] = {}
        self._by_flat: dict[bytes, int] = {}
        self._by_coarse: dict[bytes, int] = {}
        self._by_masked: dict[str, int] = {}
        self._by_word: dict[str, str] = {}
        self._by_coarse_word: dict[bytes, str] = {}
        self._generic: dict[str, str] = {}
        self._kinds: dict[str, int] = {}
        """Masked word -> its generic form, its kind (`_shape`); per miner, so a fresh miner
        starts cold."""
        self._variable_words: set[str] = set()
        """Plain words seen as the values of a collapsed sibling group: names, not event words."""
        self._value_holes: dict[str, dict[int, int]] = {}
        """Plain word -> the sibling groups it is a value in -> its position there."""
        self._next_id = 1
        self._lines = 0
        self._max_chars = self.config.max_line_chars
        self._max_samples = self.config.max_samples
        """`config`'s, read once per line: an attribute, not two."""

    # -- public API -------------------------------------------------------------------------

    def add(self, line: str) -> int:
        """Group one line, learning from it; returns its template's id."""
        n = self._lines = self._lines + 1
        if len(line) > self._max_chars:
            line = line[: self._max_chars]
        fine = line.encode("utf-8", "surrogatepass").translate(_FINE)
        tid = self._by_skeleton.get(fine)
        t = None if tid is None else self._templates.get(tid)
        if t is None:
            t = self._slow(line, fine)
        t.count += 1
        t.last_seen = n
        if len(t.samples) < self._max_samples:
            t.samples.append(_clean(line))
        tid = t.id
        self._templates.move_to_end(tid)
        return tid

    def _slow(self, line: str, fine: bytes) -> _Template:
        """`add` for a line whose skeleton is not cached (or points at a merged template).
        `_cached` and `_remember`, written out: this runs for every new skeleton."""
        limit = self.config.cache_entries
        if ("x" in line and "0x" in line) or ("X" in line and "0X" in line):
            fine = fine.replace(b"0x", b"\xffx").replace(b"0X", b"\xffX")
        flat = fine.translate(_ZERO)
        by_flat = self._by_flat
        tid = by_flat.get(flat)
        t = None if tid is None else self._templates.get(tid) or self._resolve(tid)
        if t is None:
            if tid is not None:
                del by_flat[flat]
            t = self._coarse(line, flat, limit)
            if len(by_flat) >= limit:
                by_flat.clear()
            by_flat[flat] = t.id
        by_skeleton = self._by_skeleton
        if len(by_skeleton) >= limit:
            by_skeleton.clear()
        by_skeleton[fine] = t.id
        return t

    def _coarse(self, line: str, flat: bytes, limit: int) -> _Template:
        """`_slow` for a line whose flat skeleton is not cached either."""
        coarse = collapse_digits(flat)
        by_coarse = self._by_coarse
        tid = by_coarse.get(coarse)
        t = None if tid is None else self._templates.get(tid) or self._resolve(tid)
        if t is None:
            if tid is not None:
                del by_coarse[coarse]
            words = self._mask(line, coarse)
            mkey = " ".join(words)
            by_masked = self._by_masked
            tid = by_masked.get(mkey)
            t = None if tid is None else self._templates.get(tid) or self._resolve(tid)
            if t is None:
                if tid is not None:
                    del by_masked[mkey]
                t = self._learn(line, words, mkey)
                if len(by_masked) >= limit:
                    by_masked.clear()
                by_masked[mkey] = t.id
            if len(by_coarse) >= limit:
                by_coarse.clear()
            by_coarse[coarse] = t.id
        return t

    def match(self, line: str) -> int | None:
        """The id of the template `line` would join, without learning anything from it."""
        line = line[: self.config.max_line_chars]
        flat = flat_skeleton(line)
        coarse = collapse_digits(flat)
        t = (
            self._cached(self._by_skeleton, skeleton(line))
            or self._cached(self._by_flat, flat)
            or self._cached(self._by_coarse, coarse)
        )
        if t is not None:
            return t.id
        words = self._mask(line, coarse)
        mkey = " ".join(words)
        t = self._cached(self._by_masked, mkey)
        if t is None:
            t = self._best(words, mkey, *self._shapes_of(words))
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

    def _mask(self, line: str, coarse: bytes) -> list[str]:
        found = coarse_words(coarse, line)
        if found is None:
            words = self._masked(words_of(line), self._by_word, mask_word)
        else:
            words = self._masked(found, self._by_coarse_word, mask_coarse_word)
        if LEADER in line:
            _key_value(words)
        elif '":' in line:
            _json_pair(words)
        return words

    def _masked(
        self, found: list[_W], cache: dict[_W, str], mask: Callable[[_W], str]
    ) -> list[str]:
        """Each word's masked form, from `cache` (cleared when full) or `mask`."""
        words: list[str] = []
        for word in found:
            masked = cache.get(word)
            if masked is None:
                masked = mask(word)
                if len(cache) >= self.config.cache_entries:
                    cache.clear()
                cache[word] = masked
            words.append(masked)
        return words

    def _shape(self, word: str) -> tuple[str, int]:
        (generic,), (kind,) = self._shapes_of([word])
        return generic, kind

    def _shapes_of(self, words: list[str]) -> tuple[list[str], list[int]]:
        """The words' generic forms and kinds (two new lists), computed for new words only."""
        cache = self._kinds
        generic_of = self._generic
        if len(cache) + len(words) > self.config.cache_entries:
            for word in words:
                if word not in cache:
                    cache.clear()
                    generic_of.clear()
                    break
        generic: list[str] = []
        kinds: list[int] = []
        for word in words:
            kind = cache.get(word)
            if kind is None:
                shape, kind = _shape(word)
                generic_of[word] = shape
                cache[word] = kind
                generic.append(shape)
            else:
                generic.append(generic_of[word])
            kinds.append(kind)
        return generic, kinds

    def _learn(self, line: str, words: list[str], key: str) -> _Template:
        """`key` is `" ".join(words)`, which the caller has made."""
        generic, kinds = self._shapes_of(words)
        best = self._best(words, key, generic, kinds)
        if best is None:
            return self._create(words, key, line, generic, kinds)
        changes = best.widening(words, generic)
        if changes:
            self._unindex(best)
            best.widen(changes, self._shape)
            best = self._index(best)
        return best

    def _best(
        self, words: list[str], key: str, generic: list[str], kinds: list[int]
    ) -> _Template | None:
        """The template at or above `similarity` most like the line (ties: the first in bucket
        order with the highest count), or None."""
        n = len(words)
        bucket = self._buckets.get(n)
        if not bucket:
            return None
        exact = bucket.get(key)
        if exact is not None:
            return exact
        candidates = bucket.values() if len(bucket) <= _SCAN else self._candidates(n, generic)
        best: _Template | None = None
        best_sim = -1.0
        for t in candidates:
            sim = _similarity(t, generic, kinds)
            if sim > best_sim or (sim == best_sim and best is not None and t.count > best.count):
                best, best_sim = t, sim
        if best is None or best_sim < self.config.similarity:
            return None
        return best

    def _candidates(self, n: int, generic: list[str]) -> list[_Template]:
        """The bucket's templates that share a signature word with the line, in bucket order:
        every template the line is similar enough to join is among them (see `_sign`)."""
        found = dict(self._unsigned.get(n, ()))
        for words, b in zip(self._signatures.get(n, ()), generic, strict=False):
            group = words.get(b)
            if group is not None:
                found.update(group)
        return sorted(found.values(), key=_bucket_order)

    def _sign(self, t: _Template) -> None:
        """Enter `t` in its bucket's signature index: its last k text words, k one more than
        the text words a line may miss and still reach `similarity`. The similarity's total
        counts every text word of the template, so a line at or above it matches at least
        one of any k of them; templates with no text word are always candidates."""
        n = len(t.words)
        self._seq += 1
        t.seq = self._seq
        text = [i for i, k in enumerate(t.kinds) if k in _TEXT]
        if not text:
            self._unsigned.setdefault(n, {})[t.id] = t
            return
        index = self._signatures.get(n)
        if index is None:
            index = self._signatures[n] = [{} for _ in range(n)]
        keep = int((1.0 - self.config.similarity) * len(text) + 1e-9) + 1
        for i in text[-keep:]:
            a = t.generic[i]
            index[i].setdefault(a, {})[t.id] = t
            t.signature.append((i, a))

    def _unsign(self, t: _Template) -> None:
        if not t.seq:
            return
        t.seq = 0
        n = len(t.words)
        if t.signature:
            index = self._signatures[n]
            for i, a in t.signature:
                group = index[i][a]
                del group[t.id]
                if not group:
                    del index[i][a]
            t.signature.clear()
        else:
            del self._unsigned[n][t.id]

    def _create(
        self, words: list[str], key: str, line: str, generic: list[str], kinds: list[int]
    ) -> _Template:
        """A new template from the line (`generic` and `kinds` become its own)."""
        t = _Template(self._next_id, list(words), None, self._lines, generic, kinds, line, key)
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
        self._sign(t)
        kinds = t.kinds
        text = len(kinds) - kinds.count(VAR) - kinds.count(WILD)
        if text <= self.config.sibling_context or len(t.words) > _MAX_SIBLING_WORDS:
            return t
        words = tuple(t.words)
        for i, kind in enumerate(kinds):
            if kind != WORD:
                continue
            hole = hash((i, words[:i], words[i + 1 :]))
            group = self._holes.setdefault(hole, {})
            group[t.id] = t
            t.holes.append((hole, i))
            self._value_holes.setdefault(t.words[i], {})[hole] = i
            if len(group) >= 2 and self._variable_at(group, i):
                return self._collapse(list(group.values()), i)
        return t

    def _variable_at(self, group: dict[int, _Template], i: int) -> bool:
        """Enough siblings differ at `i`, or several of their words there are known names."""
        if len(group) >= self.config.sibling_values:
            return True
        known = self._variable_words
        return len(group) >= 2 and sum(m.words[i] in known for m in group.values()) >= 2

    def _unindex(self, t: _Template) -> None:
        n = len(t.words)
        bucket = self._buckets[n]
        if bucket.get(t.key) is t:
            del bucket[t.key]
        self._unsign(t)
        if not bucket:
            del self._buckets[n]
            self._signatures.pop(n, None)
            self._unsigned.pop(n, None)
        for hole, i in t.holes:
            group = self._holes[hole]
            del group[t.id]
            if not group:
                del self._holes[hole]
            holes = self._value_holes[t.words[i]]
            del holes[hole]
            if not holes:
                del self._value_holes[t.words[i]]
        t.holes.clear()

    def _collapse(self, siblings: list[_Template], position: int) -> _Template:
        """Templates equal but for one plain word: that word is a variable after all."""
        keep = min(siblings, key=lambda t: t.id)
        values = [t.words[position] for t in siblings]
        if len(self._variable_words) + len(values) > self.config.cache_entries:
            self._variable_words.clear()
        self._variable_words.update(values)
        for t in siblings:
            self._unindex(t)
            if t is not keep:
                self._fold(keep=keep, gone=t)
        keep.set_wild(position)
        self._index(keep)
        # Other groups whose words here are these very names: variables there too.
        for value in values:
            for hole, i in list(self._value_holes.get(value, {}).items()):
                group = self._holes.get(hole)
                if group is not None and self._variable_at(group, i):
                    self._collapse(list(group.values()), i)
        return self._resolve(keep.id) or keep

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
        if len(keep.absorbed) > _MAX_ALIASES:
            # The oldest merged ids stop resolving, so aliases stay bounded too.
            for old in keep.absorbed[:-_MAX_ALIASES]:
                self._alias.pop(old, None)
            del keep.absorbed[:-_MAX_ALIASES]

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

    def _cached(self, cache: dict[Any, int], key: object) -> _Template | None:
        tid = cache.get(key)
        if tid is None:
            return None
        t = self._resolve(tid)
        if t is None:
            del cache[key]
        return t

    def _remember(self, cache: dict[Any, int], key: object, tid: int) -> None:
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
            "variable_words": sorted(self._variable_words),
            "templates": [
                {
                    "id": t.id,
                    "words": t.words,
                    "seps": t.separators(),
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
            miner._variable_words = {str(w) for w in data["variable_words"]}
            for raw in data["templates"]:
                words = [str(w) for w in raw["words"]]
                seps = [str(s) for s in raw["seps"]]
                t = _Template(int(raw["id"]), words, seps, 0, *miner._shapes_of(words))
                t.count = int(raw["count"])
                t.first_seen = int(raw["first_seen"])
                t.last_seen = int(raw["last_seen"])
                t.samples = [str(s) for s in raw["samples"]]
                t.absorbed = [int(i) for i in raw["absorbed"]]
                miner._templates[t.id] = t
                for old in t.absorbed:
                    miner._alias[old] = t.id
                miner._index(t)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed miner state: {exc}") from exc
        return miner
