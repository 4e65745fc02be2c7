"""Convolution plan settings between fastest and memory-optimal: the fastest plans within a
workspace limit. Plan choice and the ladder of limits (kernels/cudnn_conv.py), the layer's
setting string (layers/conv.py), the profile's costs of each setting (planner/profile.py, with
a stand-in plan table on the CPU) and the planner's use of them (planner/search.py)."""
import math

import pytest

from minidnn import Network
from minidnn.errors import ConfigError
from minidnn.kernels import cpu as cpu_kernels
from minidnn.kernels.cudnn_conv import PlanTiming, choose_plan, workspace_ladder
from minidnn.layers import Conv2d, Flatten, Linear, ReLU
from minidnn.layers.conv import describe_plan_setting, parse_plan_setting, plan_setting
from minidnn.planner import LayerCost, Profile
from minidnn.planner import profile as profiling
from minidnn.planner.dyn import FixedDecision
from minidnn.memory.policy import MemoryDecision
from minidnn.planner.search import Planner
from minidnn.backend import Device
from minidnn.decide import build_executor

MiB = 2**20
INF = math.inf
FPROP = [PlanTiming(0, 600 * MiB, 1.0),    # fastest
         PlanTiming(1, 40 * MiB, 1.2),     # nearly as fast, a fifteenth of the workspace
         PlanTiming(2, 8 * MiB, 2.0),
         PlanTiming(3, 0, 4.0),            # memory-optimal
         PlanTiming(4, 0, INF)]            # did not run
WGRAD = [PlanTiming(0, 300 * MiB, 2.0), PlanTiming(1, 40 * MiB, 2.5), PlanTiming(2, 0, 9.0)]


def test_a_workspace_limit_picks_the_fastest_plan_within_it():
    assert choose_plan(FPROP, "fastest", workspace_limit=None).index == 0
    assert choose_plan(FPROP, "fastest", workspace_limit=600 * MiB).index == 0
    assert choose_plan(FPROP, "fastest", workspace_limit=599 * MiB).index == 1
    assert choose_plan(FPROP, "fastest", workspace_limit=10 * MiB).index == 2
    assert choose_plan(FPROP, "fastest", workspace_limit=0).index == 3
    assert choose_plan(FPROP, "fastest", workspace_limit=0, by_rank=True).index == 3
    # No plan that lean: the leanest ones (never a plan that did not run).
    lean = [PlanTiming(0, 50, 1.0), PlanTiming(1, 20, 3.0), PlanTiming(2, 20, 2.0)]
    assert choose_plan(lean, "fastest", workspace_limit=10).index == 2
    # min_workspace ignores the limit.
    assert choose_plan(FPROP, "min_workspace", workspace_limit=600 * MiB).index == 3


def test_the_ladder_keeps_the_rungs_that_trade_memory_for_time():
    tables = {"fprop": FPROP, "wgrad": WGRAD}
    # fastest: 600 MiB, 3 ms. Rungs: 300 MiB (fprop 1, wgrad 0: 3.2 ms), 40 MiB (fprop 1,
    # wgrad 1: 3.7 ms), 8 MiB (fprop 2, wgrad 2: 11 ms, still faster than memory-optimal's
    # 13 ms). Limits between them give one of these choices again, not another rung.
    assert workspace_ladder(tables) == [300 * MiB, 40 * MiB, 8 * MiB]
    assert workspace_ladder({"fprop": FPROP}) == [40 * MiB, 8 * MiB]
    # A rung no faster than memory-optimal is dropped.
    slow = [PlanTiming(0, 100, 1.0), PlanTiming(1, 50, 5.0), PlanTiming(2, 0, 5.0)]
    assert workspace_ladder({"fprop": slow}) == []
    # A plan that saves a sliver of the workspace of the rung above is no rung.
    sliver = [PlanTiming(0, 600, 1.0), PlanTiming(1, 590, 1.1), PlanTiming(2, 300, 1.5),
              PlanTiming(3, 0, 5.0)]
    assert workspace_ladder({"fprop": sliver}) == [300]
    # Nothing between when the fastest plan needs no workspace.
    assert workspace_ladder({"fprop": [PlanTiming(0, 0, 1.0), PlanTiming(1, 9, 2.0)]}) == []


