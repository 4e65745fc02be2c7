"""StepGraphs (minidnn/step_graph.py) on the CPU, with a stand-in for CuPy's stream capture:
which steps run plainly, when a step is captured and when a graph is launched instead, one
graph per input address and per optimizer setting, a loss slot per replay, and a failed
capture that ends in plain steps with a warning and the pool given back. The replays' bits
against plain steps are checked on a GPU (test_step_graph_gpu.py)."""
import sys
import types

import numpy as np
import pytest

from minidnn.backend import Device
from minidnn.memory.arena import Arena
from minidnn.step_graph import LOSS_SLOTS, MAX_GRAPHS, WARMUP, StepGraphs

MiB = 1024 ** 2


class DeviceArray:
    """What StepGraphs reads of an input: its address, shape, strides and dtype."""

    def __init__(self, ptr, shape=(4, 3), dtype=np.float32):
        self.data = types.SimpleNamespace(ptr=ptr)
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.strides = tuple(int(np.prod(shape[i + 1:])) * self.dtype.itemsize
                             for i in range(len(shape)))


class Slots(np.ndarray):
    """CuPy's a[i] is a 0-d array one can write into; NumPy's is a scalar."""

    def __getitem__(self, index):
        return np.ndarray.__getitem__(self, (index, Ellipsis)) if isinstance(index, int) \
            else np.ndarray.__getitem__(self, index)


class Graph:
    def __init__(self, replay):
        self.replay, self.launches = replay, 0

    def upload(self, stream):
        pass

    def launch(self, stream):
        self.launches += 1
        self.replay()


class Stream:
    """Capture: the step's Python runs, and its 'kernels' (callables it queues) are kept. A copy
    stream takes part in a capture once it waits for the captured stream (`fork`); as in CUDA,
    the capture must end with it joined back (the captured stream waits for its last work)."""

    def __init__(self, sides=()):
        self.capturing, self.queued, self.waited, self.sides = False, [], [], list(sides)

    def is_capturing(self):
        return self.capturing

    def wait_event(self, event):
        self.waited.append(event)

    def fork(self):
        self.capturing = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self, mode):
        self.capturing, self.queued = True, []

    def end_capture(self):
        self.capturing = False
        for side in self.sides:
            joined = any(ev.stream is side for ev in self.waited)
            if side.capturing and not joined:
                raise RuntimeError("operation not permitted when stream is capturing "
                                   "(a forked stream was not joined)")
            side.capturing = False
        queued = self.queued
        return Graph(lambda: [kernel() for kernel in queued])


class Event:
    def record(self, stream):
        self.stream = stream


class Optimizer:
    def __init__(self, lr=0.1):
        self.lr = lr
        self.written = []    # the rates written before replays

    def graph_key(self):
        return (self.lr,)

    def write_lr(self):
        self.written.append(self.lr)


