"""Blocks that outlive the call that takes them (Allocator.lasting) come from the top of the
arena, apart from the calls' short-lived blocks, which take theirs by best fit from below.

The evidence is two allocation traces recorded on an H200 (tests/data/arena_traces_h200.json:
every take with its size, what asked and its offset, every free, up to the failure), of small
bf16 networks at the least budget the planner named for them: a ResNet with split batch
statistics in 8 micro-batches, and a VGG in 4 micro-batches with conv1_1..pool1 in 2 pieces.
Both failed in their first step for want of one block while enough bytes were free, in
pieces: a layer's bf16 weight copy, made in its forward and kept for the batch, had been
placed among the short-lived blocks and stayed behind as an island. Replayed through the
arena's BlockList, best fit for every block reproduces each failure at the same offsets; the
same requests with the lasting blocks taken from the top fit.
"""
import json
import os

import numpy as np
import pytest

from minidnn.backend import Device
from minidnn.memory.allocator import ALIGNMENT
from minidnn.memory.arena import Arena
from minidnn.memory.blocks import BlockList

from fakes import KiB

TRACES = os.path.join(os.path.dirname(__file__), "data", "arena_traces_h200.json")


def test_a_top_block_comes_from_the_high_end_of_the_highest_hole_that_fits():
    blocks = BlockList(256)
    blocks.add_region(16 * KiB)
    low = blocks.allocate(KiB)
    top = blocks.allocate(2 * KiB, top=True)
    assert low == 0 and top == 14 * KiB
    mid = blocks.allocate(4 * KiB)                  # best fit from below, under the top block
    blocks.release(low)
    assert blocks.allocate(512, top=True) == 14 * KiB - 512    # the highest hole, not the first
    assert blocks.allocate(64 * KiB, top=True) is None
    assert mid == KiB
    blocks.check_invariants()


def test_inside_lasting_the_arena_takes_from_its_top():
    arena = Arena(Device("cpu"), 64 * KiB)
    first = arena.alloc(KiB)
    with arena.lasting():
        kept = arena.alloc(4 * KiB, "a copy that lasts")
    after = arena.alloc(KiB)
    base = first.__array_interface__["data"][0]
    assert kept.__array_interface__["data"][0] - base == 60 * KiB
    assert after.__array_interface__["data"][0] - base == KiB     # below, by best fit
    arena._blocks.check_invariants()


def lasting_takes(events) -> set:
    """Indexes of the takes the code now makes inside lasting(): a layer's bf16 weight copy
    (taken in its forward, still held when a later call takes a block) and a split step's
    summed gradients."""
    held, lasting = {}, set()
    for i, e in enumerate(events):
        if e[0] == "take":
            held[e[3]] = i
        elif e[0] == "free":
            j = held.pop(e[1])
            what = events[j][2]
            later = {x[2] for x in events[j + 1:i] if x[0] == "take"} - {what}
            if (what.startswith("forward of") and later) or what.endswith("(summed)"):
                lasting.add(j)
    return lasting | {j for j in held.values() if events[j][2].startswith("forward of")}


def replay(trace: dict, lasting: set) -> tuple[bool, list]:
    """The trace's requests through a BlockList of its budget, the `lasting` takes from the
    top: (did the request that failed on the GPU fit, the free blocks then)."""
    blocks = BlockList(ALIGNMENT)
    blocks.add_region(trace["budget"] // ALIGNMENT * ALIGNMENT)
    placed = {}
    for i, e in enumerate(trace["events"]):
        if e[0] == "take":
            offset = blocks.allocate(e[1], top=i in lasting)
            assert offset is not None, f"take {i} ({e[2]}) did not fit"
            if not lasting:
                assert offset == e[3], "best fit places every block where the GPU did"
            placed[e[3]] = offset
        elif e[0] == "free":
            blocks.release(placed.pop(e[1]))
    blocks.check_invariants()
    last = trace["events"][-1]
    assert last[0] == "fail"
    return blocks.allocate(last[1]) is not None, sorted(blocks._free_by_start.items())


@pytest.mark.parametrize("name", ["split_resnet", "chunked_vgg"])
def test_the_h200_traces_fit_with_lasting_blocks_at_the_top(name):
    with open(TRACES) as f:
        trace = json.load(f)[name]
    lasting = lasting_takes(trace["events"])
    assert lasting
    fits, free = replay(trace, set())
    assert not fits and len(free) > 1          # the failure, reproduced: bytes in pieces
    fits, _ = replay(trace, lasting)
    assert fits


def test_a_split_steps_summed_gradients_are_the_only_lasting_blocks_on_the_cpu(monkeypatch):
    """On the CPU (no bf16 weight copies) a micro-batched step takes its summed gradients and
    the rows its fully connected layer's gradients are gathered from (minidnn/gathered.py),
    and nothing else, inside lasting()."""
    from minidnn import SGD
    from minidnn.decide import build_executor
    from test_micro_batches import BATCH, batches, small_net
    seen = []
    take = Arena._take

    def noting(self, nbytes, where):
        seen.append((where or self.current_where, self._lasting > 0))
        return take(self, nbytes, where)

    monkeypatch.setattr(Arena, "_take", noting)
    with build_executor(small_net(np.float32), BATCH, device="cpu", micro_batches=2,
                        memory_budget=64 * 2**20) as ex:
        assert isinstance(ex.allocator, Arena)
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for x, y in batches(2, np.float32):
            ex.train_step(x, y, opt)
    kept = ("(summed)", "(gathered)")
    for kind in kept:
        assert any(w.endswith(kind) for w, _ in seen), kind
    assert all(top for w, top in seen if w.endswith(kept))
    assert not [w for w, top in seen if top and not w.endswith(kept)]


def test_cupys_allocations_inside_lasting_come_from_the_top(monkeypatch):
    """The GPU's route: a bf16 weight copy is a CuPy array (cuda_weights.weights_in), taken
    through the arena's CuPy allocator; inside lasting() it comes from the top."""
    import sys
    from test_arena import _FakeCupy, _FakeGpu
    fake = _FakeCupy()
    monkeypatch.setitem(sys.modules, "cupy", fake)
    arena = Arena(_FakeGpu(), 64 * KiB)
    with arena.route_cupy():
        short = fake.empty(KiB)
        with arena.lasting():
            kept = fake.empty(4 * KiB)
        after = fake.empty(KiB)
        base = arena.base_address
        assert (short.ptr - base, kept.ptr - base, after.ptr - base) == (0, 60 * KiB, KiB)
        del short, kept, after
    assert arena.in_use == 0
    arena._blocks.check_invariants()
