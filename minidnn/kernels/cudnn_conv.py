"""cuDNN convolutions through the cuDNN frontend: one graph per problem, every plan measured once.

A *problem* is one convolution op (fprop, dgrad, wgrad, or fprop_bias_relu: fprop with the
bias and a ReLU in its epilogue) at fixed shapes, strides, dtype,
stride/padding/dilation, groups and math mode. The first time a problem is seen its frontend
graph is built, every candidate execution plan the heuristics offer (modes A and FALLBACK) is
built, and each plan is run and timed once with CUDA events; the table
[(plan_index, workspace_bytes, time_ms)] is kept with the graph. Later calls pick a plan from
that table (`choose_plan`) and only execute. This is vDNN's per-layer algorithm choice: the
fastest plan needs workspace memory, the memory-optimal one needs little or none, and the memory
manager may switch a layer between them (ConvSpec.algo) without rebuilding anything.

Math modes follow the engines' numerical notes, the way PyTorch filters cuDNN engine configs:
'tf32' allows tensor-core (TF32) plans for float32; 'fp32' drops plans noted TENSOR_CORE (and
those that down-convert inputs or reduce in lower precision), leaving strict FP32 plans.
deterministic=True also drops plans noted NONDETERMINISTIC and runs, whatever the setting
(fastest, memory-optimal or a workspace limit), the best-ranked of the plans that need the least
workspace: the choice then depends neither on timing noise nor on the memory budget, so the same
seed gives the same bits under every policy and every budget that fits. The cost is speed: the
memory-optimal plans, e.g. VGG-16 conv1_2 at batch 32 in TF32 on an H200, fprop 2.8 ms instead
of 0.94 ms and wgrad 7.0 ms instead of 1.6 ms (benchmarks/RESULTS.md, the kernel table).

Everything above `CudnnConvGraph` is plain Python (no CuPy, no cuDNN) and runs on the CPU: the
cache logic is tested there with a fake graph and a fake timer (tests/test_cudnn_cpu.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from ..errors import ConfigError
from .math_mode import MATH_MODES

OPS = ("fprop", "dgrad", "wgrad", "fprop_bias_relu")
# Plans whose kernels cuDNN compiles at run time (NVRTC) cost seconds to build, per shape; the
# precompiled engines cover every convolution here, so those plans are not offered.
EXCLUDE_RUNTIME_COMPILED = True
# Plans measured per problem: the first this many in the heuristics' rank order (PyTorch's
# cudnn.benchmark_limit is 10 too). The fallback plans ranked last can be very slow: on the
# H200, channels-last weight gradients at batch 256 offered zero-workspace plans that ran for
# 5 to 22 s each (the best plan: 2 to 5 ms), so measuring every candidate cost minutes.
# The others stay in the table with time NaN (not measured): never chosen by choose_plan;
# only a convolution whose chosen workspace cannot be had runs one (cuda._leaner_plan).
MEASURED_PLANS = 10
# Steady-state calls go straight to the lowered graph's execute (see CudnnConvGraph.runner);
# False uses the frontend's public execute_plan_at_index, about 40 us slower per call.
DIRECT_EXECUTE = True
ALGOS = ("fastest", "min_workspace")
DTYPES = ("float32", "float64", "bfloat16")

# What each op reads and writes, in the roles x (image), w (filter), y (output map):
#   fprop  y  = conv(x, w)          dgrad  x = conv^T(y, w)          wgrad  w = corr(x, y)
#   fprop_bias_relu  y = max(conv(x, w) + b, 0), b (O,) read too: the bias and the ReLU in
#   the convolution's epilogue, on the float32 sums before y is written (float32 maps only:
#   on bf16 maps the H200 offers it from runtime-compiled engines alone, slower than the
#   convolution and the pass it saves; benchmarks/runs/wave15/probe_fusion.py).


def deselected_notes(math_mode: str, deterministic: bool, dtype: str = "float32") -> tuple:
    """Names of the cuDNN numerical notes whose plans a problem must not use.

    Plans that down-convert their inputs (to FP16/BF16) are never wanted. Strict FP32 also
    excludes tensor-core plans (TF32 on float32 data) and reduced-precision reductions.
    float64 has no TF32, so its math mode changes nothing. bfloat16 data (mixed precision)
    runs on tensor cores whatever the mode, and always sums in float32.
    """
    notes = ["DOWN_CONVERT_INPUTS"]
    if dtype == "bfloat16":
        notes += ["REDUCED_PRECISION_REDUCTION"]
    elif math_mode == "fp32" or dtype == "float64":
        notes += ["TENSOR_CORE", "REDUCED_PRECISION_REDUCTION"]
    if deterministic:
        notes.append("NONDETERMINISTIC")
    return tuple(notes)


def check_math(math_mode: str, deterministic) -> tuple:
    """Validated (math_mode, deterministic); ConfigError naming the bad argument."""
    if math_mode not in MATH_MODES:
        raise ConfigError(f"math must be one of {', '.join(MATH_MODES)}; got {math_mode!r}")
    if not isinstance(deterministic, (bool, np.bool_)):
        raise ConfigError(f"deterministic must be True or False; got {deterministic!r}")
    return math_mode, bool(deterministic)


def _layout(a) -> tuple:
    """(shape, strides in elements) of a NumPy or CuPy array."""
    return tuple(int(d) for d in a.shape), tuple(int(s) // a.itemsize for s in a.strides)


@dataclass(frozen=True)
class ConvProblem:
    """Everything a cuDNN graph is built for; hashable, so it is the cache key.

    x, w, y: (shape, strides in elements) of the image (N, C, H, W), the filter
    (O, C/groups, KH, KW) and the output map (N, O, OH, OW), whichever of them the op reads or
    writes. The layer's name is not part of it: layers with equal shapes share one graph.
    """
    op: str
    x: tuple
    w: tuple
    y: tuple
    dtype: str
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int
    math: str
    deterministic: bool

    @classmethod
    def of(cls, op: str, x, w, y, spec, math_mode: str, deterministic: bool,
           groups: int | None = None) -> "ConvProblem":
        """The problem of running `op` on arrays x, w, y (NumPy or CuPy) with a ConvSpec."""
        if op not in OPS:
            raise ConfigError(f"convolution op must be one of {', '.join(OPS)}; got {op!r}")
        dtype = np.dtype(x.dtype).name
        for role, a in (("w", w), ("y", y)):
            if np.dtype(a.dtype).name != dtype:
                raise ConfigError(f"convolution {spec.key or '(unnamed)'} {op}: {role} has dtype "
                                  f"{np.dtype(a.dtype).name}, x has {dtype}; all must match")
        if dtype not in DTYPES:
            raise ConfigError(f"convolution {spec.key or '(unnamed)'}: dtype {dtype} is not "
                              f"supported on the GPU (expected one of {', '.join(DTYPES)})")
        return cls(op, _layout(x), _layout(w), _layout(y), dtype,
                   tuple(int(v) for v in spec.stride), tuple(int(v) for v in spec.padding),
                   tuple(int(v) for v in spec.dilation),
                   int(spec.groups if groups is None else groups), math_mode, bool(deterministic))

    def describe(self) -> str:
        return (f"{self.op} x{list(self.x[0])} w{list(self.w[0])} y{list(self.y[0])} "
                f"{self.dtype} stride {self.stride} padding {self.padding} dilation "
                f"{self.dilation} groups {self.groups}, math {self.math}"
                f"{', deterministic' if self.deterministic else ''}")


def split_by_group(x, w, y, groups: int) -> list:
    """[(x_g, w_g, y_g)] views, one per group: channel slices of x and y, filter rows of w.

    For graphs cuDNN cannot run grouped: each group becomes an ordinary convolution on strided
    views (same strides as the whole arrays, so one graph serves every group).
    """
    c, o = x.shape[1], w.shape[0]
    cg, og = c // groups, o // groups
    return [(x[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og], y[:, g * og:(g + 1) * og])
            for g in range(groups)]


class PlanTiming(NamedTuple):
    """One candidate plan of a problem: its index in the graph's plan list, the workspace it
    needs, and its measured time: inf when it could not run (e.g. its workspace did not fit),
    NaN when it was not measured (ranked past ConvPlanCache.max_measured)."""
    index: int
    workspace_bytes: int
    time_ms: float


def choose_plan(table, algo: str, by_rank: bool = False, where: str = "",
                workspace_limit: int | None = None) -> PlanTiming:
    """The plan to run from a problem's table (in the heuristics' rank order).

    algo 'fastest': the least measured time among the plans whose workspace is at most
    `workspace_limit` (None: any workspace; when no plan is that lean, the leanest ones).
    'min_workspace': among the plans needing the least workspace, the least time.
    by_rank=True (deterministic mode): the best-ranked plan needing the least workspace, for
    every algo and limit, so that the choice depends neither on timing noise nor on the
    budget (see the module doc). Plans that did not run (time inf) are never chosen.
    """
    if algo not in ALGOS:
        raise ConfigError(f"{where or 'convolution'}: algo must be one of {', '.join(ALGOS)}; "
                          f"got {algo!r}")
    ran = [p for p in table if math.isfinite(p.time_ms)]
    if not ran:
        raise ConfigError(f"{where or 'convolution'}: none of the {len(table)} cuDNN plans could "
                          f"run (each one's workspace failed to allocate, or none was offered)")
    least = min(p.workspace_bytes for p in ran)
    if by_rank or algo == "min_workspace" or (workspace_limit is not None and
                                               workspace_limit < least):
        ran = [p for p in ran if p.workspace_bytes == least]
    elif workspace_limit is not None:
        ran = [p for p in ran if p.workspace_bytes <= workspace_limit]
    if by_rank:
        return ran[0]
    return min(ran, key=lambda p: p.time_ms)


def choose_plans(tables: dict, algo: str, by_rank: bool = False, where: str = "",
                 workspace_limit: int | None = None) -> dict:
    """{op: PlanTiming}: choose_plan for each op of one layer ({op: table}) under one setting."""
    return {op: choose_plan(t, algo, by_rank, where, workspace_limit) for op, t in tables.items()}


# At most this many workspace limits are offered between a convolution's fastest and its
# memory-optimal plans: enough to trade memory for time in steps, few enough for the planner.
MAX_RUNGS = 6
# A rung must need at most this fraction of the workspace of the rung above: cuDNN offers many
# plans a few MiB apart, and a step that saves 0.1% of the workspace for 50% more time is no
# trade the planner could use.
RUNG_RATIO = 0.9


def workspace_ladder(tables: dict, by_rank: bool = False, max_rungs: int = MAX_RUNGS) -> list:
    """Workspace limits worth running a convolution layer under, between its fastest and its
    memory-optimal setting (both excluded), most workspace first.

    tables: {op: [PlanTiming]} of the ops one layer runs (fprop, and dgrad and/or wgrad); one
    limit applies to all of them. A limit is kept only if it is a rung of the trade-off: it
    needs at most RUNG_RATIO of the workspace (the largest of its ops' chosen plans) of the rung
    above (the fastest of those that do) and takes less time (the sum of its ops' chosen
    plans) than the memory-optimal setting. Each limit is the workspace its choice actually
    needs, so equal choices give one rung. With more than `max_rungs`, evenly spaced ones are
    kept.
    """
    def setting(algo, limit=None):
        chosen = choose_plans(tables, algo, by_rank, workspace_limit=limit).values()
        return max(p.workspace_bytes for p in chosen), sum(p.time_ms for p in chosen)

    top_ws, _ = setting("fastest")
    bottom_ws, bottom_ms = setting("min_workspace")
    limits = sorted({p.workspace_bytes for t in tables.values() for p in t
                     if math.isfinite(p.time_ms) and bottom_ws < p.workspace_bytes < top_ws},
                    reverse=True)
    rungs, above = [], top_ws
    for limit in limits:
        ws, ms = setting("fastest", limit)
        if bottom_ws < ws <= above * RUNG_RATIO and ms < bottom_ms:
            rungs.append(ws)
            above = ws
    if len(rungs) > max_rungs:
        step = (len(rungs) - 1) / (max_rungs - 1) if max_rungs > 1 else 0
        rungs = sorted({rungs[round(k * step)] for k in range(max_rungs)}, reverse=True)
    return rungs


class PlanUnavailable(Exception):
    """cuDNN offers no plan for a problem (e.g. a grouped convolution it cannot run)."""


@dataclass
class ConvEntry:
    """A built graph, its measured plan table, and the plan chosen for each (algo, workspace
    limit)."""
    problem: ConvProblem
    graph: object
    table: list
    chosen: dict = field(default_factory=dict)

    def plan_for(self, algo: str, where: str = "", workspace_limit: int | None = None
                 ) -> PlanTiming:
        plan = self.chosen.get((algo, workspace_limit))
        if plan is None:
            plan = self.chosen[(algo, workspace_limit)] = choose_plan(
                self.table, algo, by_rank=self.problem.deterministic,
                where=f"{where + ': ' if where else ''}{self.problem.describe()}",
                workspace_limit=workspace_limit)
        return plan


class ConvPlanCache:
    """Graphs and plan tables by problem. Builds and measures each problem once.

    build_graph(problem) -> a graph with `.candidates` [(plan_index, workspace_bytes, name)],
    raising PlanUnavailable when cuDNN has nothing. time_plan(graph, plan_index,
    workspace_bytes, operands, best_ms) -> milliseconds, or None when the plan could not run;
    best_ms is the best time so far (inf at first), so that a timer may cut short a plan that
    is clearly slower. Only the first `max_measured` candidates (None: all) are measured; the
    rest stay in the table, unmeasured (time NaN), unless none of the measured ones could
    run: then the rest are measured leanest first until one runs (`_measure_leanest`).
    """

    def __init__(self, build_graph: Callable, time_plan: Callable,
                 max_measured: int | None = MEASURED_PLANS):
        self._build_graph = build_graph
        self._time_plan = time_plan
        self.max_measured = max_measured
        self._entries: dict = {}
        self._unavailable: dict = {}
        self.stats = {"graphs_built": 0, "plans_measured": 0, "plans_skipped": 0, "hits": 0,
                      "build_s": 0.0, "measure_s": 0.0}

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list:
        """Every ConvEntry measured so far."""
        return list(self._entries.values())

    def lookup(self, problem: ConvProblem):
        """The entry of a problem already measured, or None."""
        return self._entries.get(problem)

    def get(self, problem: ConvProblem, operands) -> ConvEntry:
        """The problem's entry; on first sight builds its graph and times every plan on
        `operands` (whatever time_plan needs: device pointers of x, w, y)."""
        entry = self._entries.get(problem)
        if entry is not None:
            self.stats["hits"] += 1
            return entry
        if problem in self._unavailable:
            raise PlanUnavailable(self._unavailable[problem])
        t0 = time.perf_counter()
        try:
            graph = self._build_graph(problem)
        except PlanUnavailable as exc:
            self._unavailable[problem] = str(exc)
            raise
        t1 = time.perf_counter()
        self.stats["graphs_built"] += 1
        self.stats["build_s"] += t1 - t0
        table, best = [], math.inf
        for rank, (index, workspace, _name) in enumerate(graph.candidates):
            if self.max_measured is not None and rank >= self.max_measured:
                self.stats["plans_skipped"] += 1
                table.append(PlanTiming(int(index), int(workspace), math.nan))
                continue
            ms = self._time_plan(graph, index, workspace, operands, best)
            self.stats["plans_measured"] += 1
            ms = math.inf if ms is None else float(ms)
            best = min(best, ms)
            table.append(PlanTiming(int(index), int(workspace), ms))
        if not math.isfinite(best):
            table = self._measure_leanest(graph, table, operands)
        self.stats["measure_s"] += time.perf_counter() - t1
        entry = self._entries[problem] = ConvEntry(problem, graph, table)
        return entry

    def _measure_leanest(self, graph, table: list, operands) -> list:
        """The table after none of the measured plans could run (each one's workspace was
        more than the memory free, as in a run under a tight budget that meets a problem
        its profile measured in another process): the plans not measured, leanest first,
        until one runs, so that a plan within what the budget holds is found where cuDNN
        offers one."""
        table = list(table)
        for k in sorted((k for k, p in enumerate(table) if math.isnan(p.time_ms)),
                        key=lambda k: (table[k].workspace_bytes, k)):
            plan = table[k]
            ms = self._time_plan(graph, plan.index, plan.workspace_bytes, operands, math.inf)
            self.stats["plans_measured"] += 1
            self.stats["plans_skipped"] -= 1
            table[k] = plan._replace(time_ms=math.inf if ms is None else float(ms))
            if ms is not None:
                break
        return table

    def clear(self) -> None:
        self._entries.clear()
        self._unavailable.clear()
        for k in self.stats:
            self.stats[k] = 0.0 if k.endswith("_s") else 0


# ---- the cuDNN side (needs a GPU, CuPy and the cuDNN frontend) ---------------------------------
def load_cudnn():
    """The cuDNN frontend module, or a DeviceError that says how to get it. cuDNN itself comes
    from the nvidia-cudnn-cu13 package of the 'gpu' extra (nvidia_libraries.preload), not
    from PyTorch's wheels."""
    from .nvidia_libraries import preload
    try:
        preload("cudnn")  # before the frontend looks for it by name
        import cudnn
    except (ImportError, OSError) as exc:
        from ..errors import DeviceError
        raise DeviceError("GPU convolutions need the cuDNN frontend Python package "
                          "(pip install 'nvidia-cudnn-frontend<1.30', part of the 'gpu' extra); "
                          f"importing it failed: {exc}") from exc
    return cudnn


class CudnnConvGraph:
    """The cuDNN frontend graph of one ConvProblem and its buildable plans.

    candidates: [(plan_index, workspace_bytes, name)] in the heuristics' rank order, only
    plans that passed the math-mode note filter and built. declined: [(plan_index, reason)].
    """

    def __init__(self, problem: ConvProblem, handle):
        cudnn = load_cudnn()
        self.problem = problem
        self.handle = handle
        dt = {"float32": cudnn.data_type.FLOAT, "float64": cudnn.data_type.DOUBLE,
              "bfloat16": cudnn.data_type.BFLOAT16}[problem.dtype]
        # bfloat16 operands (mixed precision) are summed in float32
        acc = cudnn.data_type.FLOAT if problem.dtype == "bfloat16" else dt
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=acc, compute_data_type=acc,
                          handle=handle)
        conv = dict(padding=list(problem.padding), stride=list(problem.stride),
                    dilation=list(problem.dilation), compute_data_type=acc)

        def tensor(name, layout):
            shape, strides = layout
            return g.tensor(name=name, dim=list(shape), stride=list(strides), data_type=dt)

        op = problem.op
        self._b = None
        if op in ("fprop", "fprop_bias_relu"):
            self._x, self._w = tensor("x", problem.x), tensor("w", problem.w)
            self._y = g.conv_fprop(image=self._x, weight=self._w, **conv)
            if op == "fprop_bias_relu":
                o = problem.w[0][0]
                self._b = g.tensor(name="b", dim=[1, o, 1, 1], stride=[o, 1, o, o], data_type=dt)
                self._y = g.relu(input=g.bias(input=self._y, bias=self._b))
            out = (self._y, problem.y)
        elif op == "dgrad":
            self._y, self._w = tensor("dy", problem.y), tensor("w", problem.w)
            self._x = g.conv_dgrad(loss=self._y, filter=self._w, **conv)
            out = (self._x, problem.x)
        else:
            self._x, self._y = tensor("x", problem.x), tensor("dy", problem.y)
            self._w = g.conv_wgrad(image=self._x, loss=self._y, **conv)
            out = (self._w, problem.w)
        # Without explicit dim and stride the output would be laid out NHWC.
        t, (shape, strides) = out
        t.set_output(True).set_dim(list(shape)).set_stride(list(strides)).set_data_type(dt)

        declined_types = (cudnn.cudnnGraphNotSupportedError, RuntimeError)
        try:
            g.validate()
            g.build_operation_graph()
            notes = [getattr(cudnn.numerical_note, n)
                     for n in deselected_notes(problem.math, problem.deterministic, problem.dtype)]
            g.deselect_numeric_notes(notes)
            if EXCLUDE_RUNTIME_COMPILED:
                g.deselect_behavior_notes([cudnn.behavior_note.RUNTIME_COMPILATION])
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        except declined_types as exc:
            raise PlanUnavailable(f"cuDNN cannot run {problem.describe()}: {exc}") from exc
        self.candidates, self.declined = [], []
        for i in range(g.get_execution_plan_count()):
            try:  # a plan excluded by the note filter, or unsupported here, fails to build
                g.build_plan_at_index(i)
                workspace = int(g.get_workspace_size_plan_at_index(i))
            except declined_types as exc:
                self.declined.append((i, str(exc).strip().splitlines()[0] if str(exc) else ""))
                continue
            self.candidates.append((i, workspace, g.get_plan_name_at_index(i)))
        if not self.candidates:
            raise PlanUnavailable(f"cuDNN has no plan for {problem.describe()} "
                                  f"({len(self.declined)} candidates declined)")
        self._graph = g

    def _pack(self, x_ptr, w_ptr, y_ptr, b_ptr) -> dict:
        pack = {self._x: x_ptr, self._w: w_ptr, self._y: y_ptr}
        if self._b is not None:
            pack[self._b] = b_ptr
        return pack

    def execute(self, index: int, x_ptr: int, w_ptr: int, y_ptr: int, workspace_ptr: int,
                b_ptr: int = 0) -> None:
        """Run plan `index` on device pointers (b_ptr: the bias of fprop_bias_relu), on the
        stream the handle is bound to."""
        self._graph.execute_plan_at_index(self._pack(x_ptr, w_ptr, y_ptr, b_ptr),
                                          workspace=workspace_ptr, index=index,
                                          handle=self.handle)

    def runner(self, index: int, direct: bool | None = None):
        """A function (x_ptr, w_ptr, y_ptr, workspace_ptr, b_ptr=0) -> None running plan
        `index` (b_ptr: the bias of fprop_bias_relu).

        The frontend's public execute_plan_at_index re-derives on every call what is fixed once
        a plan is chosen (its position in the backend's list, the excluded plans, the operand
        map). The direct runner resolves those once and calls the lowered graph's execute, a
        private entry point of nvidia-cudnn-frontend (pinned below 1.30); where it is missing it
        falls back to the public call.
        """
        direct = DIRECT_EXECUTE if direct is None else direct
        g = self._graph
        lowered = getattr(g, "_lowered_graph", None)
        raw = getattr(lowered, "_execute_plan_at_index", None)
        materialize = getattr(g, "_materialize_backend_plan", None)
        if direct and raw is not None and materialize is not None:
            cpp_index = materialize(index).cpp_index
            ux, uw, uy = self._x.uid, self._w.uid, self._y.uid
            ub = None if self._b is None else self._b.uid
            handle = self.handle.backend_handle
            if cpp_index is not None:
                def run(x_ptr, w_ptr, y_ptr, workspace_ptr, b_ptr=0):
                    pack = {ux: x_ptr, uw: w_ptr, uy: y_ptr}
                    if ub is not None:
                        pack[ub] = b_ptr
                    raw(pack, workspace_ptr, cpp_index, handle)
                return run

        def run(x_ptr, w_ptr, y_ptr, workspace_ptr, b_ptr=0):
            self.execute(index, x_ptr, w_ptr, y_ptr, workspace_ptr, b_ptr)
        return run

