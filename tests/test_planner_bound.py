"""The step model's shortcuts: the lower bound that lets pruning skip decisions that cannot
fit, the residency read off the manager's log, and the liveness plan its dry runs share."""
import numpy as np
import pytest

from minidnn.assembly import Assembly, DryParts
from minidnn.memory.policy import NO_DECISION
from minidnn.spec import StepSpec
from minidnn import models
from minidnn.errors import ConfigError
from minidnn.executor import Executor
from minidnn.memory.observer import StepObserver
from minidnn.memory.plan import LivenessPlan
from minidnn.memory.policy import offload_candidates, recompute_candidates
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.recording import SymbolicDevice
from minidnn.planner.step_model import StepModel, Unfit

GiB = 2**30


def _model(budget=None, name="vgg16", batch=8):
    net = models.build(name, num_classes=10, image_size=64)
    prof = analytic_profile(net, batch, "h200")
    return StepModel(net, batch, prof, budget=budget, usable=budget)


def _decisions(model, count=8, seed=0):
    """Random offload and recompute sets, with the fastest or the leanest conv plans."""
    rng = np.random.default_rng(seed)
    offloadable = [s.id for s in offload_candidates(model.plan)]
    rebuildable = [s.id for s in recompute_candidates(model.plan)]
    for _ in range(count):
        recompute = frozenset([s for s in rebuildable if rng.random() < 0.3])
        offload = frozenset(s for s in offloadable if rng.random() < 0.5) - recompute
        algo = "fastest" if rng.random() < 0.5 else "min_workspace"
        yield offload, model.algos(algo), recompute


@pytest.mark.parametrize("name", ["vgg16", "resnet18"])
def test_least_required_never_exceeds_what_the_step_needs(name):
    model = _model(name=name)
    for offload, algos, recompute in _decisions(model):
        least = model.least_required(offload, algos, recompute)
        assert 0 < least <= model.evaluate(offload, algos, recompute).required_bytes


def test_a_decision_over_the_budget_by_the_bound_is_kept_unfit_and_finished_when_asked():
    probe = _model()
    everything = frozenset(s.id for s in offload_candidates(probe.plan))
    least = probe.evaluate(everything, probe.algos("min_workspace")).required_bytes
    model = _model(budget=least)          # only decisions that offload a lot fit
    nothing = model.least_required(frozenset(), model.algos("fastest"), frozenset())
    assert nothing > least
    assert model.evaluate_if_fits(frozenset(), model.algos("fastest")) is None
    (entry,) = model.cache.values()
    assert isinstance(entry, Unfit) and not entry.fits and entry.least == nothing
    full = model.evaluate(frozenset(), model.algos("fastest"))
    assert not full.fits and full.required_bytes >= nothing
    assert len(model.cache) == 1 and model.cache[model.key(frozenset(), full.conv_algo)] is full
    fits = model.evaluate_if_fits(everything, model.algos("min_workspace"))
    assert fits is not None and fits.fits


def test_residency_is_what_the_manager_holds_at_the_start_of_each_call():
    model = _model()
    offload, algos, recompute = next(_decisions(model, seed=3))
    ev = model.evaluate(offload, algos, recompute)

    class Scan(StepObserver):
        def __init__(self, manager, index):
            self.manager, self.index, self.seen = manager, index, {}

        def memory(self, at, phase, layer, when, device_bytes, feature_map_bytes):
            if when == "start":
                self.seen[(phase, self.index[layer])] = frozenset(
                    fm.sid for fm in self.manager.maps if fm.device is not None)

    ex = model.dry_executor(SymbolicDevice(), offload, model.workspace_blocks(algos, recompute),
                            recompute, static_layout=True)
    scan = Scan(ex.manager, model.index)
    ex.watch(scan)
    ex.simulate_step()
    assert set(ev.resident) == set(scan.seen)
    for point, sids in scan.seen.items():
        assert ev.resident[point] == sids


def test_an_executor_runs_by_a_liveness_plan_it_is_given_only_if_it_is_its_own():
    net = models.build("vgg16", num_classes=10, image_size=64)
    plan = LivenessPlan(net, 4)
    def dry(batch):
        return Executor.assembled(Assembly(net, StepSpec(batch=batch), NO_DECISION, "cpu",
                                           compute=False, dry=DryParts(plan=plan)))
    ex = dry(4)
    assert ex.plan is plan
    with pytest.raises(ConfigError, match="liveness plan"):
        dry(8)


def test_an_evaluation_after_the_bound_packs_its_recorded_blocks_to_the_same_prediction(
        monkeypatch):
    """evaluate_if_fits walks the step once for the bound; the evaluation that follows packs
    and times that walk instead of walking again, and predicts exactly what an evaluation
    with no bound before it does."""
    from minidnn.planner.step_model import StepModel
    walk = StepModel._walk
    walks = []

    def counted(self, *args):
        walks.append(args)
        return walk(self, *args)

    monkeypatch.setattr(StepModel, "_walk", counted)
    probe = _model()
    for offload, algos, recompute in _decisions(probe, count=4, seed=5):
        fresh = _model().evaluate(offload, algos, recompute)
        model = _model(budget=8 * GiB)
        walks.clear()
        reused = model.evaluate_if_fits(offload, algos, recompute)
        assert reused is not None and len(walks) == 1 and model._walked is None
        for name in ("required_bytes", "peak_bytes", "step_time_s", "compute_s",
                     "region_bytes", "held_bytes", "levels", "fm_levels", "calls", "copies",
                     "offloaded_bytes", "prefetched_bytes", "host_wait_s"):
            assert getattr(reused, name) == getattr(fresh, name), name
        assert dict(reused.resident) == dict(fresh.resident)
