"""Frees ordered by stream waits (Allocator.ordered_frees, MemoryManager.ordered_by_streams), on
the CPU: inside, a block freed behind a copy's event is reused at once and the stream that next
writes such memory waits for the event; no event is asked whether it is done, as none can be
while a step is captured as a CUDA graph (minidnn/step_graph.py)."""
import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.backend import Device
from minidnn.decide import build_executor
from minidnn.memory.allocator import SimpleAllocator
from minidnn.memory.arena import Arena
from minidnn.memory.host import HostSlab
from minidnn.memory.layout import Interval, PlannedBlocks, StaticLayout

from fakes import FakeEvent, KiB, WaitingStream, addr


class CapturedEvent:
    """An event recorded while a step is captured: asking whether it is done is an error."""

    def record(self, stream=None):
        pass

    @property
    def done(self):
        raise AssertionError("an event of a captured step was asked whether it is done")

    def synchronize(self):
        raise AssertionError("an event of a captured step was waited for by the host")


def allocators():
    cpu = Device("cpu")
    return [Arena(cpu, 64 * KiB), HostSlab(cpu, chunk_bytes=64 * KiB),
            SimpleAllocator(np, 64 * KiB)]


@pytest.mark.parametrize("allocator", allocators(), ids=lambda a: type(a).__name__)
def test_inside_a_free_behind_an_event_is_reused_at_once_behind_a_stream_wait(allocator):
    stream = WaitingStream()
    a = allocator.alloc(4 * KiB)
    kept = FakeEvent()
    allocator.free(a, after=kept)                  # before: held until the event is done
    assert allocator.in_use == 4 * KiB
    with allocator.ordered_frees(stream):
        assert allocator.in_use == 0               # the caller waited for the device: settled
        b = allocator.alloc(4 * KiB)
        event = CapturedEvent()
        allocator.free(b, after=event)
        assert allocator.in_use == 0 and stream.waited == [event]
        c = allocator.alloc(4 * KiB)
        if allocator.carves:
            assert addr(c) == addr(b)              # the same block, at once
        allocator.free(c)
    assert kept.waits == 0                         # the host never waited
    d = allocator.alloc(4 * KiB)
    outside = FakeEvent()
    allocator.free(d, after=outside)               # outside again: held as before
    assert allocator.in_use == 4 * KiB and stream.waited == [event]


class _FM:
    def __init__(self, sid, nbytes):
        self.sid, self.nbytes, self.device = sid, nbytes, None


def test_settled_planned_blocks_forget_their_release_events():
    layout = StaticLayout([Interval(0, 0, 1024, 0, 1), Interval(1, 0, 1024, 2, 3)])
    blocks = PlannedBlocks(layout, np.zeros(layout.size, np.uint8), allocator=None)
    a, b = _FM(0, 1024), _FM(1, 1024)
    stream = WaitingStream()
    a.device = blocks.acquire(a, "", stream)
    blocks.release(a, after=CapturedEvent())     # an offload still reads it
    blocks.settle()                              # the capture ended: the event never happens
    b.device = blocks.acquire(b, "", stream)
    assert np.shares_memory(a.device, b.device) and stream.waited == []


def test_a_step_with_offload_inside_runs_without_asking_an_event(monkeypatch):
    """The whole step of a static layout that offloads every map, as it runs while captured:
    every event it records is one no host may ask, and its bits are a plain step's."""
    def run(ordered):
        net = models.build("tiny_cnn", num_classes=10, image_size=16)
        with build_executor(net, 4, device="cpu", seed=1, policy="all",
                            memory_budget="16MiB") as ex:
            assert ex.layout is not None and ex.manager.offload
            opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
            rng = np.random.default_rng(0)
            x = rng.standard_normal((4, 3, 16, 16), np.float32)
            y = rng.integers(0, 10, 4)
            losses = [float(ex.train_step(x, y, opt))]
            if ordered:
                monkeypatch.setattr(ex.device, "event", CapturedEvent)
                with ex.manager.ordered_by_streams():
                    losses.append(float(ex._step(x, y, opt, True)))
                monkeypatch.undo()
            else:
                losses.append(float(ex._step(x, y, opt, True)))
            ex.step += 1
            losses.append(float(ex.train_step(x, y, opt)))   # plain again: nothing stale
            return losses, net.state_dict()

    plain_losses, plain = run(False)
    losses, state = run(True)
    assert losses == plain_losses
    for name, value in plain.items():
        assert np.array_equal(state[name], value), name
