"""Would minidnn's convolutions be faster if it measured more cuDNN plans?

minidnn (kernels/cudnn_conv.py) builds one cuDNN frontend graph per convolution problem with
heuristics A and FALLBACK, leaves out plans whose kernels are compiled at run time (NVRTC), and
times only the first MEASURED_PLANS (10) candidates in rank order. This probe:

1. builds the network and runs two plain training steps as `minidnn train` would (no memory
   budget, the GPU's default layout), counting during the second step how often each
   ConvProblem runs and which plan minidnn chose for it;
2. for each problem, most expensive first (chosen time x count), on fresh operands of the
   problem's shapes, strides and dtype, times with CUDA events (a timed first run, a warm-up,
   then --reps back-to-back runs, median): the chosen plan (the baseline), then
   a. every precompiled candidate the cache left unmeasured (ranked past 10, or that failed
      to run in training), in rank order, until they have cost --problem-limit seconds; a
      plan whose first run is over 3x the best so far (and over 20 ms) is not repeated;
   b. the first --runtime-top runtime-compiled plans of a second graph of the problem
      (heuristics --runtime-modes, default A; runtime compilation allowed), told apart by
      their RUNTIME_COMPILATION behaviour note, each built when reached (~1 s of NVRTC);
3. prints a Markdown table (one row a problem) and the totals of one step, and with --json
   writes everything. --time-limit bounds the whole run, setup included: what is not reached
   is marked not measured. (A plan already started cannot be cut: fallback plans of large
   weight gradients have run 5-22 s, so give the shell's timeout a minute of headroom.)

    python3 benchmarks/runs/wave23/conv_plans.py --model resnet50 --batch 256 \\
        --precision fp32 --math tf32 --time-limit 240 --json OUT.json
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import signal
import statistics
import sys
import time
from collections import Counter

SLOW_FACTOR, SLOW_MS = 3.0, 20.0   # a first run over both is not repeated (shorter may be loading)
MARGIN_S = 3.0                     # stop starting measurements this close to the time limit
MiB = 2 ** 20


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:120] if text else type(exc).__name__


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--math", choices=("tf32", "fp32"), default="tf32")
    p.add_argument("--time-limit", type=float, default=240.0, help="seconds for the whole probe")
    p.add_argument("--problem-limit", type=float, default=15.0,
                   help="seconds of unmeasured precompiled plans per problem (and of runtime ones)")
    p.add_argument("--runtime-top", type=int, default=3, help="runtime-compiled plans per problem")
    p.add_argument("--runtime-modes", default="A",
                   help="heuristics of the runtime-compiled graph, e.g. A,B,FALLBACK (default A)")
    p.add_argument("--reps", type=int, default=5, help="timed back-to-back runs per plan")
    p.add_argument("--retime-measured", action="store_true",
                   help="also re-time the plans the cache measured (ranks 1-10)")
    p.add_argument("--json", help="write every measurement here")
    return p.parse_args(argv)


def count_problems(args):
    """Two plain training steps; {problem: {"entry", "count", "plans"}} of the second, and facts."""
    import cupy as cp
    from minidnn import SGD, models
    from minidnn.decide import build_executor
    from minidnn.kernels import cuda
    from minidnn.kernels.cudnn_conv import ConvProblem, split_by_group
    size = models.native_image_size(args.model)
    net = models.build(args.model, num_classes=1000, image_size=size)
    ex = build_executor(net, args.batch, device="gpu", seed=0, math=args.math,
                        deterministic=False, precision=args.precision)
    opt = SGD(ex.parameters(), lr=0.01, momentum=0.9, allocator=ex.allocator)
    with ex.device.compute:
        rng = cp.random.default_rng(0)
        x = rng.standard_normal((args.batch, 3, size, size), dtype=cp.float32)
        labels = rng.integers(0, 1000, args.batch).astype(cp.int64)
    t0 = time.perf_counter()
    ex.train_step(x, labels, opt)
    ex.device.synchronize()
    log(f"step 1 (graphs built, plans measured): {time.perf_counter() - t0:.1f} s, "
        f"conv cache {cuda.conv_cache_stats()}")
    cache, counts, unknown = cuda._cache(), {}, Counter()
    original, depth = cuda._conv, [0]

    def note(op, x, w, y, spec, plan_index):
        mode = (cuda._state["math"], cuda._state["deterministic"])
        entry, calls = cache.lookup(ConvProblem.of(op, x, w, y, spec, *mode)), 1
        if entry is None and spec.groups > 1:     # run group by group (cuda._entry_and_parts)
            part = split_by_group(x, w, y, spec.groups)[0]
            entry = cache.lookup(ConvProblem.of(op, *part, spec, *mode, groups=1))
            calls = spec.groups
        if entry is None:
            unknown[op] += 1
            return
        index = plan_index if plan_index is not None else \
            entry.plan_for(spec.algo, workspace_limit=spec.workspace_limit).index
        rec = counts.setdefault(entry.problem, {"entry": entry, "count": 0, "plans": Counter()})
        rec["count"] += calls
        rec["plans"][index] += calls

    # Steady calls skip ConvPlanCache.get (cuda._ready), so observe cuda._conv itself: the
    # conv2d_* functions look it up in the module at each call.
    def counting(op, x, w, y, spec, plan_index=None, workspace=None, b=None):
        depth[0] += 1      # _conv calls itself once on the legacy stream: count the outer call
        try:
            original(op, x, w, y, spec, plan_index, workspace, b)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            note(op, x, w, y, spec, plan_index)

    cuda._conv = counting
    try:
        t0 = time.perf_counter()
        ex.train_step(x, labels, opt)
        ex.device.synchronize()
        step_ms = (time.perf_counter() - t0) * 1e3
    finally:
        cuda._conv = original
    facts = {"step2_ms_wall": step_ms, "layout": ex.maps.layout, "unmatched_calls": dict(unknown),
             "workspace_fallbacks": len(cuda.workspace_fallbacks), "cache": cuda.conv_cache_stats()}
    log(f"step 2 (counted): {step_ms:.1f} ms, {len(counts)} problems, "
        f"{sum(r['count'] for r in counts.values())} convolution calls, layout {ex.maps.layout}")
    if cuda.workspace_fallbacks:
        log(f"note: {len(cuda.workspace_fallbacks)} convolutions ran a leaner plan than chosen")
    try:
        ex.close()         # give the arena back: the probe allocates from CuPy's own pool
    except Exception as exc:  # noqa: BLE001 - the counts are what matters
        log(f"note: closing the executor failed ({exc}); probing beside its arena")
    return counts, facts


def operand(cp, layout, dtype: str, rs):
    """A flat device buffer covering a (shape, strides) layout, small random values."""
    shape, strides = layout
    span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
    v = (rs.random_sample(span, dtype=cp.float32) - 0.5) * 0.2
    if dtype == "bfloat16":    # CuPy has no bf16: the upper halves of the float32 values
        return (v.view(cp.uint32) >> 16).astype(cp.uint16)
    return v.astype(dtype)


def runtime_graph(cudnn, problem, handle, modes):
    """CudnnConvGraph's graph of `problem` (heuristics `modes`: names of cudnn.heur_mode) with
    runtime-compiled plans allowed, no plan built; returns (graph, (x, w, y, b) tensors)."""
    from minidnn.kernels.cudnn_conv import deselected_notes
    dt = {"float32": cudnn.data_type.FLOAT, "float64": cudnn.data_type.DOUBLE,
          "bfloat16": cudnn.data_type.BFLOAT16}[problem.dtype]
    acc = cudnn.data_type.FLOAT if problem.dtype == "bfloat16" else dt
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=acc, compute_data_type=acc,
                      handle=handle)
    conv = dict(padding=list(problem.padding), stride=list(problem.stride),
                dilation=list(problem.dilation), compute_data_type=acc)

    def tensor(name, layout):
        return g.tensor(name=name, dim=list(layout[0]), stride=list(layout[1]), data_type=dt)

    b = None
    if problem.op in ("fprop", "fprop_bias_relu"):
        x, w = tensor("x", problem.x), tensor("w", problem.w)
        y = out = g.conv_fprop(image=x, weight=w, **conv)
        if problem.op == "fprop_bias_relu":
            o = problem.w[0][0]
            b = g.tensor(name="b", dim=[1, o, 1, 1], stride=[o, 1, o, o], data_type=dt)
            y = out = g.relu(input=g.bias(input=y, bias=b))
        layout = problem.y
    elif problem.op == "dgrad":
        y, w = tensor("dy", problem.y), tensor("w", problem.w)
        x = out = g.conv_dgrad(loss=y, filter=w, **conv)
        layout = problem.x
    else:
        x, y = tensor("x", problem.x), tensor("dy", problem.y)
        w = out = g.conv_wgrad(image=x, loss=y, **conv)
        layout = problem.w
    out.set_output(True).set_dim(list(layout[0])).set_stride(list(layout[1])).set_data_type(dt)
    g.validate()
    g.build_operation_graph()
    g.deselect_numeric_notes([getattr(cudnn.numerical_note, n) for n in deselected_notes(
        problem.math, problem.deterministic, problem.dtype)])
    g.create_execution_plans([getattr(cudnn.heur_mode, m.strip().upper()) for m in modes])
    return g, (x, w, y, b)


class Probe:
    """Times plans of one problem at a time on one stream, within the run's deadlines."""

    def __init__(self, args, deadline):
        import cupy as cp
        from minidnn.kernels import cuda
        from minidnn.kernels.cudnn_conv import load_cudnn
        self.cp, self.args, self.deadline = cp, args, deadline
        self.cudnn, self.handle = load_cudnn(), cuda._handle()
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.cudnn.set_stream(handle=self.handle, stream=self.stream.ptr)
        self.errors = (RuntimeError, self.cudnn.cudnnGraphNotSupportedError)
        self.ws = None
        self.notes_said = False

    def workspace(self, nbytes: int):
        """Pointer to a block of at least nbytes (0 for none); None when it cannot be had."""
        if nbytes and (self.ws is None or self.ws.nbytes < nbytes):
            self.ws = None
            try:
                self.ws = self.cp.empty(nbytes, dtype=self.cp.uint8)
            except MemoryError:
                return None
        return self.ws.data.ptr if nbytes else 0

    def timed(self, run, best_ms: float):
        """(ms, runs): one timed first run; unless it was slow, a warm-up and the median of
        --reps back-to-back runs between CUDA events."""
        cp, s = self.cp, self.stream
        ev = [cp.cuda.Event() for _ in range(self.args.reps + 1)]
        ev[0].record(s)
        run()
        ev[1].record(s)
        ev[1].synchronize()
        first = cp.cuda.get_elapsed_time(ev[0], ev[1])
        if first > SLOW_MS and first > SLOW_FACTOR * best_ms:
            return first, 1
        run()
        ev[0].record(s)
        for k in range(self.args.reps):
            run()
            ev[k + 1].record(s)
        ev[-1].synchronize()
        return statistics.median(cp.cuda.get_elapsed_time(ev[k], ev[k + 1])
                                 for k in range(self.args.reps)), self.args.reps + 2

    def measure(self, row, run, best_ms):
        """Fill row's ms/runs/status by timing run(ptr) on a workspace of row's size."""
        ptr = self.workspace(row["workspace"])
        if ptr is None:
            row["status"] = "workspace could not be allocated"
            log(f"    plan {row['index']}: {row['workspace'] / MiB:.0f} MiB of workspace "
                f"could not be allocated")
            return best_ms
        t0 = time.monotonic()
        try:
            row["ms"], row["runs"] = self.timed(lambda: run(ptr), best_ms)
            row["status"] = "measured"
        except self.errors as exc:
            row["status"] = f"failed: {first_line(exc)}"
            return best_ms
        if time.monotonic() - t0 > 1.0:
            log(f"    plan {row['index']} ({row['name']}): {row['ms']:.2f} ms, {row['runs']} runs, "
                f"{time.monotonic() - t0:.1f} s")
        return min(best_ms, row["ms"])

    def stop(self, since=None) -> str | None:
        """Why no further plan may start now, or None."""
        now = time.monotonic()
        if now > self.deadline - MARGIN_S:
            return "not measured (time limit)"
        if since is not None and now - since > self.args.problem_limit:
            return "not measured (problem limit)"
        return None

    def problem(self, rec):
        entry, cp = rec["entry"], self.cp
        p, graph = entry.problem, entry.graph
        rs = cp.random.RandomState(0)
        with self.stream:
            x, w, y = (operand(cp, lay, p.dtype, rs) for lay in (p.x, p.w, p.y))
            b = operand(cp, ((p.w[0][0],), (1,)), p.dtype, rs) \
                if p.op == "fprop_bias_relu" else None
            ptrs = (x.data.ptr, w.data.ptr, y.data.ptr)
            b_ptr = 0 if b is None else b.data.ptr
            names = {i: name for i, _, name in graph.candidates}
            chosen = rec["plan"]
            rows = [dict(rank=r + 1, index=t.index, name=names.get(t.index, "?"),
                         workspace=t.workspace_bytes,
                         cache_ms=t.time_ms if math.isfinite(t.time_ms) else None, ms=None,
                         runs=0, status="not timed here",
                         phase="chosen" if t.index == chosen else "extra" if not math.isfinite(
                             t.time_ms) else "measured")
                    for r, t in enumerate(entry.table)]
            rec["precompiled"] = rows
            rec["declined"] = len(graph.declined)   # offered, but not built by minidnn's graph
            phases = ("chosen", "measured", "extra") if self.args.retime_measured else \
                ("chosen", "extra")
            todo = [r for ph in phases for r in rows if r["phase"] == ph]
            most = max(r["workspace"] for r in todo)   # the largest, once, if it fits
            if self.workspace(most) is None:
                log(f"    note: {most / MiB:.0f} MiB of workspace could not be allocated; "
                    f"each plan asks for its own")
            best, start = math.inf, None
            for row in todo:
                why = self.stop(start)
                if why:
                    row["status"] = why
                    continue
                if row["phase"] == "extra" and start is None:
                    start = time.monotonic()         # the per-problem limit counts extras only
                # minidnn's own steady-state call of the plan (CudnnConvGraph.runner)
                run = graph.runner(row["index"])
                best = self.measure(row, lambda ws, run=run: run(*ptrs, ws, b_ptr), best)
            if self.args.runtime_top > 0 and not self.stop():
                try:      # a failure here keeps the precompiled results
                    self.runtime_plans(rec, best, set(names.values()), (x, w, y, b))
                except Exception as exc:  # noqa: BLE001
                    rec["runtime_error"] = f"{type(exc).__name__}: {first_line(exc)}"
                    log(f"    runtime-compiled plans: {rec['runtime_error']}")

    def runtime_plans(self, rec, best, precompiled_names, arrays):
        p = rec["entry"].problem
        rec["runtime"] = []
        g, tensors = runtime_graph(self.cudnn, p, self.handle, self.args.runtime_modes.split(","))
        pack = {t: a.data.ptr for t, a in zip(tensors, arrays) if t is not None}
        rt_note = getattr(getattr(self.cudnn, "behavior_note", None), "RUNTIME_COMPILATION", None)
        scan = rec["runtime_scan"] = dict(offered=g.get_execution_plan_count(), scanned=0,
                                          by_note=0, by_name=0, new_names_unnoted=0)
        start, built = time.monotonic(), 0
        for i in range(scan["offered"]):
            if built >= self.args.runtime_top or self.stop(start):
                break
            name = g.get_plan_name_at_index(i)
            new = name not in precompiled_names
            scan["scanned"] += 1
            try:     # the backend's notes say it; else: a name not among the precompiled plans
                notes = g.get_behavior_notes_for_plan_at_index(i)
                compiled = any(n == rt_note or str(n).endswith("RUNTIME_COMPILATION")
                               for n in notes)
                scan["by_note"] += compiled
                scan["new_names_unnoted"] += new and not compiled
            except Exception as exc:  # noqa: BLE001 - any failure of the query: by name
                if not self.notes_said:
                    log(f"note: behaviour notes unavailable ({type(exc).__name__}: {exc}); "
                        f"telling runtime-compiled plans by name")
                    self.notes_said = True
                compiled = new
                scan["by_name"] += compiled
            if not compiled:
                continue
            t0 = time.monotonic()
            try:
                g.build_plan_at_index(i)
                ws = int(g.get_workspace_size_plan_at_index(i))
            except self.errors as exc:   # e.g. barred by the math mode's numeric notes
                rec["runtime"].append(dict(index=i, name=name, status=f"not built: "
                                           f"{first_line(exc)}"))
                continue
            built += 1
            row = dict(index=i, name=name, workspace=ws, build_s=time.monotonic() - t0, ms=None,
                       runs=0, status="")
            rec["runtime"].append(row)
            log(f"    runtime plan {i} ({name}) built in {row['build_s']:.1f} s")
            best = self.measure(row, lambda ptr, i=i: g.execute_plan_at_index(
                pack, workspace=ptr, index=i, handle=self.handle), best)


