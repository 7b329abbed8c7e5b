"""Read the labelled corpus (`evals/cases/<id>/case.yaml` plus one `<node>.log` per node).

Every case is validated strictly; all problems in the corpus are collected and reported together
(`CorpusError`), each naming its file and field, so a typo in one label never hides another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from diagnoser.diagnosis.correlate import Status
from diagnoser.evaluation.scoring import Floors, Labels
from diagnoser.evaluation.split import Split
from diagnoser.rules import Action, Category

CASE_FILE = "case.yaml"
LOG_SUFFIX = ".log"
FLOORS_FILE = "floors.yaml"


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    cls: str
    """The corpus class (`cuda_oom`, `multi_node`, ...): the rows of the report."""
    split: Split
    """`dev` (rules may be written from it) or `test` (scored only); see evaluation/split.py."""
    sources: tuple[str, ...]
    tags: tuple[str, ...]
    expected: Labels
    note: str
    logs: tuple[Path, ...]
    """One file per node, sorted by name; the file stem is the node name."""
    stalled: bool = False
    """The thread says the job was still running, without progress, when the log was taken."""
    stalled_for: float | None = None
    """For how long, in seconds, when the thread says; see `observed` in evals/README.md."""


class CorpusError(Exception):
    """The corpus cannot be evaluated; `problems` lists every `path: field: message`."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class _Expected(_Strict):
    status: Status
    category: Category | None
    failure_type: Annotated[str, Field(min_length=1)]
    action: Action
    culprit_nodes: tuple[str, ...] = ()


class _Observed(_Strict):
    """What the thread says about the job beyond its log: that it was stuck, and for how long.

    `stalled_for_s` is the duration the thread states; `null` when it states a stall but no
    duration, which the harness scores at the hang window (the moment a live service would
    decide). `quote` is the thread's own words, so the observation can be checked.
    """

    stalled: bool
    stalled_for_s: Annotated[float, Field(ge=0)] | None = None
    quote: Annotated[str, Field(min_length=1)]


class _CaseFile(_Strict):
    id: Annotated[str, Field(min_length=1)]
    cls: Annotated[str, Field(alias="class", min_length=1)]
    split: Split
    source: str | tuple[str, ...]
    tags: tuple[str, ...] = ()
    expected: _Expected
    observed: _Observed | None = None
    note: str = ""


class _SplitFloors(_Strict):
    action: Annotated[float, Field(ge=0, le=1)] | None = None
    category: Annotated[float, Field(ge=0, le=1)] | None = None
    culprit: Annotated[float, Field(ge=0, le=1)] | None = None

    def floors(self) -> Floors:
        return Floors(self.action, self.category, self.culprit)


class _FloorsFile(_SplitFloors):
    """Total floors at the top level; `dev:` and `test:` hold the same keys for each split."""

    dev: _SplitFloors | None = None
    test: _SplitFloors | None = None


def cases_dir(directory: Path) -> Path:
    """`evals/` holds `cases/`; a directory of case folders is accepted as is."""
    nested = directory / "cases"
    return nested if nested.is_dir() else directory


def _read_yaml(path: Path) -> tuple[Any, str | None]:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")), None
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path}: cannot read: {exc}"
    except yaml.YAMLError as exc:
        return None, f"{path}: not valid YAML: {exc}"


def _validation_problems(path: Path, exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(file)"
        got = f" (got {error['input']!r})" if error["type"] != "missing" else ""
        problems.append(f"{path}: {where}: {error['msg']}{got}")
    return problems


def _read_case(directory: Path) -> tuple[Case | None, list[str]]:
    path = directory / CASE_FILE
    raw, problem = _read_yaml(path)
    if problem:
        return None, [problem]
    try:
        spec = _CaseFile.model_validate(raw)
    except ValidationError as exc:
        return None, _validation_problems(path, exc)
    problems = []
    if spec.id != directory.name:
        problems.append(f"{path}: id: {spec.id!r} differs from its directory {directory.name!r}")
    logs = tuple(sorted(p for p in directory.iterdir() if p.suffix == LOG_SUFFIX and p.is_file()))
    if not logs:
        problems.append(f"{directory}: no {LOG_SUFFIX} file (one per node)")
    nodes = {p.stem for p in logs}
    unknown = [n for n in spec.expected.culprit_nodes if n not in nodes]
    if unknown:
        problems.append(
            f"{path}: expected.culprit_nodes: {', '.join(unknown)} not among the node logs "
            f"({', '.join(sorted(nodes)) or 'none'})"
        )
    if problems:
        return None, problems
    expected = spec.expected
    observed = spec.observed
    case = Case(
        id=spec.id,
        cls=spec.cls,
        split=spec.split,
        sources=(spec.source,) if isinstance(spec.source, str) else spec.source,
        tags=spec.tags,
        expected=Labels(
            expected.status,
            expected.category,
            expected.failure_type,
            expected.action,
            tuple(sorted(expected.culprit_nodes)),
        ),
        note=spec.note.strip(),
        logs=logs,
        stalled=observed is not None and observed.stalled,
        stalled_for=observed.stalled_for_s if observed is not None else None,
    )
    return case, []


def load_corpus(directory: Path) -> list[Case]:
    """Every case under `directory` (or its `cases/`), sorted by id; raises CorpusError."""
    root = cases_dir(directory)
    if not root.is_dir():
        raise CorpusError([f"{directory}: not a directory"])
    cases: list[Case] = []
    problems: list[str] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        case, found = _read_case(folder)
        problems.extend(found)
        if case is not None:
            cases.append(case)
    if not cases and not problems:
        problems.append(f"{root}: no case directories (each holds {CASE_FILE} and node logs)")
    if problems:
        raise CorpusError(problems)
    return cases


def load_floors(path: Path) -> Floors:
    """`floors.yaml`; a missing file means no floors (false cordons still fail the run)."""
    if not path.exists():
        return Floors()
    raw, problem = _read_yaml(path)
    if problem:
        raise CorpusError([problem])
    try:
        spec = _FloorsFile.model_validate(raw or {})
    except ValidationError as exc:
        raise CorpusError(_validation_problems(path, exc)) from exc
    sides = {side.value: getattr(spec, side.value) for side in Split}
    return Floors(
        spec.action,
        spec.category,
        spec.culprit,
        {side: floors.floors() for side, floors in sides.items() if floors is not None},
    )
