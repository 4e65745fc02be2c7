"""A timeline of a training step: every layer on the compute track, every copy on the offload
and prefetch tracks, and device memory at each layer boundary.

    ex = Executor(net, batch, trace=True)
    ex.train_step(x, y, opt)
    ex.tracer.write_chrome_trace("step.json")   # open in https://ui.perfetto.dev
    ex.tracer.plot_memory("memory.png")         # device memory over the step, vDNN style

Times: on the GPU each span is a pair of CUDA timing events recorded on its stream and read
(`cupy.cuda.get_elapsed_time`) only when the trace is written, so tracing never synchronizes
the step; on the CPU, `time.perf_counter()`. All times are relative to the first mark.
The executor holds no tracer unless asked (trace=True), so tracing costs nothing otherwise.

A layer call's span on the GPU starts when the device reaches it. Where the host issues a
call more slowly than the device runs it (passes of a few images), the device waits for the
host inside the span, and the span measures the host. A *held* trace (`hold=True`,
`minidnn train --trace-held`) keeps the compute stream busy before each call
(kernels/cuda_hold.py) while the host issues the call behind the hold, as the planner's
profile does: each span is then the device's time for the call, the step itself slower by
the holds. A call's hold is a few times what the host took to issue the same call in an
earlier pass, at least MIN_HOLD_S and at most MAX_HOLD_S; a call not issued before (the
traced step's first pass: only the last step is traced) holds MAX_HOLD_S. A call in
which the host waits for the device (the arena's pressure rule waits for a copy, and the
holds are device time too) takes longer to issue the more the device holds, so a hold learnt
from every call, unbounded, grew without end. A call whose issue outlasted its hold is marked
(`held: false`).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from .memory.observer import StepObserver

TRACKS = ("compute", "offload", "prefetch", "allreduce")
# A held trace's hold before a call: HOLD_MARGIN times the host's time to issue the same call
# in an earlier pass, within [MIN_HOLD_S, MAX_HOLD_S]; MAX_HOLD_S for a call not issued before
# (see the module docstring).
MIN_HOLD_S = 0.5e-3
MAX_HOLD_S = 5e-3
HOLD_MARGIN = 3.0


def hold_seconds(issued_s: float | None) -> float:
    """The hold before a call the host took `issued_s` to issue in an earlier pass (None: not
    issued before, so the longest hold)."""
    if issued_s is None:
        return MAX_HOLD_S
    return min(MAX_HOLD_S, max(MIN_HOLD_S, HOLD_MARGIN * issued_s))


def step_label(step: int) -> int:
    """The step as people count it: the executor's `step` is the number of steps done before
    it (0 for the first), a 20-step run's last step is step 20."""
    return int(step) + 1


@dataclass
class Span:
    """One interval on one track. start_us/dur_us are filled when the trace is resolved."""
    track: str
    name: str
    category: str            # 'forward' | 'backward' | 'offload' | 'prefetch'
    step: int                # the executor's step: steps done before it (step_label: 1-based)
    start: object            # marker: perf_counter seconds (CPU) or a CUDA event (GPU)
    end: object
    args: dict
    start_us: float = 0.0
    dur_us: float = 0.0


@dataclass
class Sample:
    """Memory at one layer boundary. `when` is 'start' (buffers in place) or 'end' (after frees)."""
    step: int
    at: object
    phase: str
    layer: str
    when: str
    device_bytes: int
    feature_map_bytes: int
    ts_us: float = 0.0


