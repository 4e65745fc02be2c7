"""The tracer: Chrome trace JSON with the compute / offload / prefetch tracks and memory
counters, and the memory plot."""
import json

import numpy as np
import pytest

from minidnn import Network, SGD
from minidnn.backend import Device
from minidnn.layers import Conv2d, Flatten, Linear, MaxPool2d, ReLU
from minidnn.trace import Tracer
from minidnn.decide import build_executor


def net() -> Network:
    return Network.sequential((3, 8, 8), [
        Conv2d(4, 3, padding=1, name="conv1"), ReLU(name="relu1"), MaxPool2d(2, name="pool1"),
        Conv2d(6, 3, padding=1, name="conv2"), ReLU(name="relu2"), Flatten(name="flat"),
        Linear(5, name="fc")], num_classes=5)


def traced(policy="all", steps=2, **kw):
    ex = build_executor(net(), 2, device="cpu", policy=policy, trace=True, **kw)
    opt = SGD(ex.parameters(), lr=0.1, allocator=ex.allocator)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
        ex.train_step(x, rng.integers(0, 5, 2), opt)
    return ex


def test_chrome_trace_has_three_tracks_and_memory_counters(tmp_path):
    ex = traced("all", steps=2)
    path = tmp_path / "trace.json"
    ex.tracer.write_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["compute stream", "offload stream", "prefetch stream"]
    by_track = {name: [e for e in events if e["ph"] == "X" and e["tid"] == tid]
                for tid, name in threads.items()}
    n = ex.plan.num_nodes
    # Every layer's forward and backward, each step.
    assert len(by_track["compute stream"]) == 2 * n * 2
    assert {e["cat"] for e in by_track["compute stream"]} == {"forward", "backward"}
    # One offload and one prefetch per chosen storage per step, with their sizes.
    chosen = ex.decision.offload_bytes(ex.plan)
    for track in ("offload stream", "prefetch stream"):
        spans = by_track[track]
        assert len(spans) == 2 * len(ex.decision.offload)
        assert sum(e["args"]["bytes"] for e in spans if e["args"]["step"] == 1) == chosen
    for e in events:
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 2 * (2 * n) * 2       # start and end of every layer call
    assert all({"in use", "feature maps"} <= set(c["args"]) for c in counters)
    assert max(c["args"]["in use"] for c in counters) <= ex.memory_stats()["peak_device_bytes"]
    assert max(c["args"]["feature maps"] for c in counters) > 0


def test_compute_spans_follow_the_step_order():
    ex = traced("none", steps=1)
    spans = [s for s in ex.tracer.resolved_spans() if s.track == "compute"]
    names = [s.name for s in spans]
    order = [node.name for node in ex.plan.nodes]
    assert names == [f"forward {n}" for n in order] + [f"backward {n}" for n in reversed(order)]
    starts = [s.start_us for s in spans]
    assert starts == sorted(starts)


def test_copies_sit_inside_their_phase():
    ex = traced("all", steps=1)
    spans = ex.tracer.resolved_spans()
    compute = [s for s in spans if s.track == "compute"]
    forward_end = max(s.start_us + s.dur_us for s in compute if s.category == "forward")
    assert any(s.track == "offload" for s in spans) and any(s.track == "prefetch" for s in spans)
    for s in spans:
        if s.track == "offload":
            assert s.start_us <= forward_end
        if s.track == "prefetch":   # issued by backward, before the layer's kernels
            assert s.start_us >= forward_end


def test_plot_memory_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    ex = traced("all", steps=2)
    for x in ("time", "call"):
        path = tmp_path / f"memory_{x}.png"
        ex.tracer.plot_memory(path, x=x)
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    with pytest.raises(ValueError, match="not traced"):
        ex.tracer.plot_memory(tmp_path / "none.png", step=99)


def test_tracing_is_off_by_default():
    ex = build_executor(net(), 2, device="cpu", policy="all")
    assert ex.tracer is None and ex.manager.observer is None and ex.manager.mover.observer is None
    tracer = ex.enable_trace()
    assert ex.manager.mover.observer is tracer
    ex.enable_trace(False)
    assert ex.tracer is None and ex.manager.mover.observer is None


