"""The static layout of a step, recorded from a dry walk of its schedule.

`record_intervals` walks one training step's schedule (memory/schedule.py) through a dry
memory manager (receipts, no memory) and notes when each block is taken and released;
`layout_for_step` packs those intervals into a StaticLayout (memory/layout.py).
"""
from __future__ import annotations

from ..backend import Device
from .allocator import CountingAllocator
from .layout import RecordingBlocks, StaticLayout
from .manager import MemoryManager
from .policy import MemoryDecision
from .schedule import walk


def record_intervals(plan, offload, prefetch_lookahead: int, keep: tuple = (),
                     workspace: dict | None = None, recompute=(),
                     scratch: dict | None = None) -> list:
    """The block intervals (layout.Interval) of one training step under this offload (and
    recompute) set, from a dry walk of its schedule, with a block for each layer call's
    workspace in `workspace` and scratch block in `scratch` ({(node index, phase): bytes})."""
    blocks = RecordingBlocks()
    decision = MemoryDecision(offload=frozenset(offload), recompute=frozenset(recompute),
                              prefetch_lookahead=int(prefetch_lookahead))
    mm = MemoryManager(plan, Device("cpu"), CountingAllocator(None), host=CountingAllocator(None),
                       decision=decision, dry=True, blocks=blocks, workspace=workspace,
                       scratch=scratch)
    mm.begin_step(True, keep)
    mm.write_input("data", None)
    mm.write_input("label", None)
    for call in walk(mm.schedule, mm):
        mm.buffers(call)
        mm.acquire_workspace(call.index, call.phase)
        mm.acquire_scratch(call.index, call.phase)
        mm.release_call_blocks()
        mm.after(call)
    mm.end_step()
    return blocks.intervals


def layout_for_step(plan, offload, prefetch_lookahead: int, keep: tuple = (),
                    workspace: dict | None = None, recompute=(),
                    scratch: dict | None = None) -> StaticLayout:
    """The packed StaticLayout of one training step (arguments as record_intervals)."""
    return StaticLayout(record_intervals(plan, offload, prefetch_lookahead, keep, workspace,
                                         recompute, scratch))
