"""Random draws in scratch blocks of the memory manager (layers/draws.py): the same numbers as
the plain generator's, taken from the device allocator in every run, planned in the static
layout, and counted by the planner with the device's generator (issue 14: on an H200 a
dropout's cuRAND generator state, 12.4 MiB, was allocated outside what the plan counts; the
GPU's generator now keeps none, and a modelled one still counts)."""
import dataclasses

import numpy as np
import pytest

from minidnn.assembly import Assembly, DryParts
from minidnn.memory.policy import NO_DECISION
from minidnn.spec import StepSpec
from minidnn import SGD, Network, models
from minidnn.backend import Device
from minidnn.executor import Executor
from minidnn.layers import Dropout, Flatten, Linear, ReLU
from minidnn.layers.base import StepContext
from minidnn.layers.draws import scratch_bytes
from minidnn.memory.allocator import SimpleAllocator
from minidnn.planner.gpus import H200, analytic_profile
from minidnn.planner.profile import measure_profile
from minidnn.planner.search import Planner
from minidnn.planner.step_model import StepModel

MiB = 2**20


class BigGeneratorCpu(Device):
    """The CPU, as if its random generator kept `generator_bytes` of state on the device (as
    CuPy's does): every draw's scratch block then reserves them."""

    def __init__(self, generator_bytes: int):
        super().__init__("cpu")
        self._generator_bytes = int(generator_bytes)


class LoggingAllocator(SimpleAllocator):
    """A counting CPU allocator that notes (bytes, where) of every allocation."""

    def __init__(self):
        super().__init__(np, None)
        self.requests = []

    def alloc(self, nbytes, where=""):
        self.requests.append((int(nbytes), where or self.current_where))
        return super().alloc(nbytes, where)


def dropout_net(width=256) -> Network:
    """data (8,) -> fc1 width -> relu -> dropout -> fc2 10 -> loss."""
    return Network.sequential((8,), [
        Flatten(name="flat"), Linear(width, name="fc1"), ReLU(name="relu1"),
        Dropout(0.5, name="drop"), Linear(10, name="fc2")], num_classes=10)


@pytest.mark.parametrize("global_batch, offset", [(None, 0), (12, 4)])
def test_draws_made_in_a_scratch_block_are_the_generators_own_numbers(global_batch, offset):
    layer = Dropout(0.5)
    layer.setup([(4, 3, 5)])
    shape = (4, 3, 5)
    plain = StepContext(np, step=3, seed=11, batch_offset=offset, global_batch=global_batch)
    block = np.zeros(scratch_bytes(shape, 0), np.uint8)
    inside = StepContext(np, step=3, seed=11, batch_offset=offset, global_batch=global_batch,
                         device=Device("cpu"), scratch=block)
    want = plain.uniform_rows(layer, shape)
    got = inside.uniform_rows(layer, shape)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.float32 and np.shares_memory(got, block)
    assert block.nbytes == 4 * int(np.prod(shape))     # the call's own rows only


@pytest.mark.parametrize("budget", [None, 64 * MiB])
def test_a_training_step_takes_each_dropout_draw_from_the_memory_manager(budget):
    """The draws come out of the device allocator (without a budget) or are a block of the
    static layout (with one), sized for the generator too; the masks stay those of a plain
    draw."""
    net, batch, gen = dropout_net(), 16, 3 * MiB
    net.init_params(0)
    x = np.random.default_rng(0).standard_normal((batch, 8)).astype(np.float32)
    y = np.arange(batch) % 10
    need = scratch_bytes((batch, 256), gen)
    allocator = LoggingAllocator() if budget is None else None
    setup = Assembly(net, StepSpec(batch=batch, memory_budget=budget), NO_DECISION,
                     BigGeneratorCpu(gen), dry=DryParts(allocator=allocator))
    with Executor.assembled(setup) as ex:
        ex.forward(x, y)
        mask = ex.manager.view("drop:mask").copy()
        ex.backward()
        if budget is None:
            assert (need, "random draws of drop (forward)") in allocator.requests
        else:
            drop = net.nodes.index(net.node("drop"))
            planned = ex.layout.intervals[(("scratch", drop, "forward"), 0)]
            assert planned.nbytes == need
            assert ex.memory_stats()["unplanned_blocks"] == 0
        assert ex.memory_stats()["peak_device_bytes"] >= need
    layer = net.node("drop").layer
    draws = StepContext(np, step=0, seed=0).uniform_rows(layer, (batch, 256))
    np.testing.assert_array_equal(mask, draws >= np.float32(0.5))


