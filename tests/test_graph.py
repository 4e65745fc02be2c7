"""Whole networks through the Executor on the CPU in float64: branches, joins, in-place layers,
and parameter gradients against finite differences of the loss."""
import numpy as np
import pytest

from minidnn import Network
from minidnn.layers import (LRN, Add, AvgPool2d, Concat, Conv2d, Dropout, Flatten, Linear,
                            MaxPool2d, ReLU)
from minidnn.decide import build_executor

BATCH, CLASSES = 3, 5


def branchy_net(dropout: bool = True) -> Network:
    """conv -> relu, read by three layers (two convs and a pool); Add joins the convs, Concat
    joins the sum and the pool; LRN -> relu -> pool -> grouped conv -> relu -> fc -> relu ->
    dropout -> fc -> loss."""
    net = Network((3, 8, 8), num_classes=CLASSES, dtype=np.float64)
    net.add(Conv2d(4, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(Conv2d(4, 3, padding=1), inputs="relu1", name="branch_a")
    net.add(Conv2d(4, 1), inputs="relu1", name="branch_b")
    net.add(AvgPool2d(3, stride=1, padding=1, count_include_pad=False), inputs="relu1",
            name="branch_c")
    net.add(Add(), inputs=["branch_a", "branch_b"], name="sum")
    net.add(Concat(), inputs=["sum", "branch_c"], name="cat")
    net.add(LRN(3, alpha=0.5, beta=0.75, k=1.0), name="lrn")
    net.add(ReLU(), name="relu2")
    net.add(MaxPool2d(3, stride=2, ceil_mode=True), name="pool")
    net.add(Conv2d(6, 3, padding=1, groups=2), name="conv2")
    net.add(ReLU(), name="relu3")
    net.add(Flatten(), name="flat")
    net.add(Linear(10), name="fc1")
    net.add(ReLU(), name="relu4")
    if dropout:
        net.add(Dropout(0.4), name="drop")
    net.add(Linear(CLASSES), name="fc2")
    net.add_loss()
    return net


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((BATCH, 3, 8, 8)), rng.integers(0, CLASSES, BATCH)


def test_branch_and_join_gradients_match_finite_differences():
    net = branchy_net()
    ex = build_executor(net, BATCH, device="cpu", seed=1)
    x, labels = batch()
    check_gradients(ex, x, labels)


def check_gradients(ex, x, labels):
    """Each parameter's gradient from ex's backward, at three random entries, against
    central differences of the loss (float64)."""
    ex.forward(x, labels)
    ex.backward()
    grads = ex.gradients()
    rng = np.random.default_rng(2)
    eps = 1e-6
    for name, p in ex.parameters():
        for _ in range(3):
            idx = tuple(int(rng.integers(0, d)) for d in p.shape)
            old = p.data[idx]
            p.data[idx] = old + eps
            plus = float(ex.forward(x, labels))   # same step: dropout draws the same mask
            p.data[idx] = old - eps
            minus = float(ex.forward(x, labels))
            p.data[idx] = old
            numeric = (plus - minus) / (2 * eps)
            assert grads[name][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-8), \
                f"{name}{list(idx)}: backward {grads[name][idx]!r}, finite difference {numeric!r}"


def test_in_place_decisions():
    net = branchy_net()
    ex = build_executor(net, BATCH, device="cpu")
    index = {node.name: i for i, node in enumerate(net.nodes)}
    inplace = ex.plan.inplace
    assert inplace[index["relu1"]]      # over conv1's output (conv1 keeps its input, not output)
    assert inplace[index["relu3"]]
    # LRN keeps its input and its scale, not its output: the ReLU after it may write over it.
    assert inplace[index["relu2"]]
    # ReLU keeps its output for backward: dropout after it must not overwrite it.
    assert not inplace[index["drop"]]
    # The storage that relu1 shares with conv1 is read in backward by branch_a and branch_b.
    s = ex.plan.storage_of("relu1")
    assert {"conv1", "relu1"} <= set(s.tensors) and s.needed_in_backward


def test_in_place_layers_give_the_gradients_of_copies():
    """The same net with every layer forced out of place gives bit-identical gradients."""
    x, labels = batch(3)

    def grads(allow_inplace):
        net = branchy_net()
        if not allow_inplace:
            for node in net.nodes:
                node.layer.inplace = False          # instance attribute shadows the class's
        ex = build_executor(net, BATCH, device="cpu", seed=4)
        loss = float(ex.forward(x, labels))
        ex.backward()
        assert any(ex.plan.inplace.values()) == allow_inplace
        return loss, ex.gradients()
    loss_a, ga = grads(True)
    loss_b, gb = grads(False)
    assert loss_a == loss_b
    for name in ga:
        np.testing.assert_array_equal(ga[name], gb[name], err_msg=name)


def test_dropout_train_versus_eval():
    x, labels = batch(5)
    with_drop, without = branchy_net(dropout=True), branchy_net(dropout=False)
    ex = build_executor(with_drop, BATCH, device="cpu", seed=6)
    without.load_state_dict(with_drop.state_dict())
    ex_plain = build_executor(without, BATCH, device="cpu", seed=6)

    loss_eval, logits_eval = ex.evaluate(x, labels)
    loss_plain, logits_plain = ex_plain.evaluate(x, labels)
    np.testing.assert_array_equal(logits_eval, logits_plain)   # eval: dropout is the identity
    assert loss_eval == loss_plain

    train_a = ex.forward(x, labels, keep_outputs=True)
    logits_a = ex.outputs()
    train_b = ex.forward(x, labels, keep_outputs=True)
    np.testing.assert_array_equal(logits_a, ex.outputs())      # same step: same mask
    assert float(train_a) == float(train_b)
    assert not np.allclose(logits_a, logits_eval)              # train: units are dropped
    ex.step += 1                                               # the next step draws anew
    ex.forward(x, labels, keep_outputs=True)
    assert not np.allclose(logits_a, ex.outputs())


def test_sequential_alexnet_shaped_net_trains():
    """A small AlexNet-shaped chain (conv s2, LRN, overlapping pools, grouped conv, dropout):
    shapes infer, a few SGD steps lower the loss on a fixed batch."""
    from minidnn import SGD
    layers = [Conv2d(8, 5, stride=2, padding=2), ReLU(), LRN(5), MaxPool2d(3, stride=2),
              Conv2d(12, 3, padding=1, groups=2), ReLU(), MaxPool2d(3, stride=2, ceil_mode=True),
              Flatten(), Linear(16), ReLU(), Dropout(0.5), Linear(CLASSES)]
    net = Network.sequential((3, 20, 20), layers, num_classes=CLASSES)
    ex = build_executor(net, 4, device="cpu", seed=0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 20, 20)).astype(np.float32)
    labels = rng.integers(0, CLASSES, 4)
    opt = SGD(ex.parameters(), lr=0.05, momentum=0.9)
    first = float(ex.evaluate(x, labels)[0])
    for _ in range(15):
        ex.train_step(x, labels, opt)
    assert float(ex.evaluate(x, labels)[0]) < first


def test_a_loss_needs_a_layer_before_it():
    from minidnn.errors import ConfigError
    with pytest.raises(ConfigError, match="no layer to compute a loss on"):
        Network.sequential((3, 4, 4), [])
