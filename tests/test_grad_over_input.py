"""A convolution's input gradient written over its input's buffer (Layer.grad_over_input,
memory/plan.py), when its backward is the only one that reads that buffer: the same bits,
one map less, and what it means for recomputation. On the CPU."""
import numpy as np
import pytest

from minidnn import Network, SGD, models
from minidnn.layers import Add, AvgPool2d, Conv2d, Flatten, Linear, ReLU
from minidnn.layers.conv import Conv2d as ConvClass
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import recompute_candidates, relus_worth_bits
from minidnn.decide import build_executor


def crossing() -> Network:
    """relu1 (bit mask) feeds an average pool and, later, convc; convc's backward alone reads
    relu1's map, so it writes relu1's gradient there, before convr's backward runs."""
    net = Network((3, 8, 8), num_classes=4, name="crossing")
    net.add(Conv2d(4, 3, padding=1), name="conv1")
    net.add(ReLU(keep="bits"), name="relu1")
    net.add(AvgPool2d(2), inputs="relu1", name="pool")
    net.add(Conv2d(4, 3, padding=1), inputs="pool", name="convr")
    net.add(Conv2d(4, 3, stride=2, padding=1), inputs="relu1", name="convc")
    net.add(Add(), inputs=["convr", "convc"], name="join")
    net.add(Flatten(), name="flat")
    net.add(Linear(4), name="fc")
    net.add_loss()
    return net


def train(net_fn, monkeypatch=None, allow=True, relu_bits=False, steps=2):
    if monkeypatch is not None:
        monkeypatch.setattr(ConvClass, "grad_over_input", allow)
    rng = np.random.default_rng(0)
    net = net_fn()
    shape = net.input_shape
    classes = net.infer_shapes(2)[net.output][-1]
    with build_executor(net, 2, device="cpu", seed=0, relu_bits=relu_bits) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for _ in range(steps):
            x = rng.standard_normal((2,) + tuple(shape)).astype(np.float32)
            ex.train_step(x, rng.integers(0, classes, 2), opt)
        stats, plan = ex.memory_stats(), ex.plan
    return net.state_dict(), stats, plan


def test_the_input_takes_its_gradient_only_when_no_other_backward_reads_it():
    plan = LivenessPlan(crossing(), 2)
    index = {n.name: i for i, n in enumerate(plan.nodes)}
    # convc alone reads relu1's map in backward (relu1 keeps bits); convr alone reads the
    # pool's (an average pool's backward reads nothing). conv1 reads the image: never.
    assert plan.grad_over_input == {index["convr"]: True, index["convc"]: True}
    t = plan.storage_of("relu1")
    assert plan.tensors["grad:relu1"].storage == t.id
    assert t.gradient_from == plan.backward_time(index["convc"])
    # relu1's map holds its gradient until conv1's backward has read it (relu1 in place).
    assert t.free_time == plan.backward_time(index["conv1"])
    assert plan.tensors["grad:pool"].storage == plan.storage_of("pool").id
    # With relu1 keeping its output, its own backward reads the map as well: no sharing.
    net = crossing()
    net.node("relu1").layer.keep = "output"
    assert index["convc"] not in LivenessPlan(net, 2).grad_over_input


def test_a_map_whose_inputs_took_a_gradient_first_is_not_recomputed():
    """The pool's output would be rebuilt from relu1's map before convr's backward; by then
    convc's backward has written relu1's gradient over that map."""
    plan = LivenessPlan(crossing(), 2)
    found = {plan.storages[s.id].tensors[0] for s in recompute_candidates(plan)}
    assert "pool" not in found


@pytest.mark.parametrize("relu_bits", [False, True])
def test_the_same_bits_and_less_memory(monkeypatch, relu_bits):
    def vgg():
        return models.build("vgg11", num_classes=5, image_size=32)
    own, own_stats, own_plan = train(vgg, monkeypatch, True, relu_bits)
    apart, apart_stats, _ = train(vgg, monkeypatch, False, relu_bits)
    for key in own:
        assert np.array_equal(own[key], apart[key]), key
    assert own_plan.grad_over_input          # pool outputs at least; with bits, ReLU maps too
    assert own_stats["peak_feature_map_bytes"] <= apart_stats["peak_feature_map_bytes"]
    assert own_stats["avg_feature_map_bytes"] < apart_stats["avg_feature_map_bytes"]


def test_crossing_net_trains_to_the_same_bits(monkeypatch):
    own, _, _ = train(crossing, monkeypatch, True)
    apart, _, _ = train(crossing, monkeypatch, False)
    for key in own:
        assert np.array_equal(own[key], apart[key]), key


def test_relus_before_a_single_convolution_keep_bits():
    net = models.build("vgg11", num_classes=5, image_size=32)
    plan = LivenessPlan(net, 2)
    worth = set(relus_worth_bits(plan))
    convolved = {n.inputs[0] for n in net.nodes if n.layer.kind == "conv"}
    relus = {n.name for n in net.nodes if n.layer.kind == "relu"}
    assert convolved & relus <= worth
    # A ReLU whose map a second layer keeps for backward (two convolutions read it) stays.
    branchy = Network((3, 8, 8), num_classes=4, name="two-readers")
    branchy.add(Conv2d(4, 3, padding=1), name="conv1")
    branchy.add(ReLU(), name="relu1")
    branchy.add(Conv2d(4, 3, padding=1), inputs="relu1", name="conva")
    branchy.add(Conv2d(4, 3, padding=1), inputs="relu1", name="convb")
    branchy.add(Add(), inputs=["conva", "convb"], name="join")
    branchy.add(Flatten(), name="flat")
    branchy.add(Linear(4), name="fc")
    branchy.add_loss()
    assert "relu1" not in relus_worth_bits(LivenessPlan(branchy, 2))