@pytest.fixture
def fake_cupy(monkeypatch):
    fake = types.SimpleNamespace(
        ndarray=DeviceArray,
        zeros=lambda n, dtype: np.zeros(n, dtype).view(Slots),
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(streamCaptureModeRelaxed=1)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


class Executor:
    """A plain step that queues one 'kernel': it writes the step's loss, 1 + the times run."""

    def __init__(self, fail=False, copies=False):
        offload, prefetch = Stream(), Stream()
        self.device = types.SimpleNamespace(compute=Stream((offload, prefetch)), offload=offload,
                                            prefetch=prefetch, synchronize=lambda: None,
                                            event=Event)
        self.allocator = Arena(Device("cpu"), 16 * MiB)
        self.plain, self.ran, self.fail, self.copies = 0, 0, fail, copies

    def run_step(self, x, labels, optimizer, dropout, step_keys):
        stream = self.device.compute
        if self.fail and stream.capturing:
            raise RuntimeError("not capturable")
        if self.copies and stream.capturing:
            self.device.offload.fork()             # an offload waited for the compute stream
        loss = np.zeros((), np.float32)
        scratch = self.allocator.alloc(MiB)        # a temporary of the step

        def kernel():
            self.ran += 1
            loss[...] = self.ran
        if stream.capturing:
            stream.queued.append(kernel)
        else:
            self.plain += 1
            kernel()
        self.allocator.free(scratch)
        return loss

    def graphs(self):
        return StepGraphs(self.device, self.allocator, self.run_step, 0, (), bind=lambda: None)


def warmed_up(ex):
    """(graphs, x, labels, optimizer) after the plain steps before the first capture."""
    graphs = ex.graphs()
    x, y, opt = DeviceArray(1000), DeviceArray(2000, (4,), np.int64), Optimizer()
    for step in range(WARMUP):
        graphs.step(x, y, opt, True, step)
    return graphs, x, y, opt


def test_warm_up_then_capture_once_then_replay(fake_cupy):
    ex = Executor()
    graphs = ex.graphs()
    x, y, opt = DeviceArray(1000), DeviceArray(2000, (4,), np.int64), Optimizer()
    for step in range(WARMUP):
        assert graphs.step(x, y, opt, True, step) is None      # the caller runs it plainly
    losses = [graphs.step(x, y, opt, True, WARMUP + k) for k in range(5)]
    assert graphs.count == 1 and ex.plain == 0 and ex.ran == 5 and graphs.replays == 5
    assert graphs.captured_at == [WARMUP]     # the report leaves that step's time out
    assert [float(loss) for loss in losses] == [1, 2, 3, 4, 5]   # each replay's own slot
    assert ex.allocator.in_use == MiB        # the captured step's temporary stays its graph's
    graphs.close()
    assert ex.allocator.in_use == 0


def test_one_graph_per_input_address_and_setting(fake_cupy):
    ex = Executor()
    graphs = ex.graphs()
    y, opt = DeviceArray(2000, (4,), np.int64), Optimizer()
    for step in range(WARMUP):
        graphs.step(DeviceArray(1000), y, opt, True, step)
    for ptr in range(MAX_GRAPHS):
        assert graphs.step(DeviceArray(ptr * 64), y, opt, True, 9) is not None
    assert graphs.count == MAX_GRAPHS
    assert graphs.step(DeviceArray(999_999), y, opt, True, 9) is None   # past the limit
    assert graphs.step(DeviceArray(0), y, opt, True, 9) is not None     # a known one
    opt.lr = 0.05                                            # another update: another graph,
    assert graphs.step(DeviceArray(0), y, opt, True, 9) is None         # none left to make
    assert graphs.step(DeviceArray(0), y, opt, False, 9) is None        # nor without dropout
    assert ex.allocator.in_use == MiB        # the graphs share one pool: one step's memory


def test_host_inputs_run_plainly(fake_cupy):
    graphs = Executor().graphs()
    x = np.zeros((4, 3), np.float32)
    for step in range(WARMUP + 2):
        assert graphs.step(x, np.zeros(4, np.int64), Optimizer(), True, step) is None
    assert graphs.count == 0


def test_a_failed_capture_warns_and_leaves_plain_steps(fake_cupy):
    ex = Executor(fail=True)
    graphs, x, y, opt = warmed_up(ex)
    with pytest.warns(RuntimeWarning, match="could not be captured.*not capturable"):
        assert graphs.step(x, y, opt, True, WARMUP) is None
    assert graphs.given_up.startswith("RuntimeError at step_graph.py:")   # innermost in minidnn
    assert graphs.step(x, y, opt, True, WARMUP + 1) is None
    assert ex.allocator.in_use == 0          # nothing kept for a graph that never was


def test_the_loss_slots_come_round_after_LOSS_SLOTS_replays(fake_cupy):
    ex = Executor()
    graphs, x, y, opt = warmed_up(ex)
    first = graphs.step(x, y, opt, True, WARMUP)
    for k in range(LOSS_SLOTS - 1):
        graphs.step(x, y, opt, True, k)
    assert float(first) == 1
    graphs.step(x, y, opt, True, 0)
    assert float(first) == LOSS_SLOTS + 1


def test_a_capture_joins_the_copy_streams_it_forked(fake_cupy):
    ex = Executor(copies=True)
    graphs, x, y, opt = warmed_up(ex)
    assert graphs.step(x, y, opt, True, WARMUP) is not None and graphs.given_up is None
    joined = [ev.stream for ev in ex.device.compute.waited]
    assert joined == [ex.device.offload]       # the prefetch stream took no part: no join
