"""The device allocator the memory manager draws every buffer from, with a budget.

This is the simple version: each request is its own array from the array module, and the
allocator only counts bytes (in use, peak) and enforces the budget. The arena (one device
allocation of the whole budget, sub-allocated; memory/arena.py) implements the same interface.

`CountingAllocator` hands out no memory at all, only receipts: the dry run walks a step of a
network far larger than this machine through the memory manager with it, so the figures of
AlexNet or VGG-16 at batch 256 come out of a laptop in seconds.
"""
from __future__ import annotations

import contextlib

import numpy as np

from ..errors import MemoryBudgetError

ALIGNMENT = 256  # bytes; what cudaMalloc guarantees and cuDNN expects


def aligned(nbytes: int) -> int:
    return (int(nbytes) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class Allocator:
    """The contract of every allocator the memory manager, the executor and the optimizer use
    (device: SimpleAllocator, CountingAllocator, arena.Arena; host: host.HostSlab).

    alloc(nbytes, where='') -> a flat uint8 buffer (or a receipt in a dry run);
    free(buf, after=None): give it back, after `after` (an event) has happened when given;
    empty(shape, dtype, where='') -> (typed array, its buffer) (device allocators);
    `in_use` and `peak` bytes, reset_peak(); fragmentation() -> 0..1 (0: one piece);
    stats() -> dict; close(): release what it holds; `lasting()`: a context for blocks that
    outlive the call that takes them. `current_where` names what is running,
    for budget errors of allocations that do not say. `carves`: every buffer is a piece of
    one block the allocator holds until close(), so an address names the same memory all that
    time and a view made of a buffer may be kept after the buffer is freed (the arena).

    A buffer freed behind an event is held (pending) until the event is done, asked without
    blocking at later allocations (`_reusable_now`). While a step is captured as a CUDA graph
    nothing has run and no event may be asked: `ordered_frees(stream)` orders such frees by a
    stream wait instead.
    """

    current_where = ""
    carves = False
    _ordered_by = None     # inside ordered_frees: the stream that waits for frees behind events

    def alloc(self, nbytes: int, where: str = ""):
        raise NotImplementedError

    def free(self, buf, after=None) -> None:
        raise NotImplementedError

    def reset_peak(self) -> None:
        raise NotImplementedError

    def fragmentation(self) -> float:
        """Share of the free bytes outside the largest free block (0 when not fragmented)."""
        return 0.0

    def close(self) -> None:
        """Release whatever the allocator holds (nothing to do by default)."""

    def settle(self) -> None:
        """The caller has waited for the device: release every pending free now."""
        raise NotImplementedError

    @contextlib.contextmanager
    def lasting(self):
        """Inside: the blocks taken live until the step's end or longer (a batch's bf16
        weight copies, a split step's summed gradients). An allocator that places blocks
        (the arena) keeps them apart from the calls' short-lived ones; the others need
        nothing. A block kept for a few calls only takes its place among the calls' blocks
        (MemoryManager.backward_buffers says why)."""
        yield self

    @contextlib.contextmanager
    def ordered_frees(self, stream):
        """Inside: a buffer freed behind an event is released at once, and `stream`, the
        one that writes this allocator's memory next (compute for the device, the offload
        stream for the pinned host slab), waits for the event. For a step captured as a CUDA
        graph (minidnn/step_graph.py), whose events cannot be asked whether they are done.
        Pending frees are released first (settle): the caller has waited for the device."""
        self.settle()
        self._ordered_by = stream
        try:
            yield self
        finally:
            self._ordered_by = None

    def _reusable_now(self, after) -> bool:
        """May a buffer freed behind `after` (an event, or None) be reused at once?"""
        if after is None:
            return True
        if self._ordered_by is not None:
            self._ordered_by.wait_event(after)
            return True
        return after.done


def wait_until_fits(try_take, wait_oldest):
    """The pressure rule of a budgeted allocator whose frees may wait behind copies in flight:
    when a request does not fit, wait for the oldest pending free, then try again, until it
    fits or nothing is pending. try_take() -> the block (None: does not fit); wait_oldest()
    -> False when nothing is pending. Returns try_take()'s last answer. arena.Arena allocates
    by it, and the planner's step model (planner/step_model.py) replays the arena by it."""
    got = try_take()
    while got is None and wait_oldest():
        got = try_take()
    return got


class SimpleAllocator(Allocator):
    """Counts and budgets allocations made with the device's array module.

    alloc(nbytes) -> flat uint8 array; free(buf, after=None). `in_use` and `peak` are in aligned
    bytes. `current_where` names what is running (e.g. 'forward of conv3') for budget errors
    raised by allocations that do not say where they come from.

    free(buf, after=event): the buffer may still be read by a copy on another stream; it stays
    counted (and referenced, so the array module cannot hand its memory out again) until
    `event.done`, and is reclaimed at a later alloc.
    """

    def __init__(self, xp, budget: int | None = None):
        self.xp = xp
        self.budget = budget
        self.in_use = 0
        self.peak = 0
        self.current_where = ""
        self.allocs = 0
        self.frees = 0
        self._sizes: dict[int, int] = {}
        self._pending: list[tuple[object, object]] = []   # (buf, event) not yet reusable

    def _new_buffer(self, size: int):
        return self.xp.empty(size, dtype=np.uint8)

    def alloc(self, nbytes: int, where: str = ""):
        size = aligned(max(int(nbytes), 1))
        self._reclaim()
        if self.budget is not None and self.in_use + size > self.budget and self._pending:
            self._wait_pending()
        if self.budget is not None and self.in_use + size > self.budget:
            raise MemoryBudgetError(size, self.in_use, self.budget, where or self.current_where)
        buf = self._new_buffer(size)
        self._sizes[id(buf)] = size
        self.in_use += size
        self.peak = max(self.peak, self.in_use)
        self.allocs += 1
        return buf

    def free(self, buf, after=None) -> None:
        if id(buf) not in self._sizes:
            raise ValueError("free() of a buffer this allocator did not hand out (or freed twice)")
        if not self._reusable_now(after):
            self._pending.append((buf, after))
            return
        self._drop(buf)

    def settle(self) -> None:
        for buf, _ in self._pending:
            self._drop(buf)
        self._pending = []

    def _drop(self, buf) -> None:
        self.in_use -= self._sizes.pop(id(buf))
        self.frees += 1

    def _reclaim(self) -> None:
        """Release the pending buffers whose copies have finished (a non-blocking query)."""
        if self._pending:
            still = []
            for buf, event in self._pending:
                if event.done:
                    self._drop(buf)
                else:
                    still.append((buf, event))
            self._pending = still

    def _wait_pending(self) -> None:
        """Under pressure: wait for the pending copies, oldest first, and release their buffers."""
        for buf, event in self._pending:
            event.synchronize()
            self._drop(buf)
        self._pending = []

    def empty(self, shape, dtype, where: str = ""):
        """(typed array of `shape`, its buffer) carved from a fresh allocation."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        buf = self.alloc(n * dtype.itemsize, where)
        return buf[:n * dtype.itemsize].view(dtype).reshape(shape), buf

    def reset_peak(self) -> None:
        self.peak = self.in_use

    def fragmentation(self) -> float:
        """Each buffer is its own allocation here, so there is no fragmentation to speak of."""
        return 0.0

    def stats(self) -> dict:
        return dict(budget=self.budget, in_use=self.in_use, peak=self.peak,
                    pending=len(self._pending), allocs=self.allocs, frees=self.frees,
                    fragmentation=self.fragmentation())


class Receipt:
    """What CountingAllocator hands out instead of memory: just the size."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = nbytes

    def __repr__(self) -> str:
        return f"Receipt({self.nbytes})"


class CountingAllocator(SimpleAllocator):
    """Same bookkeeping and budget as SimpleAllocator, without memory: alloc returns a Receipt.

    Used by the dry run (device side) and as its host side (`capacity` mirrors HostSlab's).
    `empty()` returns (None, receipt).
    """

    def __init__(self, budget: int | None = None):
        super().__init__(None, budget)

    def _new_buffer(self, size: int):
        return Receipt(size)

    def empty(self, shape, dtype, where: str = ""):
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return None, self.alloc(n, where)

    @property
    def capacity(self) -> int:
        return self.peak
