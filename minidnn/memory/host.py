"""The pinned host slab: where offloaded feature maps wait for their backward.

Copies between device and host run at full PCIe speed, asynchronously, only from page-locked
(pinned) host memory; pageable memory is ~25x slower and makes the copy synchronous. Pinning
is itself slow (the OS must lock every page), so the slab pins large chunks (64 MiB or the
request, whichever is larger), keeps them across steps and sub-allocates inside them with the
same free list as the device arena (memory/blocks.py). After the first step of a repeating
pattern it holds everything the pattern needs and pins nothing more.

On the CPU the chunks are ordinary NumPy memory, so the offload logic runs unchanged.
"""
from __future__ import annotations

import bisect
import os

import numpy as np

from ..errors import ConfigError, HostMemoryError, fmt_bytes
from .allocator import ALIGNMENT, Allocator
from .blocks import BlockList, PendingFrees

DEFAULT_CHUNK_BYTES = 64 * 1024**2


def available_host_bytes() -> int | None:
    """Bytes of RAM the OS can hand out now without swapping: MemAvailable from /proc/meminfo
    (Linux), else the free physical pages (os.sysconf); None when neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def check_host_memory(arena_bytes: int, slab_bytes: int) -> None:
    """Refuse, before anything is allocated, a CPU run whose device arena (`arena_bytes`: on
    the CPU the arena is host memory too) and host slab (`slab_bytes`: the feature maps the
    decision offloads) together exceed the RAM available now. Raises HostMemoryError."""
    available = available_host_bytes()
    need = int(arena_bytes) + int(slab_bytes)
    if available is None or need <= available:
        return
    raise HostMemoryError(
        f"on the CPU the memory budget and the host slab both live in RAM: a "
        f"{fmt_bytes(arena_bytes)} arena and {fmt_bytes(slab_bytes)} of offloaded feature "
        f"maps need {fmt_bytes(need)}, but only {fmt_bytes(available)} is available; choose a "
        f"smaller --memory-budget, batch or model, or run on a GPU (`minidnn plan` and "
        f"`scripts/bench_memory.py --dry` give the memory figures without allocating)")


class HostSlab(Allocator):
    """Pinned host memory in reused chunks, sub-allocated in 256-byte-aligned blocks.

    device: a backend.Device (pinned through CuPy on the GPU, plain NumPy on the CPU).
    limit: most bytes of chunks to hold (None: no limit); HostMemoryError beyond it.
    chunk_bytes: the smallest chunk to pin at a time.

    alloc(nbytes) -> flat uint8 NumPy array; free(buf, after=None). `capacity` is the bytes of
    chunks held, `in_use` the bytes in blocks not reusable now (including blocks freed behind
    an event that has not completed), `peak` the highest `in_use`.
    """

    def __init__(self, device, limit: int | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        if limit is not None and (isinstance(limit, bool) or int(limit) <= 0):
            raise ConfigError(f"host memory limit must be a positive number of bytes, "
                              f"got {limit!r}")
        if int(chunk_bytes) < ALIGNMENT:
            raise ConfigError(f"chunk_bytes must be at least {ALIGNMENT}, got {chunk_bytes!r}")
        self.device = device
        self.limit = None if limit is None else int(limit)
        self.chunk_bytes = int(chunk_bytes)
        self.peak = 0
        self.allocs = 0
        self.frees = 0
        self.chunk_allocs = 0
        self._blocks = BlockList(ALIGNMENT)
        self._pending = PendingFrees()
        self._chunk_bases: list[int] = []      # offset of each chunk in the block list
        self._chunks: list[np.ndarray] = []    # aligned uint8 view of each chunk
        self._backing: list[object] = []       # what keeps each chunk's memory alive
        self._live: dict[int, tuple[int, int]] = {}   # address -> (offset, size)

    # ---- the allocator interface --------------------------------------------------------------
    def alloc(self, nbytes: int) -> np.ndarray:
        """A flat uint8 array of `nbytes` rounded up to 256 bytes, in pinned memory on the GPU.

        Reuses free space first; then waits for pending frees (a copy finishing is cheaper
        than pinning more memory, and keeps the slab's size independent of copy timing);
        only then pins a new chunk. HostMemoryError beyond `limit` or when pinning fails.
        """
        self._pending.reclaim_done(self._release)
        size = self._blocks.round(nbytes)
        offset = self._blocks.allocate(size)
        while offset is None and self._pending.wait_oldest(self._release):
            offset = self._blocks.allocate(size)
        if offset is None:
            self._grow(size)
            offset = self._blocks.allocate(size)
        self.allocs += 1
        self.peak = max(self.peak, self._blocks.used)
        k = bisect.bisect_right(self._chunk_bases, offset) - 1
        local = offset - self._chunk_bases[k]
        buf = self._chunks[k][local:local + size]
        self._live[buf.__array_interface__["data"][0]] = (offset, size)
        return buf

    def free(self, buf: np.ndarray, after=None) -> None:
        """Give a buffer from `alloc` back; with `after` (an event recorded behind the last
        copy that reads or writes it) the block is reused only once the event has completed."""
        address = buf.__array_interface__["data"][0]
        entry = self._live.get(address)
        if entry is None or entry[1] != buf.nbytes:
            raise ValueError(f"free of a buffer this host slab did not hand out (or freed "
                             f"twice): address 0x{address:x}, {buf.nbytes} bytes")
        del self._live[address]
        if self._reusable_now(after):
            self._release(entry[0])
        else:
            self._pending.add(entry[0], after)

    def settle(self) -> None:
        self._pending.release_all(self._release)

    @property
    def in_use(self) -> int:
        return self._blocks.used

    @property
    def capacity(self) -> int:
        return self._blocks.capacity

    def reset_peak(self) -> None:
        self.peak = self.in_use

    def stats(self) -> dict:
        b = self._blocks
        return {"capacity": self.capacity, "limit": self.limit, "in_use": b.used,
                "peak": self.peak, "free": b.free, "largest_free_block": b.largest_free,
                "fragmentation": b.fragmentation(), "num_blocks": b.num_allocated,
                "chunks": len(self._chunks), "chunk_allocs": self.chunk_allocs,
                "pending": len(self._pending), "allocs": self.allocs,
                "frees": self.frees}

    def close(self) -> None:
        """Drop every chunk (arrays still viewing one keep it alive until they die) and give
        CuPy's pinned pool back to the system: page-locked memory left pinned is memory the
        rest of the machine cannot page."""
        self._chunks.clear()
        self._backing.clear()
        self._chunk_bases.clear()
        self._live.clear()
        self._pending = PendingFrees()
        self._blocks = BlockList(ALIGNMENT)
        if self.device.is_gpu:
            import cupy
            cupy.get_default_pinned_memory_pool().free_all_blocks()

    def __repr__(self) -> str:
        return (f"HostSlab({self.device.kind}, {len(self._chunks)} chunks, capacity "
                f"{fmt_bytes(self.capacity)}, in use {fmt_bytes(self.in_use)})")

    # ---- internals ----------------------------------------------------------------------------
    def _release(self, offset: int) -> None:
        self._blocks.release(offset)
        self.frees += 1

    def _grow(self, size: int) -> None:
        """Add a chunk that holds at least `size` bytes, within the limit."""
        chunk = max(self.chunk_bytes, size)
        if self.limit is not None:
            room = (self.limit - self.capacity) // ALIGNMENT * ALIGNMENT
            if room < size:
                raise HostMemoryError(
                    f"host memory limit reached: asked for {fmt_bytes(size)} of pinned memory "
                    f"for an offloaded feature map, holding {fmt_bytes(self.capacity)} "
                    f"({fmt_bytes(self.in_use)} in use, {fmt_bytes(self._blocks.largest_free)} "
                    f"largest free block), limit {fmt_bytes(self.limit)}")
            chunk = min(chunk, room)
        chunk = -(-chunk // ALIGNMENT) * ALIGNMENT
        backing, raw = self._allocate_chunk(chunk + ALIGNMENT, size)
        skip = -raw.__array_interface__["data"][0] % ALIGNMENT
        self._chunks.append(raw[skip:skip + chunk])
        self._backing.append(backing)
        self._chunk_bases.append(self._blocks.add_region(chunk))
        self.chunk_allocs += 1

    def _allocate_chunk(self, nbytes: int, asked: int) -> tuple[object, np.ndarray]:
        """(owner of the memory, flat uint8 NumPy array over it) of `nbytes` bytes."""
        if self.device.is_gpu:
            import cupy
            try:
                # Page-locked memory via cudaHostAlloc (through CuPy's pinned pool, which
                # keeps freed chunks pinned for the next slab).
                mem = cupy.cuda.alloc_pinned_memory(nbytes)
            except (cupy.cuda.runtime.CUDARuntimeError, MemoryError) as e:
                raise self._chunk_error(nbytes, asked, e) from e
            return mem, np.frombuffer(mem, np.uint8, nbytes)
        try:
            raw = np.empty(nbytes, dtype=np.uint8)
        except MemoryError as e:
            raise self._chunk_error(nbytes, asked, e) from e
        return raw, raw

    def _chunk_error(self, nbytes: int, asked: int, cause: Exception) -> HostMemoryError:
        limit = "none" if self.limit is None else fmt_bytes(self.limit)
        return HostMemoryError(
            f"could not {'pin' if self.device.is_gpu else 'allocate'} a chunk of "
            f"{fmt_bytes(nbytes)} of host memory for offloaded feature maps (asked for "
            f"{fmt_bytes(asked)}, holding {fmt_bytes(self.capacity)} in {len(self._chunks)} "
            f"chunks, limit {limit}): {cause}")