def best_of(rows):
    done = [r for r in rows if r.get("ms") is not None]
    return min(done, key=lambda r: r["ms"]) if done else None


def summarize(recs):
    """Per problem: baseline, best precompiled, best overall (ms); and the step's totals."""
    tot = dict(chosen=0.0, precompiled=0.0, overall=0.0, cache_chosen=0.0)
    for rec in recs:
        chosen = next((r for r in rec.get("precompiled", []) if r["phase"] == "chosen"), None)
        base = chosen["ms"] if chosen and chosen["ms"] is not None else rec["cache_ms"]
        pre, rt = best_of(rec.get("precompiled", [])), best_of(rec.get("runtime", []))
        rec["chosen_ms"], rec["best_pre"], rec["best_rt"] = base, pre, rt
        rec["pre_ms"] = min(base, pre["ms"]) if pre else base
        rec["all_ms"] = min(rec["pre_ms"], rt["ms"]) if rt else rec["pre_ms"]
        rec["saving_ms"] = (base - rec["all_ms"]) * rec["count"]
        n = rec["count"]
        for k, v in (("chosen", base), ("precompiled", rec["pre_ms"]), ("overall", rec["all_ms"]),
                     ("cache_chosen", rec["cache_ms"])):
            tot[k] += n * v
    return tot


