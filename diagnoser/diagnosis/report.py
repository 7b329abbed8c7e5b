"""Human-readable rendering of an offline diagnosis, for a terminal at 3 a.m.

Log lines, file and node names and exception names are the logs' own text: they are printed
as `Text`, never parsed as rich markup (a `[/data/x.bin]` or `[rank3]` must show as it is).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diagnoser.diagnosis.correlate import Status
from diagnoser.diagnosis.offline import OfflineResult

STATUS_STYLE = {Status.FAILURE: "bold red", Status.INCONCLUSIVE: "bold yellow"}


def render(result: OfflineResult, console: Console) -> None:
    verdict = result.verdict
    style = STATUS_STYLE.get(verdict.status, "bold green")
    console.print(Text.assemble((verdict.status.value.upper(), style), "  ", verdict.summary))
    if verdict.status is Status.HEALTHY:
        return
    console.print(
        Text.assemble(
            "failure type ",
            (verdict.failure_type or "-", "bold"),
            f" ({verdict.category}), action ",
            (verdict.action.value, "bold"),
            f", confidence {verdict.confidence:.2f}, source {verdict.source.value}",
        )
    )
    if verdict.culprit_nodes:
        culprits = ", ".join(verdict.culprit_nodes)
        console.print(Text.assemble("culprit node(s): ", (culprits, "bold")))
        console.print(Text(f"why: {result.culprit_reason()}"))
    root = verdict.root.entities if verdict.root is not None else {}
    if "xid" in root or "pci" in root:
        console.print(Text(f"Xid {root.get('xid', '-')} on PCI {root.get('pci', '-')}"))
    console.print(Text(f"rules: {', '.join(verdict.rule_ids) or 'none fired'}"))
    table = Table("node", "file", "line", "evidence", show_lines=False, expand=True)
    for row in result.evidence_rows(limit=12):
        table.add_row(
            Text(row["node"]), Text(row["file"]), Text(str(row["line_no"])), Text(row["text"][:300])
        )
    console.print(table)