@pytest.mark.parametrize("static_layout", [True, False])
def test_the_plan_counts_the_generator_and_the_draws_of_a_dropout(static_layout):
    """tiny_cnn at batch 16: its dropout draws 4 KiB; on the H200 with no generator state (the
    GPU's generator is counter-based), and with a modelled 12.4 MiB one (CuPy's cuRAND
    generator's on an H200)."""
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    batch = 16
    assert analytic_profile(net, batch, "h200").generator_bytes == H200.generator_bytes == 0
    prof = dataclasses.replace(analytic_profile(net, batch, "h200"), generator_bytes=12976128)
    model = StepModel(net, batch, prof, static_layout=static_layout, input_batches=0,
                      momentum=False)
    ev = model.evaluate(frozenset())
    draws = scratch_bytes(net.node("drop3").layer.in_shapes[0], prof.generator_bytes)
    assert ev.required_bytes >= model.param_grad_bytes + draws
    assert ev.peak_bytes >= model.param_grad_bytes + draws


def test_a_budget_equal_to_the_unconstrained_peak_holds_the_planned_run():
    """Issue 14 on the CPU, with a generator as large as a GPU's: dyn plans for a budget equal
    to the unconstrained run's peak, the run stays in it, and the plan's peak is the run's."""
    net, batch = dropout_net(width=512), 32
    device = BigGeneratorCpu(4 * MiB)
    net.init_params(0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    y = rng.integers(0, 10, batch)

    def run(budget, decision=None):
        with Executor(net, batch, device=device, memory_budget=budget, decision=decision,
                      seed=3) as ex:
            opt = SGD(net.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
            for _ in range(2):
                ex.train_step(x, y, opt)
            return ex.memory_stats()["peak_device_bytes"]

    free_peak = run(None)
    assert free_peak >= 4 * MiB
    prof = measure_profile(net, batch, device, repeats=1)
    assert prof.generator_bytes == 4 * MiB
    # No share kept for fragmentation: the static layout has none, and the budget is tight.
    plan = Planner(net, batch, prof, budget=free_peak, input_batches=0, reserve=0.0).run().best
    assert plan.fits
    measured = run(free_peak, dataclasses.replace(plan.decision, prefetch_lookahead=1))
    assert measured <= free_peak
    assert abs(plan.peak_bytes - measured) <= 0.05 * measured


def test_the_gpu_generator_reference_is_splitmix64():
    """The NumPy reference of the GPU's counter-based draws (kernels/cuda_random.py) against
    splitmix64 written out in Python integers (Java's SplittableRandom), and in [0, 1)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "minidnn", "kernels", "cuda_random.py")
    source = open(path).read()
    # The reference needs no GPU: run the module's NumPy part without importing CuPy.
    namespace = {}
    exec(compile(source.replace("import cupy as cp\n", "cp = None\n").replace(
        "_module = cp.RawModule(code=_SOURCE)", "_module = None"), path, "exec"), namespace)
    key, n = 0x123456789ABCDEF, 1000
    mask = 2**64 - 1
    want = []
    for i in range(1, n + 1):
        z = (key + i * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        want.append((z >> 40) / 2**24)
    got = namespace["draws"](key, n)
    assert got.dtype == np.float32 and np.array_equal(got, np.array(want, np.float32))
    assert importlib.util.find_spec("minidnn.kernels.cuda_random") is not None
