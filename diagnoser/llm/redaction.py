"""Secrets are removed from log text before any of it leaves the process for an LLM.

Training logs print environment dumps, launcher command lines and tracebacks with URLs in them,
so keys and passwords do show up. Each kind below is replaced by `[REDACTED:<kind>]`; the
counts per kind are returned so the caller can record that something was removed without ever
recording what. Patterns are written for the published token formats (OpenAI `sk-`, Hugging
Face `hf_`, GitHub's `ghp_`/`github_pat_` families, AWS `AKIA`/`ASIA` key ids, JWTs) plus the
generic shapes (`Authorization: Bearer`, `scheme://user:password@host`, `password=...`,
PEM private key blocks, e-mail addresses). Order matters: a PEM block or a URL is taken whole
before the token patterns look inside it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import regex

PATTERN_TIMEOUT_S = 0.5
"""Operator-supplied patterns run under this budget per text; a pattern that exceeds it is
treated as a match of the whole text, so a slow pattern fails closed (nothing leaks)."""

BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "private_key",
        r"(?P<s>-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----.*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z))",
    ),
    ("url_password", r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,20}://[^\s:/@]{1,256}:(?P<s>[^\s@/]{1,256})@"),
    ("bearer", r"(?i)\bbearer\s+(?P<s>[A-Za-z0-9._~+/=-]{8,})"),
    ("jwt", r"(?P<s>\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,})"),
    ("openai_key", r"(?P<s>\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,})"),
    ("huggingface_token", r"(?P<s>\bhf_[A-Za-z0-9]{30,})"),
    ("github_token", r"(?P<s>\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,}))"),
    ("aws_access_key_id", r"(?P<s>\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[A-Z0-9]{16}\b)"),
    (
        "secret_assignment",
        r"(?i)\b[a-z0-9_]{0,40}(?:password|passwd|secret|token|api_key|apikey|access_key)"
        r"[a-z0-9_]{0,40}[\"']?\s{0,4}[=:]\s{0,4}[\"']?"
        r"(?![0-9.eE+-]+(?:[\s\"',;]|$))(?P<s>[^\s\"',;\[\]]{4,})",
    ),
    (
        "email",
        r"(?P<s>\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*"
        r"\.[A-Za-z]{2,24}\b)",
    ),
)
"""(kind, pattern); the named group `s` is the secret itself, replaced by the marker, so the
words around it (`Authorization: Bearer`, `password=`) stay readable for the model."""


@dataclass(frozen=True, slots=True)
class Redacted:
    text: str
    counts: dict[str, int]
    """How many secrets of each kind were removed (kind -> count); empty when none."""


class Redactor:
    """Applies the built-in patterns and any configured ones (kind `custom`)."""

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        compiled = [(kind, regex.compile(p, regex.DOTALL)) for kind, p in BUILTIN_PATTERNS]
        for pattern in extra_patterns:
            try:
                compiled.append(("custom", regex.compile(pattern)))
            except regex.error as exc:
                raise ValueError(f"redaction pattern {pattern!r} does not compile: {exc}") from exc
        self._patterns = compiled

    def redact(self, text: str) -> Redacted:
        counts: Counter[str] = Counter()
        for kind, pattern in self._patterns:
            marker = f"[REDACTED:{kind}]"
            try:
                text, n = pattern.subn(_replacer(marker), text, timeout=PATTERN_TIMEOUT_S)
            except TimeoutError:
                text, n = marker, 1
            if n:
                counts[kind] += n
        return Redacted(text=text, counts=dict(counts))


def _replacer(marker: str) -> Callable[[regex.Match[str]], str]:
    def replace(match: regex.Match[str]) -> str:
        if "s" not in match.groupdict() or match.start("s") < 0:
            return marker
        whole, start, end = match.group(0), match.start("s"), match.end("s")
        base = match.start()
        return whole[: start - base] + marker + whole[end - base :]

    return replace
