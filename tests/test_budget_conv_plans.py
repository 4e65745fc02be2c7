"""A convolution's plans measured inside a run under a budget (kernels/cudnn_conv.py,
kernels/cuda.py): a run that meets a problem its profile measured in another process (the
profile is cached on disk, the plan tables are not) times the plans while the step's maps fill
the budget. The plans that fit the call's planned workspace block run in it; when none of the
best-ranked plans could run, the others are measured leanest first, so that a plan within
what the budget holds is found where cuDNN offers one (GoogLeNet bf16 under 3 GiB on the H200:
"none of the 25 cuDNN plans could run")."""
import math
import os

import numpy as np
import pytest

from minidnn.backend import gpu_available
from minidnn.kernels import ConvSpec
from minidnn.kernels.cudnn_conv import ConvPlanCache, ConvProblem, choose_plan


class TightMemory:
    """Fake cuDNN: plans (index, workspace, ms) that run only when their workspace is at most
    `free` bytes (the rest fail to allocate it, as _time_plan reports: None)."""

    def __init__(self, plans, free):
        self.plans, self.free, self.timed = plans, free, []

    def build(self, problem):
        class Graph:
            candidates = [(i, ws, f"eng{i}") for i, ws, _ in self.plans]
        return Graph()

    def time(self, graph, index, workspace, operands, best_ms):
        self.timed.append(index)
        ms = {i: t for i, _, t in self.plans}[index]
        return ms if workspace <= self.free else None


def problem():
    x = np.zeros((2, 4, 8, 8), np.float32)
    w = np.zeros((6, 4, 3, 3), np.float32)
    y = np.zeros((2, 6, 8, 8), np.float32)
    return ConvProblem.of("wgrad", x, w, y, ConvSpec(padding=(1, 1)), "tf32", False)


def test_when_no_measured_plan_fits_the_leanest_unmeasured_ones_are_tried():
    plans = [(0, 900, 0.1), (1, 800, 0.2), (2, 500, 0.9), (3, 0, 3.0), (4, 64, 1.5)]
    fake = TightMemory(plans, free=100)
    cache = ConvPlanCache(fake.build, fake.time, max_measured=2)
    entry = cache.get(problem(), operands=())
    assert fake.timed == [0, 1, 3]       # the two best-ranked, then the leanest: it runs
    times = {p.index: p.time_ms for p in entry.table}
    assert times[0] == times[1] == math.inf and times[3] == 3.0
    assert math.isnan(times[2]) and math.isnan(times[4])     # not measured
    assert choose_plan(entry.table, "min_workspace").index == 3
    assert entry.plan_for("fastest").index == 3
    assert cache.stats["plans_measured"] == 3 and cache.stats["plans_skipped"] == 2


def test_a_measured_plan_that_runs_leaves_the_others_unmeasured():
    plans = [(0, 900, 0.1), (1, 80, 0.2), (2, 0, 3.0)]
    fake = TightMemory(plans, free=100)
    entry = ConvPlanCache(fake.build, fake.time, max_measured=2).get(problem(), operands=())
    assert fake.timed == [0, 1] and entry.plan_for("fastest").index == 1
    assert math.isnan(entry.table[2].time_ms)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a GPU")
def test_a_run_whose_plans_were_measured_elsewhere_trains_at_its_least_budget(tmp_path,
                                                                              monkeypatch):
    """A small GoogLeNet in bf16: profiled (plan tables filled), then every plan table
    forgotten, as a new process with the profile on disk starts; trained at dyn's least
    budget, its convolutions measure their plans inside the budget and the step fits."""
    from minidnn import SGD, models
    from minidnn.decide import build_executor
    from minidnn.kernels import cuda
    from minidnn.planner import InfeasibleBudgetError
    from minidnn.spec import StepSpec
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path))
    path = os.path.join(os.path.dirname(__file__), "matrix_models", "tiny_googlenet.py")
    net = models.build(path, num_classes=10, image_size=32)
    spec = dict(batch=32, policy="dyn", precision="bf16", relu_bits=True)
    try:
        build_executor(net, StepSpec(memory_budget=4096, **spec), device="gpu")
        raise AssertionError("4 KiB was not refused")
    except InfeasibleBudgetError as e:
        least = e.minimum
    for cache in cuda._caches.values():
        cache.clear()
    cuda._ready.clear()
    net.init_params(0)
    # closed whatever happens: an open executor keeps CuPy's allocations in its arena
    with build_executor(net, StepSpec(memory_budget=least, **spec), device="gpu") as ex:
        opt = SGD(net.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
        rng = np.random.default_rng(0)
        x = ex.xp.asarray(rng.standard_normal((32, 3, 32, 32)).astype(np.float32))
        y = ex.xp.asarray(rng.integers(0, 10, 32))
        for _ in range(3):
            ex.train_step(x, y, opt)
        assert ex.memory_stats()["peak_device_bytes"] <= least