def shapes(p) -> str:
    dims = lambda lay: "x".join(str(d) for d in lay[0])  # noqa: E731
    nhwc = " nhwc" if p.x[1][1] == 1 and p.x[0][1] > 1 else ""
    s = "" if set(p.stride) == {1} else f" /{p.stride[0]}"
    return f"{dims(p.x)} w{dims(p.w)}{s} {p.dtype}{nhwc}"


def ws(b: int) -> str:
    return f"{b / MiB:.0f} MiB" if b >= MiB else f"{b / 1024:.0f} KiB" if b >= 1024 else str(b)


def report(recs, tot, facts, args):
    print(f"\n## {args.model} batch {args.batch}, precision {args.precision}, math {args.math}: "
          f"{facts.get('gpu', '?')}, cuDNN {facts.get('cudnn', '?')}, layout {facts['layout']}\n")
    print("| # | op | x, w | n/step | chosen ms (ws) | best precompiled ms (rank, ws) | "
          "best runtime-compiled ms (ws, build s) | saving x n ms | extras timed |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k, rec in enumerate(recs, 1):
        p, pre, rt = rec["entry"].problem, rec["best_pre"], rec["best_rt"]
        rows = rec.get("precompiled", [])
        extras = [r for r in rows if r["phase"] == "extra"]
        timed = sum(r["status"] == "measured" for r in extras)
        ch = next((r for r in rows if r["phase"] == "chosen"), None)
        chosen = f"{rec['chosen_ms']:.3f} ({ws(rec['ws'])})" + ("" if ch and ch["ms"] is not None
                                                                else " cache")
        pre_s = f"{pre['ms']:.3f} (#{pre['rank']}, {ws(pre['workspace'])})" if pre else "-"
        rt_s = f"{rt['ms']:.3f} ({ws(rt['workspace'])}, {rt['build_s']:.1f})" if rt else \
            "none built" if rec.get("runtime") is not None else "not measured"
        built = sum("build_s" in r for r in rec.get("runtime") or [])
        state = "; ".join(filter(None, (f"{timed}/{len(extras)}, rt {built}" if rows else "",
                                        rec.get("error"), rec.get("runtime_error"))))
        print(f"| {k} | {p.op} | {shapes(p)} | {rec['count']} | {chosen} | {pre_s} | {rt_s} | "
              f"{rec['saving_ms']:.2f} | {state} |")
    c = tot["chosen"]
    gain = lambda v: f"{c - v:.1f} ms, {100 * (1 - v / c):.1f}%" if c else "-"  # noqa: E731
    print(f"\nPer step (sum of count x time over {len(recs)} problems): chosen {c:.1f} ms "
          f"(cache's own times: {tot['cache_chosen']:.1f} ms); best precompiled "
          f"{tot['precompiled']:.1f} ms (gain {gain(tot['precompiled'])}); best overall "
          f"{tot['overall']:.1f} ms (gain {gain(tot['overall'])}). Step 2 took "
          f"{facts['step2_ms_wall']:.0f} ms wall (plain, counting).")


def to_json(recs, tot, facts, args) -> dict:
    """Everything, JSON-safe: NaN and infinities become null."""
    out = []
    for rec in recs:
        p = rec["entry"].problem
        keep = {k: v for k, v in rec.items() if k not in ("entry", "plans")}
        keep.update(problem=p.describe(), op=p.op, x=p.x, w=p.w, y=p.y, dtype=p.dtype,
                    plans_used=dict(rec["plans"]))
        out.append(keep)
    text = json.dumps(dict(args=vars(args), facts=facts, totals=tot, problems=out), default=str)
    return json.loads(text, parse_constant=lambda _: None)


def _interrupt(*_):
    raise KeyboardInterrupt     # SIGTERM (a shell's timeout): report what was measured


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    deadline = t_start + args.time_limit
    signal.signal(signal.SIGTERM, _interrupt)
    import cupy as cp
    counts, facts = count_problems(args)
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    recs = []
    for rec in counts.values():
        plan = rec["plans"].most_common(1)[0][0]
        t = next(t for t in rec["entry"].table if t.index == plan)
        recs.append(dict(rec, plan=plan, ws=t.workspace_bytes, cache_ms=t.time_ms))
    recs.sort(key=lambda r: -r["cache_ms"] * r["count"])   # the limit cuts the least important
    probe = Probe(args, deadline)
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    facts["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
    try:
        facts["cudnn"] = str(probe.cudnn.backend_version())
    except Exception:  # noqa: BLE001 - only a label
        facts["cudnn"] = "?"
    log(f"setup took {time.monotonic() - t_start:.0f} s; probing {len(recs)} problems")
    try:
        for k, rec in enumerate(recs, 1):
            if probe.stop():
                rec["error"] = "not measured (time limit)"
                continue
            p = rec["entry"].problem
            log(f"[{k}/{len(recs)}] {p.op} {shapes(p)} x{rec['count']}: chosen plan {rec['plan']} "
                f"{rec['cache_ms']:.3f} ms in cache, {len(rec['entry'].table)} candidates "
                f"({time.monotonic() - t_start:.0f} s)")
            try:
                probe.problem(rec)
            except Exception as exc:  # noqa: BLE001 - one problem's failure loses nothing else
                rec["error"] = f"{type(exc).__name__}: {first_line(exc)}"
                log(f"    failed: {rec['error']}")
            finally:
                probe.ws = None
                cp.get_default_memory_pool().free_all_blocks()
    except KeyboardInterrupt:
        log("interrupted: reporting what was measured")
        for rec in recs:
            if "precompiled" not in rec and not rec.get("error"):
                rec["error"] = "not measured (interrupted)"
    tot = summarize(recs)
    report(recs, tot, facts, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(recs, tot, facts, args), f, indent=1)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
