"""Micro-batches: a step of batch B run as k passes of B/k, parameter gradients accumulated,
one optimizer update (executor.py), on the CPU in float64."""
import json

import numpy as np
import pytest

from minidnn import SGD
from minidnn.decide import build_executor
from minidnn.errors import ConfigError
from minidnn.layers import Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU
from minidnn.layers.base import Layer, StepContext
from minidnn.network import Network

BATCH = 8


def small_net(dtype=np.float64) -> Network:
    """conv -> relu -> pool -> conv -> relu -> flatten -> fc -> dropout -> fc -> loss."""
    net = Network((3, 8, 8), num_classes=5, name="split", dtype=dtype)
    net.add(Conv2d(4, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(MaxPool2d(2), name="pool1")
    net.add(Conv2d(6, 3, padding=1), name="conv2")
    net.add(ReLU(), name="relu2")
    net.add(Flatten(), name="flat")
    net.add(Linear(16), name="fc1")
    net.add(Dropout(0.5), name="drop")
    net.add(Linear(5), name="fc2")
    net.add_loss()
    return net


def batches(steps, dtype=np.float64):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((BATCH, 3, 8, 8)).astype(dtype), rng.integers(0, 5, BATCH))
            for _ in range(steps)]


def train(micro_batches, steps=3, **options):
    """(parameters after `steps` SGD steps, the losses)."""
    net = small_net()
    losses = []
    with build_executor(net, BATCH, device="cpu", seed=0, micro_batches=micro_batches,
                        **options) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3,
                  allocator=ex.allocator)
        for x, y in batches(steps):
            losses.append(float(ex.train_step(x, y, opt)))
    return net.state_dict(), losses


@pytest.mark.parametrize("k", [2, 4, 8])
def test_a_split_step_matches_the_whole_batch(k):
    whole, whole_losses = train(1)
    split, split_losses = train(k)
    for name, value in whole.items():
        np.testing.assert_allclose(split[name], value, rtol=0, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(split_losses, whole_losses, rtol=1e-13)


def test_a_split_step_matches_the_whole_batch_in_channels_last():
    """Channels-last conv weights: the gradient temporaries a later pass writes into are laid
    out as the gradients are (the GPU kernels write in memory order)."""
    whole, _ = train(1, layout="nhwc")
    split, _ = train(4, layout="nhwc")
    for name, value in whole.items():
        np.testing.assert_allclose(split[name], value, rtol=0, atol=1e-12, err_msg=name)
    (x, y), = batches(1)
    with build_executor(small_net(), BATCH, device="cpu", micro_batches=2, layout="nhwc") as ex:
        conv = ex.net.node("conv2").layer
        weight = conv.params["weight"]
        seen, backward = [], conv.backward

        def watched(*args):
            seen.append(weight.grad.strides)
            backward(*args)
        conv.backward = watched
        ex.accumulate_gradients(x, y)
        assert len(seen) == 2 and seen[1] == seen[0] == weight.grad.strides


def test_a_split_run_repeats_bit_for_bit():
    first, first_losses = train(4)
    again, again_losses = train(4)
    assert first_losses == again_losses
    for name, value in first.items():
        assert np.array_equal(again[name], value), name


def test_split_gradients_are_the_whole_batchs_and_the_passes_run_at_the_micro_batch():
    (x, y), = batches(1)
    grads = {}
    for k in (1, 4):
        with build_executor(small_net(), BATCH, device="cpu", seed=0, micro_batches=k) as ex:
            assert ex.plan.batch == BATCH // k
            ex.accumulate_gradients(x, y)
            grads[k] = ex.gradients()
    for name, g in grads[1].items():
        np.testing.assert_allclose(grads[4][name], g, rtol=0, atol=1e-13, err_msg=name)
        assert not np.array_equal(g, 0 * g), name   # dropout kept some of every layer alive


def test_evaluation_with_micro_batches_gives_the_whole_batchs_loss_and_logits():
    (x, y), = batches(1)
    results = []
    for k in (1, 2):
        with build_executor(small_net(), BATCH, device="cpu", seed=0, micro_batches=k) as ex:
            results.append(ex.evaluate(x, y))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-14)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=0, atol=1e-14)


