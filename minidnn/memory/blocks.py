"""Free-list bookkeeping shared by the device arena (arena.py) and the pinned host slab (host.py).

Nothing here touches memory: a BlockList hands out *offsets* into an abstract address space
made of one or more regions (the arena has one region, the whole budget; the host slab adds a
region per pinned chunk), and the caller turns an offset into an array. PendingFrees holds
blocks that were freed behind an event (a copy on another stream may still read them) until
that event has completed.
"""
from __future__ import annotations

import bisect
from collections import deque

from .allocator import ALIGNMENT


class BlockList:
    """Best-fit sub-allocation of aligned blocks, with splitting and coalescing.

    Regions are laid end to end in one offset space: region k covers
    [base_k, base_k + size_k). A block never spans two regions, and two free blocks merge only
    when they are neighbours inside the same region (separate pinned chunks are not contiguous
    in memory even when their offsets are).

    Why best-fit (smallest free block that fits, lowest address among equals) rather than
    address-ordered first-fit: a training step's requests range from a few hundred bytes
    (biases, losses) to hundreds of MiB (early conv feature maps). First-fit carves the small
    ones out of the first big hole it meets, so the one hole that a large feature map needs is
    gone; best-fit puts small requests into small holes and keeps large holes whole. The cost
    is a binary search over free blocks ordered by size, O(log n) plus O(n) list moves, which
    is negligible for the few hundred blocks of a step.

    All sizes and offsets are multiples of `alignment`.
    """

    def __init__(self, alignment: int = ALIGNMENT):
        self.alignment = int(alignment)
        self.capacity = 0                       # sum of region sizes
        self.used = 0                           # bytes in allocated blocks
        self._region_starts: list[int] = []     # sorted; a free block never merges across one
        self._free_by_start: dict[int, int] = {}  # start -> size of each free block
        self._free_starts: list[int] = []       # sorted starts of free blocks (neighbours)
        self._free_by_size: list[tuple[int, int]] = []  # sorted (size, start) (best fit)
        self._allocated: dict[int, int] = {}    # start -> size of each allocated block

    # ---- regions -------------------------------------------------------------------------------
    def add_region(self, size: int) -> int:
        """Append a free region of `size` bytes (rounded down to the alignment); its base."""
        size = int(size) // self.alignment * self.alignment
        if size <= 0:
            raise ValueError(f"a region must hold at least {self.alignment} bytes, got {size}")
        base = self.capacity
        self._region_starts.append(base)
        self.capacity += size
        self._insert_free(base, size)
        return base

    def region_index(self, offset: int) -> int:
        """Index (in order of add_region) of the region that holds `offset`."""
        return bisect.bisect_right(self._region_starts, offset) - 1

    def _is_region_start(self, offset: int) -> bool:
        i = bisect.bisect_left(self._region_starts, offset)
        return i < len(self._region_starts) and self._region_starts[i] == offset

    # ---- allocation ----------------------------------------------------------------------------
    def allocate(self, nbytes: int, top: bool = False) -> int | None:
        """Offset of a new block of at least `nbytes` (rounded up to the alignment), or None.

        The block is cut from the low end of the best-fitting free block; the rest stays free.
        top=True: from the high end of the highest free block that fits instead, for a block
        that outlives the calls around it (Arena.lasting): kept at the top of the space, such
        blocks do not split the free space below, where the calls take and give back theirs.
        """
        size = self.round(nbytes)
        if top:
            start = next((s for s in reversed(self._free_starts)
                          if self._free_by_start[s] >= size), None)
            if start is None:
                return None
            free_size = self._free_by_start[start]
            self._remove_free(start, free_size)
            if free_size > size:
                self._insert_free(start, free_size - size)
            start += free_size - size
        else:
            i = bisect.bisect_left(self._free_by_size, (size, -1))
            if i == len(self._free_by_size):
                return None
            free_size, start = self._free_by_size[i]
            self._remove_free(start, free_size)
            if free_size > size:
                self._insert_free(start + size, free_size - size)
        self._allocated[start] = size
        self.used += size
        return start

    def release(self, offset: int) -> int:
        """Free the block at `offset`, merging it with free neighbours; returns its size."""
        size = self._allocated.pop(offset, None)
        if size is None:
            raise KeyError(f"no allocated block at offset {offset} (freed twice, or never "
                           f"allocated here)")
        self.used -= size
        start, end = offset, offset + size
        # Merge with the free block just below, unless this block starts a region.
        i = bisect.bisect_left(self._free_starts, start)
        if i > 0 and not self._is_region_start(start):
            below = self._free_starts[i - 1]
            below_size = self._free_by_start[below]
            if below + below_size == start:
                self._remove_free(below, below_size)
                start = below
        # Merge with the free block just above, unless it starts the next region.
        above_size = self._free_by_start.get(end)
        if above_size is not None and not self._is_region_start(end):
            self._remove_free(end, above_size)
            end += above_size
        self._insert_free(start, end - start)
        return size

    def claim(self, start: int, end: int) -> list[tuple[int, int]]:
        """Allocate every free part of [start, end) as a block of its own; returns the
        (offset, size) of each, in address order. The free space around them stays free."""
        claimed = []
        i = max(bisect.bisect_right(self._free_starts, start) - 1, 0)
        while i < len(self._free_starts) and self._free_starts[i] < end:
            free_start = self._free_starts[i]
            free_end = free_start + self._free_by_start[free_start]
            if free_end <= start:
                i += 1
                continue
            self._remove_free(free_start, free_end - free_start)
            lo, hi = max(free_start, start), min(free_end, end)
            if free_start < lo:
                self._insert_free(free_start, lo - free_start)
            if hi < free_end:
                self._insert_free(hi, free_end - hi)
            self._allocated[lo] = hi - lo
            self.used += hi - lo
            claimed.append((lo, hi - lo))
            i = bisect.bisect_left(self._free_starts, hi)
        return claimed

    def round(self, nbytes: int) -> int:
        """`nbytes` rounded up to the alignment (at least one alignment unit)."""
        return -(-max(int(nbytes), 1) // self.alignment) * self.alignment

    # ---- queries -------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.capacity - self.used

    @property
    def largest_free(self) -> int:
        return self._free_by_size[-1][0] if self._free_by_size else 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_starts)

    @property
    def num_allocated(self) -> int:
        return len(self._allocated)

    def fragmentation(self) -> float:
        """1 - largest free block / total free: 0 when the free space is one block (or none)."""
        free = self.free
        return 0.0 if free == 0 else 1.0 - self.largest_free / free

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (used by the tests)."""
        blocks = sorted([(s, n, "free") for s, n in self._free_by_start.items()] +
                        [(s, n, "used") for s, n in self._allocated.items()])
        assert self._free_starts == sorted(self._free_by_start), "free start index out of sync"
        assert self._free_by_size == sorted((n, s) for s, n in self._free_by_start.items()), \
            "free size index out of sync"
        pos = 0
        for k, (start, size, kind) in enumerate(blocks):
            assert start == pos, f"gap or overlap at offset {pos} (next block at {start})"
            assert size > 0 and start % self.alignment == 0 and size % self.alignment == 0
            assert self.region_index(start) == self.region_index(start + size - 1), \
                f"block at {start} of {size} bytes spans two regions"
            if k and kind == "free" and blocks[k - 1][2] == "free":
                assert self._is_region_start(start), f"free blocks at {blocks[k - 1][0]} and " \
                    f"{start} are neighbours in one region but were not merged"
            pos += size
        assert pos == self.capacity, f"blocks cover {pos} bytes of {self.capacity}"
        assert self.used == sum(self._allocated.values())

    # ---- the two indexes of free blocks --------------------------------------------------------
    def _insert_free(self, start: int, size: int) -> None:
        self._free_by_start[start] = size
        bisect.insort(self._free_starts, start)
        bisect.insort(self._free_by_size, (size, start))

    def _remove_free(self, start: int, size: int) -> None:
        del self._free_by_start[start]
        del self._free_starts[bisect.bisect_left(self._free_starts, start)]
        del self._free_by_size[bisect.bisect_left(self._free_by_size, (size, start))]


class PendingFrees:
    """Blocks freed behind an event, oldest first, waiting for the event to complete.

    `event` is anything with a non-blocking `done` property and a blocking `synchronize()`:
    a CuPy Event, or backend's CPU stand-in (always done).
    """

    def __init__(self):
        self._queue: deque[tuple[int, object]] = deque()   # (offset, event)

    def add(self, offset: int, event) -> None:
        self._queue.append((offset, event))

    def reclaim_done(self, release) -> int:
        """Call release(offset) for every block whose event has completed; returns how many.

        Checks every entry, not only the oldest: events recorded on different streams
        (offload, prefetch) complete out of order.
        """
        still = deque()
        reclaimed = 0
        while self._queue:
            offset, event = self._queue.popleft()
            if event.done:
                release(offset)
                reclaimed += 1
            else:
                still.append((offset, event))
        self._queue = still
        return reclaimed

    def wait_oldest(self, release) -> bool:
        """Block on the oldest pending event, then release its block. False when none is pending."""
        if not self._queue:
            return False
        offset, event = self._queue.popleft()
        event.synchronize()
        release(offset)
        return True

    def release_all(self, release) -> None:
        """Call release(offset) for every block, oldest first: the device is idle."""
        while self._queue:
            release(self._queue.popleft()[0])

    def offsets(self) -> list[int]:
        return [offset for offset, _ in self._queue]

    def __len__(self) -> int:
        return len(self._queue)