def test_max_steps_keeps_only_the_last_steps():
    ex = build_executor(net(), 2, device="cpu", policy="all")
    ex.enable_trace(max_steps=1)
    opt = SGD(ex.parameters(), lr=0.1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for _ in range(3):
        ex.train_step(x, rng.integers(0, 5, 2), opt)
    assert ex.tracer.steps() == [2]


def test_tracer_on_a_dry_run():
    ex = build_executor(net(), 2, device="cpu", policy="conv", compute=False, trace=True)
    ex.simulate_step()
    trace = ex.tracer.chrome_trace()
    cats = {e.get("cat") for e in trace["traceEvents"] if e["ph"] == "X"}
    assert cats == {"forward", "backward", "offload", "prefetch"}


def test_empty_tracer_cannot_plot(tmp_path):
    with pytest.raises(ValueError, match="nothing traced"):
        Tracer(Device("cpu")).plot_memory(tmp_path / "x.png")


def test_the_memory_plot_knows_the_budget(tmp_path, monkeypatch):
    ex = traced(memory_budget="4MiB")
    assert ex.tracer.budget == 4 * 2**20
    import matplotlib.axes
    lines = []
    real = matplotlib.axes.Axes.axhline
    monkeypatch.setattr(matplotlib.axes.Axes, "axhline",
                        lambda self, y=0, *a, **k: lines.append(y) or real(self, y, *a, **k))
    ex.tracer.plot_memory(tmp_path / "m.png")
    assert lines == [4.0] and (tmp_path / "m.png").stat().st_size > 0   # 4 MiB, in MiB
    assert traced().tracer.budget is None


class _GpuLike:
    """What a held Tracer asks of a GPU device, on the CPU: streams, and marks that are clock
    readings (the holds it issues are recorded, not run)."""
    is_gpu = True

    class _Event:
        def record(self, stream):
            pass

    def timing_event(self):
        return self._Event()


def test_a_held_trace_holds_each_call_by_its_own_issue_time_within_bounds(monkeypatch):
    """A call's hold is learnt from the same call in an earlier pass, within [MIN_HOLD_S,
    MAX_HOLD_S], and is MAX_HOLD_S the first time (only the last step is traced, so a step of
    one pass learns nothing before its calls): a call whose host waits (here 30 ms) marks
    itself unheld and holds at most MAX_HOLD_S the next time; the others the shortest hold (a
    hold learnt from the longest call of all fed back into the waits and grew without end)."""
    import contextlib
    import sys
    import types
    from minidnn import trace
    holds = []
    fake = types.SimpleNamespace(hold=holds.append)
    monkeypatch.setitem(sys.modules, "minidnn.kernels.cuda_hold", fake)
    monkeypatch.setattr("minidnn.kernels.cuda_hold", fake, raising=False)
    # The host's issue times from a clock the test moves, not the wall clock: on a loaded
    # machine a call without a wait took longer than the shortest hold allows.
    now = [0.0]
    monkeypatch.setattr(trace, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    tracer = Tracer(_GpuLike(), hold=True)
    tracer.begin_step(0)
    stream = contextlib.nullcontext()
    for _ in range(2):                       # two passes of three calls
        for name, wait in (("conv1", 0.0), ("bn1", 0.03), ("relu1", 0.0)):
            start = tracer.begin_layer(stream, "forward", name, 0)
            now[0] += wait
            tracer.layer("forward", name, 0, start, tracer.mark(stream))
    assert holds[:3] == [trace.MAX_HOLD_S] * 3
    assert holds[3] == holds[5] == trace.MIN_HOLD_S and holds[4] == trace.MAX_HOLD_S
    assert tracer.unheld_calls == 2
    held = [s.args["held"] for s in tracer.spans]
    assert held == [True, False, True, True, False, True]
    with pytest.raises(ValueError, match="the CPU has none"):
        Tracer(Device("cpu"), hold=True)
