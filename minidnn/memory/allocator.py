"""The device allocator the memory manager draws every buffer from, with a budget.

This is the simple version: each request is its own array from the array module, and the
allocator only counts bytes (in use, peak) and enforces the budget. The arena (one device
allocation of the whole budget, sub-allocated) implements the same interface.
"""
from __future__ import annotations

import numpy as np

from ..errors import MemoryBudgetError

ALIGNMENT = 256  # bytes; what cudaMalloc guarantees and cuDNN expects


def aligned(nbytes: int) -> int:
    return (int(nbytes) + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


class SimpleAllocator:
    """Counts and budgets allocations made with the device's array module.

    alloc(nbytes) -> flat uint8 array; free(buf). `in_use` and `peak` are in aligned bytes.
    """

    def __init__(self, xp, budget: int | None = None):
        self.xp = xp
        self.budget = budget
        self.in_use = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def alloc(self, nbytes: int, where: str = ""):
        size = aligned(max(int(nbytes), 1))
        if self.budget is not None and self.in_use + size > self.budget:
            raise MemoryBudgetError(size, self.in_use, self.budget, where)
        buf = self.xp.empty(size, dtype=np.uint8)
        self._sizes[id(buf)] = size
        self.in_use += size
        self.peak = max(self.peak, self.in_use)
        return buf

    def free(self, buf) -> None:
        self.in_use -= self._sizes.pop(id(buf))

    def empty(self, shape, dtype, where: str = ""):
        """A typed array of `shape` carved from a fresh allocation."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64))
        buf = self.alloc(n * dtype.itemsize, where)
        return buf[:n * dtype.itemsize].view(dtype).reshape(shape), buf

    def reset_peak(self) -> None:
        self.peak = self.in_use
