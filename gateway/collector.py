"""Python's cyclic garbage collector, set up for a serving gateway process.

Every message makes a few dozen short-lived objects (frames, requests, replies, futures),
almost all freed by reference counting the moment they are done with. With CPython's
default thresholds (700, 10, 10) the collector still ran a young-generation pass every
700 allocations, and now and then a full pass over everything the process holds (the
app, the imported modules, the store): profiles of ``bench/peer_compare.py`` put about 8%
of the gateway's CPU in collections, each full pass 40 ms of a stalled event loop.

:func:`tune_for_serving`, called by ``pushgate serve`` once the app is built, moves what
exists then into the permanent generation (``gc.freeze()``, as Instagram's servers do:
never traversed again) and runs young passes every 10,000 allocations instead of 700.
Garbage cycles are still collected, a little later. It changes the process, so only the
``serve`` entry point calls it: an in-process test gateway leaves the test's collector alone.
"""

from __future__ import annotations

import gc

# Allocations (net of frees) between two young-generation passes; CPython's default is 700.
YOUNG_THRESHOLD = 10_000


def tune_for_serving() -> None:
    """Freeze what the process holds now and make young collections rarer."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
