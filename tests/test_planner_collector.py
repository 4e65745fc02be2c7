"""A step model's evaluations make no reference cycles, so pausing the cyclic garbage
collector while they run (planner/collector.py) leaves nothing behind: reference counting
frees every dry walk."""
import gc

import numpy as np
import pytest

from minidnn import models
from minidnn.memory.policy import offload_candidates, recompute_candidates
from minidnn.planner.collector import collector_paused
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.step_model import StepModel


def _decisions(model, seed=0):
    """Nothing moved, then random offloads, recomputations and convolution plans."""
    rng = np.random.default_rng(seed)
    offloadable = [s.id for s in offload_candidates(model.plan)]
    rebuildable = [s.id for s in recompute_candidates(model.plan)]
    out = [(frozenset(), model.algos("fastest"), frozenset())]
    for _ in range(2):
        recompute = frozenset([s for s in rebuildable if rng.random() < 0.3])
        offload = frozenset(s for s in offloadable if rng.random() < 0.6) - recompute
        algos = {c: str(rng.choice(["fastest", "min_workspace"])) for c in model.conv_names}
        out.append((offload, algos, recompute))
    return out


@pytest.mark.parametrize("name,options", [
    ("vgg16", {}),
    ("resnet18", {"micro_batches": 2}),
    ("googlenet", {"static_layout": False}),
    ("alexnet", {"replay": False, "prefetch_lookahead": 2}),
])
def test_evaluations_leave_no_cycles(name, options):
    net = models.build(name, num_classes=10, image_size=64)
    model = StepModel(net, 8, analytic_profile(net, 8, "h200"), budget=2**30, **options)
    for offload, algos, recompute in _decisions(model):
        gc.collect()
        model.evaluate(offload, algos, recompute)
        model.least_required(offload, algos, recompute)     # a walk kept, then dropped
        model._walked = None
        assert gc.collect() == 0


def test_collector_paused_restores_the_collector():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_split_plan_makes_next_to_no_cyclic_garbage():
    """plan_split pauses the collector for all of its work (planner/split.py)."""
    from minidnn.planner.split import plan_split
    net = models.build("vgg16", num_classes=10, image_size=64)
    gc.collect()
    gc.disable()
    try:
        split = plan_split(net, 32, lambda b: analytic_profile(net, b, "h200"), 2**30,
                           (0, 1, 2), counts=[1, 2])
        assert split.chosen is not None
        assert gc.collect() < 100
    finally:
        gc.enable()
