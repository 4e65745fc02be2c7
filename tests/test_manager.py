"""The memory manager on the CPU: liveness, offload/prefetch, budgets, no leaks, dry runs.

On the CPU copies happen at once, so everything here is exact: which buffer lives where at
every layer call, and that moving bytes never changes a single bit of the result.
"""
import numpy as np
import pytest

from minidnn import Network, SGD
from minidnn.errors import ConfigError, MemoryBudgetError
from minidnn.layers import (LRN, Add, Concat, Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU)
from minidnn.memory.allocator import CountingAllocator, SimpleAllocator, aligned
from minidnn.memory.manager import MemoryManager
from minidnn.network import DATA, LABEL
from minidnn.decide import build_executor
from minidnn.memory.policy import NO_DECISION
from minidnn.planner.dyn import FixedDecision

# The executor's own guard: a decision made by hand is not weighed against the budget before
# step one (decide.py weighs the vDNN policies' decisions), so the arena meets the budget.
UNWEIGHED = FixedDecision(NO_DECISION)

BATCH = 2


def dag_net() -> Network:
    """A small conv net with a branch, a join and a tensor read by three layers.

    conv1 -> relu1 (in place) -> {conva -> relua, convb} -> join (Add) -> cat (Concat with
    relu1) -> pool -> lrn -> drop (in place, aux mask) -> flat -> fc -> loss
    """
    net = Network((3, 8, 8), num_classes=5, name="dag")
    net.add(Conv2d(4, 3, padding=1), name="conv1")
    net.add(ReLU(), name="relu1")
    net.add(Conv2d(4, 3, padding=1), inputs="relu1", name="conva")
    net.add(ReLU(), name="relua")
    net.add(Conv2d(4, 1), inputs="relu1", name="convb")
    net.add(Add(), inputs=["relua", "convb"], name="join")
    net.add(Concat(), inputs=["join", "relu1"], name="cat")
    net.add(MaxPool2d(2), name="pool")
    net.add(LRN(3), name="lrn")
    net.add(Dropout(0.25), name="drop")
    net.add(Flatten(), name="flat")
    net.add(Linear(5), name="fc")
    net.add_loss()
    return net


def batch(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 5, BATCH)
    return x, y


def train(policy="none", steps=3, lookahead=1, budget=None, **kw):
    """(executor, optimizer) after `steps` SGD steps on fixed data."""
    ex = build_executor(dag_net(), BATCH, device="cpu", seed=0, policy=policy,
                  prefetch_lookahead=lookahead, memory_budget=budget, **kw)
    opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4, allocator=ex.allocator)
    for step in range(steps):
        ex.train_step(*batch(step), opt)
    return ex, opt


# ---- correctness: moving bytes changes nothing ---------------------------------------------------
def test_policies_give_bit_identical_parameters():
    sums, offloaded = {}, {}
    for policy, lookahead in [("none", 1), ("all", 1), ("conv", 1), ("all", 0), ("all", 3)]:
        ex, _ = train(policy, steps=3, lookahead=lookahead)
        sums[policy, lookahead] = ex.net.param_checksum()
        offloaded[policy, lookahead] = ex.memory_stats()["offloaded_bytes"]
    assert len(set(sums.values())) == 1, sums
    # Not vacuous: the policies really moved different amounts of data.
    assert offloaded["none", 1] == 0
    assert 0 < offloaded["conv", 1] < offloaded["all", 1]


def test_gradients_identical_under_offload():
    grads = {}
    for policy in ("none", "all"):
        ex = build_executor(dag_net(), BATCH, device="cpu", seed=1, policy=policy)
        ex.forward(*batch(5))
        ex.backward()
        grads[policy] = ex.gradients()
    for name, g in grads["none"].items():
        assert np.array_equal(g, grads["all"][name]), name


# ---- what the policies move -----------------------------------------------------------------------
def test_offloaded_bytes_equal_the_chosen_storages():
    for policy in ("all", "conv"):
        ex, _ = train(policy, steps=2)
        st = ex.memory_stats()
        chosen = ex.decision.offload_bytes(ex.plan)
        assert chosen > 0
        assert st["offloaded_bytes"] == chosen
        assert st["prefetched_bytes"] == chosen
        assert st["on_demand_fetches"] == 0
        assert st["host_peak_bytes"] >= chosen


def test_lookahead_zero_fetches_everything_on_demand():
    ex, _ = train("all", steps=1, lookahead=0)
    st = ex.memory_stats()
    assert st["on_demand_fetches"] == len(ex.decision.offload) > 0
    assert st["on_demand_bytes"] == st["prefetched_bytes"] == st["offloaded_bytes"]


