"""The `diagnoser` command line: a second composition root beside the app's lifespan."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import typer.main
from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console
from rich.markup import escape
from rich.text import Text
from typer.core import TyperArgument, TyperOption

from diagnoser import __version__
from diagnoser.config import Settings
from diagnoser.store.database import DatabaseUrl, InvalidDatabaseUrlError, parse_database_url

if TYPE_CHECKING:
    from diagnoser.config import LlmSettings
    from diagnoser.diagnosis.offline import OfflineResult
    from diagnoser.rules import RuleSet

app = typer.Typer(
    name="diagnoser",
    help="Log diagnosis for GPU training clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one clear line and return the exit to raise: no traceback for operator errors.

    `message` is plain text (it quotes paths and user input), never markup."""
    err.print(Text.assemble(("error:", "bold red"), " ", message))
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"diagnoser {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """diagnoser: ingest training logs, diagnose failures, recommend recovery actions."""


def build_settings(data_dir: Path | None, database_url: str | None) -> Settings:
    overrides: dict[str, object] = {}
    settings = Settings()
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if database_url is not None:
        overrides["db"] = settings.db.model_copy(update={"url": database_url})
    return settings.model_copy(update=overrides) if overrides else settings


def resolve_database(settings: Settings) -> DatabaseUrl:
    try:
        return parse_database_url(settings.database_url)
    except InvalidDatabaseUrlError as exc:
        raise fail(str(exc), 2) from exc


def ensure_writable_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise fail(f"data directory {path} is not writable: {exc.strerror or exc}") from exc


def ensure_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise fail(f"{host}:{port} is already in use: choose another --port") from exc
            raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


DataDirOption = Annotated[
    Path | None,
    typer.Option(
        "--data-dir", metavar="DIR", help="Embedded SQLite directory [env DIAGNOSER_DATA_DIR]"
    ),
]
DatabaseUrlOption = Annotated[
    str | None,
    typer.Option("--database-url", metavar="URL", help="SQLAlchemy URL [env DIAGNOSER_DB__URL]"),
]


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(metavar="ADDRESS", help="Address to listen on")
    ] = None,
    port: Annotated[int | None, typer.Option(metavar="PORT", help="Port to listen on")] = None,
    data_dir: DataDirOption = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Run the HTTP service (embedded SQLite by default; no Redis or LLM needed).

    Requests need a bearer token (`diagnoser token create`) once one exists. With none, the
    service runs open on loopback only, and refuses to start on any other address.
    """
    import uvicorn

    from diagnoser.app import create_app, log_config
    from diagnoser.runtime import tune_gc

    settings = build_settings(data_dir, database_url)
    settings = settings.model_copy(
        update={"host": host or settings.host, "port": settings.port if port is None else port}
    )
    database = resolve_database(settings)
    if database.sqlite_path is not None:
        ensure_writable_dir(database.sqlite_path.parent)
    ensure_port_free(settings.host, settings.port)
    rules = _load_rules(settings.rules_dir)  # a broken pack stops here, not mid-start
    _check_auth(settings, database)
    err.print(
        f"diagnoser {__version__} on http://{settings.host}:{settings.port} "
        f"(database {database.redacted()})",
        markup=False,
    )
    # uvicorn shuts down gracefully on SIGTERM, then raises it again with this handler restored:
    # a stop that completed is a success (exit 0), not a death by signal (-15).
    signal.signal(signal.SIGTERM, _stopped)
    app = create_app(settings, rules=rules)
    tune_gc(settings.gc_thresholds)  # what start-up built leaves the collector's view
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=log_config(settings.log_level),
        timeout_graceful_shutdown=10,
        timeout_keep_alive=settings.limits.keep_alive_s,
        limit_concurrency=settings.limits.max_connections,
    )


@app.command()
def migrate(data_dir: DataDirOption = None, database_url: DatabaseUrlOption = None) -> None:
    """Bring the database schema to the latest revision (explicit step for PostgreSQL)."""
    from sqlalchemy.exc import OperationalError

    from diagnoser.store.migrate import head_revision, upgrade

    settings = build_settings(data_dir, database_url)
    database = resolve_database(settings)
    if database.sqlite_path is not None:
        ensure_writable_dir(database.sqlite_path.parent)
    try:
        upgrade(database)
    except OperationalError as exc:
        first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise fail(f"cannot reach database {database.redacted()}: {first}") from exc
    err.print(f"database {database.redacted()} is at revision {head_revision()}", markup=False)


