"""Assign or check the dev/test split of the corpus (rule: diagnoser/evaluation/split.py).

    python evals/split.py            # check: every case's `split:` follows the rule (exit 1 if not)
    python evals/split.py --write    # write `split:` into each case.yaml, printing every change

Reads each case.yaml as plain YAML (not the strict loader, which requires `split:`), so it also
runs on new cases that have none yet. `split-pins.txt` holds the threads earlier top-ups put in
test (one URL a line); `--write` adds the new ones, and a case without `split:` is new, so a
top-up takes its thread before any thread already in the corpus.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import yaml

from diagnoser.evaluation.split import (
    Split,
    SplitCase,
    check,
    mixed,
    pins,
    read_pins,
    split_of,
    test_threads,
    thread,
)

CASES = Path(__file__).resolve().parent / "cases"
PINS = Path(__file__).resolve().parent / "split-pins.txt"


def write_pins(path: Path, urls: list[str]) -> None:
    head = "# Threads a class top-up put in test (evals/README.md, held-back split). Written by\n"
    head += "# `python evals/split.py --write`, never by hand; they stay in test for good.\n"
    path.write_text(head + "".join(f"{url}\n" for url in urls), encoding="utf-8")


def read(root: Path) -> tuple[list[SplitCase], dict[str, Split], dict[str, Path]]:
    cases, recorded, files = [], {}, {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        path = folder / "case.yaml"
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        source = raw["source"]
        sources = (source,) if isinstance(source, str) else tuple(source)
        cases.append(SplitCase(raw["id"], raw["class"], sources))
        files[raw["id"]] = path
        if raw.get("split") in {s.value for s in Split}:
            recorded[raw["id"]] = Split(raw["split"])
    return cases, recorded, files


def write(path: Path, split: Split) -> None:
    """Replace the `split:` line, or add one after `class:`; the rest of the file is untouched."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    line = f"split: {split.value}\n"
    for i, text in enumerate(lines):
        if text.startswith("split:"):
            lines[i] = line
            break
    else:
        at = next(i for i, text in enumerate(lines) if text.startswith("class:"))
        lines.insert(at + 1, line)
    path.write_text("".join(lines), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the split into case.yaml")
    parser.add_argument("--cases", type=Path, default=CASES)
    args = parser.parse_args()
    cases, recorded, files = read(args.cases)
    pins_path = args.cases.parent / PINS.name
    pinned = read_pins(pins_path)
    new = [thread(url) for case in cases if case.id not in recorded for url in case.sources]
    chosen = test_threads(cases, pinned, new)
    splits = split_of(cases, chosen)
    if args.write:
        if pins(chosen) != sorted(set(pinned)):
            write_pins(pins_path, pins(chosen))
            pinned = pins(chosen)
        for case in cases:
            if recorded.get(case.id) is not splits[case.id]:
                was = recorded.get(case.id, "none")
                print(f"{case.id}: {was} -> {splits[case.id]}")
                write(files[case.id], splits[case.id])
        recorded = splits
    counts = Counter((case.cls, splits[case.id]) for case in cases)
    for cls in sorted({case.cls for case in cases}):
        print(f"{cls:24} dev {counts[cls, Split.DEV]:3}  test {counts[cls, Split.TEST]:3}")
    tested = sum(split is Split.TEST for split in splits.values())
    print(f"{'total':24} dev {len(cases) - tested:3}  test {tested:3}")
    for case_id in mixed(cases, pinned):
        print(f"mixed composition (in test): {case_id}")
    problems = check(cases, recorded, pinned)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