def test_offload_lowers_device_residency_during_backward():
    res = {}
    for policy in ("none", "all"):
        ex, _ = train(policy, steps=1)
        back = ex.manager.stats.phase_bytes("backward")
        assert len(back) == ex.plan.num_nodes
        res[policy] = (max(back), np.mean(back), ex.memory_stats()["avg_feature_map_bytes"])
    assert res["all"][0] < res["none"][0]
    assert res["all"][1] < res["none"][1]
    assert res["all"][2] < res["none"][2]


# ---- liveness ---------------------------------------------------------------------------------------
def test_buffers_live_exactly_as_the_plan_says():
    ex, _ = train("none", steps=1)
    plan, mm = ex.plan, ex.manager
    loss_sid = plan.tensors["loss"].storage
    allocs = {sid: t for t, what, sid in mm.log if what == "alloc"}
    frees = {sid: t for t, what, sid in mm.log if what == "free"}
    assert set(allocs) == set(frees) == {s.id for s in plan.storages}
    for s in plan.storages:
        assert allocs[s.id] == s.alloc_time, (s.tensors, allocs[s.id], s.alloc_time)
        if s.id == loss_sid:   # the executor keeps the loss value until the step ends
            assert frees[s.id] == 2 * plan.num_nodes
        else:
            assert frees[s.id] == s.free_time, (s.tensors, frees[s.id], s.free_time)
    assert mm.resident() == [] and mm.resident_bytes == 0


def test_peak_feature_maps_equal_the_plans_liveness_peak():
    # This net has one branch gradient temporary (relu1 is read by three layers), so compare a
    # chain: there the manager's peak is the plan's, plus the 4-byte loss value it keeps.
    net = Network.sequential((3, 8, 8), [Conv2d(4, 3, padding=1), ReLU(), MaxPool2d(2),
                                         Flatten(), Linear(5)], num_classes=5)
    ex = build_executor(net, BATCH, device="cpu")
    ex.forward(*batch())
    ex.backward()
    st = ex.memory_stats()
    assert st["liveness_peak_bytes"] <= st["peak_feature_map_bytes"] <= st["liveness_peak_bytes"] + 4
    assert st["liveness_peak_bytes"] < st["network_wide_bytes"]


def test_in_place_layers_share_storage_in_this_net():
    plan = build_executor(dag_net(), BATCH, device="cpu", compute=False).plan
    assert plan.storage_of("relu1") is plan.storage_of("conv1")
    assert plan.storage_of("drop") is plan.storage_of("lrn")
    assert plan.storage_of("flat") is plan.storage_of("lrn")   # a reshape is a view
    # relu1 is read by conva, convb and cat: its forward life ends at cat, its backward
    # readers are conva's and convb's backward (inputs) and relu1's own (its output).
    s = plan.storage_of("relu1")
    assert s.last_forward_use == plan.nodes.index(plan.net.node("cat"))
    assert len(s.backward_uses) == 3


def test_evaluation_frees_aux_buffers_at_their_last_forward_use():
    ex = build_executor(dag_net(), BATCH, device="cpu")
    ex.evaluate(*batch())
    mm, plan = ex.manager, ex.plan
    for name in ("pool:argmax", "lrn:scale", "drop:mask"):
        sid = plan.tensors[name].storage
        frees = [t for t, what, s in mm.log if what == "free" and s == sid]
        assert frees == [plan.storages[sid].producer], name
    assert mm.resident_bytes == 0


def test_no_leak_across_steps():
    ex = build_executor(dag_net(), BATCH, device="cpu", policy="all", memory_budget="8MiB")
    opt = SGD(ex.parameters(), lr=0.05, allocator=ex.allocator)
    levels, host = [], []
    for step in range(5):
        ex.train_step(*batch(step), opt)
        levels.append(ex.allocator.in_use)
        host.append(ex.host.in_use)
    assert levels[0] == levels[4], levels
    assert len(set(levels)) == 1
    assert ex.settled_in_use() == levels[0]
    assert host == [0] * 5
    assert ex.manager.resident() == []


def test_momentum_buffers_come_from_the_allocator():
    ex = build_executor(dag_net(), BATCH, device="cpu")
    before = ex.allocator.in_use
    opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
    # Taken when the optimizer is made (side by side, not between a step's temporaries) ...
    expected = sum(aligned(p.data.nbytes) for _, p in ex.parameters())
    assert ex.allocator.in_use - before == expected
    taken = ex.allocator.in_use
    ex.train_step(*batch(), opt)
    ex.train_step(*batch(), opt)
    assert ex.allocator.in_use == taken      # ... and the steps fill them, taking no more.
    # The parameters and gradients are counted too.
    assert before >= 2 * expected


