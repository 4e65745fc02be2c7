"""The arena memory of steps captured as CUDA graphs (memory/graph_pool.py), on the CPU: a
captured step allocates and reuses as a plain one does, the addresses it took are the pool's
when the capture ends, nothing of the pool is handed out after it, a block alive then joins
the pool when dropped, and releasing the pool gives everything back."""
from minidnn.backend import Device, address
from minidnn.memory.arena import Arena
from minidnn.memory.blocks import BlockList
from minidnn.memory.graph_pool import GraphPool

MiB = 1024 ** 2


def test_a_captured_steps_addresses_stay_its_own():
    arena = Arena(Device("cpu"), 16 * MiB)
    pool = GraphPool()
    with arena.capturing(pool):
        a = arena.alloc(MiB)
        b = arena.alloc(2 * MiB)
        arena.free(a)
        c = arena.alloc(MiB)              # reused as a plain step reuses: a's block
        arena.free(b)
        arena.free(c)
        kept = arena.alloc(MiB)           # alive after the capture (a step's loss)
    assert address(c) == address(a) == address(kept)
    assert arena.peak == 3 * MiB          # the step needed 3 MiB, and so does its graph
    assert arena.in_use == 3 * MiB        # `kept`, and b's range claimed for the pool
    assert pool.held == 1
    outside = arena.alloc(MiB)            # after the capture: never inside the pool's range
    assert not address(a) <= address(outside) < address(b) + 2 * MiB
    arena.free(kept)                      # dropped later: to the pool, not the arena
    assert arena.in_use == 4 * MiB and pool.held == 2
    arena.release_graph_pool(pool)
    assert arena.in_use == MiB            # only `outside` is left
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


def test_the_pool_merges_the_ranges_taken():
    pool = GraphPool()
    for offset, size in ((512, 256), (0, 256), (256, 256), (2048, 256), (2100, 100)):
        pool.taken(offset, size)
    assert pool.ranges() == [(0, 768), (2048, 2304)]
    pool.taken(768, 256)                  # a later capture: its ranges join the earlier ones
    assert pool.ranges() == [(0, 1024), (2048, 2304)]


def test_a_claim_takes_only_the_free_parts_of_a_range():
    blocks = BlockList(256)
    blocks.add_region(4096)
    a = blocks.allocate(1024)             # [0, 1024)
    b = blocks.allocate(1024)             # [1024, 2048)
    blocks.release(a)
    assert blocks.claim(512, 3072) == [(512, 512), (2048, 1024)]   # b stays b's
    assert blocks.used == 1024 + 512 + 1024
    assert blocks.allocate(512) == 0      # below the claim, still free
    assert blocks.allocate(1024) == 3072  # above it
    for offset in (0, 512, b, 2048, 3072):
        blocks.release(offset)
    assert blocks.used == 0 and blocks.num_free_blocks == 1
    blocks.check_invariants()


def test_a_second_capture_works_in_the_first_ones_memory():
    arena = Arena(Device("cpu"), 16 * MiB)
    pool = GraphPool()
    with arena.capturing(pool):
        arena.free(arena.alloc(2 * MiB))
    with arena.capturing(pool):           # lent the first graph's 2 MiB, then claims them again
        first = arena.alloc(2 * MiB)
        arena.free(first)
        arena.free(arena.alloc(3 * MiB))
    assert address(first) == arena.base_address
    assert arena.in_use == 3 * MiB        # what the larger capture took, not 2 + 3
    arena.release_graph_pool(pool)
    assert arena.in_use == 0
