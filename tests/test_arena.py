"""The budgeted device arena (memory/arena.py) and its free list (memory/blocks.py), on the CPU."""
import numpy as np
import pytest

from minidnn.backend import Device
from minidnn.errors import ConfigError, MemoryBudgetError
from minidnn.memory.allocator import ALIGNMENT, SimpleAllocator
from minidnn.memory.arena import Arena, make_allocator
from minidnn.memory.blocks import BlockList

from fakes import FakeEvent, KiB, addr


@pytest.fixture
def cpu():
    return Device("cpu")


def test_every_block_is_aligned_and_inside_the_arena(cpu):
    arena = Arena(cpu, 64 * KiB)
    bufs = [arena.alloc(n) for n in (1, 255, 256, 257, 1000, 3, 4096, 17)]
    for buf, n in zip(bufs, (1, 255, 256, 257, 1000, 3, 4096, 17)):
        assert addr(buf) % ALIGNMENT == 0
        assert buf.dtype == np.uint8 and buf.nbytes == -(-n // ALIGNMENT) * ALIGNMENT
        assert arena.owns(addr(buf)) and arena.owns(addr(buf) + buf.nbytes - 1)
    assert arena.in_use == sum(b.nbytes for b in bufs)
    arena._blocks.check_invariants()


def test_in_use_peak_and_reset_peak(cpu):
    arena = Arena(cpu, 16 * KiB)
    a = arena.alloc(4 * KiB)
    b = arena.alloc(2 * KiB)
    assert (arena.in_use, arena.peak) == (6 * KiB, 6 * KiB)
    arena.free(a)
    assert (arena.in_use, arena.peak) == (2 * KiB, 6 * KiB)
    arena.reset_peak()
    assert arena.peak == 2 * KiB
    arena.free(b)
    assert arena.in_use == 0
    s = arena.stats()
    assert s["allocs"] == 2 and s["frees"] == 2 and s["budget"] == 16 * KiB
    assert s["free"] == 16 * KiB and s["num_blocks"] == 0


def test_free_middle_then_neighbours_coalesces_into_one_block(cpu):
    arena = Arena(cpu, 8 * KiB)
    a, b, c = arena.alloc(2 * KiB), arena.alloc(2 * KiB), arena.alloc(2 * KiB)
    d = arena.alloc(2 * KiB)                       # arena now full
    assert arena.free_bytes == 0 and arena.fragmentation() == 0.0
    arena.free(b)
    arena.free(d)                                  # two holes that are not neighbours
    assert arena.stats()["num_free_blocks"] == 2
    assert arena.fragmentation() == pytest.approx(0.5)
    arena.free(a)                                  # a + b merge
    arena.free(c)                                  # a+b + c + d merge
    s = arena.stats()
    assert s["num_free_blocks"] == 1 and s["largest_free_block"] == 8 * KiB
    assert arena.fragmentation() == 0.0
    arena._blocks.check_invariants()
    # The whole budget is one block again: a single allocation of all of it succeeds.
    whole = arena.alloc(8 * KiB)
    assert whole.nbytes == 8 * KiB


def test_best_fit_picks_the_smallest_hole_that_fits(cpu):
    arena = Arena(cpu, 64 * KiB)
    # Holes of 4, 1 and 2 KiB, in that address order, separated by live blocks.
    h4, s1, h1, s2, h2, s3 = (arena.alloc(n * KiB) for n in (4, 1, 1, 1, 2, 1))
    for hole in (h4, h1, h2):
        arena.free(hole)
    one = arena.alloc(1 * KiB)
    assert addr(one) == addr(h1)                   # first-fit would have taken the 4 KiB hole
    onehalf = arena.alloc(1536)
    assert addr(onehalf) == addr(h2)
    three = arena.alloc(3 * KiB)
    assert addr(three) == addr(h4)


def test_full_arena_raises_with_the_numbers(cpu):
    arena = Arena(cpu, 4 * KiB)
    arena.alloc(3 * KiB)
    arena.current_where = "forward of conv3"
    with pytest.raises(MemoryBudgetError) as e:
        arena.alloc(2 * KiB)
    err = e.value
    assert (err.requested, err.in_use, err.budget) == (2 * KiB, 3 * KiB, 4 * KiB)
    assert err.where == "forward of conv3"
    msg = str(err)
    assert "forward of conv3" in msg and "2.00 KiB" in msg and "3.00 KiB" in msg
    assert "4.00 KiB" in msg and "fragmentation" not in msg
    # An explicit `where` wins over current_where.
    with pytest.raises(MemoryBudgetError, match="in backward of fc8"):
        arena.alloc(2 * KiB, where="backward of fc8")
    with pytest.raises(MemoryBudgetError, match="larger than the budget"):
        arena.alloc(8 * KiB)
    assert arena.in_use == 3 * KiB                 # failed requests leave nothing behind


def test_fragmentation_is_named_when_total_free_would_suffice(cpu):
    arena = Arena(cpu, 4 * KiB)
    blocks = [arena.alloc(1 * KiB) for _ in range(4)]
    arena.free(blocks[0])
    arena.free(blocks[2])                          # 2 KiB free, in two 1 KiB pieces
    with pytest.raises(MemoryBudgetError) as e:
        arena.alloc(2 * KiB, where="forward of pool1")
    msg = str(e.value)
    assert "fragmentation" in msg and "2.00 KiB is free" in msg and "1.00 KiB" in msg


def test_pending_free_is_not_reused_until_its_event_completes(cpu):
    arena = Arena(cpu, 8 * KiB)
    a = arena.alloc(2 * KiB)
    event = FakeEvent()
    arena.free(a, after=event)
    assert arena.in_use == 2 * KiB                 # still held: a copy may read it
    assert arena.stats()["pending"] == 1
    b = arena.alloc(2 * KiB)
    assert addr(b) != addr(a)                      # there was room elsewhere: no waiting
    assert event.waits == 0
    event.complete()
    c = arena.alloc(2 * KiB)                       # reclaimed at this alloc, best fit reuses it
    assert addr(c) == addr(a)
    assert arena.stats()["pending"] == 0 and event.waits == 0
    assert arena.in_use == 4 * KiB


def test_alloc_under_pressure_waits_on_pending_frees_oldest_first(cpu):
    arena = Arena(cpu, 4 * KiB)
    bufs = [arena.alloc(1 * KiB) for _ in range(4)]
    events = [FakeEvent() for _ in range(3)]
    for buf, ev in zip(bufs, events):
        arena.free(buf, after=ev)
    got = arena.alloc(1 * KiB)                     # full: must wait, only on the oldest
    assert [ev.waits for ev in events] == [1, 0, 0]
    assert addr(got) == addr(bufs[0])
    big = arena.alloc(2 * KiB)                     # waits on the next two, which then merge
    assert [ev.waits for ev in events] == [1, 1, 1]
    assert addr(big) == addr(bufs[1])
    with pytest.raises(MemoryBudgetError):         # nothing pending left to wait for
        arena.alloc(1 * KiB)


def test_done_events_release_at_once(cpu):
    arena = Arena(cpu, 4 * KiB)
    a = arena.alloc(4 * KiB)
    arena.free(a, after=cpu.event())               # the CPU stand-in is always complete
    assert arena.in_use == 0 and arena.stats()["pending"] == 0


def test_empty_gives_a_typed_view_of_an_arena_block(cpu):
    arena = Arena(cpu, 64 * KiB)
    x, buf = arena.empty((3, 5, 7), np.float32, where="forward of conv1")
    assert x.shape == (3, 5, 7) and x.dtype == np.float32
    assert addr(x) == addr(buf) and arena.owns(addr(x))
    x[...] = np.arange(105, dtype=np.float32).reshape(3, 5, 7)
    assert np.frombuffer(buf[:x.nbytes].tobytes(), np.float32)[104] == 104
    z, zbuf = arena.empty((0, 4), np.float64)
    assert z.shape == (0, 4) and zbuf.nbytes == ALIGNMENT
    arena.free(buf)
    arena.free(zbuf)
    assert arena.in_use == 0


def test_free_refuses_foreign_buffers_and_double_frees(cpu):
    arena = Arena(cpu, 8 * KiB)
    a = arena.alloc(1 * KiB)
    with pytest.raises(ValueError, match="did not hand out"):
        arena.free(np.empty(1024, np.uint8))
    with pytest.raises(ValueError, match="did not hand out"):
        arena.free(a[:512])                        # a slice is not the block
    arena.free(a)
    with pytest.raises(ValueError, match="freed twice"):
        arena.free(a)
    assert arena.in_use == 0


def test_randomized_alloc_free_against_a_model(cpu):
    """Random sizes, orders and stream-ordered frees, checked against a simple model: blocks
    never overlap, contents survive, in_use = live blocks + frees whose event the arena has
    not yet seen complete (the contract: reclaimed at the next alloc, or waited on)."""
    rng = np.random.default_rng(0)
    budget = 1024 * KiB
    arena = Arena(cpu, budget)
    live = {}                                      # address -> (buf, fill byte)
    pending = []                                   # (nbytes, event) freed behind an event
    failures = 0

    def model_in_use():
        return sum(b.nbytes for b, _ in live.values()) + sum(n for n, _ in pending)

    for step in range(3000):
        if live and (rng.random() < 0.45 or model_in_use() > 0.9 * budget):
            a = list(live)[rng.integers(len(live))]
            buf, fill = live.pop(a)
            assert (buf == fill).all(), "a block's contents were overwritten by another"
            event = FakeEvent() if rng.random() < 0.2 else None
            arena.free(buf, after=event)
            if event is not None:
                pending.append((buf.nbytes, event))
                if rng.random() < 0.5:
                    event.complete()               # completes now, reclaimed at the next alloc
        else:
            n = int(rng.choice([rng.integers(1, 600), rng.integers(1, 40 * KiB)]))
            try:
                buf = arena.alloc(n)
            except MemoryBudgetError as e:
                failures += 1
                assert e.requested > arena.largest_free_block
                assert not any(not ev.done for _, ev in pending)   # it waited on all
                buf = None
            pending = [(m, ev) for m, ev in pending if not ev.done]
            if buf is not None:
                assert buf.nbytes >= n and addr(buf) % ALIGNMENT == 0
                assert arena.owns(addr(buf))
                fill = step % 251 + 1
                buf[:] = fill
                live[addr(buf)] = (buf, fill)
        assert arena.in_use == model_in_use()
        assert arena.peak >= arena.in_use
        if step % 50 == 0:
            arena._blocks.check_invariants()
            spans = sorted((a, a + b.nbytes) for a, (b, _) in live.items())
            assert all(e1 <= s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))
    for buf, fill in list(live.values()):
        assert (buf == fill).all()
        arena.free(buf)
    for _, ev in pending:
        ev.complete()
    arena.free(arena.alloc(1))                     # any alloc reclaims completed frees
    assert arena.in_use == 0 and arena.fragmentation() == 0.0
    assert arena.largest_free_block == budget
    arena._blocks.check_invariants()
    assert 0 < failures < 3000 // 4                # the sequence did reach the budget