def test_the_ladder_is_thinned_evenly_to_max_rungs():
    table = [PlanTiming(k, 2**(20 - k), 1.0 + k) for k in range(12)] + [PlanTiming(99, 0, 50.0)]
    full = workspace_ladder({"fprop": table}, max_rungs=100)
    assert full == [2**(20 - k) for k in range(1, 12)]
    thin = workspace_ladder({"fprop": table}, max_rungs=4)
    assert len(thin) == 4 and thin[0] == full[0] and thin[-1] == full[-1]
    assert thin == sorted(thin, reverse=True) and set(thin) <= set(full)


def test_setting_strings_round_trip_and_bad_ones_are_named():
    assert plan_setting("fastest") == "fastest"
    assert plan_setting("fastest", 1024) == "fastest<=1024"
    for s in ("fastest", "min_workspace", "fastest<=0", "fastest<=123456789"):
        assert plan_setting(*parse_plan_setting(s)) == s
    for bad in ("quickest", "fastest<=", "fastest<=-5", "fastest<=1e9", None):
        with pytest.raises(ConfigError, match="plan setting must be one of"):
            parse_plan_setting(bad)
    assert describe_plan_setting("min_workspace") == "memory-optimal"
    assert describe_plan_setting(f"fastest<={40 * MiB}") == "<= 40.00 MiB"


def test_a_layer_carries_its_setting_into_its_spec():
    conv = Conv2d(8, 3, name="c")
    assert conv.plan_setting == "fastest" and conv.spec.workspace_limit is None
    conv.plan_setting = "fastest<=4096"
    assert (conv.algo, conv.workspace_limit, conv.spec.workspace_limit) == ("fastest", 4096, 4096)
    conv.plan_setting = "min_workspace"
    assert conv.workspace_limit is None and conv.spec.algo == "min_workspace"
    with pytest.raises(ConfigError, match="workspace_limit must be None or an int"):
        conv.workspace_limit = -1


def cost(fwd, bwd, ws) -> LayerCost:
    return LayerCost(dict(fwd), dict(bwd), dict(ws), dict(ws))


def test_settings_are_ordered_by_workspace():
    c = cost({"fastest": 1.0, "min_workspace": 4.0, "fastest<=40": 1.2, "fastest<=8": 2.0},
             {"fastest": 1.0, "min_workspace": 4.0, "fastest<=40": 1.2, "fastest<=8": 2.0},
             {"fastest": 600, "min_workspace": 0, "fastest<=40": 40, "fastest<=8": 8})
    assert c.settings() == ["fastest", "fastest<=40", "fastest<=8", "min_workspace"]
    assert c.leaner("fastest") == "fastest<=40" and c.leaner("min_workspace") is None
    assert c.faster("fastest<=8") == "fastest<=40" and c.faster("fastest") is None


def test_profiling_costs_each_rung_from_the_plan_table(monkeypatch):
    """The CPU has no cuDNN plans; a stand-in table exercises the path the GPU runs (by
    default not deterministic)."""
    def conv_plans(op, x_shape, w_shape, spec, dtype=None, layout="nchw"):
        return {"fprop": FPROP, "wgrad": WGRAD, "dgrad": WGRAD}[op]
    monkeypatch.setattr(cpu_kernels, "conv_plans", conv_plans, raising=False)
    monkeypatch.setattr(profiling, "kernel_settings",
                        lambda kernels: {"math": "tf32", "deterministic": False})
    net = Network.sequential((3, 8, 8), [Conv2d(4, 3, padding=1, name="conv1"),
                                         ReLU(name="relu1"), Conv2d(4, 3, padding=1,
                                                                    name="conv2"),
                                         Flatten(name="flat"), Linear(10, name="fc")],
                             num_classes=10)
    net.init_params(0)
    layers = profiling.measure_layers(net, 2, Device("cpu"), repeats=1, progress=False)
    for name, backward_ops in (("conv1", ["wgrad"]), ("conv2", ["wgrad", "dgrad"])):
        c = layers[name]
        assert c.settings() == ["fastest", f"fastest<={300 * MiB}", f"fastest<={40 * MiB}",
                                f"fastest<={8 * MiB}", "min_workspace"]
        rung = f"fastest<={40 * MiB}"
        assert c.workspace("forward", rung) == 40 * MiB
        assert c.workspace("backward", rung) == 40 * MiB
        assert c.workspace("forward", "fastest") == 600 * MiB
        # The rung's time is the fastest setting's measured time plus the table's difference.
        assert c.time("forward", rung) == pytest.approx(c.time("forward") + 0.2e-3)
        assert c.time("backward", rung) == pytest.approx(
            c.time("backward") + len(backward_ops) * 0.5e-3)
    assert net.node("conv1").layer.plan_setting == "fastest"   # left as it was


