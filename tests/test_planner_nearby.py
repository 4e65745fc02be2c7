"""The bound pruning takes from a neighbouring decision's blocks (planner/nearby.py): never
above what the decision's own dry walk gives, and None where it cannot tell."""
import numpy as np
import pytest

from minidnn import models
from minidnn.memory.layout import live_peak
from minidnn.memory.policy import offload_candidates, recompute_candidates
from minidnn.memory.record import record_intervals
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.nearby import peak_bytes, region_bound
from minidnn.planner.search import Planner
from minidnn.planner.step_model import StepModel, Unfit


def _model(name, lookahead, batch=8):
    net = models.build(name, num_classes=10, image_size=64)
    return StepModel(net, batch, analytic_profile(net, batch, "h200"),
                     prefetch_lookahead=lookahead)


def _walked(model, offload, algos, recompute) -> int:
    """The most block bytes alive at once in the decision's own dry walk."""
    workspace = {(model.index[n], phase): b
                 for (n, phase), b in model.workspace_blocks(algos, recompute).items()}
    keep = (model.net.loss_node.name, model.net.output)
    return live_peak(record_intervals(model.plan, offload, model.lookahead, keep, workspace,
                                      recompute, model.scratch))


def _bound(model, near, offload, algos, recompute):
    key, near_key = model.key(offload, algos, recompute), \
        model.key(near.offload, near.conv_algo, near.recompute)
    workspace = {(model.index[n], phase): b
                 for (n, phase), b in model.workspace_blocks(algos, recompute).items()}
    return region_bound(model._blocks[near_key], model.plan,
                        (near_key[0], near_key[2], near_key[1]), (key[0], key[2], key[1]),
                        workspace)


@pytest.mark.parametrize("name,lookahead", [("vgg16", 1), ("vgg16", 0), ("resnet18", 2),
                                            ("googlenet", 1)])
def test_the_bound_of_each_move_back_never_exceeds_the_walk(name, lookahead):
    model = _model(name, lookahead)
    rng = np.random.default_rng(0)
    offloadable = [s.id for s in offload_candidates(model.plan)]
    rebuildable = [s.id for s in recompute_candidates(model.plan)]
    checked = 0
    for _ in range(3):
        recompute = frozenset([s for s in rebuildable if rng.random() < 0.4])
        offload = frozenset(s for s in offloadable if rng.random() < 0.5) - recompute
        algos = {c: rng.choice(["fastest", "min_workspace"]) for c in model.conv_names}
        near = model.evaluate(offload, algos, recompute)
        blocks = model._blocks[model.key(offload, near.conv_algo, recompute)]
        assert peak_bytes(blocks.need, blocks.start, blocks.end) == \
            _walked(model, offload, near.conv_algo, recompute)
        moves = [("offload", s) for s in sorted(offload)] + \
            [("recompute", s) for s in sorted(recompute)] + \
            [("algo", c) for c in model.conv_names]
        for k in rng.permutation(len(moves))[:12]:
            what, x = moves[k]
            off, re, settings = offload, recompute, dict(near.conv_algo)
            if what == "offload":
                off = offload - {x}
            elif what == "recompute":
                re = recompute - {x}
            else:
                settings[x] = "fastest" if settings[x] != "fastest" else "min_workspace"
            bound = _bound(model, near, off, settings, re)
            assert bound is not None and bound <= _walked(model, off, settings, re)
            checked += 1
    assert checked >= 12


def test_no_bound_for_a_decision_that_adds_a_move():
    model = _model("vgg16", 1)
    offloadable = [s.id for s in offload_candidates(model.plan)]
    near = model.evaluate(frozenset(offloadable[:1]), model.algos("fastest"))
    assert _bound(model, near, frozenset(offloadable[:2]), near.conv_algo, frozenset()) is None
    assert _bound(model, near, frozenset(), near.conv_algo,
                  frozenset(offloadable[:1])) is None
    two = dict(near.conv_algo, **{c: "min_workspace" for c in model.conv_names[:2]})
    assert _bound(model, near, frozenset(), two, frozenset()) is None


def test_pruning_from_neighbours_finds_the_same_plan_as_walking_each_decision(monkeypatch):
    net = models.build("vgg16", num_classes=10, image_size=64)
    prof = analytic_profile(net, 64, "h200")
    least = Planner(net, 64, prof, budget=2**40).minimum().required_bytes
    budget = int(least * 1.05)        # tight: pruning meets decisions that cannot fit
    shortcut = Planner(net, 64, prof, budget=budget).run()
    monkeypatch.setattr(StepModel, "_least_from", lambda self, near, key: None)
    walking = Planner(net, 64, prof, budget=budget).run()
    assert any(isinstance(ev, Unfit) for ev in shortcut.model.cache.values())
    assert list(shortcut.model.cache) == list(walking.model.cache)
    assert [type(ev) for ev in shortcut.model.cache.values()] == \
        [type(ev) for ev in walking.model.cache.values()]
    assert shortcut.best.step_time_s == walking.best.step_time_s
    assert shortcut.decision == walking.decision