def test_budget_rules_and_allocator_choice(cpu):
    with pytest.raises(ValueError, match="make_allocator"):
        Arena(cpu, None)
    with pytest.raises(ConfigError, match="at least 256"):
        Arena(cpu, 100)
    with pytest.raises(ConfigError, match="whole number"):
        Arena(cpu, 1.5e6)
    assert isinstance(make_allocator(cpu, None), SimpleAllocator)
    arena = make_allocator(cpu, 10_000)
    assert isinstance(arena, Arena) and arena.budget == 10_000
    assert arena.stats()["capacity"] == 10_000 // ALIGNMENT * ALIGNMENT


def test_route_cupy_is_a_no_op_on_the_cpu_and_close_ends_the_arena(cpu):
    with Arena(cpu, 4 * KiB) as arena:
        with arena.route_cupy() as routed:
            assert routed is arena
        a = arena.alloc(1 * KiB)
        a[:] = 7
    assert (a == 7).all()                          # views stay valid after close
    arena.free(a)                                  # ignored once closed
    with pytest.raises(RuntimeError, match="closed"):
        arena.alloc(1 * KiB)


def test_block_list_regions_never_merge_across_boundaries():
    blocks = BlockList(256)
    r0 = blocks.add_region(1024)
    r1 = blocks.add_region(1024 + 100)             # rounded down to the alignment
    assert (r0, r1, blocks.capacity) == (0, 1024, 2048)
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 2, 0, 3]):
        offs = [blocks.allocate(512) for _ in range(4)]
        assert offs == [0, 512, 1024, 1536]
        for k in order:
            blocks.release(offs[k])
            blocks.check_invariants()
        assert blocks.num_free_blocks == 2 and blocks.largest_free == 1024
    assert blocks.allocate(2048) is None
    assert blocks.region_index(1023) == 0 and blocks.region_index(1024) == 1
    with pytest.raises(KeyError):
        blocks.release(0)


