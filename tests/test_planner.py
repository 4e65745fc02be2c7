"""vDNN_dyn's planner: analytic GPU presets, the timed dry run, the search and the dyn policy."""
import dataclasses

import numpy as np
import pytest

from minidnn.spec import StepSpec
from minidnn.step_graph import LOSS_SLOTS
from minidnn import Network, SGD
from minidnn.errors import ConfigError, MemoryBudgetError, parse_bytes
from minidnn.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU
from minidnn.memory.allocator import aligned
from minidnn.memory.policy import get_policy
from minidnn.planner import DynPolicy, LayerCost, Profile
from minidnn.planner.gpus import H200, K40, analytic_profile, get_gpu
from minidnn.planner.search import InfeasibleBudgetError, Planner, budget_to_give
from minidnn.planner.step_model import PlanOptions, StepModel
from minidnn.decide import build_executor

MiB = 2**20


def conv_chain(channels=16, size=32) -> Network:
    """data -> 3 x (conv 3x3 + relu) -> pool -> flatten -> fc -> loss."""
    return Network.sequential((3, size, size), [
        Conv2d(channels, 3, padding=1, name="conv1"), ReLU(name="relu1"),
        Conv2d(channels, 3, padding=1, name="conv2"), ReLU(name="relu2"),
        Conv2d(channels, 3, padding=1, name="conv3"), ReLU(name="relu3"),
        MaxPool2d(2, name="pool"), Flatten(name="flat"), Linear(10, name="fc")], num_classes=10)


def flat_profile(net, batch, layer_s=1e-3, host_s=0.0, bw=1e9, ws=0) -> Profile:
    """Every layer call takes layer_s on the device and host_s on the host; copies at bw."""
    net.infer_shapes(batch)
    layers = {}
    for n in net.nodes:
        w = ws if n.layer.kind == "conv" else 0
        layers[n.name] = LayerCost({"fastest": layer_s, "min_workspace": 2 * layer_s},
                                   {"fastest": layer_s, "min_workspace": 2 * layer_s},
                                   {"fastest": w, "min_workspace": 0},
                                   {"fastest": w, "min_workspace": 0},
                                   {"forward": host_s, "backward": host_s})
    return Profile(source="test", device_name="test", math="fp32", network=net.name,
                   batch=batch, memory_bytes=2**30, d2h_bw=bw, h2d_bw=bw, duplex_bw=1.8 * bw,
                   layers=layers, optimizer_s=1e-4, optimizer_host_s=0.0)


# ---- analytic presets ---------------------------------------------------------------------------
def test_presets_carry_the_documented_figures():
    assert K40.memory_bytes == 12 * 2**30 and H200.memory_bytes >= 139 * 2**30
    assert K40.math_for("tf32") == "fp32"          # cuDNN v4 on Kepler: no TF32
    assert H200.math_for("tf32") == "tf32"
    assert H200.d2h_bw == H200.h2d_bw == 55e9 and H200.duplex_bw == 100e9
    tf32 = H200.conv_flops["tf32"]
    assert 3.3 < tf32["fastest"] / tf32["min_workspace"] < 3.9   # "TF32 plans ~3.6x faster"
    for g in (K40, H200):
        for field in ("memory_bytes", "conv_flops", "mem_bw", "d2h_bw", "duplex_bw"):
            assert g.sources.get(field), f"{g.name}: no source for {field}"
        for rates in g.conv_flops.values():
            assert rates["fastest"] >= rates["min_workspace"] > 0


def test_gpu_names_resolve_and_unknown_ones_are_listed():
    assert get_gpu("NVIDIA H200") is H200 and get_gpu("Tesla K40c") is K40
    with pytest.raises(ConfigError) as err:
        get_gpu("rtx9090")
    assert "h200" in str(err.value) and "k40" in str(err.value)


