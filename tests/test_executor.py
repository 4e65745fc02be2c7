"""The executor's own contract: what it leaves behind on failure and on close, and its inputs."""
import numpy as np
import pytest

from minidnn import models
from minidnn.errors import MemoryBudgetError
from minidnn.memory.policy import MemoryDecision, Policy
from minidnn.decide import build_executor


def tiny():
    net = models.build("tiny_cnn", num_classes=5, image_size=16)
    net.init_params(0)
    return net


def test_a_failed_executor_leaves_the_parameters_as_they_were():
    net = tiny()
    before = net.state_dict()
    probe = build_executor(tiny(), 4, device="cpu", static_layout=True)
    too_small = probe.allocator.in_use - 256            # parameters fit, the layout does not
    with pytest.raises(MemoryBudgetError):
        build_executor(net, 4, device="cpu", memory_budget=too_small)
    for name, p in net.parameters():
        assert isinstance(p.data, np.ndarray) and p.data.base is None, name
        assert p.grad is None
        assert np.array_equal(p.data, before[name])


def test_parameters_loaded_before_the_executor_are_kept():
    net = models.build("tiny_cnn", num_classes=5, image_size=16)
    donor = tiny()
    w = donor.state_dict()["conv1.weight"] + 1.0
    net.load_state_dict({"conv1.weight": w}, strict=False)
    ex = build_executor(net, 4, device="cpu")
    assert np.array_equal(ex.net.state_dict()["conv1.weight"], w)
    assert all(p.data is not None for _, p in net.parameters())


class LeanConv1(Policy):
    name = "lean-conv1-test"

    def decide(self, plan, budget=None):
        return MemoryDecision(conv_algo={"conv1": "min_workspace"})


def test_a_policys_convolution_plans_reach_the_kernels_and_leave_the_layers_alone(monkeypatch):
    net = tiny()
    ex = build_executor(net, 4, device="cpu", policy=LeanConv1())
    assert ex.decision.conv_algo == {"conv1": "min_workspace"}
    assert net.node("conv1").layer.algo == "fastest"      # the layer keeps its own setting
    seen = {}
    kernels, run = ex.kernels, ex.kernels.conv2d_forward

    def spy(x, w, b, y, spec, **kw):
        seen[spec.key] = spec.algo
        return run(x, w, b, y, spec, **kw)

    monkeypatch.setattr(kernels, "conv2d_forward", spy)
    rng = np.random.default_rng(0)
    ex.forward(rng.standard_normal((4, 3, 16, 16)).astype(np.float32), [0, 1, 2, 3],
               train=False)
    assert seen["conv1"] == "min_workspace"
    assert all(algo == "fastest" for key, algo in seen.items() if key != "conv1")
    ex.close()
    assert net.node("conv1").layer.algo == "fastest"
    with pytest.raises(MemoryBudgetError):
        build_executor(net, 4, device="cpu", policy=LeanConv1(), memory_budget=1024)
    assert net.node("conv1").layer.algo == "fastest"


def test_forward_takes_nested_lists():
    ex = build_executor(tiny(), 2, device="cpu")
    x = np.zeros((2, 3, 16, 16), np.float32).tolist()
    loss = ex.forward(x, [0, 4], train=False)
    assert np.isfinite(float(loss))


def _train_checksum(relu_bits, policy, steps=3):
    net = models.build("vgg11", num_classes=5, image_size=32)
    ex = build_executor(net, 2, device="cpu", seed=3, policy=policy, relu_bits=relu_bits)
    from minidnn import SGD
    opt = SGD(net.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(5)
    for _ in range(steps):
        ex.train_step(rng.standard_normal((2, 3, 32, 32)).astype(np.float32),
                      rng.integers(0, 5, 2), opt)
    stats = ex.memory_stats()
    # What each ReLU keeps in this executor's steps: its plan's, from the decision.
    keeps = {n.name: n.layer.keep_in(ex.plan.relu_bits) for n in net.nodes
             if n.layer.kind == "relu"}
    ex.close()
    return net.param_checksum(), stats, keeps, net


@pytest.mark.parametrize("policy", ["none", "all"])
def test_relu_bit_masks_change_no_bit_and_free_the_maps_before_pools_and_convolutions(policy):
    plain, plain_stats, _, _ = _train_checksum(False, policy)
    bits, bits_stats, keeps, net = _train_checksum(True, policy)
    assert bits == plain
    # The ReLUs before a max-pool switch (VGG: the last of each stage) and those before a
    # dropout (which can then run in place). So do those before a convolution: it then
    # writes its input gradient over the map. Never one whose output a linear layer keeps.
    switched = {name for name, keep in keeps.items() if keep == "bits"}
    pooled = {n.inputs[0] for n in net.nodes if n.layer.kind == "pool"}
    assert pooled <= switched
    convolved = {n.inputs[0] for n in net.nodes if n.layer.kind == "conv"}
    relus = {n.name for n in net.nodes if n.layer.kind == "relu"}
    assert convolved & relus and convolved & relus <= switched
    linear = {n.inputs[0] for n in net.nodes if n.layer.kind == "linear"}
    assert not switched & linear
    assert bits_stats["avg_feature_map_bytes"] < plain_stats["avg_feature_map_bytes"]
    if policy == "all":
        assert bits_stats["offloaded_bytes"] < plain_stats["offloaded_bytes"]
    # The layers keep their own setting: the decision reached them through the step.
    assert all(n.layer.keep == "output" for n in net.nodes if n.layer.kind == "relu")
