"""The ReLU after a residual add folded into it (minidnn/fusion.py), forward and backward: the
add stores max(x0 + x1, 0), and in backward hands both inputs the gradient masked where that
output is positive. A fused step gives the bits of the unfused one in both precisions and
layouts (on the CPU, bf16 maps are emulated with ml_dtypes); a gradient check still passes."""
import numpy as np
import pytest

from minidnn import Network
from minidnn.decide import build_executor
from minidnn.fusion import add_relu_pairs
from minidnn.kernels import cpu
from minidnn.kernels.mapformat import MapFormat
from minidnn.layers import Add, Conv2d, Flatten, Linear, ReLU
from minidnn.memory.plan import LivenessPlan
from test_fused_bn_relu import small_resnet
from test_fusion import _run, counting
from test_graph import check_gradients

pytest.importorskip("ml_dtypes")


def test_the_relu_after_the_add_is_folded_and_the_add_keeps_its_output():
    net = small_resnet()
    plan = LivenessPlan(net, 2)
    assert add_relu_pairs(plan) == {"relu3": "sum"}
    assert add_relu_pairs(LivenessPlan(net, 2, maps=MapFormat("nhwc", "bf16"))) == \
        {"relu3": "sum"}
    index = {n.name: i for i, n in enumerate(plan.nodes)}
    out = plan.storage_of("sum")
    assert out.id == plan.storage_of("relu3").id          # the ReLU runs in place
    assert plan.backward_time(index["sum"]) in out.backward_uses
    assert out.free_time >= plan.backward_time(index["sum"])
    unfused = LivenessPlan(net, 2, fuse=False)
    assert not unfused.retains_output(index["sum"]) and add_relu_pairs(unfused) == {}
    # A ReLU that keeps bits instead of its output leaves the add alone.
    assert add_relu_pairs(LivenessPlan(net, 2, relu_bits={"relu3"})) == {}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_fused_step_gives_the_bits_of_the_unfused_one(layout, precision, monkeypatch):
    settings = {"precision": precision, "layout": layout}
    calls = counting(monkeypatch, cpu, ("add_relu", "relu_mask_copy", "relu_backward"))
    fused = _run(small_resnet(), settings, 2, True, 8, "add_relu")
    assert fused[2] == {"relu3": "sum"}
    # Two steps and an evaluation forward; two backward masks; no ReLU backward left. On
    # float32 maps the add writes one gradient, which bn2 reads on (bn_grad): the mask is
    # relu_backward's; bf16 maps, widened for the add on the CPU, keep both copies.
    one = precision == "fp32"
    assert calls == {"add_relu": 3, "relu_mask_copy": 0 if one else 2,
                     "relu_backward": 2 if one else 0}
    plain = _run(small_resnet(), settings, 2, False, 8, "add_relu")
    # Unfused, all three ReLUs run their backward (--no-fuse folds none into batch norms).
    assert plain[2] == {} and calls["add_relu"] == 3
    assert calls["relu_backward"] == (2 if one else 0) + 3 * 2
    assert fused[0] == plain[0] and fused[3] == plain[3]
    for k in fused[1]:
        assert fused[1][k].tobytes() == plain[1][k].tobytes(), k


def test_the_kernels_give_the_bits_of_add_relu_and_copy():
    """Sums that round to -0, +0 and to tiny values in bf16, and ordinary ones."""
    import ml_dtypes
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(0)
    for dtype in (np.float32, bf16):
        a = rng.standard_normal((2, 3, 5, 7)).astype(dtype)
        b = rng.standard_normal((2, 3, 5, 7)).astype(dtype)
        b.ravel()[:4] = -a.ravel()[:4]                   # exact zeros
        fused, plain = np.empty_like(a), np.empty_like(a)
        cpu.add_relu(a, b, fused)
        cpu.add(a, b, plain)
        cpu.relu_forward(plain, plain)
        assert fused.tobytes() == plain.tobytes()
        gy = rng.standard_normal(a.shape).astype(dtype)
        gx0, gx1 = gy.copy(), np.empty_like(gy)
        cpu.relu_mask_copy(fused, gx0, gx0, gx1)         # in place into gy, as the step does
        want = np.empty_like(gy)
        cpu.relu_backward(plain, gy, want)
        assert gx0.tobytes() == want.tobytes() == gx1.tobytes()