def test_a_micro_batch_draws_its_rows_of_the_whole_batchs_dropout_mask():
    layer = Dropout(0.5)
    layer.index = 3
    layer.setup([(BATCH, 7)], np.float64)
    x = np.ones((BATCH, 7))

    def mask(rows, offset, global_batch):
        ctx = StepContext(np, step=2, seed=5, batch_offset=offset, global_batch=global_batch)
        aux = {"mask": np.empty((rows, 7), np.bool_)}
        layer.forward([x[:rows]], np.empty((rows, 7)), aux, ctx)
        return aux["mask"]

    whole = mask(BATCH, 0, None)
    assert np.array_equal(mask(BATCH, 0, BATCH), whole)
    assert 0 < whole.sum() < whole.size
    for offset in range(0, BATCH, 2):
        assert np.array_equal(mask(2, offset, BATCH), whole[offset:offset + 2])


def test_micro_batches_must_divide_the_batch():
    with pytest.raises(ConfigError, match="must divide the batch 8"):
        build_executor(small_net(), BATCH, device="cpu", micro_batches=3)
    with pytest.raises(ConfigError, match="integer >= 1"):
        build_executor(small_net(), BATCH, device="cpu", micro_batches=0)


def test_training_forward_alone_is_refused_with_micro_batches():
    (x, y), = batches(1)
    with build_executor(small_net(), BATCH, device="cpu", micro_batches=2) as ex:
        with pytest.raises(ConfigError, match="train_step"):
            ex.forward(x, y, train=True)


class BatchMean(Layer):
    """Subtracts the batch's mean: a layer whose result depends on the whole batch."""
    kind = "batchmean"
    batch_statistics = True

    def infer(self, in_shapes):
        return in_shapes[0]

    def forward(self, xs, y, aux, ctx):
        y[...] = xs[0] - xs[0].mean(axis=0)

    def backward(self, xs, y, gy, gxs, aux, ctx):
        gxs[0][...] = gy - gy.mean(axis=0)


def statistics_net() -> Network:
    net = Network((3, 4, 4), num_classes=5, name="stats", dtype=np.float64)
    net.add(Flatten(), name="flat")
    net.add(BatchMean(), name="center")
    net.add(Linear(5), name="fc")
    net.add_loss()
    return net


def test_a_split_of_whole_batch_statistics_is_refused_unless_allowed():
    with pytest.raises(ConfigError, match="center.*split_batch_statistics"):
        build_executor(statistics_net(), BATCH, device="cpu", micro_batches=2)
    build_executor(statistics_net(), BATCH, device="cpu", micro_batches=1).close()
    build_executor(statistics_net(), BATCH, device="cpu", micro_batches=2,
                   split_batch_statistics=True).close()


