"""Diagnosis evaluation: a labelled corpus of real failure logs, scored against the pipeline.

`corpus` reads and validates the cases, `runner` produces (expected, got) records, `scoring`
turns records into metrics (pure), `report` prints them and `command` is `diagnoser eval`.
"""

from diagnoser.evaluation.corpus import Case, CorpusError, load_corpus, load_floors
from diagnoser.evaluation.scoring import (
    Floors,
    Labels,
    Metrics,
    Record,
    Spread,
    Summary,
    gate,
    score,
    summarise,
)

__all__ = [
    "Case",
    "CorpusError",
    "Floors",
    "Labels",
    "Metrics",
    "Record",
    "Spread",
    "Summary",
    "gate",
    "load_corpus",
    "load_floors",
    "score",
    "summarise",
]
