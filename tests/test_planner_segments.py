"""Checkpointed segments (planner/search.Planner.segments): runs of maps rebuilt one from the
other, cut into segments whose maps are recomputed together (memory/schedule.py: a chain), with
their checkpoints kept or offloaded; on the CPU, against the H200's analytic costs."""
import dataclasses

import numpy as np

from minidnn import SGD, models
from minidnn.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU
from minidnn.network import Network
from minidnn.decide import build_executor
from minidnn.memory.policy import MemoryDecision, recompute_inputs
from minidnn.planner.dyn import FixedDecision
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.search import Planner
from minidnn.planner.segments import SEGMENT_MULTIPLES
from minidnn.planner.step_model import Unfit


def planner(name: str, batch: int, image: int, budget=None, fuse=True) -> Planner:
    net = models.build(name, num_classes=10, image_size=image)
    # The CPU's random generator takes no device memory: the dry runs below are the CPU's.
    prof = dataclasses.replace(analytic_profile(net, batch, "h200"), generator_bytes=0)
    return Planner(net, batch, prof, budget=budget, input_batches=0, fuse=fuse)


def train(name: str, image: int, decision: MemoryDecision, steps: int = 2):
    rng = np.random.default_rng(0)
    net = models.build(name, num_classes=10, image_size=image)
    with build_executor(net, 2, device="cpu", seed=0, policy=FixedDecision(decision),
                        memory_budget="1GiB", static_layout=True) as ex:
        opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
        for _ in range(steps):
            x = rng.standard_normal((2, 3, image, image)).astype(np.float32)
            ex.train_step(x, rng.integers(0, 10, 2), opt)
        stats = ex.memory_stats()
    return net.state_dict(), stats


def test_runs_are_vgg_stages_and_resnet_blocks():
    p = planner("vgg16", 2, 32, fuse=False)
    names = [[p.plan.storages[s].tensors[0] for s in run] for run in p.runs()]
    assert names[0] == ["conv1_1", "conv1_2"]     # a max-pool ends each stage's run
    assert ["conv3_1", "conv3_2", "conv3_3"] in names
    # Fused, each pool applies the mask of the ReLU before it, and no backward reads the
    # stage's last map (minidnn/fusion.py): a stage's run ends one map earlier.
    fused = planner("vgg16", 2, 32)
    names = [[fused.plan.storages[s].tensors[0] for s in run] for run in fused.runs()]
    assert ["conv3_1", "conv3_2"] in names and ["conv1_1", "conv1_2"] not in names
    for run in p.runs():
        for before, after in zip(run, run[1:]):
            assert before in recompute_inputs(p.plan, after)
    r = planner("resnet18", 2, 32)
    assert r.runs() and all(len(run) >= 2 for run in r.runs())


def test_segment_decisions_run_to_the_same_bits_checkpoints_kept_or_offloaded():
    p = planner("vgg16", 2, 32)
    runs = p.runs()
    largest = max(p._bytes[s] for run in runs for s in run)
    kept, _ = train("vgg16", 32, MemoryDecision())
    for multiple, offload_checkpoints in ((1, False), (1, True), (2, False)):
        offload, recompute = p.segment_decision(runs, largest * multiple, offload_checkpoints)
        assert any(set(recompute_inputs(p.plan, s)) & recompute for s in recompute)  # chains
        assert bool(offload) == offload_checkpoints
        got, stats = train("vgg16", 32, MemoryDecision(offload=offload, recompute=recompute))
        for key in kept:
            assert np.array_equal(got[key], kept[key]), (multiple, offload_checkpoints, key)
        assert stats["recompute_storages"] == len(recompute)
        assert stats["on_demand_fetches"] == 0 or offload_checkpoints


def chain_net() -> Network:
    """Thirteen narrow convolutions at 32x32: feature maps, not parameters, fill the step."""
    net = Network((3, 32, 32), num_classes=10, name="chain")
    for k in range(13):
        net.add(Conv2d(8, 3, padding=1), name=f"conv{k}")
        net.add(ReLU(), name=f"relu{k}")
    net.add(MaxPool2d(4), name="pool")
    net.add(Flatten(), name="flat")
    net.add(Linear(10), name="fc")
    net.add_loss()
    return net


def test_segments_fit_a_budget_with_maps_rebuilt_from_one_another():
    """Under 60% of the unconstrained step's need, the segments search fits the step with
    maps rebuilt from rebuilt maps, at the cost of forwards run again."""
    def make(budget=None):
        net = chain_net()
        prof = dataclasses.replace(analytic_profile(net, 64, "h200"), generator_bytes=0)
        return Planner(net, 64, prof, budget=budget, input_batches=0)

    free = make()
    none = free.model.evaluate(frozenset(), free.model.algos("fastest"))
    p = make(int(none.required_bytes * 0.6))
    # conv0 ... conv11: the last ReLU keeps nothing, its pool applies its mask
    assert [len(run) for run in p.runs()] == [12]
    ev = p.segments()
    assert ev is not None and ev.fits
    assert any(set(recompute_inputs(p.plan, s)) & ev.recompute for s in ev.recompute)
    assert ev.step_time_s > none.step_time_s      # the forwards run again