def test_analytic_vgg16_step_is_near_the_measured_pytorch_step_and_k40_is_far_slower():
    from minidnn import models
    net = models.build("vgg16", num_classes=1000)
    h200 = analytic_profile(net, 256, "h200", "tf32")
    k40 = analytic_profile(net, 256, "k40", "tf32")
    step = {p.device_name: sum(c.time("forward") + c.time("backward")
                               for c in p.layers.values()) + p.optimizer_s for p in (h200, k40)}
    # PyTorch's TF32 VGG-16 b256 step on the H200 took 180.5 ms (BACKGROUND.md).
    assert 0.8 * 0.1805 < step["h200"] < 1.25 * 0.1805
    assert step["k40"] > 25 * step["h200"]
    # Why vDNN's choices changed: the conv inputs' bytes over PCIe vs the forward compute.
    conv_in = sum(np.prod(n.layer.in_shapes[0]) * 4 for n in net.nodes if n.layer.kind == "conv")
    forward = {p.device_name: sum(c.time("forward") for c in p.layers.values())
               for p in (h200, k40)}
    assert conv_in / K40.d2h_bw < forward["k40"]          # hidden behind compute in 2016
    assert conv_in / H200.d2h_bw > 2 * forward["h200"]    # not on an H200
    conv = h200.layer("conv2_1")
    assert conv.workspace("forward", "fastest") > 0 == conv.workspace("forward", "min_workspace")
    assert conv.time("forward", "min_workspace") > 3 * conv.time("forward", "fastest")


# ---- the timed dry run --------------------------------------------------------------------------
def _calls_fused_away(model) -> float:
    """How many layer calls' time a step model's fusions save (minidnn/fusion.py)."""
    return sum(1 - s for s in (*model.forward_share.values(), *model.backward_share.values()))


def test_step_time_without_offload_is_the_sum_of_the_calls():
    net = conv_chain()
    model = StepModel(net, 4, flat_profile(net, 4, layer_s=1e-3), input_batches=0)
    ev = model.evaluate(frozenset())
    # less the forward of each ReLU its convolution applies (float32 maps on a GPU: the
    # fused graph takes the convolution's time; minidnn/fusion.py)
    from minidnn.fusion import conv_relu_pairs, pool_bias_pairs, pool_relu_pairs
    assert model.forward_share == {r: 0.0 for r in conv_relu_pairs(model.plan, False)} != {}
    # less the backward of each ReLU whose max pool applies its mask, and sums the gradient
    # of the bias it added (pool_bias)
    pooled = pool_relu_pairs(model.plan)
    assert set(pool_bias_pairs(model.plan, False)) == set(pooled)
    assert model.backward_share == {r: 0.0 for r in pooled} != {}
    calls = 2 * len(net.nodes) - _calls_fused_away(model)
    assert ev.step_time_s == pytest.approx(calls * 1e-3 + 1e-4)
    unfused = StepModel(net, 4, flat_profile(net, 4, layer_s=1e-3), input_batches=0,
                        fuse=False)
    assert unfused.forward_share == {} == unfused.backward_share
    assert unfused.evaluate(frozenset()).step_time_s == \
        pytest.approx(2 * len(net.nodes) * 1e-3 + 1e-4)
    assert ev.compute_s == pytest.approx(ev.step_time_s)
    assert ev.offloaded_bytes == 0


def test_an_add_its_batch_norm_applies_costs_the_read_of_its_other_input():
    """On a GPU the forward of a residual add that the batch norm before it applies
    (minidnn/fusion.py, bn_add) is the batch norm's pass reading one map more: a third of the
    add's own pass (which reads two maps and writes one)."""
    from minidnn import models
    from minidnn.fusion import bn_add_pairs
    from minidnn.planner.step_model import FUSED_ADD_SHARE
    net = models.build("resnet18", num_classes=10, image_size=32)
    prof = flat_profile(net, 2, layer_s=1e-3)
    fused = StepModel(net, 2, prof, input_batches=0)
    adds = bn_add_pairs(fused.plan)
    assert adds and all(fused.forward_share[a] == FUSED_ADD_SHARE for a in adds)
    unfused = StepModel(net, 2, prof, input_batches=0, fuse=False)
    saved = unfused.evaluate(frozenset()).step_time_s - fused.evaluate(frozenset()).step_time_s
    others = _calls_fused_away(fused) - len(adds) * (1 - FUSED_ADD_SHARE)
    assert saved == pytest.approx((len(adds) * (1 - FUSED_ADD_SHARE) + others) * 1e-3)


