"""`diagnoser diagnoses list|show|watch`: the on-call API from a terminal."""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

diagnoses_app = typer.Typer(help="Query diagnoses on a running server.", no_args_is_help=True)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ServerOption = Annotated[
    str, typer.Option("--server", envvar="DIAGNOSER_SERVER", help="Base URL of the service")
]
TokenOption = Annotated[
    str | None, typer.Option("--token", envvar="DIAGNOSER_TOKEN", help="Bearer token")
]
ACTION_STYLE = {
    "cordon_node_and_restart": "bold red",
    "restart_job": "yellow",
    "escalate": "magenta",
}


def _client(server: str, token: str | None, timeout: float | None = 10.0) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout)


def _get(client: httpx.Client, path: str, params: dict[str, Any] | None = None) -> Any:
    try:
        response = client.get(path, params={k: v for k, v in (params or {}).items() if v})
    except httpx.HTTPError as exc:
        err.print(f"[bold red]error:[/] cannot reach {client.base_url}: {exc}")
        raise typer.Exit(2) from exc
    if response.status_code >= 400:
        detail = response.json().get("detail", response.text) if response.content else ""
        err.print(f"[bold red]error:[/] {response.status_code} {detail}")
        raise typer.Exit(3 if response.status_code in (401, 403) else 1)
    return response.json()


def _row(table: Table, item: dict[str, Any]) -> None:
    action = item["action"]
    table.add_row(
        item["id"][:8],
        item["job_id"],
        item["status"],
        f"[{ACTION_STYLE.get(action, '')}]{action}[/]",
        ", ".join(item["culprit_nodes"]) or "-",
        item["failure_type"] or "-",
        item["updated_at"][:19].replace("T", " "),
    )


def _table() -> Table:
    table = Table(expand=True)
    for column in ("id", "job", "status", "action", "culprits", "failure type", "updated"):
        table.add_column(column, no_wrap=column != "culprits")
    return table


@diagnoses_app.command("list")
def list_(
    server: ServerOption = "http://127.0.0.1:8080",
    token: TokenOption = None,
    job: Annotated[str | None, typer.Option(help="Only this job")] = None,
    node: Annotated[str | None, typer.Option(help="Only diagnoses naming this node")] = None,
    category: Annotated[str | None, typer.Option(help="hardware, network, ...")] = None,
    status: Annotated[str | None, typer.Option(help="open, actioned, resolved, dismissed")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw page")] = False,
) -> None:
    """The newest diagnoses first."""
    with _client(server, token) as client:
        page = _get(
            client,
            "/v1/diagnoses",
            {"job": job, "node": node, "category": category, "status": status, "limit": limit},
        )
    if as_json:
        typer.echo(json.dumps(page))
        return
    table = _table()
    for item in page["diagnoses"]:
        _row(table, item)
    out.print(table)


@diagnoses_app.command("show")
def show(
    diagnosis_id: Annotated[str, typer.Argument(help="A diagnosis id")],
    server: ServerOption = "http://127.0.0.1:8080",
    token: TokenOption = None,
) -> None:
    """One diagnosis with its evidence."""
    with _client(server, token) as client:
        item = _get(client, f"/v1/diagnoses/{diagnosis_id}")
    out.print(f"[bold]{item['summary']}[/]")
    out.print(
        f"job {item['job_id']}  status {item['status']}  action {item['action']}  "
        f"confidence {item['confidence']:.2f}  source {item['source']}"
    )
    out.print(
        f"culprits: {', '.join(item['culprit_nodes']) or '-'}  rules: {', '.join(item['rule_ids'])}"
    )
    table = Table("node", "rank", "line", "evidence", expand=True)
    for evidence in item["evidence"][:20]:
        table.add_row(
            evidence["node"],
            str(evidence["rank"] if evidence["rank"] is not None else "-"),
            str(evidence["line_no"]),
            evidence["text"][:300],
        )
    out.print(table)


@diagnoses_app.command("watch")
def watch(
    server: ServerOption = "http://127.0.0.1:8080",
    token: TokenOption = None,
) -> None:
    """Print each new or updated diagnosis as it happens (Ctrl-C to stop)."""
    with _client(server, token, timeout=None) as client:
        try:
            with client.stream("GET", "/v1/diagnoses/stream") as stream:
                if stream.status_code >= 400:
                    err.print(f"[bold red]error:[/] {stream.status_code}")
                    raise typer.Exit(3 if stream.status_code in (401, 403) else 1)
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        table = _table()
                        _row(table, json.loads(line.removeprefix("data: ")))
                        out.print(table)
        except httpx.HTTPError as exc:
            err.print(f"[bold red]error:[/] stream from {server} ended: {exc}")
            raise typer.Exit(2) from exc
        except KeyboardInterrupt:
            return
