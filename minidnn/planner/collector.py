"""The cyclic garbage collector, paused while the planner walks and times decisions.

An evaluation (step_model.py) walks one dry step through the memory manager: on a very deep
network some hundred thousand small objects (log entries, blocks, receipts, feature-map
states), most of them alive until the evaluation ends. CPython's cyclic collector runs after
every few hundred allocations and, once such objects have survived into its oldest
generation, traverses everything alive again: on VGG-416 about a fifth of the planning time,
and it finds nothing, because a walk makes no reference cycles (tests/test_planner_collector.py
checks it), so reference counting frees it all as soon as the evaluation drops it. The
rest of a plan (step models, profiles, the searches) makes next to no cyclic garbage either
(a few hundred objects in all for VGG-416's), so a split plan (split.py) pauses the
collector for all of its work.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def collector_paused():
    """Run the body with the cyclic garbage collector off (reference counting still frees
    everything that is not part of a cycle); it is switched back on after, if it was on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
