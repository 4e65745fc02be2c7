"""The executor's own contract: what it leaves behind on failure and on close, and its inputs."""
import numpy as np
import pytest

from minidnn import Executor, models
from minidnn.errors import MemoryBudgetError
from minidnn.memory.policy import MemoryDecision, Policy


def tiny():
    net = models.build("tiny_cnn", num_classes=5, image_size=16)
    net.init_params(0)
    return net


def test_a_failed_executor_leaves_the_parameters_as_they_were():
    net = tiny()
    before = net.state_dict()
    probe = Executor(tiny(), 4, device="cpu", static_layout=True)
    too_small = probe.allocator.in_use - 256            # parameters fit, the layout does not
    with pytest.raises(MemoryBudgetError):
        Executor(net, 4, device="cpu", memory_budget=too_small)
    for name, p in net.parameters():
        assert isinstance(p.data, np.ndarray) and p.data.base is None, name
        assert p.grad is None
        assert np.array_equal(p.data, before[name])


def test_parameters_loaded_before_the_executor_are_kept():
    net = models.build("tiny_cnn", num_classes=5, image_size=16)
    donor = tiny()
    w = donor.state_dict()["conv1.weight"] + 1.0
    net.load_state_dict({"conv1.weight": w}, strict=False)
    ex = Executor(net, 4, device="cpu")
    assert np.array_equal(ex.net.state_dict()["conv1.weight"], w)
    assert all(p.data is not None for _, p in net.parameters())


class LeanConv1(Policy):
    name = "lean-conv1-test"

    def decide(self, plan, budget=None):
        return MemoryDecision(conv_algo={"conv1": "min_workspace"})


def test_a_policys_convolution_plans_last_as_long_as_its_executor():
    net = tiny()
    ex = Executor(net, 4, device="cpu", policy=LeanConv1())
    assert net.node("conv1").layer.algo == "min_workspace"
    ex.close()
    assert net.node("conv1").layer.algo == "fastest"
    with pytest.raises(MemoryBudgetError):
        Executor(net, 4, device="cpu", policy=LeanConv1(), memory_budget=1024)
    assert net.node("conv1").layer.algo == "fastest"


def test_forward_takes_nested_lists():
    ex = Executor(tiny(), 2, device="cpu")
    x = np.zeros((2, 3, 16, 16), np.float32).tolist()
    loss = ex.forward(x, [0, 4], train=False)
    assert np.isfinite(float(loss))