def test_each_pass_after_the_first_adds_its_gradients():
    """A step of k micro-batches: k passes, the gradient adds of the k - 1 after the first
    (the profile's accumulate_s: measured, or from the analytic GPU's memory bandwidth), one
    optimizer update."""
    net = conv_chain()
    prof = dataclasses.replace(flat_profile(net, 4, layer_s=1e-3), accumulate_s=2.5e-3)
    one = StepModel(net, 4, prof, input_batches=0).evaluate(frozenset())
    four = StepModel(net, 4, prof, input_batches=0, micro_batches=4).evaluate(frozenset())
    assert four.compute_s == pytest.approx(4 * one.compute_s - 3 * prof.optimizer_s
                                           + 3 * 2.5e-3)
    h200 = analytic_profile(net, 4, "h200")
    params = sum(int(np.prod(p.shape)) for _, p in net.parameters()) * 4
    assert h200.accumulate_s > 3 * params / H200.mem_bw


def test_a_bf16_step_on_a_gpu_makes_its_weight_copies_once_whatever_its_passes():
    """A bf16 step on the GPU makes a bf16 copy of each weight once, which its passes share
    (kernels/cuda_weights.py): the profile's weight_copy_s is added once a step, in 1 pass
    or 4; a float32 step, or a bf16 one on the CPU (whose products read the float32
    weights), adds nothing. The analytic H200 prices the copy at its memory bandwidth."""
    from minidnn.kernels.mapformat import MapFormat
    net = conv_chain()
    prof = dataclasses.replace(flat_profile(net, 4), weight_copy_s=7e-3)

    def compute_s(precision, k, profile=prof):
        return StepModel(net, 4, profile, input_batches=0, micro_batches=k,
                         maps=MapFormat(precision=precision)).evaluate(frozenset()).compute_s

    bare = dataclasses.replace(prof, weight_copy_s=0.0)
    for k in (1, 4):
        assert compute_s("bf16", k) == pytest.approx(compute_s("bf16", k, bare) + 7e-3)
        assert compute_s("fp32", k) == pytest.approx(compute_s("fp32", k, bare))
    cpu = dataclasses.replace(prof, temporaries_in_arena=False, synchronous=True)
    assert compute_s("bf16", 1, cpu) == pytest.approx(
        compute_s("bf16", 1, dataclasses.replace(cpu, weight_copy_s=0.0)))
    weights = sum(int(np.prod(n.layer.params["weight"].shape)) for n in net.nodes
                  if n.layer.kind in ("conv", "linear"))
    assert analytic_profile(net, 4, "h200").weight_copy_s > 6 * weights / H200.mem_bw


def test_a_host_slower_than_the_device_sets_the_step_time_issued_layer_by_layer():
    net = conv_chain()
    model = StepModel(net, 4, flat_profile(net, 4, layer_s=1e-6, host_s=1e-3), input_batches=0,
                      graphs=False)
    assert model.evaluate(frozenset()).step_time_s == pytest.approx(2 * len(net.nodes) * 1e-3,
                                                                    rel=0.01)


@pytest.mark.parametrize("static_layout", [True, False])
def test_a_step_replayed_from_a_graph_costs_the_host_nothing_per_call(static_layout):
    """The executor replays a step in a static layout, or one that moves nothing, from a CUDA
    graph (step_graph.py): the device runs its calls back to back, however slow the host."""
    net = conv_chain()
    prof = flat_profile(net, 4, layer_s=1e-6, host_s=1e-3)
    model = StepModel(net, 4, prof, input_batches=0, static_layout=static_layout)
    calls = 2 * len(net.nodes)
    device = calls - _calls_fused_away(model)     # a fused ReLU's forward takes none
    assert model.evaluate(frozenset()).step_time_s == pytest.approx(device * 1e-6 + 1e-4)
    everything = get_policy("all").decide(model.plan).offload
    moved = model.evaluate(everything).step_time_s
    if static_layout:    # replayed: bounded by the copies, not by the host
        assert moved < calls * 1e-3 / 2
    else:                # issued layer by layer: the host's time per call
        assert moved >= calls * 1e-3