# ---- handles ----------------------------------------------------------------------------------------
def test_feature_map_states_device_both_host_both_freed():
    ex, _ = train("all", steps=1)
    plan, mm = ex.plan, ex.manager
    assert ex.decision.offload
    for sid in ex.decision.offload:
        s, fm = plan.storages[sid], mm.maps[sid]
        states = [state for _, state in fm.history]
        times = [t for t, _ in fm.history]
        assert states == ["device", "both", "host", "both", "freed"], (s.tensors, fm.history)
        alloc, offload, evict, fetch, freed = times
        assert alloc == s.alloc_time
        # right behind its last writer (graph inputs: as the first layer starts)
        assert offload == max(s.last_forward_write, 0)
        assert evict == s.last_forward_use         # once its last forward reader has run
        assert fetch == s.first_backward_use - 1   # during the previous backward layer
        assert freed == s.free_time


def test_offload_start_waits_for_in_place_writers():
    # conv1's storage is written again by relu1 (in place): the offload copies relu1's values.
    plan = build_executor(dag_net(), BATCH, device="cpu", compute=False).plan
    s = plan.storage_of("conv1")
    assert s.last_forward_write == plan.nodes.index(plan.net.node("relu1"))


def test_prefetch_window_respects_lookahead_and_stops_at_conv():
    for lookahead in (1, 2, 100):
        ex, _ = train("all", steps=1, lookahead=lookahead)
        plan, mm = ex.plan, ex.manager
        n = plan.num_nodes
        distances = []
        for t, what, sid in mm.log:
            if what != "fetch":
                continue
            i = 2 * n - 1 - t                                   # node whose backward issued it
            j = 2 * n - 1 - plan.storages[sid].first_backward_use  # node that needs it first
            assert 1 <= i - j <= lookahead
            between = [plan.nodes[k].layer.kind for k in range(j + 1, i)]
            assert "conv" not in between, (plan.storages[sid].tensors, between)
            distances.append(i - j)
        assert ex.memory_stats()["on_demand_fetches"] == 0
        if lookahead == 100:
            assert max(distances) > 1  # some maps really came back more than one layer early


# ---- budgets -----------------------------------------------------------------------------------------
def _peak(policy):
    ex, _ = train(policy, steps=2)
    return ex.memory_stats()["peak_device_bytes"], ex.net.param_checksum()


def test_budget_is_never_exceeded_and_offload_fits_where_none_does_not():
    none_peak, reference = _peak("none")
    all_peak, _ = _peak("all")
    assert all_peak < none_peak
    budget = (all_peak + none_peak) // 2
    with pytest.raises(MemoryBudgetError):
        train("none", steps=2, budget=budget)
    ex, _ = train("all", steps=2, budget=budget)
    assert ex.memory_stats()["peak_device_bytes"] <= budget
    assert ex.net.param_checksum() == reference


def test_too_small_budget_names_the_layer_and_leaves_nothing_behind():
    # Dynamic blocks: the budget runs out inside a step, which must say where and clean up.
    probe = build_executor(dag_net(), BATCH, device="cpu", static_layout=False)
    params = probe.allocator.in_use
    ex = build_executor(dag_net(), BATCH, device="cpu", memory_budget=params + 2048,
                        static_layout=False, policy=UNWEIGHED)
    with pytest.raises(MemoryBudgetError) as err:
        ex.forward(*batch())
    msg = str(err.value)
    assert "forward of " in msg or "input data" in msg, msg
    assert err.value.budget == params + 2048
    assert ex.allocator.in_use == params    # the failed step's buffers were released
    assert ex.manager.resident() == []


def test_too_small_budget_for_the_static_layout_fails_before_step_one():
    probe = build_executor(dag_net(), BATCH, device="cpu", static_layout=True)
    region = probe.memory_stats()["layout_bytes"]
    assert region >= probe.layout.live_peak() > 0
    with pytest.raises(MemoryBudgetError, match="feature maps \\(static layout\\)"):
        build_executor(dag_net(), BATCH, device="cpu", memory_budget=probe.allocator.in_use - 256,
                       policy=UNWEIGHED)
    # With a budget the layout is planned by default; without one, blocks are dynamic.
    assert build_executor(dag_net(), BATCH, device="cpu", memory_budget="1GiB").layout is not None
    assert build_executor(dag_net(), BATCH, device="cpu").layout is None


