"""The pass adding a convolution's bias (LayerCost.bias_s): the profile times it apart, and the
step model leaves it out of the forward of each convolution whose ReLU adds its bias
(minidnn/fusion.py, bias_relu) in a fused step, where the convolution runs without it."""
from dataclasses import replace

import pytest

from minidnn import models
from minidnn.backend import select_device
from minidnn.fusion import bias_relu_pairs
from minidnn.kernels.mapformat import MapFormat
from minidnn.planner import StepModel, analytic_profile
from minidnn.planner.costs import LayerCost
from minidnn.planner.profile import measure_layers
from minidnn.planner.timeline import timeline_data


def test_a_forward_s_time_less_its_bias_pass():
    cost = LayerCost({"fastest": 3e-3, "min_workspace": 5e-3}, {"fastest": 8e-3},
                     bias_s=1e-3)
    assert cost.time("forward") == 3e-3 and cost.time("backward") == 8e-3
    assert cost.time("forward", own_bias=False) == pytest.approx(2e-3)
    assert cost.time("recompute", "min_workspace", False) == pytest.approx(4e-3)
    assert cost.time("backward", own_bias=False) == 8e-3      # its sums move, not vanish
    assert cost.least_time("forward", own_bias=False) == pytest.approx(2e-3)
    assert LayerCost({"fastest": 1e-6}, {"fastest": 1e-6},
                     bias_s=2e-6).time("forward", "fastest", False) == 0.0


@pytest.mark.parametrize("maps", [MapFormat("nchw", "fp32"), MapFormat("nhwc", "bf16")])
def test_the_profile_times_the_bias_passes_of_a_convolution_with_a_bias(maps):
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    costs = measure_layers(net, 4, select_device("cpu"), repeats=1, progress=False, maps=maps)
    biased = [n.name for n in net.nodes if n.layer.kind == "conv" and n.layer.bias]
    assert biased
    for node in net.nodes:
        cost = costs[node.name]
        if node.name in biased:
            assert 0 < cost.bias_s < cost.time("forward"), node.name
        else:
            assert cost.bias_s == 0.0, node.name


def durations(model) -> dict:
    """{(phase, layer): device seconds} of the model's unmoved step."""
    ev = model.evaluate(frozenset())
    return {(c["phase"], c["layer"]): c["end"] - c["start"]
            for c in timeline_data(model, ev)["calls"]}


def free_bias(profile):
    """The profile with every bias pass made free: each forward less its bias's pass."""
    return replace(profile, layers={
        name: replace(cost, bias_s=0.0, forward_s={
            setting: t - cost.bias_s for setting, t in cost.forward_s.items()})
        for name, cost in profile.layers.items()})


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("fuse", [True, False])
def test_a_fused_step_leaves_out_the_bias_pass_its_relus_take_over(precision, fuse):
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    profile = analytic_profile(net, 8, "h200")
    assert not profile.synchronous
    maps = MapFormat("nhwc", precision)
    model = StepModel(net, 8, profile, maps=maps, input_batches=0, fuse=fuse)
    moved = set(bias_relu_pairs(model.plan).values()) if fuse else set()
    assert model.bias_elsewhere == moved
    # With every bias pass free, the calls of the moved convolutions take what they took,
    # every other forward (or recomputation) with a bias its bias's pass less.
    before = durations(model)
    after = durations(StepModel(net, 8, free_bias(profile), maps=maps, input_batches=0,
                                fuse=fuse))
    shorter = set()
    for (phase, name), seconds in before.items():
        own = profile.layer(name).bias_s if phase != "backward" else 0.0
        if name in moved or not own:
            assert after[(phase, name)] == pytest.approx(seconds, abs=1e-12), (phase, name)
        else:
            assert after[(phase, name)] == pytest.approx(seconds - own, abs=1e-12)
            shorter.add(name)
    assert shorter == {"conv1", "conv2"} - moved
