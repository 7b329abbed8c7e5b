"""A hash of everything the miner outputs, per input, to show two trees group identically.

    .venv/bin/python bench/mining_fingerprint.py [--loghub DIR] [--real DIR] [--cache 3 50 500]

For each of the 32 Loghub-2k inputs (each dataset's `Content` and raw lines) and each real log,
a fresh `TemplateMiner` mines every line; the hash covers every id `add` returned, `get` of each
of them (merges followed), every template's view (id, text, slots, count, first and last line,
samples) in `templates()` order, and the whole `to_json` state. Run it under two trees'
interpreters (from outside either tree, so each imports its own package) and compare: equal
hashes mean byte-identical grouping. `--cache` repeats the run with small `cache_entries`, which
drives the cache-clearing paths.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from diagnoser.templates.grouping import LOGHUB_DATASETS, load_loghub
from diagnoser.templates.miner import MinerConfig, TemplateMiner

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOGHUB = ROOT.parent / "shared" / "data" / "loghub-2k"
DEFAULT_REAL = ROOT / "bench" / "data" / "real-logs"


def fingerprint(lines: list[str] | tuple[str, ...], config: MinerConfig) -> str:
    """The hash of one fresh miner's whole output on `lines`."""
    miner = TemplateMiner(config)
    ids = [miner.add(line) for line in lines]
    h = hashlib.blake2b(digest_size=8)
    h.update(json.dumps(ids).encode())
    final = [(v.id if (v := miner.get(tid)) is not None else -tid) for tid in ids]
    h.update(json.dumps(final).encode())
    for view in miner.templates():
        h.update(json.dumps(asdict(view), default=str, ensure_ascii=False).encode())
    h.update(json.dumps(miner.to_json(), sort_keys=True, ensure_ascii=False).encode())
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loghub", type=Path, default=DEFAULT_LOGHUB)
    parser.add_argument("--real", type=Path, default=DEFAULT_REAL)
    parser.add_argument("--cache", type=int, nargs="*", default=[])
    args = parser.parse_args()
    inputs: list[tuple[str, list[str] | tuple[str, ...]]] = []
    for name in LOGHUB_DATASETS:
        sample = load_loghub(args.loghub, name)
        inputs += [(f"{name}/content", sample.content), (f"{name}/raw", sample.raw)]
    if args.real.is_dir():
        for path in sorted(args.real.glob("*.log")):
            text = path.read_text(encoding="utf-8", errors="replace")
            inputs.append((f"real/{path.name}", text.splitlines()))
    total = hashlib.blake2b(digest_size=8)
    configs = [("default", MinerConfig())]
    configs += [(f"cache={n}", MinerConfig(cache_entries=n)) for n in args.cache]
    for label, config in configs:
        for name, lines in inputs:
            if label != "default" and name.startswith("real/"):
                continue
            digest = fingerprint(lines, config)
            total.update(digest.encode())
            print(f"{label} {name} {len(lines)} {digest}")
    print(f"total {total.hexdigest()}")


if __name__ == "__main__":
    main()
