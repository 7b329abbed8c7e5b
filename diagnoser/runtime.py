"""The serving process's own garbage collector, tuned for thousands of open uploads.

Each open upload holds a few hundred container objects for its lifetime (its ASGI coroutine
chain, its framer, its commit state). With 2,000 nodes streaming, CPython's defaults collect
the youngest generation every 700 allocations and, every few seconds, run a full collection
that walks every tracked object: the rule pack, the compiled patterns and the imported modules
(about 190,000 objects, none of them ever garbage) and the open uploads. On the load benchmark
that was 9 % of the replica's CPU, in pauses of up to 400 ms (BENCHMARKS.md, "Load", round 7).

So, once per process, before the service starts serving (`diagnoser serve`): what start-up
built is moved out of the collector's view (`gc.freeze`; reference counting still frees what
drops to zero), and full collections come ten times less often (`DIAGNOSER_GC_THRESHOLDS`,
default 1000, 10, 100 against Python's 700, 10, 10). A larger young threshold was tried and
dropped: young collections grow with it, to 100-200 ms at 10,000. Garbage in reference cycles
that lived long enough to reach the oldest generation waits longer for its collection.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

_tuned = False


def tune_gc(thresholds: tuple[int, int, int]) -> bool:
    """Freeze the start-up heap and set the collector's thresholds; once per process. True
    if done."""
    global _tuned  # noqa: PLW0603 - one process, one garbage collector
    if _tuned:
        return False
    _tuned = True
    gc.set_threshold(*thresholds)
    gc.collect()
    gc.freeze()
    log.debug(
        "garbage collector: %d start-up objects frozen, thresholds %s",
        gc.get_freeze_count(),
        gc.get_threshold(),
    )
    return True
