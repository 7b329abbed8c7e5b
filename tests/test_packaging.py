"""What ships: the wheel carries the rule pack; the image and compose file keep their promises.

There is no Docker engine in the suite, so the container files are read and checked as data,
and the image's healthcheck command is run here against a real service.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from diagnoser.native import NATIVE_MODULES
from tests.servers import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
WHEEL_SOURCES = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "diagnoser",
    "rules",
    "prompts",
)
"""What `pip wheel .` reads: the checkout minus tests, caches and local state."""


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def dockerfile() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    instructions = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, arguments = line.strip().partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip()))
    return instructions


def final_stage() -> list[Instruction]:
    instructions = dockerfile()
    last_from = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last_from:]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in final_stage():
        if ins.keyword == "ENV":
            for word in shlex.split(ins.arguments):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def docker_ignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` (relative, with /) out of the build context.

    Docker's rules, not gitignore's: a pattern is anchored at the context root, `*` stays within
    one path element, `**` spans any number of them, a match on a directory drops everything
    below it, and a later `!pattern` takes a path back.
    """
    ignored = False
    parts = path.split("/")
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.removeprefix("!").strip("/").split("/")
        if any(_matches(pattern, parts[: n + 1]) for n in range(len(parts))):
            ignored = not negate
    return ignored


def _matches(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_matches(rest, parts[n:]) for n in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _matches(rest, parts[1:])


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".git/HEAD",
        "data/diagnoser.db",
        "diagnoser.db",
        "diagnoser.db-wal",
        "tests/api/leftover.db",
        "diagnoser/__pycache__/cli.cpython-311.pyc",
        "diagnoser.egg-info/PKG-INFO",
        "build/lib/diagnoser/cli.py",
    ],
)
def test_the_build_context_leaves_out_local_state(path: str) -> None:
    assert docker_ignored(path, dockerignore())


def test_the_build_context_keeps_everything_the_dockerfile_copies() -> None:
    patterns = dockerignore()
    sources = [
        source
        for ins in dockerfile()
        if ins.keyword == "COPY" and "--from=" not in ins.arguments
        for source in ins.arguments.split()[:-1]
    ]
    assert {"setup.py", "rules", "diagnoser", "pyproject.toml"} <= set(sources)
    for source in sources:
        files = [ROOT / source] if (ROOT / source).is_file() else (ROOT / source).rglob("*")
        kept = [
            file for file in files if file.suffix in {".py", ".yaml", ".j2", ".toml", ".md", ".in"}
        ]
        assert kept, source
        for file in kept:
            relative = file.relative_to(ROOT).as_posix()
            assert not docker_ignored(relative, patterns), relative


def test_compose_builds_one_image_for_both_diagnoser_services() -> None:
    services = compose()["services"]
    built = [name for name, service in services.items() if "build" in service]
    assert built == ["migrate"]
    image = services["migrate"]["image"]
    assert services["api"]["image"] == image
    assert "build" not in services["api"]
    assert services["api"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"
    }


def test_the_api_listens_where_the_healthcheck_and_the_published_port_look() -> None:
    api = compose()["services"]["api"]
    assert "--port" not in api["command"]
    assert api["environment"]["DIAGNOSER_PORT"] == "${DIAGNOSER_PORT:-8080}"
    assert api["ports"] == ["127.0.0.1:${DIAGNOSER_PORT:-8080}:${DIAGNOSER_PORT:-8080}"]
    assert "healthcheck" not in api  # the image's healthcheck applies
    assert image_env()["DIAGNOSER_PORT"] == "8080"
    healthcheck = healthcheck_command()
    assert "DIAGNOSER_PORT" in " ".join(healthcheck)
    assert "127.0.0.1:8080" not in " ".join(healthcheck)


