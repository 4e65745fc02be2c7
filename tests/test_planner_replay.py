"""The later timed steps replayed from the first step's log (planner/replay.py) give the log,
and so the prediction, that walking them through the memory manager gives."""
import dataclasses

import numpy as np
import pytest

from minidnn import models
from minidnn.memory.policy import offload_candidates, recompute_candidates
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.playback import Timeline
from minidnn.planner.recording import Alloc, Free, Mark, Record, Wait
from minidnn.planner.step_model import StepModel


def _models(name, batch=8, **options):
    """The same StepModel twice: replaying the later steps, and walking every step."""
    net = models.build(name, num_classes=10, image_size=64)
    prof = analytic_profile(net, batch, "h200")
    return (StepModel(net, batch, prof, replay=True, **options),
            StepModel(net, batch, prof, replay=False, **options))


def _decisions(model, count=4, seed=0):
    """Random decisions of `model`: offloads, recomputations, convolution plans (the first:
    none of them)."""
    rng = np.random.default_rng(seed)
    offloadable = [s.id for s in offload_candidates(model.plan)]
    rebuildable = [s.id for s in recompute_candidates(model.plan)]
    out = [(frozenset(), model.algos("fastest"), frozenset())]
    for _ in range(count - 1):
        recompute = frozenset([s for s in rebuildable if rng.random() < 0.3])
        offload = frozenset(s for s in offloadable if rng.random() < 0.6) - recompute
        algos = {c: str(rng.choice(["fastest", "min_workspace"])) for c in model.conv_names}
        out.append((offload, algos, recompute))
    return out


def _canonical(log: list) -> list:
    """The log with each event and each block key named by the order it first appears: two
    logs with the same canonical form time alike (the timeline reads nothing else)."""
    names: dict = {}

    def name(x):
        return None if x is None else names.setdefault(id(x) if not isinstance(x, int)
                                                        else ("key", x), len(names))

    out = []
    for op in log:
        cls = type(op)
        if cls is Mark:
            out.append(("mark", op.stream, op.kind, op.label, op.nbytes))
        elif cls is Record:
            out.append(("record", op.stream, name(op.event)))
        elif cls is Wait:
            out.append(("wait", op.stream, name(op.event)))
        elif cls is Alloc:
            out.append(("alloc", name(op.key), op.nbytes))
        elif cls is Free:
            out.append(("free", name(op.key), name(op.event)))
        else:
            raise AssertionError(f"unknown log entry {op!r}")
    return out


def _logs(model, decision, monkeypatch) -> list:
    """The log `model` times for `decision`."""
    seen = []
    timeline = Timeline.play

    def spy(self, log, *args, **kwargs):
        seen.append(list(log))
        return timeline(self, log, *args, **kwargs)

    monkeypatch.setattr(Timeline, "play", spy)
    offload, algos, recompute = decision
    model._evaluate(offload, {n: algos.get(n, "fastest") for n in model.conv_names},
                    recompute)
    monkeypatch.setattr(Timeline, "play", timeline)
    return seen[0]


def _same_evaluation(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "resident":
            x, y = dict(x), dict(y)
        assert x == y, f.name


@pytest.mark.parametrize("name,options", [
    ("vgg16", dict(prefetch_lookahead=1)),
    ("vgg16", dict(prefetch_lookahead=2, micro_batches=2)),
    ("resnet18", dict(prefetch_lookahead=0)),
    ("googlenet", dict(prefetch_lookahead=1)),
    ("alexnet", dict(prefetch_lookahead=1, static_layout=False)),
    ("vgg16", dict(prefetch_lookahead=1, steps=3)),
])
def test_the_replayed_log_is_the_walked_one(name, options, monkeypatch):
    fast, walked = _models(name, **options)
    moved = 0
    for decision in _decisions(fast):
        a, b = _logs(fast, decision, monkeypatch), _logs(walked, decision, monkeypatch)
        assert len(a) == len(b)
        assert _canonical(a) == _canonical(b)
        moved += sum(type(op) is Mark and op.kind == "copy" for op in a)
    assert moved > 0          # decisions with copies in flight across the step boundary


@pytest.mark.parametrize("name,budget,options", [
    ("vgg16", 2**30, dict(prefetch_lookahead=1)),
    ("resnet18", 3 * 2**29, dict(prefetch_lookahead=2, micro_batches=2)),
    ("googlenet", 2**30, dict(prefetch_lookahead=0)),
])
def test_replayed_evaluations_equal_walked_ones(name, budget, options):
    fast, walked = _models(name, budget=budget, **options)
    for decision in _decisions(fast, count=5, seed=1):
        _same_evaluation(fast.evaluate(*decision), walked.evaluate(*decision))


@pytest.mark.parametrize("name,budget", [("vgg16", 516 * 2**20), ("resnet18", 150 * 2**20)])
def test_plans_are_the_same_with_and_without_replay(name, budget, monkeypatch):
    from minidnn.planner.search import Planner
    net = models.build(name, num_classes=10, image_size=64)
    prof = analytic_profile(net, 16, "h200")
    fast = Planner(net, 16, prof, budget=budget).run()
    real_init = StepModel.__init__
    monkeypatch.setattr(StepModel, "__init__", lambda self, net, spec, profile, options, **k:
                        real_init(self, net, spec, profile,
                                  dataclasses.replace(options, replay=False), **k))
    walked = Planner(net, 16, prof, budget=budget).run()
    assert not walked.model.replay
    assert fast.evaluations == walked.evaluations
    assert fast.best.offload or fast.best.recompute      # the budget made it move maps
    _same_evaluation(fast.best, walked.best)
    assert fast.model.cache.keys() == walked.model.cache.keys()
    for key, ev in walked.model.cache.items():
        if dataclasses.is_dataclass(ev) and hasattr(ev, "step_time_s"):
            _same_evaluation(fast.model.cache[key], ev)