def residual_net() -> Network:
    """float64: conv -> relu, a residual block of two convolutions whose sum with the relu's
    output goes through a ReLU (folded into the add), pool, fc, loss."""
    net = Network((3, 6, 6), num_classes=4, dtype=np.float64)
    net.add(Conv2d(4, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(Conv2d(4, 3, padding=1), name="conv2")
    net.add(ReLU(), name="relu2")
    net.add(Conv2d(4, 3, padding=1), name="conv3")
    net.add(Add(), inputs=["conv3", "relu1"], name="sum")
    net.add(ReLU(), name="relu3")
    net.add(Flatten(), name="flat")
    net.add(Linear(4), name="fc")
    net.add_loss()
    return net


def test_a_residual_network_with_the_fused_add_passes_a_gradient_check():
    net = residual_net()
    net.init_params(0)
    ex = build_executor(net, 3, device="cpu", seed=1)
    assert ex.decision.add_relu == {"relu3": "sum"}
    rng = np.random.default_rng(3)
    check_gradients(ex, rng.standard_normal((3, 3, 6, 6)), rng.integers(0, 4, 3))
    ex.close()


@pytest.mark.parametrize("fuse", [True, False])
def test_recomputing_every_candidate_keeps_the_bits(fuse):
    """Every map that can be recomputed is (the add and its ReLU among them): the fused add's
    rebuilt output is still the ReLU's, and its backward reads it; one step's gradients are
    those of the step that keeps every map."""
    from dataclasses import replace
    from minidnn.decide import decide
    from minidnn.executor import Executor
    from minidnn.memory.policy import recompute_candidates

    rng = np.random.default_rng(4)
    x, labels = rng.standard_normal((3, 3, 6, 6)), rng.integers(0, 4, 3)

    def gradients(recompute):
        net = residual_net()
        net.init_params(0)
        decision = decide(net, 3, device="cpu", fuse=fuse)
        if recompute:
            plan = LivenessPlan(net, 3, fuse=fuse)
            ids = frozenset(s.id for s in recompute_candidates(plan))
            assert plan.storage_of("sum").id in ids
            decision = replace(decision, recompute=ids)
        with Executor(net, 3, device="cpu", seed=1, decision=decision) as ex:
            assert bool(ex.decision.add_relu) == fuse
            loss = float(ex.forward(x, labels))
            ex.backward()
            return loss, {k: g.tobytes() for k, g in ex.gradients().items()}

    assert gradients(True) == gradients(False)


@pytest.mark.parametrize("inputs", [["data", "conv1"], ["conv1", "conv1", "conv1"]])
def test_an_add_that_cannot_fold_its_relu_keeps_the_unfused_plan(inputs):
    """An add of the network's input (whose gradient no one wants, so the add's backward has
    no output-gradient buffer to mask in place), or of three inputs (rounded between its
    adds), is not fused, and then does not retain its output either: the plan is the
    unfused one."""
    net = Network((3, 6, 6), num_classes=4, dtype=np.float64)
    net.add(Conv2d(3, 3, padding=1), name="conv1")
    net.add(Add(), inputs=inputs, name="sum")
    net.add(ReLU(), name="relu")
    net.add(Flatten(), name="flat")
    net.add(Linear(4), name="fc")
    net.add_loss()
    fused, unfused = LivenessPlan(net, 2), LivenessPlan(net, 2, fuse=False)
    assert add_relu_pairs(fused) == {}
    assert not fused.retains_output(1)
    assert fused.storage_of("sum").free_time == unfused.storage_of("sum").free_time


@pytest.mark.parametrize("model", ["small_resnet", "resnet18"])
def test_the_relus_that_keep_bits_do_not_depend_on_the_fusion(model):
    """--relu-bits chooses its ReLUs as the unfused step would: an add that would fold the
    ReLU after it and retain its output for the mask takes no bits away (the ReLU before the
    pool keeps bits, as do those whose map the next convolution's input gradient overwrites),
    and that add then stays unfused."""
    from minidnn import models
    from minidnn.decide import decide
    from minidnn.memory.policy import relus_worth_bits
    net = small_resnet() if model == "small_resnet" else \
        models.build("resnet18", num_classes=10, image_size=32)
    unfused = frozenset(relus_worth_bits(LivenessPlan(net, 1, fuse=False)))
    fused = decide(net, 4, device="cpu", relu_bits=True)
    assert fused.relu_bits == unfused == decide(net, 4, device="cpu", relu_bits=True,
                                                fuse=False).relu_bits
    assert not set(fused.add_relu) & unfused
    if model == "small_resnet":
        assert "relu3" in unfused and fused.add_relu == {}
