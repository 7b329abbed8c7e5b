"""The serving process's own garbage collector, tuned for thousands of open uploads.

Each open upload holds a few hundred container objects for its lifetime (its ASGI coroutine
chain, its framer, its commit state). With 2,000 nodes streaming, CPython's defaults collect
the youngest generation every 700 allocations and, every few seconds, run a full collection
that walks every tracked object: the rule pack, the compiled patterns and the imported modules
(about 190,000 objects, none of them ever garbage) and the open uploads. On the load benchmark
that was 9 % of the replica's CPU, in pauses of up to 400 ms (BENCHMARKS.md, "Load", round 7).

So, once per process, before the service starts serving (`diagnoser serve`): what start-up
built is moved out of the collector's view (`gc.freeze`; reference counting still frees what
drops to zero), and the youngest generation is collected every `young_threshold` allocations
instead of 700, which makes full collections rarer too. Garbage in reference cycles waits
longer for its collection; that memory is bounded by the threshold.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

_tuned = False


def tune_gc(young_threshold: int) -> bool:
    """Freeze the start-up heap and set the young generation's threshold (0: Python's own);
    once per process. True if done."""
    global _tuned  # noqa: PLW0603 - one process, one garbage collector
    if _tuned:
        return False
    _tuned = True
    if young_threshold > 0:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(young_threshold, older, oldest)
    gc.collect()
    gc.freeze()
    log.debug(
        "garbage collector: %d start-up objects frozen, thresholds %s",
        gc.get_freeze_count(),
        gc.get_threshold(),
    )
    return True
