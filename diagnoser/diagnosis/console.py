"""`diagnoser diagnoses list|show|watch`: the on-call API from a terminal.

Everything a server sends back (job ids, node names, summaries, log lines, error details) is
written by someone else, so it reaches the terminal as `rich.text.Text`, never as markup.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from diagnoser.diagnosis.report import vote_lines

diagnoses_app = typer.Typer(help="Query diagnoses on a running server.", no_args_is_help=True)
out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ServerOption = Annotated[
    str,
    typer.Option(
        "--server", envvar="DIAGNOSER_SERVER", metavar="URL", help="Base URL of the service"
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option("--token", envvar="DIAGNOSER_TOKEN", metavar="TOKEN", help="Bearer token"),
]
ACTION_STYLE = {
    "cordon_node_and_restart": "bold red",
    "restart_job": "yellow",
    "escalate": "magenta",
}
SHORT_ID = 8
"""Characters of an id the list shows; `show` takes any unique prefix."""
CULPRITS_WIDTH = 16
"""One node name per line; a longer name wraps inside the column."""
PREFIX_PAGES = 20
"""Pages of 500 (the newest 10,000 diagnoses) searched for an id prefix."""
AMBIGUOUS_SHOWN = 10


def _client(server: str, token: str | None, timeout: float | None = 10.0) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout)


def _error(*parts: str | Text) -> None:
    err.print(Text.assemble(Text("error:", style="bold red"), " ", *parts))


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return detail if isinstance(detail, str) else json.dumps(detail)[:300]


def _send(client: httpx.Client, path: str, params: dict[str, Any] | None) -> httpx.Response:
    try:
        return client.get(path, params={k: v for k, v in (params or {}).items() if v})
    except httpx.HTTPError as exc:
        _error(f"cannot reach {client.base_url}: {exc}")
        raise typer.Exit(2) from exc


def _fail(response: httpx.Response) -> typer.Exit:
    _error(f"{response.status_code} {_detail(response) if response.content else ''}")
    return typer.Exit(3 if response.status_code in (401, 403) else 1)


def _get(client: httpx.Client, path: str, params: dict[str, Any] | None = None) -> Any:
    response = _send(client, path, params)
    if response.status_code >= 400:
        raise _fail(response)
    return response.json()


def _cell(value: object) -> Text:
    return Text("-" if value is None or value == "" else str(value))


def _row(table: Table, item: dict[str, Any]) -> None:
    action = item["action"]
    table.add_row(
        Text(item["id"][:SHORT_ID]),
        _cell(item["job_id"]),
        _cell(item["status"]),
        Text(action, style=ACTION_STYLE.get(action, "")),
        Text("\n".join(item["culprit_nodes"]) or "-"),
        _cell(item["failure_type"]),
        Text(item["updated_at"][5:16].replace("T", " ")),
    )


def _table(width: int) -> Table:
    """Columns sized for the terminal, never below a usable width: the id, status, culprits
    and time are fixed; job, action and failure type share the rest and wrap within it.

    Rich's own sizing shrinks the widest cells first, which cut the culprits to nothing and
    the id to two characters at 80 columns.
    """
    flexible = max(3 * 8, width - 6 - SHORT_ID - 9 - CULPRITS_WIDTH - 11)
    action = min(len("cordon_node_and_restart"), max(12, flexible // 3))
    job = (flexible - action + 1) // 2
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False)
    table.add_column("id", no_wrap=True, width=SHORT_ID)
    table.add_column("job", overflow="fold", width=job)
    table.add_column("status", no_wrap=True, width=9)
    table.add_column("action", overflow="fold", width=action)
    table.add_column("culprits", overflow="fold", width=CULPRITS_WIDTH)
    table.add_column("failure type", overflow="fold", width=flexible - action - job)
    table.add_column("updated", no_wrap=True, width=11)
    return table


@diagnoses_app.command("list")
def list_(
    server: ServerOption = "http://127.0.0.1:8080",
    token: TokenOption = None,
    job: Annotated[str | None, typer.Option(metavar="JOB", help="Only this job")] = None,
    node: Annotated[
        str | None, typer.Option(metavar="NODE", help="Only diagnoses naming this node")
    ] = None,
    category: Annotated[
        str | None, typer.Option(metavar="CATEGORY", help="hardware, network, ...")
    ] = None,
    status: Annotated[
        str | None, typer.Option(metavar="STATUS", help="open, actioned, resolved, dismissed")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500, metavar="N", help="Page size")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw page")] = False,
) -> None:
    """The newest diagnoses first (the id column is a prefix `show` accepts)."""
    with _client(server, token) as client:
        page = _get(
            client,
            "/v1/diagnoses",
            {"job": job, "node": node, "category": category, "status": status, "limit": limit},
        )
    if as_json:
        typer.echo(json.dumps(page))
        return
    table = _table(out.width)
    for item in page["diagnoses"]:
        _row(table, item)
    out.print(table)


def _by_prefix(client: httpx.Client, prefix: str) -> dict[str, Any]:
    """The one diagnosis whose id starts with `prefix`, among the newest PREFIX_PAGES pages.

    Resolved here, with the list API, so the service needs no lookup of its own; the list is
    newest first, so a prefix of anything an on-call engineer just saw is found on page one.
    """
    matches: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(PREFIX_PAGES):
        page = _get(client, "/v1/diagnoses", {"limit": 500, "cursor": cursor})
        matches.extend(d for d in page["diagnoses"] if d["id"].startswith(prefix))
        cursor = page["next_cursor"]
        if cursor is None:
            break
    if len(matches) == 1:
        return matches[0]
    if not matches:
        _error("no diagnosis ", Text(repr(prefix)), " (no id starts with it)")
        raise typer.Exit(1)
    _error(Text(repr(prefix)), f" matches {len(matches)} diagnoses; give more of the id:")
    for item in matches[:AMBIGUOUS_SHOWN]:
        err.print(Text(f"  {item['id']}  {item['job_id']}  {item['failure_type'] or '-'}"))
    if len(matches) > AMBIGUOUS_SHOWN:
        err.print(f"  ... and {len(matches) - AMBIGUOUS_SHOWN} more")
    raise typer.Exit(2)


def _diagnosis(client: httpx.Client, ident: str) -> dict[str, Any]:
    """A full id, else a unique id prefix."""
    if not ident:
        _error("give a diagnosis id, or the start of one")
        raise typer.Exit(2)
    response = _send(client, f"/v1/diagnoses/{quote(ident, safe='')}", None)
    if response.status_code == 404:
        return _by_prefix(client, ident)
    if response.status_code >= 400:
        raise _fail(response)
    item: dict[str, Any] = response.json()
    return item


@diagnoses_app.command("show")
def show(
    diagnosis_id: Annotated[
        str, typer.Argument(metavar="ID", help="A diagnosis id, or a unique start of one")
    ],
    server: ServerOption = "http://127.0.0.1:8080",
    token: TokenOption = None,
) -> None:
    """One diagnosis with its evidence, and the LLM's vote when it was asked."""
    with _client(server, token) as client:
        item = _diagnosis(client, diagnosis_id)
    out.print(Text(item["summary"], style="bold"))
    out.print(
        Text(
            f"id {item['id']}  job {item['job_id']}  status {item['status']}  "
            f"action {item['action']}  confidence {item['confidence']:.2f}  "
            f"source {item['source']}"
        )
    )
    out.print(
        Text(
            f"culprits: {', '.join(item['culprit_nodes']) or '-'}  "
            f"rules: {', '.join(item['rule_ids'])}"
        )
    )
    table = Table("node", "rank", "line", "evidence", expand=True)
    for evidence in item["evidence"][:20]:
        table.add_row(
            Text(evidence["node"]),
            Text(str(evidence["rank"] if evidence["rank"] is not None else "-")),
            Text(str(evidence["line_no"])),
            Text(evidence["text"][:300]),
        )
    out.print(table)
    if item.get("llm"):
        for line in vote_lines(item["llm"]):
            out.print(line)


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
                    _error(str(stream.status_code))
                    raise typer.Exit(3 if stream.status_code in (401, 403) else 1)
                for line in stream.iter_lines():
                    if line.startswith("data: "):
                        table = _table(out.width)
                        _row(table, json.loads(line.removeprefix("data: ")))
                        out.print(table)
        except httpx.HTTPError as exc:
            _error(f"stream from {server} ended: {exc}")
            raise typer.Exit(2) from exc
        except KeyboardInterrupt:
            return
