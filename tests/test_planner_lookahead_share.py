"""Step models of one step at several prefetch lookaheads evaluate a decision that offloads
nothing once (StepModel's shares_with): nothing is prefetched then, so every lookahead walks
and times it alike, and the plans are those of models that share nothing."""
import numpy as np
import pytest

from minidnn import models
from minidnn.memory.policy import offload_candidates, recompute_candidates
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.search import Planner
from minidnn.planner.step_model import StepModel

from test_planner_replay import _canonical, _logs, _same_evaluation


def _unmoved(model, count=4, seed=0):
    """Decisions of `model` that offload nothing: recomputations and convolution plans."""
    rng = np.random.default_rng(seed)
    rebuildable = [s.id for s in recompute_candidates(model.plan)]
    out = [(frozenset(), model.algos("fastest"), frozenset())]
    for _ in range(count - 1):
        recompute = frozenset([s for s in rebuildable if rng.random() < 0.4])
        algos = {c: str(rng.choice(["fastest", "min_workspace"])) for c in model.conv_names}
        out.append((frozenset(), algos, recompute))
    return out


@pytest.mark.parametrize("name,options", [
    ("vgg16", {}),
    ("resnet18", {"micro_batches": 2}),
    ("googlenet", {"static_layout": False}),
])
def test_a_decision_that_offloads_nothing_walks_alike_at_every_lookahead(
        name, options, monkeypatch):
    net = models.build(name, num_classes=10, image_size=64)
    prof = analytic_profile(net, 8, "h200")
    by_lookahead = [StepModel(net, 8, prof, budget=2**30, prefetch_lookahead=la, **options)
                    for la in (0, 1, 2)]
    for decision in _unmoved(by_lookahead[0]):
        logs = [_canonical(_logs(m, decision, monkeypatch)) for m in by_lookahead]
        assert logs[0] == logs[1] == logs[2]
        evaluations = [m.evaluate(*decision) for m in by_lookahead]
        _same_evaluation(evaluations[0], evaluations[1])
        _same_evaluation(evaluations[0], evaluations[2])


def test_shared_evaluations_are_reused_and_equal_fresh_ones(monkeypatch):
    net = models.build("vgg16", num_classes=10, image_size=64)
    prof = analytic_profile(net, 8, "h200")
    first = StepModel(net, 8, prof, budget=2**30, prefetch_lookahead=1)
    sharing = StepModel(net, 8, prof, budget=2**30, prefetch_lookahead=2, shares_with=first)
    alone = StepModel(net, 8, prof, budget=2**30, prefetch_lookahead=2)
    decision = _unmoved(first)[1]
    evaluated = first.evaluate(*decision)
    walks = []
    monkeypatch.setattr(StepModel, "_walk", lambda self, *a: walks.append(a))
    assert sharing.evaluate(*decision) is evaluated         # no walk: taken from `first`
    assert walks == []
    monkeypatch.undo()
    _same_evaluation(sharing.evaluate(*decision), alone.evaluate(*decision))
    feature = next(s.id for s in offload_candidates(first.plan) if s.kind == "feature")
    moved = (frozenset({feature}), first.algos("fastest"), frozenset())
    assert sharing.evaluate(*moved) is not first.evaluate(*moved)   # offloads: not shared


def test_sharing_needs_the_same_step():
    net = models.build("vgg16", num_classes=10, image_size=64)
    prof = analytic_profile(net, 8, "h200")
    first = StepModel(net, 8, prof, budget=2**30)
    with pytest.raises(ValueError):
        StepModel(net, 8, prof, budget=2**31, shares_with=first)


@pytest.mark.parametrize("name,budget", [("vgg16", 2**30), ("resnet18", 3 * 2**29)])
def test_plans_at_several_lookaheads_are_those_of_planners_that_share_nothing(name, budget):
    net = models.build(name, num_classes=10, image_size=64)
    prof = analytic_profile(net, 32, "h200")
    shared, alone = None, []
    for lookahead in (1, 0, 2):
        planner = Planner(net, 32, prof, budget=budget, prefetch_lookahead=lookahead,
                          shares_with=shared)
        shared = shared or planner
        own = Planner(net, 32, prof, budget=budget, prefetch_lookahead=lookahead).run()
        got = planner.run()
        assert got.evaluations == own.evaluations
        assert got.model.cache.keys() == own.model.cache.keys()
        _same_evaluation(got.best, own.best)
    assert len(shared.model._unmoved) >= 2        # the baselines that offload nothing, at least
