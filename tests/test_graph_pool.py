"""The arena's blocks for steps captured as CUDA graphs (memory/graph_pool.py), on the CPU:
what a capture gives back stays the pool's, a request of the same size inside a capture takes
it back, nothing of the pool is handed out after the capture, and releasing the pool frees
it."""
import numpy as np

from minidnn.backend import Device
from minidnn.memory.arena import Arena
from minidnn.memory.graph_pool import GraphPool

MiB = 1024 ** 2


def test_a_captured_steps_blocks_stay_its_own():
    arena = Arena(Device("cpu"), 16 * MiB)
    pool = GraphPool()
    with arena.capturing(pool):
        a = arena.alloc(MiB)
        b = arena.alloc(2 * MiB)
        arena.free(a)
        c = arena.alloc(MiB)              # the same size: a's block again
        arena.free(b)
        arena.free(c)
        kept = arena.alloc(MiB)           # alive after the capture (a step's loss): a's again
    address = a.__array_interface__["data"][0]
    assert c.__array_interface__["data"][0] == address
    assert kept.__array_interface__["data"][0] == address
    assert arena.in_use == 3 * MiB       # b's and a's blocks stay taken
    assert pool.kept_bytes == 2 * MiB    # b's, which no array holds
    outside = arena.alloc(MiB)            # after the capture: never a block of the pool's
    pool_addresses = {x.__array_interface__["data"][0] for x in (a, b)}
    assert outside.__array_interface__["data"][0] not in pool_addresses
    arena.free(kept)                      # dropped later: back to the pool, not the arena
    assert arena.in_use == 4 * MiB
    assert pool.kept_bytes == 3 * MiB
    arena.release_graph_pool(pool)
    assert arena.in_use == MiB            # only `outside` is left
    assert pool.kept_bytes == 0
    arena.free(outside)
    assert arena.in_use == 0
    assert arena.fragmentation() == 0.0


def test_a_block_alive_when_the_pool_is_released_goes_back_when_dropped():
    arena = Arena(Device("cpu"), 8 * MiB)
    pool = GraphPool()
    with arena.capturing(pool):
        loss = arena.alloc(256)
    arena.release_graph_pool(pool)
    assert arena.in_use == 256
    arena.free(loss)
    assert arena.in_use == 0


def test_the_pool_takes_only_exact_sizes():
    pool = GraphPool()
    pool.keep(0, 512)
    assert pool.take(256) is None
    assert pool.take(512) == 0
    assert pool.take(512) is None
    pool.keep(1024, 256)
    assert sorted(pool.clear()) == [1024]
    assert np.isclose(pool.kept_bytes, 0)
