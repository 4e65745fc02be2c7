"""The L2 cache a layer's call finds inside a step, set up before each timed call.

A profile times each call `repeats` times back to back (profile._Clock). Repeated, a small
call finds its whole working set (input, weights, output) in the GPU's L2 cache, left there by
the call before it; inside a step it finds only what the call just before it wrote there: a
forward's input, a backward's incoming gradient. Its weights and the maps saved in forward
were evicted long before by the rest of the step (on an H200 the L2 holds 50 MB; one fully
connected layer of AlexNet has 151 MB of weights). Timed warm, calls on a few images ran
about a fifth faster than the same calls inside a step of 64 passes of 4 images.

So each timed call starts with the cache as the step leaves it: a write over twice the
cache's bytes evicts everything, then a read of the arrays the call finds warm brings them
back (at most the cache's bytes of each: the end a writer leaves there). The clock takes the
time of that set-up, timed alone the same way, off the call's.
"""
from __future__ import annotations

#: Bytes written to evict the cache, in multiples of its size (an LRU-like cache with
#: several ways needs more than its size written to lose every line).
EVICT_MULTIPLE = 2


class CacheState:
    """Puts the L2 cache in the state a step's call finds it: `enter(warm)` before each call.

    Args:
        xp: cupy.
        l2_bytes: the device's L2 cache size (its attribute, cudaDevAttrL2CacheSize).
    """

    def __init__(self, xp, l2_bytes: int):
        self.xp = xp
        self.l2_bytes = int(l2_bytes)
        self._evict = xp.empty(EVICT_MULTIPLE * self.l2_bytes // 4, dtype=xp.float32)

    @classmethod
    def of(cls, device) -> "CacheState":
        """The cache state of `device` (a backend.Device on a GPU)."""
        import cupy
        l2 = cupy.cuda.runtime.deviceGetAttribute(
            cupy.cuda.runtime.cudaDevAttrL2CacheSize, cupy.cuda.Device().id)
        return cls(device.xp, l2)

    def enter(self, warm) -> None:
        """Evict the cache, then read `warm` (arrays; None entries skipped) into it: the
        last l2_bytes of each, as the call that wrote it leaves them."""
        self._evict.fill(1.0)            # an elementwise write through the cache, not a memset
        for a in warm:
            if a is None or a.size == 0:
                continue
            flat = a.reshape(-1) if a.flags.c_contiguous else a
            keep = max(1, self.l2_bytes // a.itemsize)
            if flat.ndim == 1 and flat.size > keep:
                flat = flat[-keep:]
            flat.max()                   # a read of every value; the result is not used
