"""One dry walk of a step gives both the static layout and the step's log.

A run with the static layout (memory/layout.py) first records its step's blocks with a dry
walk of the schedule (memory/record.py), packs them, then walks its steps taking each block
at its packed address. The planner's step model (step_model.py) used to do just that for every
decision it weighs: two walks of the memory manager. The second walk differs from the first
only in what the planned blocks themselves issue: before a block is handed out, the stream
that will write it first waits on the release event of each earlier occupant of its
addresses that a copy may still read (PlannedBlocks.acquire). Everything else the manager
does is decided by the schedule and the storages' own states, never by addresses.

So the step model walks once, with blocks that record (StepRecording): they note each
block's interval as record_intervals does, and, in order, every block taken (with the
stream and where the step's log stood) and released (with its event). Then:

* the intervals, packed (StaticLayout), are the layout the executor would have packed
  from its own record walk once `hold_to_end` has run. That walk keeps the loss and the
  logits to the step's end (assembly.layout_keep), while the dry step keeps only the loss;
  so the logits' last block is held to the end here too. Only the order of the positions
  matters to the packing, and no block is taken after the step's end, so where among the
  releases of the step's end that block's release falls changes nothing.
* `planned_blocks(layout, waits)` tells the PlannedBlocks of that layout every block
  operation of the walk in order, with stand-in streams that note each wait where the walk
  took the block: the waits the second walk would have issued, at the place it would have
  issued them (`splice` puts them into the log). The PlannedBlocks then hold what the
  walk left (the blocks released behind a copy), for the next step's start.

tests/test_planner_recorded.py checks the intervals against record_intervals and the
spliced log against a walk at the packed addresses.
"""
from __future__ import annotations

import numpy as np

from ..memory.layout import PlannedBlocks, RecordingBlocks, StaticLayout


class StepRecording(RecordingBlocks):
    """RecordingBlocks (intervals for the layout) that also keep the walk's block operations
    for PlannedBlocks: `ops` holds (block, stream, log position) for a block taken and
    (block, None, event or None) for one released, in order.

    position(): where the step's log stands (its length).
    """

    def __init__(self, position):
        super().__init__()
        self.position = position
        self.ops: list = []

    def acquire(self, fm, where, stream):
        self.ops.append((fm, stream, self.position()))
        return super().acquire(fm, where, stream)

    def release(self, fm, after) -> None:
        self.ops.append((fm, None, after))
        super().release(fm, after)

    def hold_to_end(self, kept) -> None:
        """Hold the last block of each storage in `kept` (ids) to the step's end, as the
        executor's own record walk does (see module doc); once, after the walk."""
        last = {iv.sid: iv for iv in self.intervals if iv.sid in kept}
        for sid in sorted(last):
            last[sid].end = self.clock
            self.clock += 1

    def planned_blocks(self, layout: StaticLayout, waits: list) -> PlannedBlocks:
        """PlannedBlocks of `layout` told the walk's block operations; appends to `waits`
        (log position, stream name, event) for each wait they issue, in order."""
        blocks = PlannedBlocks(layout, np.empty(0, np.uint8), None)
        if not any(stream is None and at is not None for _, stream, at in self.ops):
            # No block was released behind a copy: nothing to wait on, in this step or at the
            # next one's start, so the blocks are as they start (each step takes them afresh).
            return blocks
        streams: dict = {}
        for fm, stream, at in self.ops:
            if stream is None:
                blocks.release(fm, after=at)
                continue
            noted = streams.get(stream.name)
            if noted is None:
                noted = streams[stream.name] = _NotedStream(stream.name, waits)
            noted.at = at
            blocks.acquire(fm, "", noted)
        return blocks


class _NotedStream:
    """Stands in for a stream in PlannedBlocks.acquire: a wait is noted with the log
    position of the block operation being told."""

    def __init__(self, name: str, waits: list):
        self.name, self.waits, self.at = name, waits, 0

    def wait_event(self, event) -> None:
        self.waits.append((self.at, self.name, event))


def splice(log: list, entries: list) -> None:
    """Put `entries` ([(position, entry)], positions in order) into `log`, each before what
    stood at its position (several at one position keep their order)."""
    if not entries:
        return
    out, done = [], 0
    for at, entry in entries:
        if at > done:
            out.extend(log[done:at])
            done = at
        out.append(entry)
    out.extend(log[done:])
    log[:] = out
