"""Hold a stream: a one-thread kernel that keeps the GPU's stream busy for a given time.

The profiler (planner/profile.py) times a layer by events around back-to-back calls on the
compute stream. When the host issues a call more slowly than the GPU runs it (a ReLU on a
small map: tens of microseconds of Python against a few of GPU work), the events measure the
host's rate, not the device's. A hold queued before the first event keeps the stream busy
while the host queues every timed call behind it, so the events see the device's time alone.
The kernel reads the GPU's nanosecond timer, so the time does not depend on the clock rate.
"""
from __future__ import annotations

import cupy as cp

_SOURCE = r"""
extern "C" __global__ void hold(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""

_module = cp.RawModule(code=_SOURCE)


def hold(seconds: float) -> None:
    """Keep the current stream busy for `seconds` from when the kernel starts; the host
    returns at once. One thread, no memory."""
    _module.get_function("hold")((1,), (1,), (cp.uint64(max(0, int(seconds * 1e9))),))
