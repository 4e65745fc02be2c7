"""The arena blocks a step captured as a CUDA graph works in, kept for its replays.

A CUDA graph replays its kernels at the addresses they had when the step was captured
(minidnn/step_graph.py). The feature maps of a static layout have fixed addresses anyway; the
temporaries a step takes from the arena (its CuPy arrays, the maps of a dynamic layout) must
also stay the graph's between replays: handed to anything else, they would be overwritten by
the next replay. So while a step is captured, a block given back goes to the pool instead of
the arena's free list, a later request of the same size inside the capture takes it from the
pool (a step's temporaries come in few sizes, so the graph needs about what a plain step
does), and after the capture the pool keeps them all. Blocks taken during the capture and
still alive after it (the step's loss) come back to the pool when they are dropped.
`Arena.release_graph_pool` gives everything back once no graph will replay.
"""
from __future__ import annotations


class GraphPool:
    """Blocks (arena offsets) held for captured steps. The arena calls `take` and `keep` while
    a capture runs (Arena.capturing) and `keep` for a captured block dropped later."""

    def __init__(self):
        self._free: dict[int, list[int]] = {}   # size -> offsets no captured array holds now
        self.owned: set[int] = set()            # every offset taken while capturing

    def take(self, size: int) -> int | None:
        """An offset of a kept block of exactly `size` bytes, or None."""
        offsets = self._free.get(size)
        return offsets.pop() if offsets else None

    def keep(self, offset: int, size: int) -> None:
        """A block of this pool's was given back: it stays the pool's."""
        self._free.setdefault(size, []).append(offset)

    def clear(self) -> list[int]:
        """Forget every block; returns the offsets of the kept ones, for the arena to free."""
        kept = [o for offsets in self._free.values() for o in offsets]
        self._free.clear()
        self.owned.clear()
        return kept

    @property
    def kept_bytes(self) -> int:
        return sum(size * len(offsets) for size, offsets in self._free.items())
