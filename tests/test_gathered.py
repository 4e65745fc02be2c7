"""A split step computes a fully connected layer's parameter gradients once, over the rows
every pass copied aside (minidnn/gathered.py): which layers, how many products, the bits
against the unsplit step, the bytes the step model counts, and data parallelism's buckets."""
from dataclasses import replace

import numpy as np
import pytest

from minidnn import models
from minidnn.decide import decide
from minidnn.distributed.buckets import GradientBuckets
from minidnn.executor import Executor
from minidnn.gathered import gathered_layers, held_bytes, weight_bytes
from minidnn.kernels import cpu
from minidnn.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU
from minidnn.memory.plan import LivenessPlan
from minidnn.network import Network
from minidnn.spec import StepSpec

BATCH = 16


def head_net() -> Network:
    """conv -> relu -> pool -> flatten -> fc1 (64 -> 32) -> relu -> fc2 (32 -> 10) -> loss:
    at batch 16, fc1's rows (16 x 96 values) are smaller than its weight (32 x 64), fc2's
    (16 x 42) larger than its (10 x 32)."""
    return Network.sequential((3, 8, 8), [
        Conv2d(4, 3, padding=1, name="conv"), ReLU(name="relu"), MaxPool2d(2, name="pool"),
        Flatten(name="flat"), Linear(32, name="fc1"), ReLU(name="relu1"),
        Linear(10, name="fc2")], num_classes=10)


def head_executor(micro_batches: int, gather: bool = True, device: str = "cpu",
                  **settings) -> Executor:
    """An executor of head_net at BATCH in `micro_batches` passes; gather=False: its decision
    without gathered layers (each pass adds its own products)."""
    net = head_net()
    spec = StepSpec(batch=BATCH, micro_batches=micro_batches, **settings)
    decision = decide(net, spec, device=device)
    if not gather:
        decision = replace(decision, gathered=frozenset())
    return Executor(net, spec, decision, device=device, seed=0)