def test_train_command_forces_a_count_and_reports_it(capsys, tmp_path):
    from minidnn.cli import main
    reports = {}
    for k in (1, 2):
        path = tmp_path / f"r{k}.json"
        code = main(["train", "--model", "mlp", "--image-size", "16", "--steps", "2", "--batch",
                     "8", "--micro-batches", str(k), "--report", str(path), "--no-progress",
                     "--device", "cpu", "--eval-every", "0"])
        assert code == 0, capsys.readouterr().err
        reports[k] = json.loads(path.read_text())
    assert reports[2]["micro_batches"] == 2 and reports[1]["micro_batches"] == 1
    np.testing.assert_allclose(reports[2]["loss"], reports[1]["loss"], rtol=1e-5)
    capsys.readouterr()
    code = main(["train", "--model", "mlp", "--image-size", "16", "--batch", "8",
                 "--micro-batches", "3", "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["minidnn: error: micro-batches 3 must divide the batch 8 into "
                                 "equal micro-batches"]


def test_dyn_does_not_split_a_batch_norm_network_unless_allowed():
    """A budget that would have dyn split ResNet-18's batch: without split_batch_statistics the
    decision keeps one pass (and fits by offload and recomputation, or says why not); with
    it, dyn may split. minidnn plan says so in a note."""
    import subprocess
    import sys
    from minidnn import models
    from minidnn.decide import decide
    from minidnn.planner.dyn import DynPolicy
    net = models.build("resnet18", num_classes=10, image_size=32)
    whole = decide(net, 64, policy=DynPolicy(gpu="h200"), memory_budget="200MiB",
                   device="cpu")
    assert whole.micro_batches == 1
    proc = subprocess.run([sys.executable, "-m", "minidnn", "plan", "--model", "resnet18",
                           "--batch", "256", "--memory-budget", "4GiB", "--gpu", "h200"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "not split into micro-batches: 20 BatchNorm layers" in proc.stdout
    forced = subprocess.run([sys.executable, "-m", "minidnn", "plan", "--model", "resnet18",
                             "--batch", "256", "--memory-budget", "4GiB", "--gpu", "h200",
                             "--micro-batches", "2"], capture_output=True, text=True,
                            timeout=240)
    assert forced.returncode == 2 and "--split-batch-statistics" in forced.stderr


def test_a_fully_connected_weight_gradient_is_added_in_place_with_the_bits_of_a_temporary(
        monkeypatch):
    """A pass after the first adds a fully connected layer's weight gradient to the one held
    (Linear.adds_in_place: the product adds, kernels/cpu.linear_backward), with no
    gradient-sized temporary; every other gradient still goes through one. On the CPU the
    product is added as the temporary was: the same bits. (The decision gathers none of the
    layers' rows here, minidnn/gathered.py, which would leave the passes nothing to add.)"""
    from dataclasses import replace

    from minidnn.decide import decide
    from minidnn.executor import Executor
    (x, y), = batches(1, np.float32)
    runs = {}
    for adds in ((), ("weight",)):
        monkeypatch.setattr(Linear, "adds_in_place", adds)
        net = small_net(np.float32)
        decision = replace(decide(net, BATCH, device="cpu", micro_batches=2),
                           gathered=frozenset())
        with Executor(net, BATCH, decision, device="cpu") as ex:
            taken, empty = [], ex.allocator.empty

            def watched(shape, dtype, what=""):
                taken.append(what)
                return empty(shape, dtype, what)
            monkeypatch.setattr(ex.allocator, "empty", watched)
            ex.accumulate_gradients(x, y)
            runs[adds] = ({name: p.grad.copy() for name, p in ex.parameters()},
                          sorted(w for w in taken if w.endswith("(summed)")))
    (apart, apart_taken), (in_place, in_place_taken) = runs[()], runs[("weight",)]
    for name, grad in apart.items():
        assert np.array_equal(in_place[name], grad), name
    assert apart_taken.count("gradient of fc1 (summed)") == 2       # weight and bias
    assert in_place_taken.count("gradient of fc1 (summed)") == 1    # the bias alone
    assert in_place_taken.count("gradient of conv1 (summed)") == 1    # its bias: pool1


def test_the_step_model_counts_no_temporary_for_a_gradient_added_in_place():
    """costs.accumulation_bytes: a later pass's temporaries are the gradients the layer does
    not add in place, under --deterministic (slices) too."""
    from minidnn.memory.allocator import aligned
    from minidnn.planner.costs import accumulation_bytes
    fc = Linear(70)
    fc.setup([(8, 50)])
    weight, bias = aligned(70 * 50 * 4), aligned(70 * 4)
    assert weight > bias
    assert accumulation_bytes(fc, None, "backward", 2) == bias
    assert accumulation_bytes(fc, ("bias",), "backward", 2) == bias
    assert accumulation_bytes(fc, ("weight",), "backward", 2) == 0
    assert accumulation_bytes(fc, None, "backward", 2, None, 2, rows=4) == bias
    assert accumulation_bytes(fc, None, "backward", 1, None, 2, rows=4) == bias
    assert accumulation_bytes(fc, None, "backward", 1) == 0