def test_budget_below_the_parameters_names_the_parameter():
    with pytest.raises(MemoryBudgetError, match="parameter conv1.weight|gradient of conv1"):
        build_executor(dag_net(), BATCH, device="cpu", memory_budget=512, policy=UNWEIGHED)


# ---- dry runs -----------------------------------------------------------------------------------------
def test_dry_run_reproduces_the_real_residency_pattern():
    for policy in ("none", "all", "conv"):
        real, _ = train(policy, steps=1)
        dry = build_executor(dag_net(), BATCH, device="cpu", policy=policy, compute=False)
        st = dry.simulate_step()
        rs = real.memory_stats()
        for key in ("peak_feature_map_bytes", "avg_feature_map_bytes", "offloaded_bytes",
                    "prefetched_bytes", "network_wide_bytes", "liveness_peak_bytes"):
            assert st[key] == rs[key], (policy, key)
        assert real.manager.stats.samples == dry.manager.stats.samples
        assert isinstance(dry.allocator, CountingAllocator)


def test_dry_executor_refuses_to_compute():
    dry = build_executor(dag_net(), BATCH, device="cpu", compute=False)
    with pytest.raises(ConfigError, match="simulate_step"):
        dry.forward(*batch())


def test_bad_lookahead_is_a_config_error():
    with pytest.raises(ConfigError, match="prefetch_lookahead"):
        build_executor(dag_net(), BATCH, device="cpu", prefetch_lookahead=-1)


def test_close_brings_parameters_home():
    ex, _ = train("all", steps=1)
    checksum = ex.net.param_checksum()
    ex.close()
    assert all(isinstance(p.data, np.ndarray) for _, p in ex.net.parameters())
    assert ex.net.param_checksum() == checksum


# ---- the manager alone ---------------------------------------------------------------------------------
def test_manager_walk_with_a_counting_allocator():
    """The manager's protocol without an executor: every buffer back after end_step."""
    from minidnn.backend import Device
    from minidnn.memory.plan import LivenessPlan
    from minidnn.memory.policy import get_policy
    net = dag_net()
    plan = LivenessPlan(net, BATCH)
    alloc, host = CountingAllocator(), CountingAllocator()
    mm = MemoryManager(plan, Device("cpu"), alloc, host=host,
                       decision=get_policy("all").decide(plan), dry=True)
    mm.begin_step(True)
    mm.write_input(DATA, None)
    mm.write_input(LABEL, None)
    for i in range(plan.num_nodes):
        mm.forward_buffers(i)
        mm.after_forward(i)
    # Between forward and backward only what backward reads and keeps on device is left.
    on_device = {fm.sid for fm in mm.resident()}
    assert not on_device & mm.offload
    assert all(mm.maps[sid].state == "host" for sid in mm.offload)
    for i in reversed(range(plan.num_nodes)):
        mm.backward_buffers(i)
        mm.after_backward(i)
    mm.end_step()
    assert alloc.in_use == 0 and host.in_use == 0
    assert alloc.allocs == alloc.frees


def test_simple_allocator_holds_buffers_freed_behind_an_unfinished_copy():
    class Event:
        done = False

        def synchronize(self):
            self.done = True

    a = SimpleAllocator(np, budget=1024)
    buf = a.alloc(512)
    ev = Event()
    a.free(buf, after=ev)
    assert a.in_use == 512            # still counted: a copy may read it
    b = a.alloc(256)                  # fits beside it; the pending one stays
    assert a.in_use == 768
    c = a.alloc(512)                  # does not fit: waits for the copy, then reuses
    assert ev.done and a.in_use == 768
    a.free(b)
    a.free(c)
    assert a.in_use == 0
    with pytest.raises(ValueError):
        a.free(c)


def test_views_of_an_arena_are_made_once_and_change_no_bit():
    """Under a budget the CPU allocates from an arena (Allocator.carves): the manager keeps
    each tensor's view at its address, so a later step gets the same view objects; the
    parameters are bit for bit those of a manager that makes every view afresh."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 5, BATCH)

    def train(cached: bool):
        with build_executor(dag_net(), BATCH, device="cpu", seed=0, policy="all",
                            memory_budget="64MiB") as ex:
            assert ex.allocator.carves
            if not cached:
                ex.manager._views = None
            opt = SGD(ex.parameters(), lr=0.1, momentum=0.9, allocator=ex.allocator)
            ex.train_step(x, labels, opt)
            first = dict(ex.manager._views or {})
            ex.train_step(x, labels, opt)
            again = ex.manager._views or {}
            return ex.net.param_checksum(), first, again

    with_cache, first, again = train(True)
    assert first and all(again.get(key) is view for key, view in first.items())
    assert train(False)[0] == with_cache
