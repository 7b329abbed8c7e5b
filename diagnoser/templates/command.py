"""`diagnoser compress PATH...`: the compressed log of one or more jobs of a family, offline.

Each PATH is one job of the same family, compressed in the order given by one compressor, so
the second job starts with every filter the first one taught. Line numbers (in the output,
`--kept-lines` and `--templates`) count the input lines of all PATHs concatenated, from 1.

`--json` prints one object, a contract others script against (keys are only ever added):
`lines_in`, `lines_kept`, `ratio` (lines_kept / lines_in, 0 for no input), `templates` (how many
templates the miner holds at the end), `filters` (how many filters are enabled at the end), then
`family`, `filters_disabled`, `filters_rejected`, `storms` and `files` (per PATH: `path`,
`lines_in`, `lines_kept`, `ratio`, `signals`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from diagnoser.config import Settings
from diagnoser.rules import RuleLoadError, load_dir
from diagnoser.templates.compressor import (
    Compressor,
    JobLog,
    KeptLine,
    Run,
    Storm,
)
from diagnoser.templates.family import family_of

BATCH_LINES = 4096
_err = Console(stderr=True, highlight=False, soft_wrap=True)


def _fail(message: str, code: int) -> typer.Exit:
    _err.print(Text("error: ", style="bold red") + Text(message))
    return typer.Exit(code)


def read_batches(path: Path) -> Iterator[list[str]]:
    """The file's lines (split at `\\n`, a `\\r` before it dropped, UTF-8 with replacement)."""
    batch: list[str] = []
    with path.open("rb") as handle:
        for raw in handle:
            batch.append(raw.rstrip(b"\n").removesuffix(b"\r").decode("utf-8", "replace"))
            if len(batch) == BATCH_LINES:
                yield batch
                batch = []
    if batch:
        yield batch


def compress(
    paths: Annotated[
        list[Path], typer.Argument(help="Log files, one job each, same family", show_default=False)
    ],
    family: Annotated[
        str | None,
        typer.Option(help="Job family [default: derived from the first file's name]"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    kept_lines: Annotated[
        Path | None,
        typer.Option("--kept-lines", help="Write the 1-based numbers of kept lines here"),
    ] = None,
    templates: Annotated[
        Path | None,
        typer.Option("--templates", help="Write each input line's template id here"),
    ] = None,
    rules_dir: Annotated[
        Path | None,
        typer.Option("--rules-dir", help="Rule pack directory [env DIAGNOSER_RULES_DIR]"),
    ] = None,
) -> None:
    """Compress training logs: failure lines kept, learned templates filtered and counted."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise _fail(f"no such file: {', '.join(missing)}", 2)
    directory = rules_dir or Settings().rules_dir
    try:
        ruleset = load_dir(directory)
    except RuleLoadError as exc:
        raise _fail(str(exc), 2) from exc
    compressor = Compressor(ruleset)
    logs: list[JobLog] = []
    offset = 0
    kept_numbers: list[int] = []
    template_ids: list[int] = []
    for path in paths:
        job = compressor.job(record=templates is not None)
        for batch in read_batches(path):
            job.feed(batch)
        log = job.finish()
        logs.append(log)
        kept_numbers.extend(offset + k.line_no for k in log.kept)
        if log.template_ids is not None:
            template_ids.extend(log.template_ids)
        offset += log.lines_in

    if kept_lines is not None:
        kept_lines.write_text("".join(f"{n}\n" for n in kept_numbers), encoding="utf-8")
    if templates is not None:
        resolved = _resolve(compressor, set(template_ids))
        templates.write_text(
            "".join(f"{resolved.get(t, t)}\n" for t in template_ids), encoding="utf-8"
        )

    family_name = family or family_of(paths[0].name)
    if as_json:
        typer.echo(json.dumps(_summary(compressor, logs, paths, family_name), ensure_ascii=False))
        return
    _render(compressor, logs, paths, family_name)


def _resolve(compressor: Compressor, ids: set[int]) -> dict[int, int]:
    """Ids of templates the miner merged since, mapped to the template that absorbed them."""
    out: dict[int, int] = {}
    for tid in ids:
        view = compressor.miner.get(tid)
        if view is not None and view.id != tid:
            out[tid] = view.id
    return out


def _summary(
    compressor: Compressor, logs: list[JobLog], paths: list[Path], family: str
) -> dict[str, object]:
    lines_in = sum(log.lines_in for log in logs)
    lines_kept = sum(log.lines_kept for log in logs)
    storm_min = compressor.config.storm_min
    return {
        "lines_in": lines_in,
        "lines_kept": lines_kept,
        "ratio": round(lines_kept / lines_in, 6) if lines_in else 0.0,
        "templates": len(compressor.templates()),
        "filters": len(compressor.filters.enabled),
        "family": family,
        "filters_disabled": len(compressor.filters.disabled),
        "filters_rejected": len(compressor.filters.rejections),
        "storms": sum(len(log.storms(storm_min)) for log in logs),
        "files": [
            {
                "path": str(path),
                "lines_in": log.lines_in,
                "lines_kept": log.lines_kept,
                "ratio": round(log.ratio, 6),
                "signals": log.signals.as_record(),
            }
            for path, log in zip(paths, logs, strict=True)
        ],
    }


def _render(compressor: Compressor, logs: list[JobLog], paths: list[Path], family: str) -> None:
    """The compressed log for a terminal. Log text is only ever a `Text`, never markup."""
    out = Console(highlight=False, soft_wrap=True)
    texts = {t.id: t.text for t in compressor.templates()}
    offset = 0
    for path, log in zip(paths, logs, strict=True):
        out.print(Text(f"== {path} ", style="bold") + Text(f"(family {family})", style="dim"))
        for entry in log.entries(texts, compressor.config.storm_min):
            out.print(_entry(entry, offset))
        offset += log.lines_in
        summary = (
            f"{log.lines_in:,} lines in, {log.lines_kept:,} kept ({log.ratio:.1%}), "
            f"{len(compressor.filters.enabled)} filters"
        )
        out.print(Text(summary, style="dim"))
        for signal in log.signals.raised:
            resume = (
                f", resume from checkpoint step {signal.resume_from}"
                if signal.resume_from is not None
                else ""
            )
            line = f"signal {signal.kind.value} at line {offset - log.lines_in + signal.line_no}"
            out.print(Text(f"{line} (step {signal.step}, value {signal.value}){resume}", "yellow"))


def _entry(entry: KeptLine | Run | Storm, offset: int) -> Text:
    if isinstance(entry, Run):
        return Text(f"{'':>8}  [x {entry.count:,} lines] ", style="dim") + Text(
            entry.template, style="dim"
        )
    if isinstance(entry, Storm):
        head = Text(
            f"{offset + entry.first.line_no:>8}  [storm x {entry.count:,} lines, "
            f"{len(entry.ranks)} ranks, {len(entry.nodes)} nodes] ",
            style="bold red",
        )
        head += Text(entry.template)
        head += Text(f"\n{'':>10}first: ", style="dim") + Text(entry.first.text)
        head += Text(f"\n{'':>10}last ({offset + entry.last.line_no}): ", style="dim")
        head += Text(entry.last.text)
        return head
    style = "red" if entry.guarded is not None else ""
    return Text(f"{offset + entry.line_no:>8}  ", style="dim") + Text(entry.text, style=style)