class Tracer(StepObserver):
    """Records spans and memory samples of the steps it is given (see module docstring).

    max_steps: keep only the last N steps (None: all). budget: the device memory budget in
    bytes, drawn as a line on the memory plot (None: no line). hold: hold the compute stream
    before each layer call, so that its span is the device's time (GPU only; see above).
    """

    def __init__(self, device, max_steps: int | None = None, budget: int | None = None,
                 hold: bool = False):
        if hold and not device.is_gpu:
            raise ValueError("a held trace holds a GPU stream; the CPU has none")
        self.device = device
        self.max_steps = max_steps
        self.budget = budget
        self.hold = hold
        self.issue_s: dict = {}      # a held trace: (phase, layer) -> host seconds to issue it
        self._issue = None           # (host clock, hold seconds) of the call being issued
        self.spans: list[Span] = []
        self.samples: list[Sample] = []
        self.step = -1
        self._origin = None
        self._unresolved = 0

    # ---- recording ------------------------------------------------------------------------------
    def mark(self, stream):
        """A point in time on `stream` (a recorded timing event on GPU, a clock reading on CPU)."""
        if self.device.is_gpu:
            event = self.device.timing_event()
            event.record(stream)
            marker = event
        else:
            marker = time.perf_counter()
        if self._origin is None:
            self._origin = marker
        return marker

    def begin_layer(self, stream, phase: str, name: str, index: int):
        if self.hold:
            from .kernels import cuda_hold
            seconds = hold_seconds(self.issue_s.get((phase, name)))
            with stream:
                cuda_hold.hold(seconds)
            self._issue = (time.perf_counter(), seconds)
        return self.mark(stream)

    def begin_step(self, step: int) -> None:
        self.step = int(step)
        if self.max_steps is not None:
            first = self.step - self.max_steps + 1
            self.spans = [s for s in self.spans if s.step >= first]
            self.samples = [s for s in self.samples if s.step >= first]
        if self.device.is_gpu and self._unresolved > 20000:
            self._resolve()  # bound the number of live CUDA events on long traced runs

    def layer(self, phase: str, name: str, index: int, start, end) -> None:
        """A layer's forward or backward on the compute track."""
        args = {"layer": name, "index": index}
        if self._issue is not None:
            issue_s = time.perf_counter() - self._issue[0]
            self.issue_s[(phase, name)] = issue_s
            args["held"] = issue_s < self._issue[1]
            self._issue = None
        self._add(Span("compute", f"{phase} {name}", phase, self.step, start, end, args))

    @property
    def unheld_calls(self) -> int:
        """A held trace's calls (of the steps kept) whose issue outlasted their hold."""
        return sum(s.args.get("held") is False for s in self.spans)

    def copy(self, track: str, name: str, start, end, nbytes: int) -> None:
        """A copy on the offload or prefetch track (or a bucket's all-reduce on its own)."""
        self._add(Span(track, name, track, self.step, start, end, {"bytes": int(nbytes)}))

    def memory(self, at, phase: str, layer: str, when: str, device_bytes: int,
               feature_map_bytes: int) -> None:
        self.samples.append(Sample(self.step, at, phase, layer, when, int(device_bytes),
                                   int(feature_map_bytes)))
        self._unresolved += 1

    def _add(self, span: Span) -> None:
        self.spans.append(span)
        self._unresolved += 2

    def clear(self) -> None:
        self.spans, self.samples = [], []
        self._origin, self._unresolved = None, 0

    # ---- resolving ------------------------------------------------------------------------------
    def _us(self, marker) -> float:
        if isinstance(marker, float):
            return (marker - self._origin) * 1e6
        from cupy.cuda import get_elapsed_time
        return get_elapsed_time(self._origin, marker) * 1e3

    def _resolve(self) -> None:
        """Turn markers into microseconds (GPU: waits for the recorded events once)."""
        if not self._unresolved:
            return
        if self.device.is_gpu:
            self.device.synchronize()
        for s in self.spans:
            if s.start is not None:
                s.start_us = self._us(s.start)
                s.dur_us = max(self._us(s.end) - s.start_us, 0.0)
                s.start = s.end = None  # frees the CUDA events
        for m in self.samples:
            if m.at is not None:
                m.ts_us = self._us(m.at)
                m.at = None
        self._unresolved = 0

    def resolved_spans(self) -> list[Span]:
        self._resolve()
        return list(self.spans)

    def resolved_samples(self) -> list[Sample]:
        self._resolve()
        return list(self.samples)

    def steps(self) -> list[int]:
        return sorted({s.step for s in self.spans} | {m.step for m in self.samples})

    # ---- output -------------------------------------------------------------------------------
    def timeline(self, step: int | None = None) -> dict:
        """One traced step (default: the last) as minidnn/planner/timeline.py draws it, the
        measured twin of the step model's: {'step_time_s', 'compute_s', 'calls': [{'phase',
        'layer', 'start', 'end', 'stall'}], 'copies': [{'stream', 'name', 'start', 'end'}]},
        seconds from the step's first compute call; a call's stall is the compute stream's
        idle time since the call before it."""
        spans = self.resolved_spans()
        if not spans:
            raise ValueError("timeline: nothing traced yet (run a step with trace=True)")
        step = spans[-1].step if step is None else step
        spans = sorted((s for s in spans if s.step == step), key=lambda s: s.start_us)
        compute = [s for s in spans if s.track == "compute"]
        if not compute:
            raise ValueError(f"timeline: step {step} was not traced (traced: {self.steps()})")
        t0 = compute[0].start_us
        calls, last_end = [], t0
        for s in compute:
            start = (s.start_us - t0) / 1e6
            calls.append({"phase": s.category, "layer": s.args["layer"], "start": start,
                          "end": start + s.dur_us / 1e6,
                          "stall": max(s.start_us - last_end, 0.0) / 1e6})
            last_end = max(last_end, s.start_us + s.dur_us)
        copies = [{"stream": s.track, "name": s.name, "start": (s.start_us - t0) / 1e6,
                   "end": (s.start_us + s.dur_us - t0) / 1e6}
                  for s in spans if s.track != "compute"]
        end = max([c["end"] for c in calls] + [c["end"] for c in copies])
        return {"step_time_s": end, "compute_s": sum(c["end"] - c["start"] for c in calls),
                "calls": calls, "copies": copies}

    def chrome_trace(self) -> dict:
        """The trace as a Chrome trace-event object (`traceEvents`, times in microseconds)."""
        spans, samples = self.resolved_spans(), self.resolved_samples()
        pid = 0
        events = [{"name": "process_name", "ph": "M", "pid": pid,
                   "args": {"name": f"minidnn on {getattr(self.device, 'name', self.device.kind)}"}}]
        # The memory manager's three streams always; the all-reduce when data parallel used it.
        tracks = [t for t in TRACKS if t in TRACKS[:3] or any(s.track == t for s in spans)]
        for tid, track in enumerate(tracks, start=1):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": f"{track} stream"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
        tids = {track: tid for tid, track in enumerate(tracks, start=1)}
        for s in spans:
            events.append({"name": s.name, "cat": s.category, "ph": "X", "pid": pid,
                           "tid": tids[s.track], "ts": round(s.start_us, 3),
                           "dur": round(s.dur_us, 3),
                           "args": dict(s.args, step=step_label(s.step))})
        for m in samples:
            events.append({"name": "device memory", "ph": "C", "pid": pid,
                           "ts": round(m.ts_us, 3),
                           "args": {"in use": m.device_bytes, "feature maps": m.feature_map_bytes}})
        trace = {"traceEvents": events, "displayTimeUnit": "ms"}
        if self.hold:   # each span is the device's time for its call (see the module docstring)
            trace["otherData"] = {"held": True, "unheld_calls": self.unheld_calls}
        return trace

    def write_chrome_trace(self, path) -> None:
        """Write the Chrome trace JSON (opens in Perfetto or chrome://tracing)."""
        with open(path, "w") as f:
            json.dump(self.chrome_trace(), f)

    def plot_memory(self, path, step: int | None = None, x: str = "time") -> None:
        """PNG of device memory over one step (default: the last traced), layer boundaries marked.

        x: 'time' (milliseconds since the step began) or 'call' (one unit per layer call, as in
        vDNN's per-layer figures). Two panels, each on its own scale: everything in the device
        allocator (parameters, gradients, workspaces, feature maps) and the feature maps alone;
        forward is shaded blue, backward orange; the budget, when the tracer knows it, is a
        dashed line. Layers are named where their names do not
        overlap (a label is left out when it is closer than 1/60 of the axis to the last one).
        """
        if x not in ("time", "call"):
            raise ValueError(f"plot_memory: x must be 'time' or 'call', got {x!r}")
        samples = self.resolved_samples()
        if not samples:
            raise ValueError("plot_memory: nothing traced yet (run a step with trace=True)")
        step = samples[-1].step if step is None else step
        samples = [m for m in samples if m.step == step]
        if not samples:
            raise ValueError(f"plot_memory: step {step} was not traced (traced: {self.steps()})")

        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t0 = samples[0].ts_us
        xs, calls, call = [], [], 0
        for m in samples:
            if m.when == "start" and xs:
                call += 1
            calls.append(call + (0.9 if m.when == "end" else 0.0))
            xs.append((m.ts_us - t0) / 1e3)
        if x == "call":
            xs = calls
        def unit_of(top):
            return next((u, b) for u, b in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10),
                                            ("bytes", 1)) if max(top, 1) >= b)
        # Two panels, each on its own scale: feature maps are often small beside parameters.
        fig, axes = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
        curves = (("device_bytes", "k", "device memory in use (all: parameters, gradients, "
                   "workspaces, feature maps)"),
                  ("feature_map_bytes", "tab:red", "feature maps, aux and gradient maps"))
        for ax, (field, colour, label) in zip(axes, curves):
            values = [getattr(m, field) for m in samples]
            top = max(values + ([self.budget] if field == "device_bytes" and self.budget
                                else []))
            unit, scale = unit_of(top)
            for phase, shade in (("forward", "tab:blue"), ("backward", "tab:orange")):
                idx = [k for k, m in enumerate(samples) if m.phase == phase]
                if idx:
                    ax.axvspan(xs[idx[0]], xs[idx[-1]], color=shade, alpha=0.08, lw=0,
                               label=phase)
            for k, m in enumerate(samples):
                if m.when == "start":
                    ax.axvline(xs[k], color="0.85", lw=0.5, zorder=0)
            ax.step(xs, [v / scale for v in values], where="post", color=colour, lw=1.3,
                    label=label)
            if field == "device_bytes" and self.budget:
                ax.axhline(self.budget / scale, color="k", ls="--", lw=1,
                           label=f"memory budget ({self.budget / scale:.2f} {unit})")
            ax.set_ylabel(unit)
            ax.set_ylim(bottom=0)
            ax.legend(loc="upper right", fontsize=8)
        ax = axes[-1]
        starts, gap = [], (xs[-1] - xs[0]) / 60 if len(xs) > 1 else 0
        for k, m in enumerate(samples):
            if m.when == "start" and (not starts or xs[k] - xs[starts[-1]] >= gap):
                starts.append(k)
        if starts:
            ax.set_xticks([xs[k] for k in starts])
            ax.set_xticklabels([samples[k].layer for k in starts], rotation=90, fontsize=6)
            ax.set_xlabel("layer call" + (" (time →)" if x == "time" else ""))
        else:
            ax.set_xlabel("time (ms)" if x == "time" else "layer call")
        axes[0].set_title(f"device memory over step {step_label(step)} (of the steps traced)")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
