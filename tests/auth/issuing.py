"""Tokens made the way an administrator makes them: `diagnoser token create`, before or while
the service runs against the same database."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.servers import run_diagnoser


@dataclass(frozen=True)
class Token:
    id: str
    raw: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.raw}"}


def create_token(data_dir: Path, role: str, *args: str) -> Token:
    result = run_diagnoser(
        "token", "create", "--role", role, "--data-dir", str(data_dir), *args, timeout=60
    )
    assert result.returncode == 0, result.stderr
    raw = result.stdout.strip()
    assert raw.startswith("dgn_"), result.stdout
    return Token(raw.split("_")[1], raw)