def chain_profile(net, batch) -> Profile:
    """Convolutions whose fastest plan needs a large workspace, with a rung nearly as fast."""
    net.infer_shapes(batch)
    layers = {}
    for n in net.nodes:
        if n.layer.kind == "conv":
            t = {"fastest": 1e-3, f"fastest<={MiB}": 1.1e-3, "min_workspace": 5e-3}
            ws = {"fastest": 64 * MiB, f"fastest<={MiB}": MiB, "min_workspace": 0}
            layers[n.name] = cost(t, t, ws)
        else:
            layers[n.name] = cost({"fastest": 1e-4}, {"fastest": 1e-4}, {"fastest": 0})
    return Profile(source="test", device_name="test", math="fp32", network=net.name,
                   batch=batch, memory_bytes=2**30, d2h_bw=1e8, h2d_bw=1e8, duplex_bw=2e8,
                   layers=layers, optimizer_s=1e-4)


def test_the_planner_takes_a_rung_rather_than_the_memory_optimal_plan():
    net = Network.sequential((3, 16, 16), [
        Conv2d(8, 3, padding=1, name="conv1"), ReLU(name="relu1"),
        Conv2d(8, 3, padding=1, name="conv2"), ReLU(name="relu2"),
        Flatten(name="flat"), Linear(10, name="fc")], num_classes=10)
    batch = 8
    prof = chain_profile(net, batch)
    probe = Planner(net, batch, prof, budget=None)
    none = probe.baseline("none").required_bytes
    # The fastest plans' 64 MiB workspace does not fit, the 1 MiB rung does.
    budget = int((none - 60 * MiB) / 0.99)
    result = Planner(net, batch, prof, budget=budget).run()
    assert result.best.fits
    assert set(result.best.conv_algo.values()) <= {"fastest", f"fastest<={MiB}"}
    assert f"fastest<={MiB}" in result.best.conv_algo.values()
    assert result.best.offload == frozenset()
    assert result.best.step_time_s < result.baselines["none/min_workspace"].step_time_s
    # The executor runs the decision's settings and leaves the layers' own alone.
    ex = build_executor(net, batch, device="cpu", policy=FixedDecision(result.best.decision),
                  compute=False)
    assert ex.decision.conv_algo == result.best.conv_algo
    assert {net.node(n).layer.plan_setting for n in ("conv1", "conv2")} == {"fastest"}
    ex.close()
    assert {net.node(n).layer.plan_setting for n in ("conv1", "conv2")} == {"fastest"}


def test_deterministic_profiling_costs_one_plan_for_every_setting(monkeypatch):
    """In deterministic mode every setting runs the same plan (the best-ranked of the least
    workspace), so the profile offers no trade-off and no budget changes a bit."""
    def conv_plans(op, x_shape, w_shape, spec, dtype=None, layout="nchw"):
        return {"fprop": FPROP, "wgrad": WGRAD, "dgrad": WGRAD}[op]
    monkeypatch.setattr(cpu_kernels, "conv_plans", conv_plans, raising=False)
    net = Network.sequential((3, 8, 8), [Conv2d(4, 3, padding=1, name="conv1"),
                                         Flatten(name="flat"), Linear(10, name="fc")],
                             num_classes=10)
    net.init_params(0)
    layers = profiling.measure_layers(net, 2, Device("cpu"), repeats=1, progress=False)
    c = layers["conv1"]
    assert set(c.settings()) == {"fastest", "min_workspace"}
    for phase in ("forward", "backward"):
        assert c.workspace(phase, "fastest") == c.workspace(phase, "min_workspace") == 0