def test_a_cpu_profile_is_never_replayed():
    net = conv_chain()
    prof = dataclasses.replace(flat_profile(net, 4, layer_s=1e-6, host_s=1e-3), synchronous=True)
    model = StepModel(net, 4, prof, input_batches=0)
    assert model.evaluate(frozenset()).step_time_s >= 2 * len(net.nodes) * 1e-3
    assert model.forward_share == {} == model.backward_share  # the CPU runs each pass still


def test_copies_hide_behind_compute_only_when_the_link_is_fast():
    net = conv_chain()
    fast = StepModel(net, 8, flat_profile(net, 8, layer_s=1e-3, bw=1e12), input_batches=0)
    slow = StepModel(net, 8, flat_profile(net, 8, layer_s=1e-3, bw=1e7), input_batches=0)
    everything = get_policy("all").decide(fast.plan).offload
    none_s = fast.evaluate(frozenset()).step_time_s
    hidden = fast.evaluate(everything)
    assert hidden.offloaded_bytes > 0
    assert hidden.step_time_s < none_s * 1.01
    exposed = slow.evaluate(everything)
    assert exposed.step_time_s >= slow.lower_bound_s(exposed) >= exposed.offloaded_bytes / 1e7
    assert exposed.step_time_s > 2 * none_s
    assert sum(c[2] for c in exposed.calls.values()) > 0.5 * exposed.step_time_s  # waits


def test_a_flatten_of_channels_last_maps_copies_them_in_a_planned_scratch_block(monkeypatch):
    """Flatten reorders channels-last maps over their own buffer through a copy (layers/
    flatten.py): the memory manager hands each such call a scratch block of the map's size,
    planned with the step's other blocks; on NCHW maps it is a reshape, on widened bf16 maps
    the copies are layers/precision.py's. The step's bits do not change."""
    from minidnn import models
    from minidnn.decide import build_executor
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    i = next(i for i, n in enumerate(net.nodes) if n.layer.kind == "reshape")

    def scratch(layout, precision="fp32"):
        with build_executor(net, 16, device="cpu", layout=layout, precision=precision,
                            compute=False) as ex:
            return {phase: ex.manager.scratch.get((i, phase), 0) for phase in ("forward", "backward")}

    assert scratch("nhwc") == {"forward": 16 * 512 * 4, "backward": 16 * 512 * 4}
    assert scratch("nchw") == {"forward": 0, "backward": 0}
    widened = scratch("nhwc", "bf16")        # precision.py's float32 copies, apart
    assert widened["forward"] == 2 * 16 * 512 * 4
    bits = []
    for planned in (True, False):      # False: the copy from the array module, unplanned
        net.init_params(0)
        if not planned:
            monkeypatch.setattr(type(net.nodes[i].layer), "copy_bytes", lambda self, *a: 0)
        with build_executor(net, 16, device="cpu", layout="nhwc", seed=1) as ex:
            assert bool(ex.manager.scratch.get((i, "forward"))) == planned
            opt = SGD(ex.parameters(), lr=0.05, momentum=0.9)
            rng = np.random.default_rng(2)
            for _ in range(2):
                x = rng.standard_normal((16, 3, 16, 16)).astype(np.float32)
                ex.train_step(x, rng.integers(0, 10, 16), opt)
        bits.append(net.param_checksum())
    assert bits[0] == bits[1]


