"""Human-readable rendering of an offline diagnosis, for a terminal at 3 a.m.

Log lines, file and node names and exception names are the logs' own text: they are printed
as `Text`, never parsed as rich markup (a `[/data/x.bin]` or `[rank3]` must show as it is).
So is everything an LLM wrote (summaries, abstention reasons quoting its answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diagnoser.diagnosis.correlate import Status
from diagnoser.diagnosis.offline import OfflineResult

STATUS_STYLE = {Status.FAILURE: "bold red", Status.INCONCLUSIVE: "bold yellow"}


MAX_ABSTENTIONS_SHOWN = 5


def vote_lines(record: Mapping[str, Any]) -> list[Text]:
    """An LLM vote record (the service's `llm` field, `diagnose --json`'s `votes`) for a
    terminal: outcome, the count per answer, what abstained and why, model, prompt and cost."""
    k, asked = record.get("k"), record.get("asked")
    decided = record.get("decided") is True
    share = float(record.get("confidence") or 0.0)
    outcome = (
        Text.assemble(("decided", "bold green"), f" with {share:.2f} of the votes")
        if decided
        else Text.assemble(
            ("not decided", "bold yellow"),
            f": the best answer had {share:.2f} of the votes, "
            f"{float(record.get('min_agreement') or 0.0):.2f} needed",
        )
    )
    lines = [Text.assemble("LLM vote: ", outcome, f" (k {k}, asked {asked})")]
    votes = record.get("votes") or {}
    if isinstance(votes, Mapping) and votes:
        ranked = sorted(votes.items(), key=lambda item: (item[0] == "abstain", -int(item[1])))
        lines.append(Text("votes: " + ", ".join(f"{answer} {count}" for answer, count in ranked)))
    for cited in (record.get("evidence") or [])[:MAX_ABSTENTIONS_SHOWN]:
        lines.append(
            Text(f"cited line {cited.get('line')} ({cited.get('node')}): {cited.get('text')}"[:300])
        )
    if decided and record.get("mitigation"):
        lines.append(Text(f"mitigation: {record['mitigation']}"))
    reasons = [str(reason) for reason in record.get("abstentions") or []]
    for reason in reasons[:MAX_ABSTENTIONS_SHOWN]:
        lines.append(Text(f"abstained: {reason}"))
    if len(reasons) > MAX_ABSTENTIONS_SHOWN:
        lines.append(Text(f"abstained: ... and {len(reasons) - MAX_ABSTENTIONS_SHOWN} more"))
    latency = record.get("latency_s")
    lines.append(
        Text(
            f"model {record.get('model', '-')}, prompt {record.get('prompt_version', '-')}, "
            f"output {record.get('output_mode', '-')}, tokens {record.get('tokens_in', 0)} in "
            f"/ {record.get('tokens_out', 0)} out"
            + (f", {float(latency):.2f} s" if latency is not None else "")
        )
    )
    return lines


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
    if result.llm is not None:
        for line in vote_lines(result.llm):
            console.print(line)
