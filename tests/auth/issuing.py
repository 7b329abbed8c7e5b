"""Tokens made the way an administrator makes them: `diagnoser token create`, before or while
the service runs against the same database. The command runs in process (the same click command
the console script runs; a child process per token cost seconds); tests/auth/test_tokens.py runs
the real console script."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from diagnoser import cli


@dataclass(frozen=True)
class Token:
    id: str
    raw: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.raw}"}


def create_token(data_dir: Path, role: str, *args: str) -> Token:
    result = CliRunner().invoke(
        cli.command(),
        ["token", "create", "--role", role, "--data-dir", str(data_dir), *args],
        prog_name="diagnoser",
    )
    assert result.exit_code == 0, result.stderr
    raw = result.stdout.strip()
    assert raw.startswith("dgn_"), result.stdout
    return Token(raw.split("_")[1], raw)