def test_a_bias_gradient_s_partial_sums_are_counted_in_the_backward_that_takes_them():
    """A convolution's bias gradient is summed in two stages on the GPU, (blocks, C) partial
    sums on channels-last maps, (N, C) on NCHW ones (kernels/column_sums.py): a temporary
    of the backward that sums it, the convolution's, or the ReLU's that added the bias, or
    the max pool's after that ReLU, but under --deterministic (minidnn/fusion.py)."""
    from minidnn.kernels.column_sums import SUM_BLOCKS, column_blocks
    from minidnn.kernels.mapformat import MapFormat
    from minidnn.planner.costs import accumulation_bytes
    net = conv_chain()              # three 16-channel convolutions with a bias at 32x32
    rows = 8 * 32 * 32
    assert column_blocks(rows) == (4, SUM_BLOCKS)
    for layout, sums, slice_, pooled in (("nhwc", SUM_BLOCKS * 16 * 4, None, "pool"),
                                         ("nchw", 8 * 16 * 4, None, "pool"),
                                         ("nhwc", SUM_BLOCKS * 16 * 4, 4, "relu3")):
        options = PlanOptions(batch_slice=slice_)
        fused = StepModel(net, 8, flat_profile(net, 8), options, maps=MapFormat(layout, "fp32"))
        apart = StepModel(net, 8, flat_profile(net, 8), options, maps=MapFormat(layout, "fp32"),
                          fuse=False)
        names = [n.name for n in fused.nodes]
        # Under --deterministic relu3 sums its bias's gradient itself: that pass it still runs.
        from minidnn.planner.step_model import POOLED_RELU_BIAS_SHARE
        assert fused.backward_share["relu3"] == (0.0 if slice_ is None
                                                 else POOLED_RELU_BIAS_SHARE)
        for conv, relu in (("conv1", "relu1"), ("conv2", "relu2"), ("conv3", pooled)):
            c, r = names.index(conv), names.index(relu)
            # Under --deterministic the bias's gradient also goes through a temporary of
            # the call that sums it (layers/slices.sum_in_slices), moved with the sums.
            moved = accumulation_bytes(net.node(conv).layer, ("bias",), "backward", 1, None,
                                       slice_, rows=8)
            assert fused._transient[("backward", r)] - apart._transient[("backward", r)] \
                == apart._transient[("backward", c)] - fused._transient[("backward", c)] \
                == aligned(sums) + moved
            assert moved == (0 if slice_ is None else aligned(16 * 4))
            assert fused._transient[("forward", r)] == apart._transient[("forward", r)]


@pytest.mark.parametrize("static_layout", [True, False])
def test_required_bytes_are_the_dry_run_peak_plus_what_it_does_not_count(static_layout):
    net = conv_chain()
    ws = 3 * MiB
    model = StepModel(net, 8, flat_profile(net, 8, ws=ws), momentum=True, input_batches=2,
                      static_layout=static_layout)
    extras = model.momentum_bytes + model.input_bytes + model.loss_bytes
    # a GPU step replayed from CUDA graphs copies its losses into a ring (step_graph.py)
    assert model.loss_bytes == aligned(LOSS_SLOTS * 4)
    # one momentum buffer per parameter, each an allocator block of its own (aligned)
    assert model.momentum_bytes == sum(aligned(4 * int(np.prod(p.shape)))
                                       for _, p in net.parameters())
    assert model.input_bytes == 2 * (8 * 3 * 32 * 32 * 4 + 8 * 8)
    # the calls' temporaries (those of the layers and their gradient sums); the optimizer's
    # update takes none (optim.py)
    temporaries = max(model._transient.values())
    assert 0 < temporaries < aligned(10 * 16 * 16 * 16 * 4)    # less than fc's weight
    for policy in ("none", "all"):
        offload = get_policy(policy).decide(model.plan).offload
        ex = build_executor(net, 8, device="cpu", policy=policy, compute=False,
                      static_layout=static_layout)
        dry = ex.simulate_step()["peak_device_bytes"]
        lean = model.evaluate(offload, model.algos("min_workspace"))
        if static_layout:   # region held all step: the need is it plus its call's temporary
            assert lean.required_bytes == dry + extras + \
                model._transient.get(lean.peak_point, 0)
            assert lean.region_bytes == ex.layout.size
        else:
            assert dry + extras <= lean.required_bytes <= dry + extras + temporaries
        fast = model.evaluate(offload, model.algos("fastest"))
        convs = [n.name for n in net.nodes if n.layer.kind == "conv"]
        if static_layout:
            # Workspaces are blocks of the region, packed among the feature maps: the region
            # grows by at most one workspace, and every level by that growth.
            assert fast.workspace == {(c, p): ws for c in convs for p in ("forward", "backward")}
            grow = fast.region_bytes - lean.region_bytes
            assert 0 < grow <= ws
            assert all(fast.levels[k] - lean.levels[k] == grow for k in lean.levels)
        else:
            assert fast.workspace == {}
            for i, node in enumerate(net.nodes):        # each conv call holds its workspace
                for phase in ("forward", "backward"):
                    extra = ws if node.layer.kind == "conv" else 0
                    assert fast.levels[(phase, i)] - lean.levels[(phase, i)] == extra
        assert fast.required_bytes > lean.required_bytes