@app.command()
def prune(
    data_dir: DataDirOption = None,
    database_url: DatabaseUrlOption = None,
    days: Annotated[
        float | None,
        typer.Option(
            metavar="DAYS", help="Prune jobs idle this long [env DIAGNOSER_RETENTION__DAYS]"
        ),
    ] = None,
    diagnosis_days: Annotated[
        float | None,
        typer.Option(
            metavar="DAYS",
            help="Diagnoses not updated this long go too; 0 keeps them "
            "[env DIAGNOSER_RETENTION__DIAGNOSIS_DAYS]",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counts as JSON")] = False,
) -> None:
    """Run one retention pass now (the service runs them by itself when retention is set).

    Safe beside a running service: small transactions, and live jobs are never touched.
    """
    import asyncio

    from sqlalchemy.exc import SQLAlchemyError

    from diagnoser.config import RetentionSettings
    from diagnoser.store.database import Sessions, create_service_engine
    from diagnoser.store.migrate import upgrade
    from diagnoser.store.retention import TABLES, Pruner, PruneReport

    settings = build_settings(data_dir, database_url)
    chosen = settings.retention.model_dump()
    chosen.update(
        {k: v for k, v in (("days", days), ("diagnosis_days", diagnosis_days)) if v is not None}
    )
    try:
        retention = RetentionSettings.model_validate(chosen)
    except ValidationError as exc:
        raise fail(f"retention: {exc.errors()[0]['msg']}", 2) from None
    if not retention.enabled:
        raise fail("retention is off: give --days or set DIAGNOSER_RETENTION__DAYS", 2)
    database = resolve_database(settings)

    async def one_pass() -> PruneReport:
        engine = create_service_engine(database, connect_timeout_s=settings.db.connect_timeout_s)
        sessions = Sessions(engine, database, connect_timeout_s=settings.db.connect_timeout_s)
        try:
            return await Pruner(sessions, retention).prune()
        finally:
            await sessions.close()

    try:
        if database.sqlite_path is not None:
            upgrade(database)  # the embedded file migrates itself, as `serve` does
        report = asyncio.run(one_pass())
    except SQLAlchemyError as exc:
        raise fail(f"cannot prune {database.redacted()}: {type(exc).__name__}: {exc}") from exc
    if as_json:
        rows = {table: report.rows.get(table, 0) for table in TABLES}
        typer.echo(json.dumps({"rows": rows, "total": report.total, "seconds": report.seconds}))
        return
    for table in TABLES:
        typer.echo(f"{table:<20} {report.rows.get(table, 0):>10}")
    typer.echo(f"{'total':<20} {report.total:>10}   ({report.seconds:.1f}s)")


def _check_auth(settings: Settings, database: DatabaseUrl) -> None:
    """Refuse an open service off loopback here, with one line, rather than mid-start."""
    from diagnoser.auth.roles import startup_problem
    from diagnoser.auth.tokens import exist

    fresh = database.sqlite_path is not None and not database.sqlite_path.exists()
    problem = startup_problem(settings.auth, settings.host, False if fresh else exist(database))
    if problem is not None:
        raise fail(problem)


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _load_rules(directory: Path) -> RuleSet:
    from diagnoser.rules import RuleLoadError, load_dir

    if not directory.is_dir():
        raise fail(
            f"no rule pack at {directory}: point DIAGNOSER_RULES_DIR (or --rules-dir) at the "
            "rules/ directory of a diagnoser checkout or release"
        )
    try:
        return load_dir(directory)
    except RuleLoadError as exc:
        raise fail(str(exc)) from exc


RulesDirOption = Annotated[
    Path | None,
    typer.Option(
        "--rules-dir", metavar="DIR", help="Rule pack directory [env DIAGNOSER_RULES_DIR]"
    ),
]


@app.command()
def diagnose(
    paths: Annotated[
        list[Path],
        typer.Argument(metavar="FILE", help="One log file per node", show_default=False),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    job: Annotated[
        str | None, typer.Option(metavar="NAME", help="Job name, for the report only")
    ] = None,
    node_map: Annotated[
        list[str] | None,
        typer.Option("--node-map", metavar="FILE=NODE", help="Name a file's node (repeatable)"),
    ] = None,
    rules_dir: RulesDirOption = None,
    stalled_for: Annotated[
        str | None,
        typer.Option(
            "--stalled-for",
            metavar="DURATION",
            help="The job is still running and its logs have not advanced for this long "
            "(90s, 45m, 2h, or `mtime`: since the newest file was written); enables hang "
            "diagnosis",
            show_default=False,
        ),
    ] = None,
    hang_timeout: Annotated[
        str | None,
        typer.Option(
            "--hang-timeout",
            metavar="DURATION",
            help="A stall at least this long is a hang [default: DIAGNOSER_HANG__TIMEOUT_S]",
            show_default=False,
        ),
    ] = None,
    no_llm: Annotated[
        bool,
        typer.Option("--no-llm", help="Rules only, even when DIAGNOSER_LLM__BASE_URL names an LLM"),
    ] = False,
) -> None:
    """Diagnose log files in-process, no server: each file is one node's log.

    What the rules leave to a human (`escalate`) goes to the configured LLM, if any."""
    from diagnoser.diagnosis.offline import diagnose as run_diagnosis
    from diagnoser.diagnosis.offline import node_logs
    from diagnoser.diagnosis.report import render
    from diagnoser.rules import Action

    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise fail(f"no such file: {', '.join(missing)}", 2)
    stall: float | None = None
    if stalled_for == "mtime":
        stall = max(0.0, time.time() - max(path.stat().st_mtime for path in paths))
    elif stalled_for is not None:
        stall = _seconds(stalled_for, "--stalled-for")
    if hang_timeout is not None:
        timeout = _seconds(hang_timeout, "--hang-timeout")
        if timeout <= 0:
            raise fail("--hang-timeout must be longer than 0", 2)
    else:
        timeout = Settings().hang.timeout_s
    mapping: dict[str, str] = {}
    for item in node_map or []:
        file_name, sep, node = item.partition("=")
        if not sep or not file_name or not node:
            raise fail(f"--node-map takes FILE=NODE, got {item!r}", 2)
        mapping[file_name] = node
    ruleset = _load_rules(rules_dir or Settings().rules_dir)
    result = run_diagnosis(
        node_logs(paths, mapping),
        ruleset,
        stalled_for=stall,
        hang_timeout=timeout,
        hang_action=Action(Settings().hang.action),
        signal_config=Settings().signals.config(),
    )
    llm = Settings().llm
    if llm.enabled and not no_llm and result.unresolved:
        result = _consult_llm(result, llm, job or "offline")
    if as_json:
        typer.echo(json.dumps(result.as_json(), ensure_ascii=False))
        return
    out = Console(highlight=False)
    if job:
        out.print(Text.assemble("job ", (job, "bold")))
    render(result, out)


def _consult_llm(result: OfflineResult, llm: LlmSettings, job_id: str) -> OfflineResult:
    """The LLM's vote on an unresolved result; when it cannot be had, the rules' result and
    one line on stderr (the exit code stays that of the diagnosis)."""
    import asyncio

    from diagnoser.diagnosis.offline import consult

    try:
        consulted, failure = asyncio.run(consult(result, llm, job_id))
    except Exception as exc:  # a broken prompt or pattern must not hide the rules' verdict
        consulted, failure = result, f"{type(exc).__name__}: {exc}"
    if failure is not None:
        err.print(Text(f"note: the LLM could not be asked ({failure}); the verdict stays escalate"))
    return consulted


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SECRET_WORDS = ("URL", "KEY", "PASSWORD", "SECRET", "TOKEN", "DESTINATIONS")
"""Settings whose rejected value is not echoed back: it may hold a credential (a notify
destination carries webhook URLs and routing keys, whatever its keys are misspelt as)."""


def _seconds(text: str, option: str) -> float:
    """`90`, `90s`, `45m`, `2h`, `1d` -> seconds; anything else is a usage error."""
    value = text.strip().lower()
    scale = _UNITS.get(value[-1:], 0) if value else 0
    number = value[:-1] if scale else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise fail(f"{option} takes a duration like 90s, 45m or 2h, got {text!r}", 2) from None
    if not 0 <= seconds < float("inf"):
        raise fail(f"{option} takes a duration like 90s, 45m or 2h, got {text!r}", 2)
    return seconds


rules_app = typer.Typer(help="Validate and try the rule pack.", no_args_is_help=True)
app.add_typer(rules_app, name="rules")


@rules_app.command("check")
def rules_check(
    directory: Annotated[
        Path | None, typer.Argument(metavar="DIR", help="Rule directory [default: the pack]")
    ] = None,
) -> None:
    """Validate every rule file and run every rule's examples; exit 1 on any problem."""
    from diagnoser.rules import check

    target = directory or Settings().rules_dir
    problems = check(target)
    for problem in problems:
        err.print(Text.assemble(("✗", "red"), " ", str(problem)))
    if problems:
        raise fail(f"{len(problems)} problem(s) in {target}")
    ruleset = _load_rules(target)
    err.print(
        Text.assemble(
            ("✓", "green"),
            f" {len(ruleset.rules)} rules in {target} (digest {ruleset.digest[:12]})",
        )
    )


@rules_app.command("test")
def rules_test(
    logfile: Annotated[Path, typer.Argument(metavar="LOGFILE", help="A log file to scan")],
    rules_dir: RulesDirOption = None,
) -> None:
    """Show which rules fire on which lines of a log file."""
    from rich.table import Table

    from diagnoser.diagnosis.offline import node_logs, scan

    if not logfile.is_file():
        raise fail(f"no such file: {logfile}", 2)
    ruleset = _load_rules(rules_dir or Settings().rules_dir)
    events = scan(node_logs([logfile]), ruleset)
    table = Table(expand=True)
    for column in ("line", "rule", "failure type", "action"):
        table.add_column(column, no_wrap=True)
    table.add_column("text", overflow="fold")
    for event in sorted(events, key=lambda e: e.line_no):
        table.add_row(
            Text(str(event.line_no)),
            Text(event.rule_id),
            Text(event.failure_type),
            Text(event.action.value),
            Text(event.text[:200]),
        )
    Console(highlight=False).print(table)
    err.print(f"{len(events)} event(s) from {len(ruleset.rules)} rules")


class _PlainArgument(TyperArgument):
    """An argument whose help shows its name (the metavar) without a Python type label."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        """`FILE...` and `[DIR]`, as click writes them (typer puts braces around required)."""
        name = self.metavar or (self.name or "").upper()
        name = name if self.required or name.startswith("[") else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")


def plain_help(command: Any) -> Any:
    """Help that reads like a man page: `--json`, `--job JOB`, `FILE...`, not `--json <bool>`,
    `--job <str>`, `{paths}... <list[Path]>` as typer labels every value by its Python type.

    Flags show no value; a value without a metavar of its own is named after its option
    (`--rules-dir RULES_DIR`); arguments show their metavar (or upper-case name) alone. Help
    texts are plain text: typer would read `[env DIAGNOSER_DATA_DIR]` as markup and drop it.
    """
    if command.help:
        command.help = escape(command.help)
    params = list(command.params)
    with contextlib.suppress(AttributeError, TypeError):
        params.append(command.get_help_option(command.context_class(command)))
    for param in params:
        if param is None:
            continue
        if getattr(param, "help", None):
            param.help = escape(param.help)
        if param.metavar:
            pass
        elif isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""
        elif param.name:
            param.metavar = param.name.upper()
        if type(param) is TyperArgument:
            param.__class__ = _PlainArgument
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)
    return command


@functools.cache
def command() -> Any:
    """The whole command line as one click command, built once (tests invoke it in process)."""
    from diagnoser.auth.command import token_app
    from diagnoser.diagnosis.console import diagnoses_app
    from diagnoser.evaluation.command import evaluate
    from diagnoser.operator.command import operator
    from diagnoser.shipper.command import ship
    from diagnoser.shipper.run import run
    from diagnoser.templates.command import compress

    app.command("compress")(compress)
    app.command("ship")(ship)
    app.command("run")(run)
    app.command("eval")(evaluate)
    app.command("operator")(operator)
    app.add_typer(diagnoses_app, name="diagnoses")
    app.add_typer(token_app, name="token")
    return plain_help(typer.main.get_command(app))


def main(args: Sequence[str] | None = None) -> None:
    """The console script: `args` None reads sys.argv."""
    try:
        command()(args=None if args is None else list(args), prog_name="diagnoser")
    except ValidationError as exc:
        if exc.title != Settings.__name__:
            raise
        for error in exc.errors():
            variable = "DIAGNOSER_" + "__".join(str(part).upper() for part in error["loc"])
            secret = any(word in variable for word in _SECRET_WORDS) or len(error["loc"]) < 2
            shown = "" if secret else f" (got {error['input']!r})"
            problem = f"{variable}: {error['msg']}{shown}"
            err.print(f"[bold red]error:[/] {escape(problem)}")
        raise SystemExit(2) from None
    except SettingsError as exc:
        # A JSON-valued variable that is not JSON: the cause says where, never the value.
        problem = str(exc).removeprefix("error ") + (f": {exc.__cause__}" if exc.__cause__ else "")
        err.print(f"[bold red]error:[/] {escape(problem)}")
        raise SystemExit(2) from None
