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
from diagnoser.evaluation.runner import LlmTally, llm_diagnoser, rules_diagnoser, run
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
    show_test_cases: Annotated[
        bool,
        typer.Option(
            "--show-test-cases",
            help="Also list the misses of the held-back test split one by one (by default it is "
            "reported as aggregates only: its logs must not be read to write a rule).",
        ),
    ] = False,
    llm: Annotated[
        bool,
        typer.Option(
            "--llm",
            help="Ask the configured LLM (DIAGNOSER_LLM__*) about what the rules leave "
            "`escalate`, as the service does; use --repeat N for its mean and spread.",
        ),
    ] = False,
) -> None:
    """Score the rules + correlation pipeline (and, with --llm, the LLM stage) on a corpus."""
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
    tally = LlmTally()
    if llm:
        settings = Settings().llm
        if not settings.enabled:
            err.print(
                "[bold red]error:[/] --llm needs DIAGNOSER_LLM__BASE_URL (an OpenAI endpoint)"
            )
            raise typer.Exit(2)
        diagnoser = llm_diagnoser(
            ruleset, settings, tally, hang_timeout=DEFAULT_TIMEOUT_S, stalls=stalls
        )
    else:
        diagnoser = rules_diagnoser(ruleset, hang_timeout=DEFAULT_TIMEOUT_S, stalls=stalls)
    summary = summarise(run(cases, diagnoser, repeat, on_run=tally.new_run if llm else None))
    failures = gate(summary, floors)
    if as_json_output:
        result = as_json(summary, failures, show_test_cases=show_test_cases)
        if llm:
            result["llm"] = llm_json(tally)
        typer.echo(json.dumps(result, ensure_ascii=False))
    else:
        console = Console(highlight=False)
        # Piped output (CI logs, bench files) gets room for the whole table, not 80 columns.
        wide = 200 if repeat == 1 else 220
        render(
            summary,
            failures,
            Console(highlight=False, width=max(console.width, wide)),
            show_test_cases=show_test_cases,
        )
        if llm:
            console.print(escape(llm_line(tally)))
    if failures:
        raise typer.Exit(1)


def llm_json(tally: LlmTally) -> dict[str, object]:
    """Per run: cases the rules left `escalate` and the LLM was asked about, the ones its vote
    decided, and the decided ones whose action matches the label."""
    return {
        "asked": tally.asked,
        "decided": tally.decided,
        "right": tally.right,
        "unreachable": tally.unreachable,
    }


def llm_line(tally: LlmTally) -> str:
    runs = len(tally.asked)
    per_run = "; ".join(
        f"{a} asked, {d} decided, {r} right"
        for a, d, r in zip(tally.asked, tally.decided, tally.right, strict=True)
    )
    note = f" ({tally.unreachable} could not be asked)" if tally.unreachable else ""
    return f"LLM stage over {runs} run(s): {per_run}{note}"
