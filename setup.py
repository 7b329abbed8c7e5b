"""Build step that ships the top-level rule pack and prompts inside the package.

The pack stays in `rules/` at the top of the checkout (its documented home, and what a source
checkout loads). A wheel built from the checkout carries a copy in `diagnoser/rules/pack/`, so an
installed diagnoser has a pack without a checkout; `diagnoser.config` falls back to it when the
source tree's `rules/` is absent. An editable install needs no copy: it loads `rules/` itself.
The prompt templates (`prompts/*.j2`) travel the same way, to `diagnoser/llm/prompts/`.
Everything else about the package is declared in pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PACK_SOURCE = ROOT / "rules"
PACK_TARGET = ("diagnoser", "rules", "pack")
PACK_PATTERNS = ("*.yaml", "schema.json")
PROMPTS_SOURCE = ROOT / "prompts"
PROMPTS_TARGET = ("diagnoser", "llm", "prompts")


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


setup(cmdclass={"build_py": BuildPyWithRulePack})
