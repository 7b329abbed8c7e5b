"""`diagnoser compress`: its JSON, --kept-lines and --templates are contracts others script."""

from __future__ import annotations

import json
from pathlib import Path

from tests.servers import run_diagnoser
from tests.templates.corpus import LOGHUB, RULES_DIR, read_lines
from tests.templates.test_compressor import training_lines


def compress(*args: str) -> tuple[int, str, str]:
    result = run_diagnoser("compress", "--rules-dir", str(RULES_DIR), *args, timeout=120)
    return result.returncode, result.stdout, result.stderr


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_json_contract_and_audit_files(tmp_path: Path) -> None:
    lines = training_lines(1, 1500)
    lines.insert(700, "RuntimeError: CUDA error: an illegal memory access was encountered")
    log = _write(tmp_path / "gpt-7b-run3.log", lines)
    kept_out, templates_out = tmp_path / "kept.txt", tmp_path / "templates.txt"
    code, out, err = compress(
        str(log), "--json", "--kept-lines", str(kept_out), "--templates", str(templates_out)
    )
    assert code == 0, err
    summary = json.loads(out)
    assert {"lines_in", "lines_kept", "ratio", "templates", "filters"} <= set(summary)
    assert summary["lines_in"] == len(lines)
    assert summary["ratio"] == round(summary["lines_kept"] / len(lines), 6)
    assert summary["ratio"] < 0.1
    assert isinstance(summary["templates"], int)
    assert isinstance(summary["filters"], int)
    assert summary["filters"] >= 2
    assert summary["family"] == "gpt-7b"

    kept = [int(n) for n in kept_out.read_text().split()]
    assert len(kept) == summary["lines_kept"]
    assert kept == sorted(kept)
    assert 701 in kept  # the failure line, 1-based
    ids = templates_out.read_text().splitlines()
    assert len(ids) == len(lines)
    assert all(i.lstrip("-").isdigit() for i in ids)
    iteration = {ids[n] for n, line in enumerate(lines) if line.startswith(" iteration")}
    assert len(iteration) == 1


def test_several_files_are_jobs_of_one_family_numbered_as_one_input(tmp_path: Path) -> None:
    first = _write(tmp_path / "job-1.log", training_lines(1, 1000))
    second = _write(tmp_path / "job-2.log", training_lines(2, 1000))
    kept_out = tmp_path / "kept.txt"
    code, out, _ = compress(str(first), str(second), "--json", "--kept-lines", str(kept_out))
    assert code == 0
    summary = json.loads(out)
    one, two = summary["files"]
    assert two["lines_kept"] * 3 <= one["lines_kept"]
    assert summary["lines_in"] == one["lines_in"] + two["lines_in"]
    numbers = [int(n) for n in kept_out.read_text().split()]
    assert max(numbers) <= summary["lines_in"]


def test_terminal_output_shows_runs_and_never_renders_log_text_as_markup(tmp_path: Path) -> None:
    lines = [*training_lines(1, 300), "[bold red]boom[/] Traceback (most recent call last):"]
    log = _write(tmp_path / "job.log", lines)
    code, out, _ = compress(str(log))
    assert code == 0
    assert "[bold red]boom[/] Traceback (most recent call last):" in out
    assert "[x " in out
    assert "lines in," in out


def test_loghub_templates_file_has_one_id_per_line(tmp_path: Path) -> None:
    path = LOGHUB / "HDFS" / "HDFS_2k.log"
    out = tmp_path / "t.txt"
    code, _, err = compress(str(path), "--templates", str(out), "--json")
    assert code == 0, err
    assert len(out.read_text().splitlines()) == len(read_lines(path))


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = compress(str(tmp_path / "nope.log"))
    assert code == 2
    assert "no such file" in err
    assert "Traceback" not in err