# ---- routing CuPy's allocator, with a stand-in for the few CuPy calls the arena makes --------
class _FakeCupy:
    """Just enough of CuPy's allocator API (cuda.Memory, UnownedMemory, MemoryPointer,
    get_allocator / set_allocator, ndarray over a MemoryPointer) to run the arena's GPU
    bookkeeping on the CPU. Device memory is a NumPy array; pointers are its addresses."""

    uint8 = np.uint8

    def __init__(self):
        fake = self

        class Memory:
            def __init__(self, size):
                self._host = np.empty(size + 512, np.uint8)
                self.ptr = 0 if size == 0 else -addr(self._host) % 512 + addr(self._host)
                self.size = size

        class UnownedMemory:
            def __init__(self, ptr, size, owner, device_id=-1):
                self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id

        class MemoryPointer:
            def __init__(self, mem, offset):
                self.mem, self.ptr = mem, mem.ptr + offset

        class ndarray:
            def __init__(self, shape, dtype, memptr):
                self.data, self.nbytes, self.dtype = memptr, int(np.prod(shape)), dtype

        class Dev:
            id = 0

        class runtime:
            CUDARuntimeError = RuntimeError

            @staticmethod
            def memGetInfo():
                return (1 << 30) + (512 << 20), 2 << 30

        class Pool:
            def free_all_blocks(self):
                pass

        def default_allocator(size):
            return MemoryPointer(Memory(size), 0)

        self.allocator = default_allocator
        self.cuda = type("cuda", (), dict(
            Memory=Memory, UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
            Device=Dev, runtime=runtime,
            get_allocator=staticmethod(lambda: fake.allocator),
            set_allocator=staticmethod(lambda a: setattr(fake, "allocator", a))))
        self.ndarray = ndarray
        self.get_default_memory_pool = Pool

    def empty(self, nbytes):
        """What cupy.empty does with memory: ask the current allocator."""
        return self.allocator(nbytes)