def ladder_in_full(p: Planner):
    """Planner.segments as it was, every size evaluated in full: the fastest first fit."""
    m, found = p.model, []
    runs = p.runs()
    largest = max(p._bytes[s] for run in runs for s in run)
    for offload_checkpoints, ladder in ((False, SEGMENT_MULTIPLES),
                                        (True, SEGMENT_MULTIPLES[::-1])):
        for multiple in ladder:
            offload, recompute = p.segment_decision(runs, largest * multiple,
                                                    offload_checkpoints)
            ev = m.evaluate(offload, m.algos("fastest"), recompute)
            if ev.fits:
                found.append(ev)
                break
    return min(found, key=lambda ev: ev.step_time_s, default=None)


def test_segments_finds_what_evaluating_every_size_in_full_finds():
    """The ladder asks only whether each size fits (StepModel.evaluate_if_fits): the same
    sizes are weighed, the same one chosen, and a size shown not to fit by the bound is kept
    as Unfit instead of being packed and timed."""
    def make(budget):
        net = chain_net()
        prof = dataclasses.replace(analytic_profile(net, 64, "h200"), generator_bytes=0)
        return Planner(net, 64, prof, budget=budget, input_batches=0)

    free = make(None).model
    none = free.evaluate(frozenset(), free.algos("fastest"))
    unfit = 0
    for fraction in (0.45, 0.6, 0.8):
        budget = int(none.required_bytes * fraction)
        p, full = make(budget), make(budget)
        want, got = ladder_in_full(full), p.segments()
        assert (got is None) == (want is None), fraction
        if want is not None:
            assert (got.offload, got.recompute) == (want.offload, want.recompute)
            assert got.step_time_s == want.step_time_s
        assert p.model.cache.keys() == full.model.cache.keys()
        for key, entry in p.model.cache.items():
            assert entry.fits == full.model.cache[key].fits
        unfit += sum(isinstance(e, Unfit) for e in p.model.cache.values())
    assert unfit > 0      # some sizes were only walked


def test_greedy_from_the_closest_segments_fits_resnet50_where_no_size_does():
    """ResNet-50 b256 TF32 with whole-batch statistics in 8 GiB (the H200's model): no size of
    segments with kept checkpoints fits, and greedy from nothing offloads 3 GiB each way.
    Greedy started from the segments that come closest fits by recomputing maps that start no
    chain (conv1's) as well: the step runs at about the segments' speed."""
    net = models.build("resnet50", num_classes=1000)
    p = Planner(net, 256, analytic_profile(net, 256, "h200"), budget=8 * 2**30)
    result = p.run()
    found = result.searches["segments+greedy"]
    assert result.searches["segments"] is None
    assert found is not None and found.fits
    best = result.best                                  # found, pruned once more (finish)
    assert best.step_time_s <= found.step_time_s < 0.6 * result.searches["greedy"].step_time_s
    assert "conv1" in p.plan.tensor_names(best.recompute)
    chains = [s for s in best.recompute if set(recompute_inputs(p.plan, s)) & best.recompute]
    assert len(chains) > 40                                  # segments, rebuilt one from another
    # At 12 GiB greedy alone finds a faster step than any segments: no second start.
    roomy = Planner(net, 256, analytic_profile(net, 256, "h200"), budget=12 * 2**30).run()
    assert "segments+greedy" not in roomy.searches
    assert roomy.best.step_time_s <= roomy.searches["greedy"].step_time_s \
        < roomy.searches["segments"].step_time_s


def test_greedy_from_segments_trains_to_the_same_bits():
    """A decision greedy finds from segments (chains, single maps and offloads together)
    trains to the bits of the step that moves nothing, on the CPU."""
    roomy = planner("resnet18", 2, 32, budget=2**30)
    largest = max(roomy._bytes[s] for run in roomy.runs() for s in run)
    ladder = [roomy.model.evaluate(offload, roomy.model.algos("fastest"), recompute)
              for offload, recompute in (roomy.segment_decision(roomy.runs(), largest * k, False)
                                         for k in SEGMENT_MULTIPLES)]
    closest = min(ev.required_bytes for ev in ladder)
    # A budget whose usable part is just under the closest size's need.
    p = planner("resnet18", 2, 32, budget=int((closest - 1024) * 2**30 / roomy.usable))
    ev = p.segments_then_greedy()
    assert ev is not None and ev.fits and ev.offload and ev.recompute
    assert any(set(recompute_inputs(p.plan, s)) & ev.recompute for s in ev.recompute)
    kept, _ = train("resnet18", 32, MemoryDecision())
    got, stats = train("resnet18", 32, MemoryDecision(offload=ev.offload, recompute=ev.recompute))
    assert stats["recompute_storages"] == len(ev.recompute)
    for key in kept:
        assert np.array_equal(got[key], kept[key]), key