def test_without_a_layout_blocks_behind_copies_pile_up_until_the_host_must_wait():
    net = conv_chain()
    prof = flat_profile(net, 8, layer_s=1e-4, host_s=1e-6, bw=1e7)
    everything = get_policy("all").decide(StepModel(net, 8, prof).plan).offload
    free_run = StepModel(net, 8, prof, budget=None, static_layout=False).evaluate(everything)
    assert free_run.peak_bytes > free_run.required_bytes   # the host ran ahead of the copies
    budget = free_run.required_bytes + MiB // 4
    held = StepModel(net, 8, prof, budget=budget, static_layout=False).evaluate(everything)
    assert held.fits and not held.over_budget
    assert held.required_bytes <= held.peak_bytes <= budget
    assert held.host_wait_s > 0


def test_with_the_static_layout_the_peak_is_known_and_compute_waits_for_copies_instead():
    net = conv_chain()
    prof = flat_profile(net, 8, layer_s=1e-4, host_s=1e-6, bw=1e7)
    model = StepModel(net, 8, prof, budget=None)
    everything = get_policy("all").decide(model.plan).offload
    ev = model.evaluate(everything)
    assert ev.peak_bytes == ev.required_bytes and ev.host_wait_s == 0
    assert ev.region_bytes < model.evaluate(frozenset()).region_bytes
    # A block's next occupant waits until the copy reading the old one is done.
    assert sum(c[2] for c in ev.calls.values()) > 0.5 * ev.step_time_s


# ---- the planner --------------------------------------------------------------------------------
def test_nothing_is_offloaded_when_everything_fits():
    net = conv_chain()
    prof = analytic_profile(net, 16, "h200")
    planner = Planner(net, 16, prof, budget=2**30)
    result = planner.run()
    assert result.best.offload == frozenset()
    assert set(result.best.conv_algo.values()) == {"fastest"}
    assert result.best is result.baselines["none/fastest"]
    assert result.floor is result.baselines["none/fastest"]


@pytest.mark.parametrize("gpu", ["h200", "k40"])
def test_every_planned_decision_fits_its_budget_in_the_dry_run(gpu):
    net = conv_chain()
    batch = 32
    probe = Planner(net, batch, analytic_profile(net, batch, gpu), budget=None)
    low, high = probe.minimum_budget(), probe.baseline("none").required_bytes
    assert low < high
    for budget in np.linspace(low, high, 5).astype(int):
        policy = DynPolicy(gpu=gpu)
        ex = build_executor(net, batch, device="cpu", policy=policy, memory_budget=int(budget),
                      compute=False)
        stats = ex.simulate_step()      # the counting allocator enforces the budget too
        best = policy.result.best
        assert stats["peak_device_bytes"] + policy.result.model.extra_bytes <= \
            best.required_bytes <= policy.result.usable <= budget
        assert best.peak_bytes <= budget and not best.over_budget
        assert set(ex.decision.offload) == set(best.offload)
        assert ex.decision.recompute == best.recompute
        assert ex.decision.conv_algo == best.decision.conv_algo
        assert ex.decision.workspace == best.workspace
        # one block per call made: each piece of a layer chunk has its own, and only the
        # pieces whose map is rebuilt run their layer again
        model = policy.result.model
        rerun = {j for sid in best.recompute for j in model.plan.writers(sid)}
        calls = {(name, phase): [i for i in model.conv_nodes[name]
                                 if phase != "recompute" or i in rerun]
                 for (name, phase) in best.workspace}
        assert ex.layout.workspace_bytes() == \
            sum(nbytes * len(calls[key]) for key, nbytes in best.workspace.items())
        if best.offload:
            assert stats["offloaded_bytes"] > 0


