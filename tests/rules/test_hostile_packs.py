"""Rule files are edited at runtime, so they are untrusted input: random YAML, patterns that
backtrack catastrophically and files that point outside the rule directory are load problems,
never a crash, a hang or a read elsewhere."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnoser.rules import RuleLoadError, load_dir
from tests.rules.conftest import MINIMAL_RULE, write_rules

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30)
)
KEYS = st.sampled_from(
    ["family", "description", "rules", "id", "patterns", "examples", "match", "no_match", "x"]
)
YAMLISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "family",
                    "description",
                    "rules",
                    "id",
                    "patterns",
                    "examples",
                    "match",
                    "no_match",
                    "category",
                    "action",
                    "scope",
                    "x",
                ]
            )
            | st.text(max_size=8),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


def _load(text: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "random.yaml").write_text(text, encoding="utf-8")
        with contextlib.suppress(RuleLoadError):  # a refusal is fine; any other error is not
            load_dir(Path(directory))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=YAMLISH)
def test_random_yaml_structures_load_or_are_refused(document: object) -> None:
    _load(yaml.safe_dump(document))


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_random_text_loads_or_is_refused(text: str) -> None:
    _load(text)


def test_a_python_object_tag_is_refused_not_constructed(tmp_path: Path) -> None:
    marker = tmp_path / "constructed"
    write_rules(tmp_path, "evil.yaml",
                f"!!python/object/apply:os.system ['touch {marker}']\n")  # fmt: skip
    with pytest.raises(RuleLoadError, match="cannot read"):
        load_dir(tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(\w+\s?)+$", r"(a|aa)+b"])
def test_a_catastrophic_pattern_is_rejected_at_load(tmp_path: Path, pattern: str) -> None:
    body = MINIMAL_RULE.replace(
        "patterns: ['No space left on device']", f"patterns: ['No space', 'No space {pattern}']"
    )
    write_rules(tmp_path, "demo.yaml", body)
    with pytest.raises(RuleLoadError, match="backtracks catastrophically"):
        load_dir(tmp_path)


def test_a_rule_file_linked_from_outside_is_not_read(tmp_path: Path) -> None:
    outside = write_rules(tmp_path / "elsewhere", "secret.yaml", MINIMAL_RULE)
    pack = tmp_path / "rules"
    write_rules(pack, "demo.yaml", MINIMAL_RULE.replace("demo_disk_full", "demo_other"))
    os.symlink(outside, pack / "linked.yaml")
    with pytest.raises(RuleLoadError, match="not a file inside the rule directory"):
        load_dir(pack)
