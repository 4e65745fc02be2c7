"""A call draws only its own rows of the whole batch's random numbers (layers/draws.py): the
same numbers as the whole batch's draws, row for row, in a scratch block of the size its
layer declares, so that a rank's step (or a micro-batch's, or a chunk piece's) allocates
what the step model of that step counts, whatever the batch around it."""
import numpy as np
import pytest

from minidnn import Network
from minidnn.assembly import Assembly
from minidnn.backend import Device, gpu_available
from minidnn.executor import Executor
from minidnn.layers import Dropout, Flatten, Linear, ReLU
from minidnn.layers.base import StepContext
from minidnn.layers.draws import scratch_bytes, skip_draws, uniform_rows_into
from minidnn.memory.policy import NO_DECISION
from minidnn.planner.profile import untimed_profile
from minidnn.planner.step_model import StepModel
from minidnn.spec import StepSpec


def dropout_net() -> Network:
    """data (8,) -> fc1 24 -> relu -> dropout -> fc2 10 -> loss."""
    return Network.sequential((8,), [
        Flatten(name="flat"), Linear(24, name="fc1"), ReLU(name="relu1"),
        Dropout(0.5, name="drop"), Linear(10, name="fc2")], num_classes=10)


@pytest.mark.parametrize("first, rows", [(0, 3), (1, 2), (3, 4), (5, 2), (7, 1)])
@pytest.mark.parametrize("in_block", [False, True])
def test_a_calls_rows_are_those_of_the_whole_batchs_draws(first, rows, in_block):
    """Rows [first, first + rows) of (8, 3, 5) draws (odd and even skips: NumPy's float32
    draws take half a 64-bit output each)."""
    layer = Dropout(0.5)
    layer.setup([(8, 3, 5)])
    whole = StepContext(np, step=2, seed=7).uniform_rows(layer, (8, 3, 5))
    shape = (rows, 3, 5)
    block = np.zeros(scratch_bytes(shape, 0), np.uint8) if in_block else None
    ctx = StepContext(np, step=2, seed=7, batch_offset=first, global_batch=8,
                      device=Device("cpu"), scratch=block)
    got = ctx.uniform_rows(layer, shape)
    np.testing.assert_array_equal(got, whole[first:first + rows])
    if in_block:
        assert np.shares_memory(got, block) and block.nbytes == 4 * rows * 15


def test_skipping_draws_is_drawing_them():
    for count in range(7):
        drawn = np.random.default_rng([1, 2, 3])
        drawn.random(count, dtype=np.float32)
        skipped = np.random.default_rng([1, 2, 3])
        skip_draws(skipped, count)
        np.testing.assert_array_equal(skipped.random(9, dtype=np.float32),
                                      drawn.random(9, dtype=np.float32))


def test_a_ranks_dropout_block_is_what_the_step_model_of_its_step_counts():
    """Rank 1 of 2 over a global batch of 8: its dropout's scratch block is that of its own 4
    rows, as the step model of a 4-image step (which knows no global batch) counts it, and
    its masks are rows 4..8 of the whole batch's."""
    net = dropout_net()
    net.init_params(0)
    spec = StepSpec(batch=4, global_batch=8, batch_offset=4, ranks=2, memory_budget=2**20)
    drop = [n.name for n in net.nodes].index("drop")
    model = StepModel(net, StepSpec(batch=4, memory_budget=2**20),
                      untimed_profile(net, 4, "cpu"))
    with Executor.assembled(Assembly(net, spec, NO_DECISION, "cpu")) as ex:
        assert ex.manager.scratch[(drop, "forward")] == model.scratch[(drop, "forward")] \
            == scratch_bytes((4, 24), 0)
        x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
        ex.forward(x, np.arange(4))
        mask = ex.manager.view("drop:mask").copy()
        ex.backward()
    layer = net.node("drop").layer
    whole = StepContext(np, step=0, seed=0).uniform_rows(layer, (8, 24))
    np.testing.assert_array_equal(mask, whole[4:] >= np.float32(0.5))


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
def test_the_gpus_counter_generator_skips_to_a_calls_rows():
    import cupy as cp
    from minidnn.kernels.cuda_random import counter_generator
    whole = counter_generator([3, 1, 4]).random((8, 3, 5))
    block = cp.zeros(scratch_bytes((3, 3, 5), 0), cp.uint8)
    got = uniform_rows_into(lambda: counter_generator([3, 1, 4]), (3, 3, 5), 5, block,
                            Device("gpu"))
    np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(whole[5:]))