def test_the_planner_beats_vdnn_dyns_greedy_order_when_copies_are_slow():
    # A link slow next to compute (as PCIe is next to an H200), no host overhead and no
    # workspace: vDNN_conv offloads every conv input; the planner only what the budget needs.
    slow = dataclasses.replace(H200, name="slowlink", d2h_bw=2e9, h2d_bw=2e9, duplex_bw=3e9,
                               host_s_per_call=1e-6, workspace_ratio={"tf32": 0.0, "fp32": 0.0})
    net = conv_chain()
    prof = analytic_profile(net, 64, slow)
    probe = Planner(net, 64, prof, budget=None, input_batches=0)
    none, least = probe.baseline("none").required_bytes, probe.minimum().required_bytes
    budget = int((least + 0.95 * (none - least)) / 0.99) + 1
    result = Planner(net, 64, prof, budget=budget, input_batches=0, recompute=False).run()
    names = {result.model.plan.storages[s].tensors[0] for s in result.best.offload}
    floor_names = {result.model.plan.storages[s].tensors[0] for s in result.floor.offload}
    assert result.floor.fits and result.best.fits
    assert floor_names == {"data", "conv1", "conv2"}   # vDNN_conv: every conv's input
    assert names == {"data"}
    assert result.best.step_time_s < 0.5 * result.floor.step_time_s
    # Allowed to recompute, it copies nothing: running conv1 again costs less than any copy.
    rebuilt = Planner(net, 64, prof, budget=budget, input_batches=0).run().best
    assert rebuilt.fits and rebuilt.offload == frozenset()
    assert {result.model.plan.storages[s].tensors[0] for s in rebuilt.recompute} == {"conv1"}
    assert rebuilt.step_time_s < result.best.step_time_s


