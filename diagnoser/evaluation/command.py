"""`diagnoser eval`: score the diagnosis pipeline against the labelled corpus (CI gate).

Exit codes: 0 every floor met and no false cordon; 1 the gate failed (a false cordon, or a total
accuracy below `floors.yaml`); 2 the corpus, floors or rule pack cannot be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from diagnoser.config import Settings
from diagnoser.diagnosis.hang import DEFAULT_TIMEOUT_S
from diagnoser.evaluation.corpus import FLOORS_FILE, CorpusError, load_corpus, load_floors
from diagnoser.evaluation.report import as_json, render
from diagnoser.evaluation.runner import rules_diagnoser, run
from diagnoser.evaluation.scoring import gate, summarise
from diagnoser.rules import RuleLoadError, load_dir


def evaluate(
    directory: Annotated[
        Path,
        typer.Argument(metavar="[DIR]", help=f"Corpus directory: holds cases/ and {FLOORS_FILE}."),
    ] = Path("evals"),
    as_json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of tables.")
    ] = False,
    repeat: Annotated[
        int,
        typer.Option("--repeat", min=1, help="Run every case N times; report mean and spread."),
    ] = 1,
    rules_dir: Annotated[
        Path | None,
        typer.Option("--rules-dir", help="Rule pack directory [env DIAGNOSER_RULES_DIR]"),
    ] = None,
    stalls: Annotated[
        bool,
        typer.Option(
            "--stalls/--no-stalls",
            help="Give the hang check the stalls the threads report (`observed:` in case.yaml); "
            "--no-stalls scores the log text alone.",
        ),
    ] = True,
) -> None:
    """Score the rules + correlation pipeline on a labelled corpus of failure logs."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        cases = load_corpus(directory)
        floors = load_floors(directory / FLOORS_FILE)
        ruleset = load_dir(rules_dir or Settings().rules_dir)
    except CorpusError as exc:
        for problem in exc.problems:
            err.print(f"[bold red]error:[/] {escape(problem)}")
        raise typer.Exit(2) from exc
    except RuleLoadError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    # The corpus is scored at the default hang window, whatever this shell's environment says.
    diagnoser = rules_diagnoser(ruleset, hang_timeout=DEFAULT_TIMEOUT_S, stalls=stalls)
    summary = summarise(run(cases, diagnoser, repeat))
    failures = gate(summary, floors)
    if as_json_output:
        typer.echo(json.dumps(as_json(summary, failures), ensure_ascii=False))
    else:
        console = Console(highlight=False)
        # Piped output (CI logs, bench files) gets room for the whole table, not 80 columns.
        wide = 200 if repeat == 1 else 220
        render(summary, failures, Console(highlight=False, width=max(console.width, wide)))
    if failures:
        raise typer.Exit(1)
