"""The pure-Python side of the cuDNN convolutions (kernels/cudnn_conv.py), on the CPU:
cache keys, plan choice, measuring once, group splitting and math-mode note filters, with a
fake graph and a fake timer standing in for cuDNN."""
import math

import numpy as np
import pytest

from minidnn.errors import ConfigError
from minidnn.kernels import ConvSpec
from minidnn.kernels.cudnn_conv import (ConvPlanCache, ConvProblem, PlanTiming, PlanUnavailable,
                                        check_math, choose_plan, deselected_notes,
                                        split_by_group)

INF = math.inf


def arrays(n=2, c=4, h=8, w=8, o=6, k=3, groups=1, dtype=np.float32, stride=1, pad=1):
    x = np.zeros((n, c, h, w), dtype)
    wt = np.zeros((o, c // groups, k, k), dtype)
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    y = np.zeros((n, o, oh, ow), dtype)
    spec = ConvSpec(stride=(stride, stride), padding=(pad, pad), groups=groups)
    return x, wt, y, spec


# ---- cache keys -------------------------------------------------------------------------------
def test_problem_key_is_shapes_strides_and_settings_not_the_layer_name():
    x, w, y, spec = arrays()
    a = ConvProblem.of("fprop", x, w, y, spec, "tf32", False)
    b = ConvProblem.of("fprop", x.copy(), w.copy(), y.copy(),
                       ConvSpec(stride=(1, 1), padding=(1, 1), key="conv7", algo="min_workspace"),
                       "tf32", False)
    assert a == b and hash(a) == hash(b)   # same shapes: one graph, whatever the layer or algo
    assert a.x == ((2, 4, 8, 8), (256, 64, 8, 1))
    assert a.dtype == "float32"


@pytest.mark.parametrize("change", ["op", "math", "deterministic", "dtype", "padding", "batch",
                                    "strides"])
def test_problem_key_changes_with_every_setting(change):
    x, w, y, spec = arrays()
    base = ConvProblem.of("fprop", x, w, y, spec, "tf32", False)
    if change == "op":
        other = ConvProblem.of("wgrad", x, w, y, spec, "tf32", False)
    elif change == "math":
        other = ConvProblem.of("fprop", x, w, y, spec, "fp32", False)
    elif change == "deterministic":
        other = ConvProblem.of("fprop", x, w, y, spec, "tf32", True)
    elif change == "dtype":
        other = ConvProblem.of("fprop", *arrays(dtype=np.float64)[:3], spec, "tf32", False)
    elif change == "padding":
        x2, w2, y2, spec2 = arrays(pad=0)
        other = ConvProblem.of("fprop", x2, w2, y2, spec2, "tf32", False)
    elif change == "batch":
        other = ConvProblem.of("fprop", *arrays(n=3)[:3], spec, "tf32", False)
    else:  # a channel slice: same shape as a 2-channel array, other strides
        xs, ws, ys, specs = arrays(c=2)
        x4 = np.zeros((2, 4, 8, 8), np.float32)[:, :2]
        a = ConvProblem.of("fprop", xs, ws, ys, specs, "tf32", False)
        other = ConvProblem.of("fprop", x4, ws, ys, specs, "tf32", False)
        assert a.x[0] == other.x[0] and a != other
        return
    assert other != base


def test_problem_rejects_mixed_or_unsupported_dtypes():
    x, w, y, spec = arrays()
    with pytest.raises(ConfigError, match="dtype float64, x has float32"):
        ConvProblem.of("fprop", x, w.astype(np.float64), y, spec, "tf32", False)
    with pytest.raises(ConfigError, match="float16 is not supported"):
        ConvProblem.of("fprop", *(a.astype(np.float16) for a in (x, w, y)), spec, "tf32", False)
    with pytest.raises(ConfigError, match="op must be one of"):
        ConvProblem.of("bprop", x, w, y, spec, "tf32", False)


def test_c_order_strides():
    from minidnn.kernels.mapformat import layout_strides
    assert layout_strides((2, 3, 4, 5)) == (60, 20, 5, 1)


# ---- math modes ---------------------------------------------------------------------------------
def test_note_filters_per_mode():
    assert deselected_notes("tf32", False) == ("DOWN_CONVERT_INPUTS",)
    fp32 = deselected_notes("fp32", False)
    assert "TENSOR_CORE" in fp32 and "NONDETERMINISTIC" not in fp32
    assert "NONDETERMINISTIC" in deselected_notes("tf32", True)
    assert "TENSOR_CORE" in deselected_notes("tf32", False, dtype="float64")


def test_check_math():
    assert check_math("fp32", True) == ("fp32", True)
    with pytest.raises(ConfigError, match="math must be one of tf32, fp32; got 'fp16'"):
        check_math("fp16", False)
    with pytest.raises(ConfigError, match="deterministic"):
        check_math("tf32", "yes")


# ---- plan choice ----------------------------------------------------------------------------------
TABLE = [PlanTiming(0, 50_000_000, 0.30),   # heuristics' favourite
         PlanTiming(3, 0, 0.90),
         PlanTiming(5, 26_000_000, 0.10),   # fastest
         PlanTiming(7, 0, 0.40),            # fastest of the zero-workspace plans
         PlanTiming(9, 0, INF)]             # could not run


def test_fastest_and_min_workspace():
    assert choose_plan(TABLE, "fastest").index == 5
    assert choose_plan(TABLE, "min_workspace").index == 7


def test_deterministic_choice_follows_rank_not_timing_and_not_the_setting():
    """One plan for every setting: the best-ranked of the least-workspace plans (3, not the
    faster 7), so that no budget changes a bit of the result."""
    for algo in ("fastest", "min_workspace"):
        assert choose_plan(TABLE, algo, by_rank=True).index == 3
    for limit in (None, 0, 26_000_000, 10**9):
        assert choose_plan(TABLE, "fastest", by_rank=True, workspace_limit=limit).index == 3


def test_plans_that_did_not_run_are_never_chosen():
    table = [PlanTiming(0, 0, INF), PlanTiming(1, 10, 2.0)]
    assert choose_plan(table, "min_workspace").index == 1   # least workspace *that ran*
    with pytest.raises(ConfigError, match="none of the 1 cuDNN plans could run"):
        choose_plan([PlanTiming(0, 0, INF)], "fastest", where="layer conv1")


def test_unknown_algo_is_named():
    with pytest.raises(ConfigError, match="conv1: algo must be one of fastest, min_workspace; "
                                          "got 'quickest'"):
        choose_plan(TABLE, "quickest", where="conv1")


# ---- the cache --------------------------------------------------------------------------------------
class FakeGraph:
    def __init__(self, problem, candidates):
        self.problem = problem
        self.candidates = candidates


class FakeCuDNN:
    """Builds fake graphs and times plans from a table of (index, workspace, ms)."""

    def __init__(self, plans, unsupported=()):
        self.plans = plans
        self.unsupported = set(unsupported)
        self.built, self.timed = [], []

    def build(self, problem):
        if problem.groups in self.unsupported:
            raise PlanUnavailable(f"no plan for groups={problem.groups}")
        self.built.append(problem)
        return FakeGraph(problem, [(i, ws, f"eng{i}") for i, ws, _ in self.plans])

    def time(self, graph, index, workspace, operands, best_ms):
        self.timed.append((graph.problem.op, index, best_ms))
        ms = {i: t for i, _, t in self.plans}[index]
        return None if ms is None else ms


def test_cache_builds_and_measures_each_problem_once():
    fake = FakeCuDNN([(0, 100, 0.5), (1, 0, 0.7), (2, 1 << 40, None)])
    cache = ConvPlanCache(fake.build, fake.time)
    x, w, y, spec = arrays()
    p = ConvProblem.of("fprop", x, w, y, spec, "tf32", False)
    e1 = cache.get(p, operands=(1, 2, 3))
    e2 = cache.get(ConvProblem.of("fprop", x, w, y, spec, "tf32", False), operands=(4, 5, 6))
    assert e1 is e2
    assert cache.stats["graphs_built"] == 1 and cache.stats["hits"] == 1
    assert cache.stats["plans_measured"] == 3 and len(fake.timed) == 3
    assert [t[2] for t in fake.timed] == [INF, 0.5, 0.5]     # the best time so far, to cut short
    assert e1.table == [PlanTiming(0, 100, 0.5), PlanTiming(1, 0, 0.7), PlanTiming(2, 1 << 40, INF)]
    # Switching a layer between algos needs no new graph and no new measurement.
    assert e1.plan_for("fastest").index == 0
    assert e1.plan_for("min_workspace").index == 1
    assert cache.stats["graphs_built"] == 1 and len(fake.timed) == 3
    # Another op of the same layer is another problem.
    cache.get(ConvProblem.of("dgrad", x, w, y, spec, "tf32", False), operands=(1, 2, 3))
    assert cache.stats["graphs_built"] == 2 and len(cache) == 2
    assert cache.lookup(p) is e1
    cache.clear()
    assert len(cache) == 0 and cache.stats["graphs_built"] == 0


def test_only_the_best_ranked_plans_are_measured():
    """Past max_measured candidates (in rank order) nothing runs: those plans stay in the
    table, unmeasured, and are never chosen, however little workspace they need."""
    fake = FakeCuDNN([(0, 100, 0.5), (1, 50, 0.7), (2, 0, 0.1), (3, 0, 0.05)])
    cache = ConvPlanCache(fake.build, fake.time, max_measured=2)
    x, w, y, spec = arrays()
    e = cache.get(ConvProblem.of("wgrad", x, w, y, spec, "tf32", False), operands=())
    assert [t[1] for t in fake.timed] == [0, 1]
    assert cache.stats["plans_measured"] == 2 and cache.stats["plans_skipped"] == 2
    assert [(p.index, p.workspace_bytes) for p in e.table[2:]] == [(2, 0), (3, 0)]
    assert all(math.isnan(p.time_ms) for p in e.table[2:])            # not measured
    assert e.plan_for("fastest").index == 0 and e.plan_for("min_workspace").index == 1
    every = ConvPlanCache(fake.build, fake.time, max_measured=None)
    e = every.get(ConvProblem.of("wgrad", x, w, y, spec, "tf32", False), operands=())
    assert e.plan_for("fastest").index == 3


def test_deterministic_entry_chooses_by_rank():
    fake = FakeCuDNN([(0, 100, 0.5), (1, 0, 0.2)])
    cache = ConvPlanCache(fake.build, fake.time)
    x, w, y, spec = arrays()
    e = cache.get(ConvProblem.of("wgrad", x, w, y, spec, "fp32", True), operands=())
    assert e.plan_for("fastest").index == 1 == e.plan_for("min_workspace").index


def test_unavailable_problem_is_remembered_and_not_rebuilt():
    fake = FakeCuDNN([(0, 0, 1.0)], unsupported={2})
    cache = ConvPlanCache(fake.build, fake.time)
    x, w, y, spec = arrays(groups=2)
    p = ConvProblem.of("fprop", x, w, y, spec, "tf32", False)
    for _ in range(2):
        with pytest.raises(PlanUnavailable, match="groups=2"):
            cache.get(p, operands=())
    assert fake.built == []
    # The per-group problem is an ordinary convolution on strided views.
    parts = split_by_group(x, w, y, 2)
    q = ConvProblem.of("fprop", *parts[0], spec, "tf32", False, groups=1)
    assert q.groups == 1 and q.x[0] == (2, 2, 8, 8) and q.x[1] == (256, 64, 8, 1)
    assert cache.get(q, operands=()).plan_for("fastest").index == 0


def test_split_by_group_views_cover_every_channel():
    x = np.arange(2 * 6 * 3 * 3, dtype=np.float32).reshape(2, 6, 3, 3)
    w = np.arange(3 * 2 * 1 * 1, dtype=np.float32).reshape(3, 2, 1, 1)
    y = np.zeros((2, 3, 3, 3), np.float32)
    parts = split_by_group(x, w, y, 3)
    assert len(parts) == 3
    for g, (xg, wg, yg) in enumerate(parts):
        assert np.shares_memory(xg, x) and np.shares_memory(wg, w) and np.shares_memory(yg, y)
        np.testing.assert_array_equal(xg, x[:, 2 * g:2 * g + 2])
        np.testing.assert_array_equal(wg, w[g:g + 1])
        yg[...] = g + 1                      # writing through the views fills y
    np.testing.assert_array_equal(y[0, :, 0, 0], [1, 2, 3])
