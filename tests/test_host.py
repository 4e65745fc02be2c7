"""The pinned host slab (memory/host.py) on the CPU: chunk reuse, limits, stream-ordered frees."""
import numpy as np
import pytest

from minidnn.backend import Device
from minidnn.errors import ConfigError, HostMemoryError
from minidnn.memory.allocator import ALIGNMENT
from minidnn.memory.host import DEFAULT_CHUNK_BYTES, HostSlab

from fakes import FakeEvent, KiB, addr


@pytest.fixture
def cpu():
    return Device("cpu")


def run_step(slab, sizes):
    """One training step's host traffic: offload in forward order, free in backward order
    (the prefetch brings each map back, then its host copy is freed), with a few maps that
    are freed early (a policy that drops them). Contents are checked on the way back."""
    bufs = []
    for k, n in enumerate(sizes):
        buf = slab.alloc(n)
        assert isinstance(buf, np.ndarray) and buf.dtype == np.uint8
        assert buf.nbytes >= n and addr(buf) % ALIGNMENT == 0
        buf[:] = k % 256
        bufs.append((k, buf))
        if k % 5 == 4:                               # freed before backward
            kk, early = bufs.pop(-2)
            assert (early == kk % 256).all()
            slab.free(early)
    for k, buf in reversed(bufs):
        assert (buf == k % 256).all(), "an offloaded map was overwritten while on the host"
        slab.free(buf)


def test_default_chunk_is_64_mib_and_small_requests_share_it(cpu):
    slab = HostSlab(cpu)
    a, b = slab.alloc(1000), slab.alloc(3000)
    assert slab.capacity == DEFAULT_CHUNK_BYTES == 64 * 1024**2
    assert slab.stats()["chunk_allocs"] == 1
    assert (a.nbytes, b.nbytes) == (1024, 3072) and slab.in_use == 4096
    slab.free(a)
    slab.free(b)
    assert slab.in_use == 0 and slab.peak == 4096


def test_capacity_stops_growing_once_the_step_pattern_repeats(cpu):
    rng = np.random.default_rng(1)
    sizes = [int(s) for s in rng.integers(1, 48 * KiB, size=40)]
    slab = HostSlab(cpu, chunk_bytes=64 * KiB)
    run_step(slab, sizes)
    assert slab.in_use == 0
    first = slab.stats()
    assert first["chunk_allocs"] > 1               # the pattern needed several chunks
    for _ in range(5):
        run_step(slab, sizes)
        assert slab.in_use == 0
    later = slab.stats()
    assert later["capacity"] == first["capacity"]
    assert later["chunk_allocs"] == first["chunk_allocs"]   # no pinning in the steady state
    assert later["allocs"] == 6 * len(sizes) and later["frees"] == 6 * len(sizes)
    slab._blocks.check_invariants()


def test_a_request_larger_than_a_chunk_gets_its_own_chunk(cpu):
    slab = HostSlab(cpu, chunk_bytes=4 * KiB)
    small = slab.alloc(1 * KiB)
    big = slab.alloc(10 * KiB + 1)
    assert big.nbytes == 10 * KiB + ALIGNMENT
    assert slab.capacity == 4 * KiB + 10 * KiB + ALIGNMENT
    assert slab.stats()["chunks"] == 2
    big[:] = 3
    small[:] = 9
    assert (big == 3).all() and (small == 9).all()


def test_chunks_are_not_merged_with_each_other(cpu):
    slab = HostSlab(cpu, chunk_bytes=2 * KiB)
    a, b = slab.alloc(2 * KiB), slab.alloc(2 * KiB)   # one chunk each
    slab.free(a)
    slab.free(b)
    assert slab.stats()["largest_free_block"] == 2 * KiB   # two chunks, not one 4 KiB block
    c = slab.alloc(4 * KiB)                          # does not fit either: a third chunk
    assert slab.stats()["chunk_allocs"] == 3
    c[:] = 1
    slab._blocks.check_invariants()


def test_limit_raises_host_memory_error_with_the_numbers(cpu):
    slab = HostSlab(cpu, limit=10 * KiB, chunk_bytes=4 * KiB)
    slab.alloc(4 * KiB)
    slab.alloc(4 * KiB)
    last = slab.alloc(2 * KiB)                       # the last chunk is cut to the limit
    assert slab.capacity == 10 * KiB
    with pytest.raises(HostMemoryError) as e:
        slab.alloc(1 * KiB)
    msg = str(e.value)
    assert "asked for 1.00 KiB" in msg and "holding 10.00 KiB" in msg
    assert "limit 10.00 KiB" in msg
    assert slab.capacity == 10 * KiB and slab.in_use == 10 * KiB   # the failure left nothing
    slab.free(last)
    assert slab.alloc(1 * KiB).nbytes == 1 * KiB    # room again, no new chunk
    assert slab.stats()["chunk_allocs"] == 3


def test_pending_frees_are_waited_on_before_pinning_more(cpu):
    slab = HostSlab(cpu, chunk_bytes=4 * KiB)
    a = slab.alloc(4 * KiB)
    ev = FakeEvent()
    slab.free(a, after=ev)                           # a prefetch copy still reads it
    assert slab.in_use == 4 * KiB and slab.stats()["pending"] == 1
    b = slab.alloc(4 * KiB)                          # waits for the copy instead of growing
    assert ev.waits == 1 and addr(b) == addr(a)
    assert slab.stats()["chunk_allocs"] == 1


def test_completed_pending_frees_are_reclaimed_without_waiting(cpu):
    slab = HostSlab(cpu, chunk_bytes=4 * KiB)
    a = slab.alloc(2 * KiB)
    ev = FakeEvent()
    slab.free(a, after=ev)
    ev._done = True
    b = slab.alloc(4 * KiB)
    assert ev.waits == 0 and slab.stats()["chunk_allocs"] == 1
    slab.free(b, after=cpu.event())                  # the CPU stand-in: released at once
    assert slab.in_use == 0


def test_free_refuses_foreign_buffers_and_double_frees(cpu):
    slab = HostSlab(cpu, chunk_bytes=4 * KiB)
    a = slab.alloc(1 * KiB)
    with pytest.raises(ValueError, match="did not hand out"):
        slab.free(np.zeros(1024, np.uint8))
    slab.free(a)
    with pytest.raises(ValueError, match="freed twice"):
        slab.free(a)


def test_bad_arguments(cpu):
    with pytest.raises(ConfigError, match="limit"):
        HostSlab(cpu, limit=0)
    with pytest.raises(ConfigError, match="chunk_bytes"):
        HostSlab(cpu, chunk_bytes=16)