def step_gradients(micro_batches: int, gather: bool = True, device: str = "cpu", **settings):
    """(the decision, every parameter's gradient) of one step of a head_executor."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 10, BATCH)
    with head_executor(micro_batches, gather, device, **settings) as ex:
        ex.accumulate_gradients(x, labels)
        return ex.decision, ex.gradients()


def test_a_split_step_gathers_the_layers_whose_rows_are_smaller_than_their_weight():
    net = head_net()
    plan = LivenessPlan(net, BATCH // 4)
    fc1, fc2 = net.node("fc1").layer, net.node("fc2").layer
    assert held_bytes(fc1, BATCH, np.dtype(np.float32)) < weight_bytes(fc1)
    assert held_bytes(fc2, BATCH, np.dtype(np.float32)) > weight_bytes(fc2)
    assert gathered_layers(plan, 4, StepSpec(batch=BATCH)) == {"fc1"}
    assert gathered_layers(plan, 1, StepSpec(batch=BATCH)) == frozenset()
    # A decision of one pass gathers nothing; of four, fc1, with --no-fuse as well (the
    # order of a sum, as the split itself: fused and unfused steps keep the same bits).
    assert decide(net, StepSpec(batch=BATCH), device="cpu").gathered == frozenset()
    for fuse in (True, False):
        spec = StepSpec(batch=BATCH, micro_batches=4, fuse=fuse)
        assert decide(head_net(), spec, device="cpu").gathered == {"fc1"}
    # VGG-16 at batch 256 in 8 passes: its three fully connected layers.
    vgg = models.build("vgg16", num_classes=1000)
    assert gathered_layers(LivenessPlan(vgg, 32), 8, StepSpec(batch=256)) == \
        {"fc6", "fc7", "fc8"}


def test_the_weight_gradient_product_runs_once_a_step(monkeypatch):
    """Each of the 4 passes computes fc1's input gradient alone; one call after them the
    weight's and bias's, over the step's 16 rows. fc2, not gathered, computes its own in
    every pass."""
    calls = []
    real = cpu.linear_backward

    def watched(x, gy, w, gw, gb, gx, add=False):
        calls.append((w.shape, x.shape[0], gw is not None, gb is not None, gx is not None))
        real(x, gy, w, gw, gb, gx, add)

    monkeypatch.setattr(cpu, "linear_backward", watched)
    step_gradients(4)
    fc1 = [c for c in calls if c[0] == (32, 64)]
    fc2 = [c for c in calls if c[0] == (10, 32)]
    assert fc1 == [((32, 64), 4, False, False, True)] * 4 + [((32, 64), 16, True, True, False)]
    assert fc2 == [((10, 32), 4, True, True, True)] * 4


def test_gathered_gradients_are_the_unsplit_steps_where_the_rows_are():
    """bf16 maps: the rows fc1 reads are rounded to bf16, so a split step's are the unsplit
    step's bits, and so is fc1's gradient, one product over the same rows; each pass adding
    its own product sums in another order. The other gradients agree within float32
    rounding. Under --deterministic every gradient of every split has the same bits,
    gathered or not (layers/slices.py)."""
    _, whole = step_gradients(1, precision="bf16")
    decision, gathered = step_gradients(4, precision="bf16")
    _, apart = step_gradients(4, gather=False, precision="bf16")
    assert decision.gathered == {"fc1"}
    for name in ("fc1.weight", "fc1.bias"):
        assert np.array_equal(gathered[name], whole[name]), name
    assert not np.array_equal(apart["fc1.weight"], whole["fc1.weight"])
    for name, grad in whole.items():
        np.testing.assert_allclose(gathered[name], grad, rtol=1e-5, atol=1e-7, err_msg=name)
    _, whole = step_gradients(1, deterministic=True)
    for k in (2, 4):
        for gather in (True, False):
            _, split = step_gradients(k, gather, deterministic=True)
            for name, grad in whole.items():
                assert np.array_equal(split[name], grad), (k, gather, name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_step_model_counts_the_rows_a_step_holds(monkeypatch, precision):
    """The two blocks of fc1's rows the executor takes are the bytes the step model adds to
    every level of the step (StepModel.gathered_bytes), in the maps' dtype."""
    from minidnn.planner.gpus import analytic_profile
    from minidnn.planner.step_model import StepModel
    net = head_net()
    spec = StepSpec(batch=BATCH, micro_batches=4, precision=precision, static_layout=True)
    model = StepModel(net, spec, analytic_profile(net, BATCH // 4, "h200"))
    assert model.gathered == {"fc1"}
    decision = decide(net, spec, device="cpu")
    taken = []
    with Executor(net, spec, decision, device="cpu", seed=0) as ex:
        empty = ex.allocator.empty

        def watched(shape, dtype, where=""):
            if where.endswith("(gathered)"):
                taken.append((where, shape, np.dtype(dtype).itemsize))
            return empty(shape, dtype, where)

        monkeypatch.setattr(ex.allocator, "empty", watched)
        rng = np.random.default_rng(0)
        ex.accumulate_gradients(rng.standard_normal((BATCH, 3, 8, 8)).astype(np.float32),
                                rng.integers(0, 10, BATCH))
    itemsize = 2 if precision == "bf16" else 4
    assert taken == [("input of fc1 (gathered)", (BATCH, 64), itemsize),
                     ("output gradient of fc1 (gathered)", (BATCH, 32), itemsize)]
    assert model.gathered_bytes == held_bytes(net.node("fc1").layer, BATCH,
                                              decision_map_dtype(precision))
    unsplit = StepModel(net, StepSpec(batch=BATCH, precision=precision, static_layout=True),
                        analytic_profile(net, BATCH, "h200"))
    assert unsplit.gathered_bytes == 0


def test_the_step_model_adds_no_gathered_gradient_pass_by_pass():
    """A gathered layer's gradients are computed once a step, so the passes after the first
    add every gradient but its: the step model prices each at the share of the profile's
    accumulate_s that the other gradients' values take (a weight its layer adds in place
    weighs a third of its values, as the profile measured it)."""
    from minidnn.planner.costs import IN_PLACE_ADD_SHARE, accumulated_share
    from minidnn.planner.gpus import analytic_profile
    from minidnn.planner.step_model import StepModel
    net = head_net()
    sizes = {name: int(np.prod(p.shape)) for name, p in net.parameters()}
    weighed = {name: n * (IN_PLACE_ADD_SHARE if name.endswith("fc1.weight") or
                          name.endswith("fc2.weight") else 1.0) for name, n in sizes.items()}
    kept = sum(w for name, w in weighed.items() if not name.startswith("fc1."))
    assert accumulated_share(net, {"fc1"}) == pytest.approx(kept / sum(weighed.values()))
    assert accumulated_share(net) == 1.0
    profile = analytic_profile(net, BATCH // 4, "h200")
    model = StepModel(net, StepSpec(batch=BATCH, micro_batches=4, static_layout=True), profile)
    assert model.gathered == {"fc1"}
    assert model.accumulate_s == pytest.approx(profile.accumulate_s * kept /
                                               sum(weighed.values()))
    assert 0 < model.accumulate_s < profile.accumulate_s


def decision_map_dtype(precision: str):
    from minidnn.kernels.mapformat import MapFormat
    return MapFormat("nchw", precision).map_dtype(np.float32)


class _Reducer:
    def __init__(self):
        self.started = []

    def start(self, arrays, trace):
        self.started.append(len(arrays))

    def finish(self):
        pass


def test_buckets_wait_for_the_gathered_call():
    """Data parallelism's buckets send a gathered layer's gradients after its call that
    follows the passes (one more backward report), not after its last pass."""
    net = head_net()
    net.infer_shapes(BATCH)
    for _, p in net.parameters():
        p.grad = np.zeros(p.shape, np.float32)
    fc1 = next(i for i, node in enumerate(net.nodes) if node.name == "fc1")
    reducer = _Reducer()
    buckets = GradientBuckets(net, reducer, bucket_bytes=1, first_bucket_bytes=1, passes=2,
                              gathered=frozenset({fc1}))
    first = len(reducer.started)
    for _ in range(2):                   # the two passes' backward calls of fc1
        buckets.layer("backward", "fc1", fc1, None, None)
    assert len(reducer.started) == first
    buckets.layer("backward", "fc1", fc1, None, None)      # the gathered call
    assert len(reducer.started) > first


def test_plan_and_the_run_report_the_gathered_layers(tmp_path):
    """`minidnn plan` names them in its decision line and its JSON; a run's report lists
    them (none in a step of one pass)."""
    import argparse
    import json

    from minidnn.planner import command
    from minidnn.train import TrainConfig, train
    parser = argparse.ArgumentParser(prog="minidnn")
    command.add_parser(parser.add_subparsers(dest="command"))
    lines = []
    args = parser.parse_args(["plan", "--model", "vgg16", "--batch", "256", "--gpu", "h200",
                              "--memory-budget", "4GiB", "--relu-bits", "--json"])
    assert command.run(args, out=lines.append) == 0
    planned = json.loads("\n".join(lines))
    assert planned["micro_batches"] > 1 and planned["gathered"] == ["fc6", "fc7", "fc8"]
    assert "the gradients of fc6, fc7, fc8 once a step" in planned["decision"]
    for k, expected in ((1, []), (2, ["fc1", "fc2"])):
        report = train(TrainConfig(model="mlp", image_size=16, batch=8, steps=1, device="cpu",
                                   eval_every=0, eval_batches=1, progress=False,
                                   micro_batches=k), log=lambda *_: None)
        assert report["gathered"] == expected
