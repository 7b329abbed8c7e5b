"""Build step that ships the top-level rule pack and prompts inside the package.

The pack stays in `rules/` at the top of the checkout (its documented home, and what a source
checkout loads). A wheel built from the checkout carries a copy in `diagnoser/rules/pack/`, so an
installed diagnoser has a pack without a checkout; `diagnoser.config` falls back to it when the
source tree's `rules/` is absent. An editable install needs no copy: it loads `rules/` itself.
The prompt templates (`prompts/*.j2`) travel the same way, to `diagnoser/llm/prompts/`.

The template miner's per-line path is compiled to C by mypyc (`NATIVE_MODULES`): the same
type-checked source, about 1.5x the lines per CPU second (BENCHMARKS.md, template mining). The
extensions are optional: without a C compiler, or with `DIAGNOSER_COMPILE=0`, the package
installs as pure Python and behaves the same (`diagnoser.native` says which one runs).
Everything else about the package is declared in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACK_SOURCE = ROOT / "rules"
PACK_TARGET = ("diagnoser", "rules", "pack")
PACK_PATTERNS = ("*.yaml", "schema.json")
PROMPTS_SOURCE = ROOT / "prompts"
PROMPTS_TARGET = ("diagnoser", "llm", "prompts")
NATIVE_MODULES = ("diagnoser/templates/masking.py", "diagnoser/templates/miner.py")
"""Compiled by mypyc; they import nothing but the standard library and `templates.model`.
`diagnoser.native.NATIVE_MODULES` names the same modules."""
BUILD_RECORD = "native-build.json"
"""`diagnoser.native.BUILD_RECORD`: the SHA-256 of each source an extension was compiled from."""


class BuildPyWithRulePack(build_py):
    """`build_py` that also copies the rule pack into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        files = sorted(path for pattern in PACK_PATTERNS for path in PACK_SOURCE.glob(pattern))
        if not any(path.suffix == ".yaml" for path in files):
            raise SystemExit(f"error: no rule pack in {PACK_SOURCE}: a wheel without it is useless")
        prompts = sorted(PROMPTS_SOURCE.glob("*.j2"))
        if not prompts:
            raise SystemExit(f"error: no prompt templates in {PROMPTS_SOURCE}")
        for sources, parts in ((files, PACK_TARGET), (prompts, PROMPTS_TARGET)):
            target = Path(self.build_lib).joinpath(*parts)
            self.mkpath(str(target))
            for path in sources:
                self.copy_file(str(path), str(target / path.name))


class BuildExtRecordingSources(build_ext):
    """`build_ext` that records which source each extension was compiled from.

    Python imports an extension before the .py beside it: after an edit or a pull, an editable
    install's old extension would shadow the new source. `diagnoser.native` compares the record
    with the sources at import and runs the .py files when they differ.
    """

    def run(self) -> None:
        self.built: set[str] = set()
        super().run()  # builds in build_lib, then copies into the checkout when in place
        # An optional extension that failed leaves any older build in place: record nothing
        # then, so that no record vouches for it.
        complete = bool(self.extensions) and all(e.name in self.built for e in self.extensions)
        recorded = {
            source.removesuffix(".py").replace("/", "."): hashlib.sha256(
                (ROOT / source).read_bytes()
            ).hexdigest()
            for source in NATIVE_MODULES
        }
        targets = [Path(self.build_lib, "diagnoser")]
        if self.inplace:
            package = self.get_finalized_command("build_py").get_package_dir("diagnoser")
            targets.append(Path(package))
        for target in targets:
            record = target / BUILD_RECORD
            if complete:
                self.mkpath(str(target))
                record.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
            elif record.exists():
                record.unlink()

    def build_extension(self, ext: Extension) -> None:
        """Built, or up to date with the C that mypyc just wrote from the current sources."""
        super().build_extension(ext)
        self.built.add(ext.name)


def native_extensions() -> list[Extension]:
    """The mypyc extensions, or none when compiling is turned off or mypyc is missing."""
    if os.environ.get("DIAGNOSER_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print("warning: mypyc not found; diagnoser installs as pure Python", file=sys.stderr)
        return []
    # An empty config file: the project's [tool.mypy] names plugins the build does not need.
    extensions = mypycify(["--config-file=", *NATIVE_MODULES], opt_level="3")
    for extension in extensions:
        extension.optional = True  # no C compiler: pure Python, with a warning from setuptools
    return extensions


setup(
    cmdclass={"build_py": BuildPyWithRulePack, "build_ext": BuildExtRecordingSources},
    ext_modules=native_extensions(),
)
