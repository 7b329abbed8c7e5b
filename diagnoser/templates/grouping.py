"""Grouping accuracy (Loghub's GA) and the Loghub-2k ground truth it is measured against.

GA counts a line as right when the group it was put in holds exactly the lines of its true
event, no more and no fewer; it is the share of such lines. The ground truth is Loghub's 2k
samples (Zhu et al., ISSRE 2023), with the template corrections that Loghub-2.0 ships (Jiang et
al., ISSTA 2024; `*_structured_corrected.csv`) wherever a dataset has them.
"""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

LOGHUB_DATASETS = (
    "Android",
    "Apache",
    "BGL",
    "HDFS",
    "HPC",
    "Hadoop",
    "HealthApp",
    "Linux",
    "Mac",
    "OpenSSH",
    "OpenStack",
    "Proxifier",
    "Spark",
    "Thunderbird",
    "Windows",
    "Zookeeper",
)


def grouping_accuracy(truth: Sequence[Hashable], predicted: Sequence[Hashable]) -> float:
    """Share of lines whose predicted group is exactly their true group."""
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} true labels but {len(predicted)} predicted")
    if not truth:
        return 1.0
    true_sizes = Counter(truth)
    members: dict[Hashable, list[Hashable]] = defaultdict(list)
    for t, p in zip(truth, predicted, strict=True):
        members[p].append(t)
    right = 0
    for labels in members.values():
        first = labels[0]
        if all(label == first for label in labels) and true_sizes[first] == len(labels):
            right += len(labels)
    return right / len(truth)


@dataclass(frozen=True, slots=True)
class LoghubSample:
    """One Loghub-2k dataset: its raw lines, their `Content` field, and the true templates."""

    name: str
    raw: tuple[str, ...]
    content: tuple[str, ...]
    truth: tuple[str, ...]
    corrected: bool
    """True when `truth` comes from the Loghub-2.0 corrected templates."""


def load_loghub(root: Path, name: str) -> LoghubSample:
    """Read `<root>/<name>/<name>_2k.log` and its structured CSV (the corrected one if present)."""
    base = root / name / f"{name}_2k.log"
    corrected = base.with_name(base.name + "_structured_corrected.csv")
    structured = corrected if corrected.exists() else base.with_name(base.name + "_structured.csv")
    with structured.open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    raw = base.read_text(encoding="utf-8", errors="replace").splitlines()
    if len(raw) != len(rows):
        raise ValueError(f"{name}: {len(raw)} raw lines but {len(rows)} structured rows")
    return LoghubSample(
        name=name,
        raw=tuple(raw),
        content=tuple(r["Content"] for r in rows),
        truth=tuple(r["EventTemplate"] for r in rows),
        corrected=structured is corrected,
    )