class _FakeGpu:
    kind = "gpu"
    is_gpu = True


@pytest.fixture
def fake_cupy(monkeypatch):
    import sys
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_routed_allocations_come_from_the_arena_and_return_when_dropped(fake_cupy):
    arena = Arena(_FakeGpu(), 64 * KiB)
    default = fake_cupy.cuda.get_allocator()
    with arena.route_cupy():
        assert fake_cupy.cuda.get_allocator() is not default
        x = fake_cupy.empty(10 * KiB)
        y = fake_cupy.empty(1000)
        assert arena.owns(x.ptr) and arena.owns(y.ptr) and x.ptr % ALIGNMENT == 0
        assert x.mem.size == 10 * KiB and y.mem.size == 1024
        assert arena.in_use == 11 * KiB and arena.stats()["cupy_blocks"] == 2
        buf = arena.alloc(4 * KiB)                 # the manager's buffers share the budget
        assert arena.owns(buf.data.ptr) and buf.data.ptr not in (x.ptr, y.ptr)
        del x                                      # CuPy drops the array: its block returns
        assert arena.in_use == 5 * KiB
        zero = fake_cupy.empty(0)                  # empty arrays take no block
        assert zero.ptr == 0 and arena.in_use == 5 * KiB
        arena.current_where = "forward of conv3"
        with pytest.raises(MemoryBudgetError, match="in forward of conv3") as e:
            fake_cupy.empty(64 * KiB)
        assert e.value.requested == 64 * KiB and e.value.in_use == 5 * KiB
        del y
        arena.free(buf)
    assert fake_cupy.cuda.get_allocator() is default
    assert arena.in_use == 0 and arena.fragmentation() == 0.0
    arena._blocks.check_invariants()


def test_blocks_held_by_reference_cycles_are_collected_before_failing(fake_cupy):
    import gc
    arena = Arena(_FakeGpu(), 8 * KiB)
    gc.disable()                                   # keep the cycle alive until the arena acts
    try:
        with arena.route_cupy():
            cycle = [fake_cupy.empty(6 * KiB)]
            cycle.append(cycle)
            del cycle                              # unreachable, but not freed by refcounting
            assert arena.in_use == 6 * KiB
            again = fake_cupy.empty(6 * KiB)       # would not fit: the arena runs the collector
            assert arena.owns(again.ptr) and arena.in_use == 6 * KiB
    finally:
        gc.enable()


def test_routed_blocks_outlive_a_closed_arena(fake_cupy):
    arena = Arena(_FakeGpu(), 8 * KiB)
    arena.install()
    x = fake_cupy.empty(1 * KiB)
    memory = arena._memory
    arena.close()                                  # uninstalls, drops the reservation
    assert fake_cupy.cuda.get_allocator() is not arena._cupy_malloc
    assert x.mem._owner._memory is memory          # the array still keeps the memory alive
    del x                                          # returning it to a closed arena is harmless
    arena.stats()


def test_gpu_arena_without_a_budget_keeps_a_safety_margin(fake_cupy):
    arena = Arena(_FakeGpu(), None)                # the stand-in reports 1.5 GiB free
    assert arena.budget == 1 << 30


def test_arenas_routed_in_turn_can_be_closed_in_any_order(fake_cupy):
    default = fake_cupy.cuda.get_allocator()
    first, second = Arena(_FakeGpu(), 8 * KiB), Arena(_FakeGpu(), 8 * KiB)
    first.install()
    second.install()
    first.close()                                  # not the newest: CuPy stays with `second`
    assert fake_cupy.cuda.get_allocator() == second._cupy_malloc
    assert second.owns(fake_cupy.empty(KiB).ptr)
    second.close()
    assert fake_cupy.cuda.get_allocator() is default