def test_a_budget_below_the_minimum_names_the_minimum():
    net = conv_chain()
    prof = analytic_profile(net, 32, "k40")
    minimum = Planner(net, 32, prof).minimum_budget()
    with pytest.raises(InfeasibleBudgetError) as err:
        Planner(net, 32, prof, budget=minimum - 4096).run()
    assert isinstance(err.value, MemoryBudgetError)
    assert err.value.minimum == minimum
    suggested = budget_to_give(minimum)   # rounded up, by less than 1%
    assert f"--memory-budget {suggested} or more" in str(err.value)
    assert minimum <= parse_bytes(suggested) < minimum / 0.99
    result = Planner(net, 32, prof, budget=minimum).run()   # exactly the minimum works
    assert result.best.fits
    with pytest.raises(MemoryBudgetError):      # one pass, no layer chunks
        build_executor(net, 32, device="cpu", policy=DynPolicy(gpu="k40"), micro_batches=1,
                       chunks=(), memory_budget=minimum // 2, compute=False)
    # Unless the step may run in micro-batches: dyn then splits it.
    with build_executor(net, 32, device="cpu", policy=DynPolicy(gpu="k40"),
                        memory_budget=minimum // 2, compute=False) as ex:
        assert ex.micro_batches > 1


def test_dyn_is_registered_and_plans_nothing_without_a_budget():
    policy = get_policy("dyn")
    assert isinstance(policy, DynPolicy)
    net = conv_chain()
    ex = build_executor(net, 4, device="cpu", policy=DynPolicy(gpu="h200"), compute=False)
    assert ex.decision.offload == frozenset()
    assert ex.decision.conv_algo == {"conv1": "fastest", "conv2": "fastest", "conv3": "fastest"}


def uniform_times(prof: Profile, layer_s=1e-3, bw=1e12) -> Profile:
    """`prof` with every call taking `layer_s` and copies at `bw` (fast beside the calls, so
    offloading costs no time): its memory as measured, its plan independent of the clock."""
    layers = {name: LayerCost({k: layer_s for k in c.forward_s},
                              {k: layer_s for k in c.backward_s},
                              c.workspace_forward, c.workspace_backward,
                              {"forward": 0.0, "backward": 0.0})
              for name, c in prof.layers.items()}
    return dataclasses.replace(prof, layers=layers, d2h_bw=bw, h2d_bw=bw, duplex_bw=1.8 * bw,
                               optimizer_s=layer_s, optimizer_host_s=0.0)


def test_a_planned_run_trains_within_its_budget_on_the_cpu(tmp_path):
    """The measured-profile path end to end: profile this CPU (cached), plan, train in a real
    arena. The plan is made from the measured profile with uniform times: what it chooses
    must not depend on how loaded the CPU was while it was measured."""
    net = conv_chain(channels=8, size=16)
    batch = 8
    measuring = DynPolicy(device="cpu", cache_dir=tmp_path, input_batches=0)
    measured = measuring.source.at(net, batch)
    assert measured.source == "measured" and list(tmp_path.glob("*.json"))   # cached
    prof = uniform_times(measured)
    policy = DynPolicy(profile=prof, input_batches=0)
    probe = Planner(net, batch, prof, input_batches=0)
    budget = (probe.minimum_budget() + probe.baseline("none").required_bytes) // 2
    net.init_params(0)
    with build_executor(net, batch, device="cpu", policy=policy, memory_budget=budget) as ex:
        opt = SGD(net.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
        rng = np.random.default_rng(0)
        for _ in range(2):
            x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
            y = rng.integers(0, 10, batch)
            assert np.isfinite(float(ex.train_step(x, y, opt)))
        stats = ex.memory_stats()
    assert stats["peak_device_bytes"] <= budget
    assert stats["offloaded_bytes"] > 0        # free copies: offloading is the plan's choice


def test_the_executor_can_tell_dyn_what_it_runs_with():
    policy = DynPolicy(gpu="h200")
    spec = StepSpec(batch=8, prefetch_lookahead=0, static_layout=False)
    policy.bind(spec, device="cpu")
    assert (policy.source.device, policy.spec.prefetch_lookahead,
            policy.spec.static_layout) == ("cpu", 0, False)
    policy.bind(spec, device="gpu")                 # a device given at construction stays
    assert policy.source.device == "cpu"


def test_a_fixed_decision_is_run_as_given():
    from dataclasses import replace
    from minidnn.memory.policy import MemoryDecision
    from minidnn.planner import FixedDecision
    net = conv_chain()
    model = StepModel(net, 4, flat_profile(net, 4))
    offload = get_policy("all").decide(model.plan).offload
    decision = MemoryDecision(offload=offload, conv_algo={"conv2": "min_workspace"})
    ex = build_executor(net, 4, device="cpu", policy=FixedDecision(decision), compute=False)
    # The decision as given, finished with the executor's prefetch lookahead and the biases
    # its ReLUs add, here in their convolutions (float32 maps; minidnn/fusion.py).
    from minidnn.fusion import bias_relu_pairs, conv_relu_pairs, pool_relu_pairs
    assert ex.decision == replace(decision, prefetch_lookahead=1, policy="fixed",
                                  bias_relu=bias_relu_pairs(ex.plan),
                                  conv_relu=conv_relu_pairs(ex.plan, False),
                                  pool_relu=pool_relu_pairs(ex.plan),
                                  pool_bias=pool_relu_pairs(ex.plan), spec=ex.spec)
    assert ex.decision.conv_relu
    assert ex.decision.conv_algo == {"conv2": "min_workspace"}
    assert net.node("conv2").layer.algo == net.node("conv1").layer.algo == "fastest"
    stats = ex.simulate_step()
    assert stats["offloaded_bytes"] == model.evaluate(offload).offloaded_bytes > 0


def test_a_dyn_decision_carries_its_prefetch_lookahead_to_the_executor():
    from minidnn import models
    from minidnn.planner import DynPolicy
    from minidnn.planner.search import LOOKAHEADS
    net = models.build("tiny_cnn", num_classes=10, image_size=32)
    probe = build_executor(net, 64, device="cpu", policy=DynPolicy(gpu="h200"), compute=False,
                     memory_budget="4GiB")
    assert probe.decision.prefetch_lookahead in LOOKAHEADS
    assert probe.prefetch_lookahead == probe.decision.prefetch_lookahead
    assert probe.manager.prefetch_lookahead == probe.prefetch_lookahead
