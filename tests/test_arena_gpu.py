"""The device arena and the pinned host slab on a CUDA GPU (skipped without one)."""
import numpy as np
import pytest

from minidnn.backend import Device, gpu_available
from minidnn.errors import MemoryBudgetError
from minidnn.memory.arena import GPU_SAFETY_MARGIN, Arena
from minidnn.memory.host import HostSlab

cupy = pytest.importorskip("cupy")
pytestmark = pytest.mark.gpu

MiB = 1024**2
CUDA_MEMORY_TYPE_UNREGISTERED = 0   # cudaMemoryType: pageable host memory
CUDA_MEMORY_TYPE_HOST = 1           # cudaMemoryType: page-locked host memory


@pytest.fixture(scope="module")
def gpu():
    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    return Device("gpu")


def memory_type(address: int) -> int:
    attrs = cupy.cuda.runtime.pointerGetAttributes(address)
    # CuPy names the field `type` (CUDA 11+) or `memoryType` (older releases).
    return getattr(attrs, "type", getattr(attrs, "memoryType", None))


def test_alloc_views_the_arena_and_holds_data(gpu):
    with Arena(gpu, 16 * MiB) as arena:
        buf = arena.alloc(1000)
        assert isinstance(buf, cupy.ndarray) and buf.dtype == cupy.uint8 and buf.size == 1024
        assert buf.data.ptr % 256 == 0 and arena.owns(buf.data.ptr)
        x, xbuf = arena.empty((4, 8), np.float32, where="forward of fc1")
        assert x.data.ptr == xbuf.data.ptr and arena.owns(x.data.ptr)
        x[...] = cupy.arange(32, dtype=cupy.float32).reshape(4, 8)
        np.testing.assert_array_equal(cupy.asnumpy(x),
                                      np.arange(32, dtype=np.float32).reshape(4, 8))
        assert arena.in_use == 1024 + 256
        arena.free(buf)
        arena.free(xbuf)
        assert arena.in_use == 0


def test_route_cupy_serves_cupy_arrays_from_the_arena_and_gives_them_back(gpu):
    arena = Arena(gpu, 64 * MiB)
    previous = cupy.cuda.get_allocator()
    try:
        with arena.route_cupy():
            base = arena.in_use
            x = cupy.arange(1 << 20, dtype=cupy.float32)          # 4 MiB
            assert arena.owns(x.data.ptr) and arena.owns(x.data.ptr + x.nbytes - 1)
            assert arena.in_use >= base + x.nbytes
            y = x * 2 + 1                                          # a temporary and a result
            assert arena.owns(y.data.ptr)
            assert float(y[10]) == 21.0
            empty = cupy.empty(0, dtype=cupy.float32)              # no bytes, no block
            assert empty.size == 0
            del x, y, empty
            assert arena.in_use == base                            # CuPy dropped them: back
        assert cupy.cuda.get_allocator() is previous
        outside = cupy.ones(10)
        assert not arena.owns(outside.data.ptr)
    finally:
        arena.close()


def test_library_calls_allocate_from_the_arena(gpu):
    arena = Arena(gpu, 64 * MiB)
    try:
        with arena.route_cupy():
            a = cupy.ones((256, 256), dtype=cupy.float32)
            c = a @ a                                              # cuBLAS
            s = c.sum()                                            # a reduction's temporaries
            assert arena.owns(c.data.ptr) and arena.owns(s.data.ptr)
            assert float(s) == 256.0 ** 3
    finally:
        arena.close()


def test_exceeding_the_budget_raises_memory_budget_error_not_cuda_oom(gpu):
    arena = Arena(gpu, 8 * MiB)
    arena.current_where = "forward of conv3"
    try:
        with arena.route_cupy():
            with pytest.raises(MemoryBudgetError, match="forward of conv3") as e:
                cupy.empty(16 * MiB, dtype=cupy.uint8)
            assert not isinstance(e.value, cupy.cuda.memory.OutOfMemoryError)
            assert e.value.budget == 8 * MiB and e.value.requested == 16 * MiB
            held = cupy.empty(6 * MiB, dtype=cupy.uint8)
            with pytest.raises(MemoryBudgetError, match="backward of conv3"):
                arena.alloc(4 * MiB, where="backward of conv3")
            del held
            arena.free(arena.alloc(4 * MiB))                       # room again
    finally:
        arena.close()


def test_free_after_an_event_waits_for_the_copy_on_another_stream(gpu):
    arena = Arena(gpu, 4 * MiB)
    slab = HostSlab(gpu, chunk_bytes=4 * MiB)
    try:
        a = arena.alloc(4 * MiB)
        host = slab.alloc(4 * MiB)
        with gpu.offload:
            a.fill(7)
            a.data.copy_to_host_async(host.ctypes.data, a.nbytes)
            copied = gpu.offload.record()
        arena.free(a, after=copied)
        assert arena.in_use == 4 * MiB                  # held until the copy is done
        b = arena.alloc(4 * MiB)                        # the only room: waits on `copied`
        assert copied.done and b.data.ptr == a.data.ptr
        assert (host == 7).all()
        arena.free(b)
    finally:
        arena.close()
        slab.close()


def test_no_budget_takes_free_memory_minus_the_margin(gpu):
    cupy.get_default_memory_pool().free_all_blocks()
    free_before, _ = cupy.cuda.runtime.memGetInfo()
    arena = Arena(gpu, None)
    try:
        assert abs(arena.budget - (free_before - GPU_SAFETY_MARGIN)) < 64 * MiB
        free_during, _ = cupy.cuda.runtime.memGetInfo()
        assert free_during < GPU_SAFETY_MARGIN + 64 * MiB
    finally:
        arena.close()
    free_after, _ = cupy.cuda.runtime.memGetInfo()
    assert free_after > free_before - 64 * MiB         # close gave the reservation back


def test_host_slab_buffers_are_pinned_and_reused(gpu):
    slab = HostSlab(gpu, chunk_bytes=8 * MiB)
    try:
        buf = slab.alloc(3 * MiB)
        assert isinstance(buf, np.ndarray) and buf.ctypes.data % 256 == 0
        assert memory_type(buf.ctypes.data) == CUDA_MEMORY_TYPE_HOST
        assert memory_type(np.empty(1 << 20, np.uint8).ctypes.data) == \
            CUDA_MEMORY_TYPE_UNREGISTERED                   # the query tells them apart
        # An asynchronous device-to-host copy on a non-blocking stream lands in it.
        x = cupy.arange(3 * MiB // 4, dtype=cupy.float32)
        gpu.offload.wait_event(cupy.cuda.get_current_stream().record())
        x.data.copy_to_host_async(buf.ctypes.data, x.nbytes, stream=gpu.offload)
        gpu.offload.synchronize()
        np.testing.assert_array_equal(buf[:x.nbytes].view(np.float32), cupy.asnumpy(x))
        slab.free(buf)
        for _ in range(5):                                  # steady state: no new pinning
            slab.free(slab.alloc(3 * MiB))
        assert slab.stats()["chunk_allocs"] == 1
    finally:
        slab.close()
