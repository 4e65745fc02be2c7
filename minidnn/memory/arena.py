"""The budgeted device arena: one device allocation of the whole budget, sub-allocated.

Every byte minidnn uses on the device comes out of this arena: feature maps and gradients that
the memory manager asks for (`alloc` / `empty` / `free`), and, once `route_cupy()` is active,
every allocation CuPy makes on its own (parameters, optimizer state, cuDNN workspaces,
temporaries of elementwise kernels). So the budget is a hard cap on everything, and going over
it raises MemoryBudgetError naming where, never a raw CUDA out-of-memory error.

Allocation and release are bookkeeping on a free list (memory/blocks.py) and never synchronize
the device. A buffer that a copy on another stream may still read is freed with
`free(buf, after=event)`: its block is reused only once the event has completed.

On the CPU the arena is one NumPy array (the OS backs only the pages that are touched), so the
manager's logic and the budget behave the same as on the GPU.
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
import traceback
from collections import deque

import numpy as np

from ..backend import address
from ..errors import ConfigError, DeviceError, MemoryBudgetError, fmt_bytes
from .allocator import ALIGNMENT, Allocator, SimpleAllocator, wait_until_fits
from .blocks import BlockList, PendingFrees

def caller() -> str:
    """Where an allocation named by nothing (made outside any layer call, the optimizer and
    the executor's named buffers) was asked for: 'code at FILE:LINE (FUNCTION)', the
    innermost frame of minidnn's outside memory/, else of any code outside it; so that its
    failure says what to count."""
    frames = [f for f in traceback.extract_stack()[:-1]
              if f"{os.sep}memory{os.sep}" not in f.filename
              and "cupy" not in f.filename and "contextlib" not in f.filename]
    ours = [f for f in frames if f"{os.sep}minidnn{os.sep}" in f.filename]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return ""
    name = os.sep.join(frame.filename.split(os.sep)[-2:])
    return f"code at {name}:{frame.lineno} ({frame.name})"


# Device memory left outside the arena when no budget is given: the CUDA context, cuDNN's and
# cuBLAS's handles and kernels live there, and they allocate outside CuPy.
GPU_SAFETY_MARGIN = 512 * 1024**2

# Arenas that CuPy's allocator is routed to, oldest first, and what CuPy had before them.
_ROUTED: list = []
_ROUTED_BASE: list = [None]


def make_allocator(device, budget: int | None):
    """The allocator for `device`: an Arena, or a SimpleAllocator on the CPU without a budget.

    A CPU run without a budget has nothing to enforce, so it skips reserving address space.
    """
    if budget is None and not device.is_gpu:
        return SimpleAllocator(device.xp, None)
    return Arena(device, budget)


class _RoutedBlock:
    """Owner of one arena block lent to CuPy; CuPy drops it when the last array using it dies.

    Its finalizer only queues the offset: it can run from the garbage collector in the middle
    of the arena's own bookkeeping, so it must not touch the free list itself. The arena drains
    the queue before every operation. It also holds the arena's device allocation, so that
    arrays CuPy still holds stay valid even after the arena is closed.
    """

    __slots__ = ("_returned", "_offset", "_memory")

    def __init__(self, returned: deque, offset: int, memory):
        self._returned, self._offset, self._memory = returned, offset, memory

    def __del__(self):
        self._returned.append(self._offset)   # deque.append is atomic: safe from any thread


class Arena(Allocator):
    """A budget of device memory reserved once and sub-allocated in 256-byte-aligned blocks.

    Same interface as SimpleAllocator (alloc, free, empty, in_use, peak, reset_peak), plus
    stream-ordered frees, fragmentation statistics and routing of CuPy's allocator.

    device: a backend.Device. budget: bytes; None on the GPU takes the device's free memory
    minus GPU_SAFETY_MARGIN (on the CPU None is refused: use make_allocator).
    `in_use` counts every block not yet reusable, including blocks freed behind an event that
    has not completed (they still hold memory). `current_where` names what is running (the
    executor sets it, e.g. 'forward of conv3'); allocations without a `where` of their own,
    CuPy's in particular, report it when they fail.
    """

    carves = True

    def __init__(self, device, budget: int | None):
        self.device = device
        self.is_gpu = bool(device.is_gpu)
        self.current_where = ""
        self.peak = 0
        self.allocs = 0
        self.frees = 0
        self._lock = threading.RLock()     # CuPy may free a block from any thread (garbage collection)
        self._live: dict[int, tuple[int, int]] = {}   # address -> (offset, size) of alloc()'d
        self._routed: set[int] = set()     # offsets lent to CuPy through route_cupy
        self._returned: deque[int] = deque()   # offsets CuPy has dropped, not yet released
        self._pending = PendingFrees()
        self._capturing = None     # the GraphPool of the step being captured (graph_pool.py)
        self._lasting = 0          # depth of lasting() scopes: their blocks go to the top
        self._graph_owned: dict[int, object] = {}    # offset -> GraphPool it goes to, freed
        self._installed = False
        self._closed = False
        if self.is_gpu:
            self._reserve_gpu(budget)
        else:
            self._reserve_cpu(budget)
        self._blocks = BlockList(ALIGNMENT)
        self._blocks.add_region(self.capacity)

    # ---- reserving the budget -----------------------------------------------------------------
    @staticmethod
    def _check_budget(budget) -> int:
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
            raise ConfigError(f"memory budget must be a whole number of bytes, got {budget!r}")
        if budget < ALIGNMENT:
            raise ConfigError(f"memory budget must be at least {ALIGNMENT} bytes, "
                              f"got {int(budget)}")
        return int(budget)

    def _reserve_cpu(self, budget) -> None:
        if budget is None:
            raise ValueError("a CPU arena needs a budget; without one use make_allocator(), "
                             "which returns a SimpleAllocator")
        self.budget = self._check_budget(budget)
        self.capacity = self.budget // ALIGNMENT * ALIGNMENT
        # NumPy aligns arrays to 16 or 64 bytes; over-allocate and start at a 256-byte boundary.
        raw = np.empty(self.capacity + ALIGNMENT, dtype=np.uint8)
        skip = -raw.__array_interface__["data"][0] % ALIGNMENT
        self._memory = raw[skip:skip + self.capacity]
        self.base_address = address(self._memory)

    def _reserve_gpu(self, budget) -> None:
        import cupy
        self._cupy = cupy
        self.device_id = cupy.cuda.Device().id
        if budget is None:
            # Cached blocks of CuPy's default pool are not free to the driver; give them back,
            # with those of arenas no one can reach any more: an executor that a failure left
            # in a reference cycle holds its whole arena until the cycle is collected (a GPU
            # test after a failed one then found 505 MiB free of 140 GiB).
            gc.collect()
            cupy.get_default_memory_pool().free_all_blocks()
            free, total = cupy.cuda.runtime.memGetInfo()
            if free <= GPU_SAFETY_MARGIN + ALIGNMENT:
                raise DeviceError(f"the GPU has only {fmt_bytes(free)} free of "
                                  f"{fmt_bytes(total)}, not more than the "
                                  f"{fmt_bytes(GPU_SAFETY_MARGIN)} kept for the CUDA context "
                                  f"and cuDNN; no memory is left for an arena")
            budget = free - GPU_SAFETY_MARGIN
        self.budget = self._check_budget(budget)
        self.capacity = self.budget // ALIGNMENT * ALIGNMENT
        try:
            # cupy.cuda.Memory calls cudaMalloc directly, bypassing any pool or routed
            # allocator; cudaMalloc returns at least 256-byte-aligned addresses.
            self._memory = cupy.cuda.Memory(self.capacity)
        except (cupy.cuda.runtime.CUDARuntimeError, MemoryError) as e:
            free, total = cupy.cuda.runtime.memGetInfo()
            raise ConfigError(f"cannot reserve a device arena of {fmt_bytes(self.capacity)}: "
                              f"the GPU has {fmt_bytes(free)} free of {fmt_bytes(total)}; "
                              f"choose a smaller memory budget ({e})") from e
        self.base_address = self._memory.ptr

    # ---- the allocator interface --------------------------------------------------------------
    def alloc(self, nbytes: int, where: str = ""):
        """A flat uint8 array of `nbytes` rounded up to 256 bytes, viewing the arena.

        Raises MemoryBudgetError (naming `where`, or `current_where`) when no block fits even
        after waiting for pending frees.
        """
        with self._lock:
            offset, size = self._take(nbytes, where)
            buf = self._view(offset, size)
            self._live[address(buf)] = (offset, size)
            return buf

    def free(self, buf, after=None) -> None:
        """Give a buffer from `alloc` back.

        after: None to make the block reusable now (any later use is ordered behind the
        compute stream, which is where every arena buffer is written); or an event recorded
        behind the last work that reads the block on another stream (an offload copy): the
        block is reusable only once the event has completed.
        """
        with self._lock:
            if self._closed:
                return
            entry = self._live.pop(address(buf), None)
            if entry is None or entry[1] != buf.nbytes:
                if entry is not None:
                    self._live[address(buf)] = entry
                raise ValueError(f"free of a buffer this arena did not hand out (or freed "
                                 f"twice): address 0x{address(buf):x}, {buf.nbytes} bytes")
            offset, _ = entry
            if self._reusable_now(after):
                self._release(offset)
            else:
                self._pending.add(offset, after)

    def settle(self) -> None:
        with self._lock:
            self._pending.release_all(self._release)

    def empty(self, shape, dtype, where: str = ""):
        """(typed array of `shape` and `dtype`, the flat buffer to pass to `free`)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buf = self.alloc(nbytes, where)
        return buf[:nbytes].view(dtype).reshape(shape), buf

    @property
    def in_use(self) -> int:
        """Bytes in blocks not reusable now: live buffers, CuPy's arrays, pending frees."""
        with self._lock:
            self._drain_returned()
            return self._blocks.used

    def reset_peak(self) -> None:
        self.peak = self.in_use

    # ---- statistics ---------------------------------------------------------------------------
    @property
    def free_bytes(self) -> int:
        with self._lock:
            self._drain_returned()
            return self._blocks.free

    @property
    def largest_free_block(self) -> int:
        with self._lock:
            self._drain_returned()
            return self._blocks.largest_free

    def fragmentation(self) -> float:
        """1 - largest free block / total free (0 when nothing or one block is free)."""
        with self._lock:
            self._drain_returned()
            return self._blocks.fragmentation()

    def stats(self) -> dict:
        with self._lock:
            self._drain_returned()
            b = self._blocks
            return {"budget": self.budget, "capacity": self.capacity, "in_use": b.used,
                    "peak": self.peak, "free": b.free, "largest_free_block": b.largest_free,
                    "fragmentation": b.fragmentation(), "num_blocks": b.num_allocated,
                    "num_free_blocks": b.num_free_blocks, "pending": len(self._pending),
                    "cupy_blocks": len(self._routed), "allocs": self.allocs,
                    "frees": self.frees}

    def owns(self, address: int) -> bool:
        """True when a device (or host, on the CPU) address lies inside the arena."""
        return self.base_address <= address < self.base_address + self.capacity

    # ---- routing CuPy's allocator (GPU) -------------------------------------------------------
    #
    # Stream-ordering invariant. CuPy gives a block back as soon as Python drops the last
    # array on it, although a kernel already queued on the compute stream may still read it.
    # Handing the block out again at once is safe only because every use of a reused block is
    # also queued on the compute stream, behind that kernel: all layer compute, CuPy
    # temporaries and cuDNN workspaces run on the compute stream (device.compute, current while
    # the executor runs). Blocks that copy streams (offload, prefetch) touch are not CuPy's:
    # the manager takes them with alloc() and frees them with free(buf, after=event). Never
    # create CuPy arrays with a copy stream current while routing is installed.

    def install(self) -> None:
        """Route every CuPy device allocation to this arena (until `uninstall`).

        Arenas installed one after another form a stack: the newest serves CuPy, and
        uninstalling any of them, in any order, hands CuPy to the newest one left (or to
        the allocator CuPy had before the first).
        """
        if not self.is_gpu or self._installed:
            return
        if self._closed:
            raise RuntimeError("cannot route CuPy to a closed arena")
        if not _ROUTED:
            _ROUTED_BASE[0] = self._cupy.cuda.get_allocator()
        _ROUTED.append(self)
        self._cupy.cuda.set_allocator(self._cupy_malloc)
        self._installed = True

    def uninstall(self) -> None:
        """Stop serving CuPy; the newest other installed arena, or CuPy's own, takes over."""
        if not self._installed:
            return
        _ROUTED.remove(self)
        self._cupy.cuda.set_allocator(_ROUTED[-1]._cupy_malloc if _ROUTED else _ROUTED_BASE[0])
        self._installed = False

    @contextlib.contextmanager
    def route_cupy(self):
        """`with arena.route_cupy():` every CuPy allocation inside comes from the arena.

        On the CPU there is nothing to route (NumPy temporaries are host memory): a no-op.
        """
        self.install()
        try:
            yield self
        finally:
            self.uninstall()

    def _cupy_malloc(self, nbytes: int):
        """CuPy's allocator interface: size in bytes -> cupy.cuda.MemoryPointer."""
        cupy = self._cupy
        if nbytes == 0:  # empty arrays: a null pointer, no cudaMalloc, nothing to budget
            return cupy.cuda.MemoryPointer(cupy.cuda.Memory(0), 0)
        with self._lock:
            offset, size = self._take(nbytes, "")
            self._routed.add(offset)
        owner = _RoutedBlock(self._returned, offset, self._memory)
        mem = cupy.cuda.UnownedMemory(self.base_address + offset, size, owner, self.device_id)
        return cupy.cuda.MemoryPointer(mem, 0)

    @contextlib.contextmanager
    def lasting(self):
        """Inside, blocks are taken from the top of the arena (BlockList.allocate(top=True)).
        A block that outlives its call, placed by best fit among the calls' short-lived ones,
        stays behind as an island in the free space they leave: on an H200 a small bf16
        network at its least budget then failed for want of one block while the bytes free
        were enough (a split ResNet's summed fc gradient, 62.5 KiB with 71.5 KiB free in two
        pieces, its fc weight's bf16 copy between them). The step model counts bytes, not
        places; kept at the top, these blocks leave the bytes it counts in one piece."""
        with self._lock:
            self._lasting += 1
        try:
            yield self
        finally:
            with self._lock:
                self._lasting -= 1

    # ---- CUDA graphs (minidnn/step_graph.py) -------------------------------------------------------
    @contextlib.contextmanager
    def capturing(self, pool):
        """While the body captures a step into a CUDA graph, note every block it takes; when it
        ends, claim for `pool` every part of those blocks' addresses that is free then, and
        make the blocks still alive `pool`'s when they are dropped (memory/graph_pool.py). The
        arrays the body dropped are collected first, so that their blocks are free by then."""
        with self._lock:
            self._drain_returned()
            for offset in pool.begin():     # an earlier graph's memory, lent to this capture
                self._blocks.release(offset)
            self._capturing = pool
        try:
            yield pool
        finally:
            gc.collect()
            with self._lock:
                self._drain_returned()
                self._capturing = None
                for start, end in pool.ranges():
                    for offset, _ in self._blocks.claim(start, end):
                        pool.keep(offset)
                for offset in pool.live:
                    self._graph_owned[offset] = pool
                pool.live.clear()
                self.peak = max(self.peak, self._blocks.used)

    def release_graph_pool(self, pool) -> None:
        """Give `pool`'s memory back to the arena: no graph that works in it will replay (the
        caller has waited for the last replay). Blocks of it that arrays still hold go back
        to the arena when those arrays are dropped."""
        with self._lock:
            self._drain_returned()
            for offset in [o for o, p in self._graph_owned.items() if p is pool]:
                del self._graph_owned[offset]
            for offset in pool.clear():
                self._blocks.release(offset)

    # ---- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Drop the arena's reservation (and CuPy routing).

        Memory still viewed by live arrays stays valid until they die (they hold a reference
        to the allocation); only then is it returned to the device.
        """
        with self._lock:
            self.uninstall()
            self._closed = True
            self._live.clear()
            self._memory = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self) -> str:
        return (f"Arena({self.device.kind}, budget {fmt_bytes(self.budget)}, in use "
                f"{fmt_bytes(self.in_use)}, peak {fmt_bytes(self.peak)})")

    # ---- internals ----------------------------------------------------------------------------
    def _take(self, nbytes: int, where: str) -> tuple[int, int]:
        """Offset and size of a new block; the lock is held."""
        if self._closed:
            raise RuntimeError("allocation from a closed arena")
        self._drain_returned()
        self._pending.reclaim_done(self._release)
        size = self._blocks.round(nbytes)
        # Under pressure, wait for pending frees oldest first: each wait may free enough.
        top = self._lasting > 0
        offset = wait_until_fits(lambda: self._blocks.allocate(size, top),
                                 lambda: self._pending.wait_oldest(self._release))
        if offset is None and self._routed:
            # CuPy arrays caught in reference cycles hold blocks until the collector runs.
            gc.collect()
            self._drain_returned()
            offset = self._blocks.allocate(size, top)
        if offset is None:
            raise self._budget_error(size, where or self.current_where or caller())
        self.allocs += 1
        self.peak = max(self.peak, self._blocks.used)
        if self._capturing is not None:
            self._capturing.taken(offset, size)
        return offset, size

    def _release(self, offset: int) -> None:
        pool = self._graph_owned.pop(offset, None)
        if pool is not None:    # taken by a captured step, dropped since: its graph's
            pool.keep(offset)
        else:
            self._blocks.release(offset)
            if self._capturing is not None:
                self._capturing.given_back(offset)
        self.frees += 1

    def _drain_returned(self) -> None:
        while self._returned:
            offset = self._returned.popleft()
            if offset in self._routed and not self._closed:
                self._routed.discard(offset)
                self._release(offset)

    def _view(self, offset: int, size: int):
        if self.is_gpu:
            cupy = self._cupy
            return cupy.ndarray((size,), dtype=cupy.uint8,
                                memptr=cupy.cuda.MemoryPointer(self._memory, offset))
        return self._memory[offset:offset + size]

    def _budget_error(self, size: int, where: str) -> MemoryBudgetError:
        b = self._blocks
        if size > b.capacity:
            detail = "the request alone is larger than the budget"
        elif b.free >= size:
            detail = (f"fragmentation: {fmt_bytes(b.free)} is free in total, but in "
                      f"{b.num_free_blocks} pieces, the largest {fmt_bytes(b.largest_free)}")
        else:
            detail = f"{fmt_bytes(b.free)} free"
        return MemoryBudgetError(size, b.used, self.budget, where, detail)
