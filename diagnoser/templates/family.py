"""A job's family from its name: jobs of one family share their learned filters.

`llama-70b-run7` and `llama-70b-run8` are one recipe run twice, so the second starts with the
first one's filters. What varies between runs (run numbers, versions, dates, times, hashes,
trailing counters, a log file's extension) is stripped; what names the recipe (`70b`, `7b`)
stays: only a whole part between separators (`-`, `_`, `.`) is noise, so `t5` keeps its 5.
"""

from __future__ import annotations

import regex

_NOISE = regex.compile(
    r"(?i)(?:^|[-_.])(?:\d{4}-?\d{2}-?\d{2}(?:[-_T]?\d{2}:?\d{2}(?::?\d{2})?)?|[0-9a-f]{7,40}"
    r"|run\d+|v\d+|\d+)(?=$|[-_.])"
)
_EXTENSION = regex.compile(r"\.(?:log|txt|out|err)$")


def family_of(job_name: str) -> str:
    """The family of a job name (or of a log file's name); the name itself if nothing is left."""
    stem = job_name.rsplit("/", 1)[-1]
    stem = _EXTENSION.sub("", stem)
    family = _NOISE.sub("", stem).strip("-_. ")
    return family or stem