def healthcheck_command() -> list[str]:
    (check,) = [ins for ins in final_stage() if ins.keyword == "HEALTHCHECK"]
    command: list[str] = json.loads(check.arguments.split(" CMD ", 1)[1])
    return command


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A service started with compose's default environment: Redis's URL present but empty."""
    data = tmp_path_factory.mktemp("data")
    process = ServiceProcess(env={"DIAGNOSER_DATA_DIR": str(data), "DIAGNOSER_REDIS__URL": ""})
    process.start()
    yield process
    process.stop()


def test_the_image_healthcheck_follows_diagnoser_port(service: ServiceProcess) -> None:
    program, *arguments = healthcheck_command()
    assert program == "python"

    def check(port: int) -> int:
        env = {"DIAGNOSER_PORT": str(port), "PATH": "/usr/bin:/bin"}
        done = subprocess.run(
            [sys.executable, *arguments], env=env, capture_output=True, check=False
        )
        return done.returncode

    assert check(service.port) == 0
    assert check(free_port()) != 0


def test_redis_is_optional_in_compose(service: ServiceProcess) -> None:
    services = compose()["services"]
    assert services["redis"]["profiles"] == ["redis"]
    for name, spec in services.items():
        assert "redis" not in spec.get("depends_on", {}), name
    assert services["api"]["environment"]["DIAGNOSER_REDIS__URL"] == "${DIAGNOSER_REDIS__URL:-}"
    ready = httpx.get(f"{service.base_url}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    assert "redis" not in ready.json()["checks"]


def test_the_sqlite_default_lives_on_a_volume() -> None:
    data_dir = image_env()["DIAGNOSER_DATA_DIR"]
    volumes = [ins.arguments for ins in final_stage() if ins.keyword == "VOLUME"]
    assert volumes == [json.dumps([data_dir])]
    spec = compose()
    assert f"data:{data_dir}" in spec["services"]["api"]["volumes"]
    assert "data" in spec["volumes"]


def test_the_rule_pack_is_mounted_where_the_image_looks_for_it() -> None:
    rules_dir = image_env()["DIAGNOSER_RULES_DIR"]
    mounts = [m.split(":") for m in compose()["services"]["api"]["volumes"]]
    (source,) = [m[0] for m in mounts if m[1] == rules_dir]
    assert (ROOT / source).resolve() == ROOT / "rules"
    copies = [ins.arguments.split() for ins in final_stage() if ins.keyword == "COPY"]
    assert ["rules", rules_dir] in copies  # without the mount, the image still has the pack


def test_compose_says_how_to_create_the_first_token() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    header = text.split("services:", 1)[0]
    assert "docker compose run --rm api token create --role admin" in header
    api = compose()["services"]["api"]
    assert all(port.startswith("127.0.0.1:") for port in api["ports"])


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the checkout, so the build leaves nothing in the tree."""
    source = tmp_path_factory.mktemp("source")
    for name in WHEEL_SOURCES:
        if not (ROOT / name).exists():
            continue
        if (ROOT / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "native-build.json")
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", ".", "-w", str(out)],
        cwd=source, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (built,) = out.glob("diagnoser-*.whl")
    return built


def test_the_wheel_carries_the_rule_pack(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    pack = {p.name for p in (ROOT / "rules").glob("*.yaml")}
    assert pack
    assert {f"diagnoser/rules/pack/{name}" for name in pack} <= names
    assert not any(name.startswith("rules/") for name in names)
    prompts = {p.name for p in (ROOT / "prompts").glob("*.j2")}
    assert prompts
    assert {f"diagnoser/llm/prompts/{name}" for name in prompts} <= names


def test_the_wheel_carries_the_compiled_miner_and_the_record_of_its_sources(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        record = json.loads(archive.read("diagnoser/native-build.json"))
    for module in NATIVE_MODULES:
        path = module.replace(".", "/")
        assert any(n.startswith(f"{path}.") and n.endswith(".so") for n in names), module
        assert f"{path}.py" in names  # the source ships too: the fallback, and for tracebacks
        assert record[module] == hashlib.sha256((ROOT / f"{path}.py").read_bytes()).hexdigest()


def test_an_installed_wheel_finds_its_rule_pack_outside_a_checkout(
    wheel: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    # The dependencies come from this interpreter's site-packages, added as a plain path entry:
    # its .pth files (the editable install of this checkout among them) are not processed.
    purelib = Path(sysconfig.get_paths()["purelib"])
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "test-dependencies.pth").write_text(f"{purelib}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    where = subprocess.run(
        [str(python), "-c", "import diagnoser; print(diagnoser.__file__)"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(site)

    check = subprocess.run(
        [str(venv / "bin" / "diagnoser"), "rules", "check"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    packaged = Path(site) / "diagnoser" / "rules" / "pack"
    assert f"rules in {packaged}" in check.stderr

    native = subprocess.run(
        [str(python), "-c", "from diagnoser.native import compiled; print(compiled())"],
        cwd=elsewhere, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert native.stdout.strip() == str(dict.fromkeys(NATIVE_MODULES, True)), native.stderr
    assert not native.stderr  # no warning: the record vouches for every extension
