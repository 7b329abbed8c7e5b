"""A simulated 4-node training job whose GPU falls off the bus, diagnosed and acted on.

`python -m examples.cluster_demo` runs it from the repository root; `run_demo` is the same
thing as a function, for the end-to-end test (tests/examples/test_cluster_demo.py).
"""

from examples.cluster_demo.demo import DemoConfig, run_demo
from examples.cluster_demo.timeline import Step, Timeline, render

__all__ = ["DemoConfig", "Step", "Timeline", "render", "run_demo"]
