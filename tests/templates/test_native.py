"""The compiled miner: it groups exactly as its source does, and an old build never shadows it.

Run in child interpreters, since which module a process runs is decided at its first import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import diagnoser
from diagnoser.native import NATIVE_MODULES, PURE_PYTHON_ENV, compiled, stale_modules
from tests.servers import missing_service
from tests.templates.corpus import LOGHUB, ROOT

PACKAGE = Path(diagnoser.__file__).resolve().parent


@pytest.fixture(scope="module")
def built() -> None:
    """The suite's install compiles the miner (scripts/setup.sh); CI must not pass without it."""
    if not all(compiled().values()) or stale_modules():
        missing_service("the miner is not compiled: run ./scripts/setup.sh (needs a C compiler)")


def run(code: str, *, env: dict[str, str] | None = None, path: Path | None = None) -> str:
    child_env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    child_env.update(env or {})
    if path is not None:
        child_env["PYTHONPATH"] = str(path)
    done = subprocess.run(
        [sys.executable, "-c", code], env=child_env, cwd=path or ROOT,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


WHICH = "from diagnoser.native import compiled; print(sorted(compiled().items()))"


def test_the_installed_miner_runs_compiled(built: None) -> None:
    assert run(WHICH) == f"{sorted((m, True) for m in NATIVE_MODULES)}\n"
    pure = run(WHICH, env={PURE_PYTHON_ENV: "1"})
    assert pure == f"{sorted((m, False) for m in NATIVE_MODULES)}\n"


def test_compiled_and_pure_miners_group_every_loghub_line_identically(built: None) -> None:
    if not (LOGHUB / "HDFS").is_dir():
        pytest.fail(f"loghub-2k not found at {LOGHUB} (set DIAGNOSER_LOGHUB_DIR)")
    script = ROOT / "bench" / "mining_fingerprint.py"
    code = (
        f"import sys; sys.argv = [{str(script)!r}, '--loghub', {str(LOGHUB)!r}, "
        "'--cache', '3', '50']; "
        f"sys.path.insert(0, {str(ROOT)!r}); import runpy; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    native = run(code).splitlines()
    pure = run(code, env={PURE_PYTHON_ENV: "1"}).splitlines()
    assert len(native) > 3 * 32  # every input under three configurations, then the total
    assert native == pure


def copy_install(into: Path) -> Path:
    """The installed package (extensions and build record too) and mypyc's shared library."""
    shutil.copytree(PACKAGE, into / "diagnoser", ignore=shutil.ignore_patterns("__pycache__"))
    for shared in PACKAGE.parent.glob("*__mypyc*"):
        shutil.copy2(shared, into / shared.name)
    return into


def test_an_edited_source_runs_instead_of_its_old_extension(built: None, tmp_path: Path) -> None:
    copy = copy_install(tmp_path)
    which = "import diagnoser.templates.miner as m; print(m.__file__, hasattr(m, 'EDITED'))"
    out = run(which, path=copy)
    assert out.split()[1] == "False"
    assert not out.split()[0].endswith(".py"), "an unchanged copy runs its extension"

    source = copy / "diagnoser" / "templates" / "miner.py"
    source.write_text(source.read_text() + "\nEDITED = True\n")
    out = run(which, path=copy)
    assert out.splitlines()[0].endswith(".py True"), out
    assert "does not match its source" in out  # said once, on stderr


def test_an_extension_with_no_build_record_is_not_trusted(built: None, tmp_path: Path) -> None:
    copy = copy_install(tmp_path)
    (copy / "diagnoser" / "native-build.json").unlink()
    out = run(WHICH, path=copy)
    assert f"{sorted((m, False) for m in NATIVE_MODULES)}" in out
