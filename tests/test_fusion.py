"""A convolution's bias added by the ReLU after it (minidnn/fusion.py): which pairs qualify,
and that a fused step gives the bits of the unfused one, under memory decisions too."""
import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.builder import NetBuilder
from minidnn.decide import decide
from minidnn.errors import ConfigError
from minidnn.executor import Executor
from minidnn.fusion import bias_relu_pairs, conv_relu_pairs
from minidnn.kernels import cpu, relu_mask_bytes
from minidnn.kernels.mapformat import MapFormat
from minidnn.memory.plan import LivenessPlan


def test_every_conv_relu_pair_of_vgg16_fuses_and_nothing_else():
    net = models.build("vgg16")
    pairs = bias_relu_pairs(LivenessPlan(net, 2))
    assert len(pairs) == 13
    assert all(net.node(c).layer.kind == "conv" and net.node(r).inputs == [c]
               for r, c in pairs.items())
    assert "relu6" not in pairs                  # after a linear layer: nothing to move
    assert bias_relu_pairs(LivenessPlan(net, 2, maps=MapFormat("nchw", "bf16"))) == pairs


def test_a_conv_output_with_a_second_reader_keeps_its_bias():
    """The ReLU may not add the bias when another layer reads the convolution's output (it
    would see the map without it), nor when the ReLU cannot run in place."""
    b = NetBuilder("fork", image_size=8, num_classes=3)
    b.conv("conv1", 4, 3, padding=1)
    b.relu("relu1", src="conv1")
    b.conv("conv2", 4, 3, padding=1, src="conv1")
    b.add("sum", ["relu1", "conv2"])
    b.relu("relu2")
    b.flatten("flat")
    b.linear("fc", 3)
    pairs = bias_relu_pairs(LivenessPlan(b.finish(), 2))
    assert "relu1" not in pairs and "relu2" not in pairs


def _run(net, decision_kwargs, steps, fuse, size, field, device="cpu", edit=None):
    """`steps` training steps of batch 4 (size x size images) and one evaluation on `device`:
    (losses, state_dict, the decision's `field` pairs, the evaluation's loss). edit: a
    function of the step's decision that returns the decision the executor runs (one made
    by hand from it); the pairs are then those of the decision before the edit."""
    from minidnn.backend import select_device
    from minidnn.spec import StepSpec
    net.init_params(0)
    dev = select_device(device)
    spec = StepSpec(batch=4, fuse=fuse, **decision_kwargs)
    decision = decide(net, spec, device=dev)
    fused = dict(getattr(decision, field))
    with Executor(net, spec, decision if edit is None else edit(decision), device=dev,
                  seed=1) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9)
        rng = np.random.default_rng(2)
        losses = []
        for _ in range(steps):
            x = rng.standard_normal((4, 3, size, size)).astype(np.float32)
            losses.append(float(ex.train_step(x, rng.integers(0, 10, 4), opt)))
        evaluated = float(ex.forward(x, rng.integers(0, 10, 4), train=False))
    state = {k: np.array(v) for k, v in net.state_dict().items()}
    return losses, state, fused, evaluated


def counting(monkeypatch, module, names) -> dict:
    """{name: calls so far} of the functions `names` of `module`, each wrapped to count its
    calls (monkeypatch undoes it)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        original = getattr(module, name)

        def counted(*a, _name=name, _original=original):
            calls[_name] += 1
            return _original(*a)
        monkeypatch.setattr(module, name, counted)
    return calls


def _train(net, decision_kwargs, steps=3, fuse=True):
    return _run(net, decision_kwargs, steps, fuse, 16, "bias_relu")[:3]


@pytest.mark.parametrize("kwargs", [{}, {"relu_bits": True},
                                    {"policy": "all", "memory_budget": "2MiB"},
                                    {"layout": "nhwc"}, {"micro_batches": 2}], ids=str)
def test_a_fused_step_gives_the_bits_of_the_unfused_one(kwargs):
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    losses, state, fused = _train(net, kwargs)
    assert fused, "tiny_cnn's conv -> relu pairs should fuse"
    plain_losses, plain_state, none = _train(net, kwargs, fuse=False)
    assert none == {}
    assert losses == plain_losses
    assert all(np.array_equal(state[k], plain_state[k]) for k in state)


def test_on_float32_maps_a_convolution_applies_its_relu_unless_the_relu_keeps_bits():
    net = models.build("vgg16")
    plan = LivenessPlan(net, 2)
    assert conv_relu_pairs(plan, False) == bias_relu_pairs(plan)
    assert conv_relu_pairs(LivenessPlan(net, 2, maps=MapFormat("nchw", "bf16")), False) == {}
    bits = frozenset({"relu1_1", "relu3_2"})
    kept = conv_relu_pairs(LivenessPlan(net, 2, relu_bits=bits), False)
    assert set(kept) == set(bias_relu_pairs(plan)) - bits


@pytest.mark.parametrize("kwargs", [{}, {"policy": "all", "memory_budget": "2MiB"},
                                    {"layout": "nhwc"}, {"micro_batches": 2}], ids=str)
def test_a_convolution_that_applies_its_relu_gives_the_bits_of_the_two_layers(
        kwargs, monkeypatch):
    """The convolution's forward is called with relu=True (its ReLU's forward does
    nothing) and the step's bits are those of the unfused step, on the CPU."""
    relus = []
    conv = cpu.conv2d_forward

    def noting(*args, relu=False, **kw):
        relus.append(relu)
        return conv(*args, relu=relu, **kw)

    monkeypatch.setattr(cpu, "conv2d_forward", noting)
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    losses, state, pairs, _ = _run(net, kwargs, 3, True, 16, "conv_relu")
    assert pairs and any(relus)
    relus.clear()
    plain_losses, plain_state, none, _ = _run(net, kwargs, 3, False, 16, "conv_relu")
    assert none == {} and not any(relus)
    assert losses == plain_losses
    assert all(np.array_equal(state[k], plain_state[k]) for k in state)


