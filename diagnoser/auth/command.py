"""`diagnoser token create|list|revoke`: tokens written straight to the service's database.

This works before any token exists (the first admin token is made here) and needs the same
`--data-dir` / `--database-url` (or DIAGNOSER_* settings) as `serve`.
"""

from __future__ import annotations

import getpass
import json
from datetime import timedelta
from typing import Annotated

import regex
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from diagnoser.auth import tokens
from diagnoser.auth.audit import record
from diagnoser.auth.binding import JOB_PATTERN
from diagnoser.auth.tokens import Role
from diagnoser.cli import (
    DatabaseUrlOption,
    DataDirOption,
    build_settings,
    ensure_writable_dir,
    err,
    fail,
    resolve_database,
)
from diagnoser.ingest.schemas import MAX_NAME_LENGTH, NAME_PATTERN
from diagnoser.store.database import DatabaseUrl, create_sync_engine
from diagnoser.store.migrate import upgrade
from diagnoser.store.models import ApiTokenRow, utcnow

token_app = typer.Typer(help="Create, list and revoke API tokens.", no_args_is_help=True)
_DURATION = regex.compile(r"^(\d{1,6})([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _session(database: DatabaseUrl) -> Session:
    if database.sqlite_path is not None:
        ensure_writable_dir(database.sqlite_path.parent)
    try:
        upgrade(database)  # a no-op when current; the tokens table comes with the schema
    except SQLAlchemyError as exc:
        problem = type(exc).__name__
        raise fail(f"cannot reach database {database.redacted()}: {problem}") from exc
    return Session(create_sync_engine(database))


def _expiry(text: str | None) -> timedelta | None:
    if text is None:
        return None
    match = _DURATION.match(text.strip().lower())
    if match is None or int(match.group(1)) == 0:
        raise fail(f"--expires takes a duration like 30d, 12h or 90m, got {text!r}", 2)
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


def _view(row: ApiTokenRow) -> dict[str, str | None]:
    return {
        "id": row.id,
        "role": row.role,
        "node": row.node,
        "jobs": row.jobs,
        "description": row.description,
        "created_by": row.created_by,
        "created_at": row.created_at.isoformat(),
        "expires_at": row.expires_at.isoformat() if row.expires_at else None,
        "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
    }


@token_app.command("create")
def create(
    role: Annotated[Role, typer.Option("--role", help="ingest, read, operator or admin")],
    node: Annotated[
        str | None, typer.Option("--node", metavar="NODE", help="Bind an ingest token to a node")
    ] = None,
    jobs: Annotated[
        str | None,
        typer.Option("--jobs", metavar="PATTERN", help="Bind an ingest token to jobs (glob)"),
    ] = None,
    expires: Annotated[
        str | None, typer.Option("--expires", metavar="DURATION", help="e.g. 30d, 12h")
    ] = None,
    description: Annotated[
        str, typer.Option("--description", metavar="TEXT", help="What the token is for")
    ] = "",
    data_dir: DataDirOption = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Create a token and print it once on stdout (only its digest is stored)."""
    if (node or jobs) and role is not Role.INGEST:
        raise fail("--node and --jobs bind ingest tokens only", 2)
    if node is not None and (len(node) > MAX_NAME_LENGTH or not regex.match(NAME_PATTERN, node)):
        raise fail(f"--node {node!r} is not a valid node name", 2)
    if jobs is not None and not regex.match(JOB_PATTERN, jobs):
        raise fail(f"--jobs {jobs!r}: a glob of job-id characters, `*` and `?`", 2)
    if any(ch < " " or ch == "\x7f" for ch in description) or len(description) > 200:
        raise fail("--description: at most 200 printable characters", 2)
    lifetime = _expiry(expires)
    database = resolve_database(build_settings(data_dir, database_url))
    actor = _actor()
    with _session(database) as session, session.begin():
        issued = tokens.issue(
            session, role, node=node, jobs=jobs, description=description, created_by=actor,
            expires_at=utcnow() + lifetime if lifetime else None,
        )  # fmt: skip
        record(session, actor, "token.create", issued.row.id, {"role": role.value, "node": node,
               "jobs": jobs})  # fmt: skip
        row_id = issued.row.id
    typer.echo(issued.raw)
    err.print(Text(f"token {row_id} ({role.value}) created: it is shown only this once"))


@token_app.command("list")
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
    data_dir: DataDirOption = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Every token: id, role, binding, expiry, revocation (never the token itself)."""
    database = resolve_database(build_settings(data_dir, database_url))
    with _session(database) as session:
        rows = [_view(row) for row in tokens.listing(session)]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table()
    for column in ("id", "role", "node", "jobs", "expires_at", "revoked_at", "description"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(Text(row[c] or "") for c in ("id", "role", "node", "jobs", "expires_at",
                                                        "revoked_at", "description")))  # fmt: skip
    Console(highlight=False).print(table)


@token_app.command("revoke")
def revoke(
    token_id: Annotated[str, typer.Argument(metavar="ID", help="The token's id (token list)")],
    data_dir: DataDirOption = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Revoke a token: the service refuses it from the next request on."""
    database = resolve_database(build_settings(data_dir, database_url))
    actor = _actor()
    with _session(database) as session, session.begin():
        row = tokens.revoke(session, token_id)
        if row is None:
            raise fail(f"no token {token_id!r}")
        record(session, actor, "token.revoke", token_id, {"role": row.role})
    err.print(Text(f"token {token_id} revoked"))
