"""`python -m examples.cluster_demo`: the demo, with the ranks' output live, then its timeline."""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.text import Text

from examples.cluster_demo.demo import DemoConfig, run_demo
from examples.cluster_demo.timeline import render

COLOURS = ("cyan", "green", "magenta", "yellow", "blue", "red")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m examples.cluster_demo", description=__doc__)
    parser.add_argument("--quiet", action="store_true", help="print the timeline only")
    parser.add_argument("--spare-nodes", type=int, default=0, help="idle Nodes to restart onto")
    parser.add_argument("--step-seconds", type=float, default=0.2, help="seconds per iteration")
    parser.add_argument("--work-dir", type=Path, help="keep logs, kubeconfig and SQLite here")
    parser.add_argument(
        "--no-operator", action="store_true", help="stop after the diagnosis and its actions"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    console = Console(highlight=False, soft_wrap=True)
    config = replace(
        DemoConfig(),
        operator=not args.no_operator,
        spare_nodes=args.spare_nodes,
        step_seconds=args.step_seconds,
        work_dir=args.work_dir,
    )
    colour = {f"node-{rank}": COLOURS[rank % len(COLOURS)] for rank in range(config.workers)}

    def echo(who: str, line: str) -> None:
        # Log text is untrusted: a Text, never markup.
        console.print(Text(f"{who:>8} | ", style=colour.get(who, "bold")) + Text(line))

    timeline = asyncio.run(run_demo(config, echo=None if args.quiet else echo))
    console.print()
    render(timeline, console)
    return 0 if timeline.finished else 1


if __name__ == "__main__":
    sys.exit(main())