def test_a_deterministic_step_keeps_the_relu_out_of_the_convolution():
    """--deterministic promises the same bits whatever the plan; on the GPU the fused
    graph's engines may sum in another order than the convolution's deterministic plan."""
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    assert decide(net, 4).conv_relu
    decision = decide(net, 4, deterministic=True)
    assert decision.bias_relu and decision.conv_relu == {}


def test_the_cpu_convolution_with_its_relu_is_the_convolution_then_the_relu_pass():
    from minidnn.kernels import ConvSpec
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    spec = ConvSpec(padding=(1, 1))
    fused, want = np.empty((2, 5, 6, 6), np.float32), np.empty((2, 5, 6, 6), np.float32)
    cpu.conv2d_forward(x, w, b, fused, spec, relu=True)
    cpu.conv2d_forward(x, w, None, want, spec)
    cpu.relu_forward(want, want, b)
    np.testing.assert_array_equal(fused, want)
    with pytest.raises(ValueError, match="needs the bias"):
        cpu.conv2d_forward(x, w, None, fused, spec, relu=True)


def test_a_decision_that_would_change_results_is_refused():
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    bad = decide(net, 4, fuse=False)
    from dataclasses import replace
    relu = next(n.name for n in net.nodes if n.layer.kind == "relu")
    with pytest.raises(ConfigError, match="would change results"):
        Executor(net, 4, device="cpu", decision=replace(bad, bias_relu={relu: "fc3"}))


def test_the_cpu_kernels_add_the_bias_before_the_relu():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 3, 4)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    y = np.empty_like(x)
    cpu.relu_forward(x, y, b)
    np.testing.assert_array_equal(y, np.maximum(x + b.reshape(1, 5, 1, 1), 0))
    mask = np.zeros(relu_mask_bytes(x.size), np.uint8)
    y2 = x.copy()
    cpu.relu_forward_bits(y2, y2, mask, b)      # in place
    np.testing.assert_array_equal(y2, y)
    assert np.array_equal(np.unpackbits(mask, count=x.size, bitorder="little"),
                          (y > 0).ravel().astype(np.uint8))


@pytest.mark.parametrize("bits", [False, True])
def test_the_cpu_relu_backward_also_gives_the_gradient_of_the_bias_it_added(bits):
    rng = np.random.default_rng(4)
    y = np.maximum(rng.standard_normal((3, 6, 4, 5)), 0).astype(np.float32)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gx, gb = np.empty_like(gy), np.full(6, np.nan, np.float32)
    if bits:
        mask = np.packbits((y > 0).ravel(), bitorder="little")
        cpu.relu_backward_bits(mask, gy, gx, gb)
    else:
        cpu.relu_backward(y, gy, gx, gb)
    want = gy * (y > 0)
    np.testing.assert_array_equal(gx, want)
    np.testing.assert_array_equal(gb, want.sum(axis=(0, 2, 3)))


def _train_resnet(decision_kwargs, fuse, steps=2):
    net = models.build("resnet18", num_classes=10, image_size=32)
    return _run(net, decision_kwargs, steps, fuse, 32, "bn_relu")


@pytest.mark.parametrize("kwargs", [{}, {"policy": "all", "memory_budget": "200MiB"},
                                    {"layout": "nhwc"},
                                    {"micro_batches": 2, "split_batch_statistics": True},
                                    {"relu_bits": True}], ids=str)
def test_a_batch_norm_that_applies_its_relu_gives_the_bits_of_the_two_layers(kwargs):
    """ResNet-18's ReLUs after batch norms (not those after the residual adds) move into the
    batch norms; training steps, running statistics and an evaluation keep their bits."""
    losses, state, fused, evaluated = _train_resnet(kwargs, fuse=True)
    net = models.build("resnet18", num_classes=10, image_size=32)
    readers = net.consumers()
    assert all(net.node(b).layer.kind == "batchnorm" and [n.name for n in readers[b]] == [r]
               for r, b in fused.items())
    if kwargs.get("relu_bits"):
        assert len(fused) < 9   # ReLUs that keep bits stay whole
    else:
        assert len(fused) == 9, fused   # the stem's and each block's first
    plain = _train_resnet(kwargs, fuse=False)
    assert plain[2] == {}
    assert losses == plain[0] and evaluated == plain[3]
    assert all(np.array_equal(state[k], plain[1][k]) for k in state)


