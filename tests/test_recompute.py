"""Recomputation: maps dropped after forward and rebuilt in backward by running their layers'
forward again (memory/policy.py, memory/manager.py, executor.py), on the CPU."""
import dataclasses

import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.memory.record import record_intervals
from minidnn.memory.schedule import StepSchedule
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import (MemoryDecision, get_policy, recompute_candidates,
                                   recompute_inputs)
from minidnn.planner.dyn import FixedDecision
from test_manager import dag_net as branchy     # conv1 -> relu1 -> {conva, convb} -> join ...
from minidnn.decide import build_executor


def names(plan, sids) -> set:
    return {plan.storages[s].tensors[0] for s in sids}


def train(decision, steps=2, budget=None, static_layout=None, lookahead=1):
    """(parameters after `steps` SGD steps, memory stats, manager log of the last step)."""
    rng = np.random.default_rng(0)
    net = branchy()
    with build_executor(net, 4, device="cpu", seed=0, policy=FixedDecision(decision),
                  memory_budget=budget, static_layout=static_layout,
                  prefetch_lookahead=lookahead) as ex:
        opt = SGD(ex.parameters(), lr=0.05, momentum=0.9, allocator=ex.allocator)
        for _ in range(steps):
            x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
            ex.train_step(x, rng.integers(0, 5, 4), opt)
        stats, log = ex.memory_stats(), list(ex.manager.log)
    return net.state_dict(), stats, log


def test_candidates_are_maps_whose_writers_can_run_again():
    plan = LivenessPlan(branchy(), 4)
    found = names(plan, [s.id for s in recompute_candidates(plan)])
    # conv1 (with relu1 in place) reads the input, which conv1's own backward keeps; conva
    # reads relu1's map, which conva's backward keeps. Not the pool's output (its argmax would
    # be written twice), not dropout's (random), not the join's (its inputs are gone by then).
    assert "conv1" in found and "conva" in found
    assert not found & {"pool", "drop", "join", "data", "label"}
    conv1 = plan.storage_of("conv1").id
    assert plan.writers(conv1) == [0, 1]                       # conv1, relu1 in place
    assert names(plan, recompute_inputs(plan, conv1)) == {"data"}
    assert names(plan, recompute_inputs(plan, plan.storage_of("conva").id)) == {"conv1"}


def test_recomputation_changes_no_bit_and_frees_the_maps_between():
    kept, kept_stats, _ = train(MemoryDecision())
    plan = LivenessPlan(branchy(), 4)
    recompute = frozenset([s.id for s in recompute_candidates(plan)])
    for budget, layout in ((None, False), ("64MiB", True)):
        got, stats, log = train(MemoryDecision(recompute=recompute), budget=budget,
                                static_layout=layout)
        for key in kept:
            assert np.array_equal(got[key], kept[key]), key
        assert stats["avg_feature_map_bytes"] < kept_stats["avg_feature_map_bytes"]
        assert stats["offloaded_bytes"] == stats["prefetched_bytes"] == 0
        assert stats["recompute_storages"] == len(recompute)
        assert stats["recompute_bytes"] == sum(plan.storages[s].nbytes for s in recompute)
        rebuilt = StepSchedule(plan, recompute=recompute).rebuild_time
        for sid in recompute:
            s = plan.storages[sid]
            events = [(t, what) for t, what, k in log if k == sid]
            # Dropped after its last forward use, taken again at its first backward reader,
            # or earlier, with a map rebuilt from it (conv1 with conva: a chain).
            assert (s.last_forward_use, "drop") in events
            assert (rebuilt[sid], "alloc") in events and rebuilt[sid] <= s.first_backward_use


def test_offloaded_inputs_of_a_recomputation_are_prefetched_for_it():
    plan = LivenessPlan(branchy(), 4)
    conv1 = plan.storage_of("conv1").id
    offload = get_policy("all").decide(plan).offload - {conv1}
    assert plan.storage_of("data").id in offload
    kept, _, _ = train(MemoryDecision())
    got, stats, _ = train(MemoryDecision(offload=offload, recompute=frozenset({conv1})))
    for key in kept:
        assert np.array_equal(got[key], kept[key]), key
    assert stats["on_demand_fetches"] == 0
    lazy, lazy_stats, _ = train(MemoryDecision(offload=offload, recompute=frozenset({conv1})),
                                lookahead=0)
    assert lazy_stats["on_demand_fetches"] > 0
    for key in kept:
        assert np.array_equal(lazy[key], kept[key]), key


def test_the_layout_gives_a_recomputed_map_two_blocks():
    plan = LivenessPlan(branchy(), 4)
    conv1 = plan.storage_of("conv1").id
    blocks = [iv for iv in record_intervals(plan, frozenset(), 1, recompute={conv1},
                                            workspace={(0, "recompute"): 1024})
              if iv.sid == conv1]
    assert len(blocks) == 2 and blocks[0].end <= blocks[1].start
    spaces = [iv for iv in record_intervals(plan, frozenset(), 1, recompute={conv1},
                                            workspace={(0, "recompute"): 1024})
              if iv.sid == ("workspace", 0, "recompute")]
    assert len(spaces) == 1


