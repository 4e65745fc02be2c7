"""The arena memory a step captured as a CUDA graph works in, kept for its replays.

A CUDA graph replays its kernels at the addresses they had when the step was captured
(minidnn/step_graph.py). The feature maps of a static layout have fixed addresses anyway; the
blocks a step takes from the arena as it runs (its CuPy temporaries, the maps of a dynamic
layout) must also stay the graph's between replays: handed to anything else, they would be
overwritten by the next replay.

So the arena lets the captured step allocate and free as a plain step does (its blocks reused
as they would be: the graph needs what a plain step needs), notes every range of addresses
the step took (`taken`), and when the capture ends claims for the pool every part of those
ranges that is free then (BlockList.claim). Blocks the step took that are still alive then
(its loss) come to the pool when they are dropped. Graphs of one executor share its pool:
they replay one after the other on one stream, so a later capture may work in the earlier
ones' memory (the pool lends it back while it runs, `begin`), and the pool then holds the
ranges of all of them. `Arena.release_graph_pool` gives it all back once no graph will
replay.
"""
from __future__ import annotations


class GraphPool:
    """Address ranges (arena offsets) held for captured steps.

    While a capture runs the arena calls `taken` and `given_back` for every block; at its end,
    `ranges()` says what to claim, and the arena `keep`s what it claimed and, later, every
    captured block that is dropped."""

    def __init__(self):
        self._ranges: list[tuple[int, int]] = []   # (start, end) of every block taken
        self._claimed: list[tuple[int, int]] = []  # the ranges of every capture so far
        self.live: set[int] = set()                # offsets taken, not given back
        self._kept: list[int] = []                 # offsets of the blocks the pool holds

    def begin(self) -> list[int]:
        """A capture starts: returns the offsets of the blocks held, for the arena to lend
        to it (`ranges` claims them again at its end)."""
        kept, self._kept = self._kept, []
        return kept

    def taken(self, offset: int, size: int) -> None:
        self._ranges.append((offset, offset + size))
        self.live.add(offset)

    def given_back(self, offset: int) -> None:
        self.live.discard(offset)

    def ranges(self) -> list[tuple[int, int]]:
        """The ranges of every capture so far, this one's included, merged, in address
        order."""
        merged: list[list[int]] = []
        for start, end in sorted(self._claimed + self._ranges):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self._ranges = []
        self._claimed = [(start, end) for start, end in merged]
        return self._claimed

    def keep(self, offset: int) -> None:
        """An allocated block at `offset` is the pool's from now on."""
        self._kept.append(offset)

    def clear(self) -> list[int]:
        """Forget everything; returns the offsets of the blocks held, for the arena to free."""
        kept, self._kept = self._kept, []
        self._ranges, self._claimed, self.live = [], [], set()
        return kept

    @property
    def held(self) -> int:
        """Blocks held."""
        return len(self._kept)
