"""The command line's promises: clear one-line errors, never a traceback, for operator mistakes."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from diagnoser import __version__
from tests.servers import PostgresServer, free_port


def diagnoser(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnoser", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_version() -> None:
    result = diagnoser("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"diagnoser {__version__}"


def test_bad_database_url_is_one_clear_line(tmp_path: Path) -> None:
    result = diagnoser("serve", "--data-dir", str(tmp_path), "--database-url", "mysql://x@y/z")
    assert result.returncode == 2
    assert "unsupported database backend 'mysql'" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = diagnoser("serve", "--data-dir", str(tmp_path), "--port", str(port))
    assert result.returncode == 1
    assert f"127.0.0.1:{port} is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_unwritable_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = diagnoser("serve", "--data-dir", str(blocker / "data"))
    assert result.returncode == 1
    assert f"data directory {blocker / 'data'} is not writable" in result.stderr
    assert "Traceback" not in result.stderr


def test_migrate_against_a_server_that_is_down() -> None:
    url = f"postgresql+psycopg://diagnoser@127.0.0.1:{free_port()}/postgres"
    result = diagnoser("migrate", "--database-url", url)
    assert result.returncode == 1
    assert "cannot reach database postgresql+psycopg://diagnoser@127.0.0.1" in result.stderr
    assert "Traceback" not in result.stderr


def test_migrate_postgres_then_again_is_a_no_op(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    first = diagnoser("migrate", "--database-url", url)
    assert first.returncode == 0, first.stderr
    again = diagnoser("migrate", "--database-url", url)
    assert again.returncode == 0
    assert "is at revision" in again.stderr