def test_a_chain_is_rebuilt_at_once_in_forward_order_and_changes_no_bit():
    """VGG's conv1_2 is rebuilt from conv1_1's map (relu1_1 in place): with both recomputed,
    conv1_1 is rebuilt first, when conv1_2 is needed (before its own first backward reader,
    conv1_2's backward), and stays for it. Unfused: fused, pool1 applies relu1_2's mask and
    no backward reads conv1_2's map (minidnn/fusion.py)."""
    net = models.build("vgg16", num_classes=10, image_size=32)
    plan = LivenessPlan(net, 2, fuse=False)
    first, second = plan.storage_of("conv1_1").id, plan.storage_of("conv1_2").id
    sched = StepSchedule(plan, recompute={first, second})
    when = plan.storages[second].first_backward_use
    assert plan.storages[first].first_backward_use > when
    assert sched.rebuild_time == {first: when, second: when}
    assert sched.chains() == [[first, second]]
    third = plan.storage_of("conv3_1").id                 # rebuilt from pool2: alone
    assert StepSchedule(plan, recompute={first, second, third}).chains() == \
        [[first, second], [third]]
    reader = plan.node_at(when)
    assert sorted(sched.recompute_at[reader]) == [first, second]
    assert sched.rebuild[second][1] == []         # conv1_1's map is rebuilt, not read
    rerun = [c.index for c in sched.backward if c.phase == "recompute"]
    assert rerun == sorted(rerun) == sched.writers_to_rerun(reader) == [0, 1, 2, 3]

    def step(decision, **options):
        rng = np.random.default_rng(0)
        with build_executor(models.build("vgg16", num_classes=10, image_size=32), 2,
                            device="cpu", seed=0, policy=FixedDecision(decision), fuse=False,
                            **options) as ex:
            opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
            for _ in range(2):
                x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
                ex.train_step(x, rng.integers(0, 10, 2), opt)
            log = list(ex.manager.log)
            return ex.net.state_dict(), log

    kept, _ = step(MemoryDecision())
    chain = MemoryDecision(recompute=frozenset({first, second}))
    for options in ({}, dict(memory_budget="512MiB", static_layout=True)):
        got, log = step(chain, **options)
        for key in kept:
            assert np.array_equal(got[key], kept[key]), key
        allocs = [k for t, what, k in log if what == "alloc" and k in (first, second)]
        assert allocs[-2:] == [first, second]     # at `when`, the chain's start first
        assert {(t, k) for t, what, k in log if what == "alloc" and k in (first, second)} \
            >= {(when, first), (when, second)}


def test_sets_the_manager_cannot_run_are_refused():
    plan = LivenessPlan(branchy(), 4)
    sid = {name: plan.storage_of(name).id for name in ("conv1", "conva", "pool", "drop")}
    bad = [(frozenset(), {sid["pool"]}, "cannot be recomputed"),
           (frozenset(), {sid["drop"]}, "cannot be recomputed"),
           ({sid["conv1"]}, {sid["conv1"]}, "both offloaded and recomputed")]
    for offload, recompute, message in bad:
        with pytest.raises(ValueError, match=message):
            build_executor(branchy(), 4, device="cpu", compute=False,
                     policy=FixedDecision(MemoryDecision(offload=offload,
                                                         recompute=frozenset(recompute))))


def test_evaluation_steps_recompute_nothing():
    plan = LivenessPlan(branchy(), 4)
    conv1 = plan.storage_of("conv1").id
    ex = build_executor(branchy(), 4, device="cpu", seed=0,
                  policy=FixedDecision(MemoryDecision(recompute=frozenset({conv1}))))
    x = np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32)
    loss, logits = ex.evaluate(x, np.arange(4) % 5)
    assert not [e for e in ex.manager.log if e[1] == "drop"]
    ref = build_executor(branchy(), 4, device="cpu", seed=0)
    ref_loss, ref_logits = ref.evaluate(x, np.arange(4) % 5)
    assert loss == ref_loss and np.array_equal(logits, ref_logits)


def test_vgg16_recomputes_from_the_image_on_the_planners_word():
    """The planner's dry run and the executor agree on what a recomputation costs in memory."""
    from minidnn.planner.gpus import analytic_profile
    from minidnn.planner.search import Planner
    net = models.build("vgg16", num_classes=10, image_size=32)
    plan = LivenessPlan(net, 8)
    conv1_1 = plan.storage_of("conv1_1").id
    # The H200's costs, and the CPU's random generator, which takes no device memory: the
    # dry run below runs on the CPU, so their dropout scratch blocks are alike.
    prof = dataclasses.replace(analytic_profile(net, 8, "h200"), generator_bytes=0)
    planner = Planner(net, 8, prof, budget=None)
    with_rc = planner.model.evaluate(frozenset(), None, frozenset({conv1_1}))
    none = planner.model.evaluate(frozenset(), None)
    assert with_rc.compute_s > none.compute_s              # conv1_1 and relu1_1 run twice
    assert ("recompute", 0) in with_rc.calls and ("recompute", 1) in with_rc.calls
    ex = build_executor(net, 8, device="cpu", compute=False, memory_budget="4GiB",
                  policy=FixedDecision(with_rc.decision))
    stats = ex.simulate_step()
    assert stats["layout_bytes"] == with_rc.region_bytes
    assert with_rc.fm_levels[with_rc.fm_peak_point] <= none.fm_levels[none.fm_peak_point]