def _train_resnet_adds(decision_kwargs, fuse, steps=2):
    net = models.build("resnet18", num_classes=10, image_size=32)
    return _run(net, decision_kwargs, steps, fuse, 32, "bn_add")


@pytest.mark.parametrize("kwargs", [{}, {"precision": "bf16"},
                                    {"precision": "bf16", "layout": "nhwc"},
                                    {"policy": "all", "memory_budget": "200MiB"},
                                    {"micro_batches": 2, "split_batch_statistics": True},
                                    {"relu_bits": True}], ids=str)
def test_a_batch_norm_that_applies_the_add_after_it_gives_the_bits_of_the_three_layers(
        kwargs):
    """ResNet-18's blocks whose identity is written before their last batch norm (all but
    the three with a projection) fold the add and its ReLU into that batch norm; training
    steps, running statistics and an evaluation keep their bits, in bf16 too."""
    losses, state, fused, evaluated = _train_resnet_adds(kwargs, fuse=True)
    net = models.build("resnet18", num_classes=10, image_size=32)
    every = ["layer1.0.add", "layer1.1.add", "layer2.1.add", "layer3.1.add", "layer4.1.add"]
    if kwargs.get("relu_bits"):    # an add whose ReLU keeps bits does not apply it
        assert fused and set(fused) < set(every)
    else:
        assert sorted(fused) == every
    assert all(net.node(a).inputs[0] == b and net.node(b).layer.kind == "batchnorm"
               for a, b in fused.items())
    plain = _train_resnet_adds(kwargs, fuse=False)
    assert plain[2] == {}
    assert losses == plain[0] and evaluated == plain[3]
    assert all(np.array_equal(state[k], plain[1][k]) for k in state)


def test_a_deterministic_split_step_with_the_add_in_the_batch_norm_keeps_its_bits():
    """Deterministic with split statistics: the batch norm normalizes slice by slice, each
    slice adding its rows of the identity."""
    from test_fused_bn_relu import small_resnet
    kwargs = {"deterministic": True, "micro_batches": 2, "split_batch_statistics": True}
    fused = _run(small_resnet(), kwargs, 2, True, 8, "bn_add")
    plain = _run(small_resnet(), kwargs, 2, False, 8, "bn_add")
    assert fused[2] == {"sum": "bn3"} and plain[2] == {}
    assert fused[0] == plain[0] and fused[3] == plain[3]
    assert all(np.array_equal(fused[1][k], plain[1][k]) for k in fused[1])


def test_recomputing_a_block_whose_batch_norm_applies_the_add_keeps_the_bits():
    """Every map that can be recomputed is, the fused adds' outputs among them: the batch
    norm runs again, reading the identity the memory manager brought back, and the step's
    gradients are those of the unfused step that keeps every map."""
    from dataclasses import replace
    from minidnn.decide import decide
    from minidnn.executor import Executor
    from minidnn.memory.policy import recompute_candidates

    rng = np.random.default_rng(5)
    x, labels = rng.standard_normal((4, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 4)

    def gradients(fuse, recompute):
        net = models.build("resnet18", num_classes=10, image_size=32)
        net.init_params(0)
        decision = decide(net, 4, device="cpu", fuse=fuse)
        if recompute:
            plan = LivenessPlan(net, 4, fuse=fuse)
            ids = frozenset(s.id for s in recompute_candidates(plan))
            assert plan.storage_of("layer1.1.bn2").id in ids
            decision = replace(decision, recompute=ids)
        with Executor(net, 4, device="cpu", seed=1, decision=decision) as ex:
            assert bool(ex.decision.bn_add) == fuse
            loss = float(ex.forward(x, labels))
            ex.backward()
            return loss, {k: g.tobytes() for k, g in ex.gradients().items()}

    assert gradients(True, True) == gradients(False, False)


def test_the_plan_counts_the_identity_a_fused_batch_norm_reads():
    """The batch norm's forward call reads the add's other input as a second map (so a
    widened bf16 call makes room for its float32 copy); unfused, it reads its input alone."""
    net = models.build("resnet18", num_classes=10, image_size=32)
    fused, unfused = LivenessPlan(net, 4), LivenessPlan(net, 4, fuse=False)
    b = [node.name for node in net.nodes].index("layer1.1.bn2")
    assert len(fused.call_maps(b, "forward")) == 3 and len(unfused.call_maps(b, "forward")) == 2
    assert fused.residual_reads[b] == net.node("layer1.1.add").inputs[1]
    assert unfused.residual_reads == {}
