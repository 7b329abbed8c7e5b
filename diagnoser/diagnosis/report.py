"""Human-readable rendering of an offline diagnosis, for a terminal at 3 a.m."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from diagnoser.diagnosis.correlate import Status
from diagnoser.diagnosis.offline import OfflineResult

STATUS_STYLE = {Status.FAILURE: "bold red", Status.INCONCLUSIVE: "bold yellow"}


def render(result: OfflineResult, console: Console) -> None:
    verdict = result.verdict
    style = STATUS_STYLE.get(verdict.status, "bold green")
    console.print(f"[{style}]{verdict.status.value.upper()}[/]  {verdict.summary}")
    if verdict.status is Status.HEALTHY:
        return
    console.print(
        f"failure type [bold]{verdict.failure_type}[/] ({verdict.category}), "
        f"action [bold]{verdict.action.value}[/], confidence {verdict.confidence:.2f}, "
        f"source {verdict.source.value}"
    )
    if verdict.culprit_nodes:
        console.print(f"culprit node(s): [bold]{', '.join(verdict.culprit_nodes)}[/]")
    console.print(f"rules: {', '.join(verdict.rule_ids) or 'none fired'}")
    table = Table("file", "line", "evidence", show_lines=False, expand=True)
    for row in result.evidence_rows(limit=12):
        table.add_row(row["file"], str(row["line_no"]), row["text"][:300])
    console.print(table)
