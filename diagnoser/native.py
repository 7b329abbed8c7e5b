"""Which modules run compiled, and the guard that keeps an old build from shadowing new source.

The template miner's per-line path (`NATIVE_MODULES`) is compiled to C by mypyc when diagnoser
is installed (setup.py): the same type-checked source, fewer CPU seconds per line. Python
imports an extension module before the .py file beside it, so after an edit or a `git pull`
an editable install's old extension would run instead of the new source. The build records
the SHA-256 of each source it compiled (`BUILD_RECORD`); `load_fresh` runs before the first
import of these modules and, when an extension is not vouched for by that record, loads every
native module from its .py file instead, with one warning. `DIAGNOSER_PURE_PYTHON=1` asks for
the .py files outright (to compare the two, or to debug with a Python debugger).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

NATIVE_MODULES = ("diagnoser.templates.masking", "diagnoser.templates.miner")
"""In import order (the miner imports masking); setup.py's `NATIVE_MODULES` are these files."""
BUILD_RECORD = "native-build.json"
PURE_PYTHON_ENV = "DIAGNOSER_PURE_PYTHON"
_PACKAGE = Path(__file__).resolve().parent

log = logging.getLogger(__name__)


def _source(module: str) -> Path:
    return _PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")


def _extension(module: str) -> Path | None:
    source = _source(module)
    for suffix in EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def _recorded() -> dict[str, str]:
    try:
        loaded = json.loads((_PACKAGE / BUILD_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def stale_modules() -> list[str]:
    """Native modules whose extension exists but was not compiled from the source beside it."""
    recorded = _recorded()
    stale = []
    for module in NATIVE_MODULES:
        if _extension(module) is None:
            continue
        digest = hashlib.sha256(_source(module).read_bytes()).hexdigest()
        if recorded.get(module) != digest:
            stale.append(module)
    return stale


def load_fresh() -> str | None:
    """Load the native modules from source when their extensions must not run; returns why.

    Call before anything imports them (the `diagnoser.templates` package does, first thing).
    """
    if any(module in sys.modules for module in NATIVE_MODULES):
        return None
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        reason = f"{PURE_PYTHON_ENV}=1"
    elif stale := stale_modules():
        reason = (
            f"the compiled {', '.join(stale)} does not match its source; running the .py files "
            "(./scripts/setup.sh or `pip install -e .` compiles them again)"
        )
        log.warning("diagnoser: %s", reason)
    else:
        return None
    for module in NATIVE_MODULES:
        spec = importlib.util.spec_from_file_location(module, _source(module))
        if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has one
            raise ImportError(f"cannot load {module} from {_source(module)}")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[module] = loaded
        spec.loader.exec_module(loaded)
        parent, _, name = module.rpartition(".")
        setattr(sys.modules[parent], name, loaded)
    return reason


def compiled() -> dict[str, bool]:
    """For each native module: whether the running process uses its compiled extension."""
    found = {}
    for module in NATIVE_MODULES:
        origin = getattr(importlib.import_module(module), "__file__", None) or ""
        found[module] = not origin.endswith(".py")
    return found
