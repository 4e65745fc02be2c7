"""The gap a layer call takes among a pass's other calls (Profile.call_gap_s): measured by the
profile on a GPU (tests/test_profile_gpu.py), 0 on the CPU, and added by the step model to
every call the step makes, but to none that a fused step runs inside another's kernel."""
import math
from dataclasses import replace

import pytest

from minidnn import models
from minidnn.backend import select_device
from minidnn.kernels.mapformat import MapFormat
from minidnn.planner import StepModel, analytic_profile
from minidnn.planner.profile import measure_call_gap, pass_bytes
from minidnn.planner.timeline import timeline_data


def calls_at(net, profile, gap):
    """(step seconds, {(phase, layer): device seconds}) of the unmoved step at `gap`."""
    model = StepModel(net, 8, replace(profile, call_gap_s=gap))
    ev = model.evaluate(frozenset())
    return ev.step_time_s, {(c["phase"], c["layer"]): c["end"] - c["start"]
                            for c in timeline_data(model, ev)["calls"]}


def test_every_call_the_step_makes_takes_the_gap_and_a_fused_away_call_none():
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    profile = analytic_profile(net, 8, "h200")
    model = StepModel(net, 8, profile)
    fused_away = {("forward", n) for n, s in model.forward_share.items() if s == 0} | \
        {("backward", n) for n, s in model.backward_share.items() if s == 0}
    assert fused_away          # the ReLUs its convolutions apply
    # Gaps of milliseconds: the device, not the host, sets the step's length.
    step1, calls1 = calls_at(net, profile, 1e-3)
    step2, calls2 = calls_at(net, profile, 2e-3)
    grew = {call: calls2[call] - calls1[call] for call in calls1}
    for call, more in grew.items():
        assert more == pytest.approx(0.0 if call in fused_away else 1e-3, abs=1e-12), call
    made = sum(1 for call in grew if call not in fused_away)
    assert made == 2 * len(net.nodes) - len(fused_away)
    assert step2 - step1 == pytest.approx(made * 1e-3, rel=1e-6)


def test_the_cpu_measures_no_gap_and_a_pass_s_bytes_grow_with_its_batch():
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    maps = MapFormat("nchw", "fp32")
    assert measure_call_gap(net, 8, select_device("cpu"), maps) == (0.0, 8)
    params = sum(math.prod(p.shape) for _, p in net.parameters()) * 2 * 4
    fp32 = {b: pass_bytes(net, b, maps) for b in (1, 2, 4)}
    bf16 = {b: pass_bytes(net, b, MapFormat("nchw", "bf16")) for b in (2, 4)}
    assert fp32[1] > params
    assert fp32[4] - fp32[2] == 2 * (fp32[2] - fp32[1]) > 0   # maps grow with the batch
    assert bf16[4] - bf16[2] == (fp32[4] - fp32[2]) // 2       # at half the bytes a value
