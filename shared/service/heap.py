"""Process-wide settings for a service process, applied once from its entry point."""

from __future__ import annotations

import gc

GC_GEN0_THRESHOLD = 50_000
"""Replaying the log allocates millions of short-lived objects and keeps a large, acyclic projection;
CPython's default (700) runs a collection every few hundred events and costs ~25% of replay time."""


def tune_gc() -> None:
    """Collect the youngest generation less often (older generations keep their default ratios)."""
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def settle_heap() -> None:
    """Move everything alive now (the freshly rebuilt projection) out of the cyclic collector's sight.

    The projection holds no reference cycles, so frozen objects are still freed by reference counting
    when dropped; later collections just stop rescanning hundreds of thousands of live objects. No
    collection first: it would cost a full heap scan at exactly the moment the service becomes ready.
    """
    gc.freeze()
