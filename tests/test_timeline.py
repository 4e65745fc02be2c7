"""`minidnn plan --timeline / --bytes-chart`: the stream timeline and the per-layer bytes of a
planned step (planner/timeline.py), from the step-time model, on any machine."""
import pytest

from minidnn import models
from minidnn.cli import main
from minidnn.planner import StepModel, analytic_profile
from minidnn.planner.timeline import bytes_by_layer, stall_seconds, timeline_data
from minidnn.memory.policy import NoOffload, OffloadAll, relu_bits_for


def model_and_all(relu_bits=False, policy=OffloadAll):
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    bits = relu_bits_for(net) if relu_bits else frozenset()
    model = StepModel(net, 8, analytic_profile(net, 8, "k40", relu_bits=bits), relu_bits=bits)
    return model, model.evaluate(policy().decide(model.plan).offload)


def test_the_timeline_has_every_call_and_copy_of_one_step():
    model, ev = model_and_all()
    t = timeline_data(model, ev)
    n = len(model.nodes)
    assert [c["phase"] for c in t["calls"]].count("forward") == n
    assert [c["phase"] for c in t["calls"]].count("backward") == n
    offloads = [c for c in t["copies"] if c["stream"] == "offload"]
    prefetches = [c for c in t["copies"] if c["stream"] == "prefetch"]
    assert len(offloads) == len(ev.offload) and prefetches
    names = {model.plan.storages[sid].tensors[0] for sid in ev.offload}
    assert {c["name"] for c in offloads} == names
    last_forward = max(c["end"] for c in t["calls"] if c["phase"] == "forward")
    for c in t["copies"]:
        assert 0 <= c["start"] <= c["end"] <= t["step_time_s"] + 1e-12
    assert all(c["start"] < last_forward for c in offloads)       # offloads start in forward
    offloaded = {c["name"]: c["end"] for c in offloads}
    for c in prefetches:   # a map comes back only once its offload has finished
        assert c["start"] >= offloaded[c["name"]] - 1e-12
    # Compute busy plus idle before its calls is the whole span the calls cover.
    first = min(c["start"] - c["stall"] for c in t["calls"])
    covered = max(c["end"] for c in t["calls"]) - first
    busy = sum(c["end"] - c["start"] for c in t["calls"])
    assert stall_seconds(t) == pytest.approx(covered - busy, rel=1e-9, abs=1e-12)


def test_bytes_by_layer_splits_what_backward_reads():
    model, ev = model_and_all()
    rows = bytes_by_layer(model.plan, ev)
    assert [r["layer"] for r in rows] == ["data"] + [n.name for n in model.nodes]
    assert sum(r["offloaded"] for r in rows) == ev.offloaded_bytes
    assert sum(r["recomputed"] + r["encoded"] for r in rows) == 0
    model, ev = model_and_all(relu_bits=True, policy=NoOffload)
    encoded = [r for r in bytes_by_layer(model.plan, ev) if r["encoded"]]
    assert encoded and all(r["layer"].startswith("relu") for r in encoded)


def test_plan_draws_both_figures(tmp_path, capsys):
    timeline, chart = tmp_path / "t.png", tmp_path / "b.png"
    code = main(["plan", "--model", "tiny_cnn", "--image-size", "16", "--batch", "8",
                 "--num-classes", "10", "--policy", "all", "--gpu", "h200",
                 "--timeline", str(timeline), "--bytes-chart", str(chart)])
    capsys.readouterr()
    assert code == 0
    for path in (timeline, chart):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unwritable_figure_is_one_clear_line(tmp_path, capsys):
    code = main(["plan", "--model", "tiny_cnn", "--image-size", "16", "--batch", "8",
                 "--num-classes", "10", "--policy", "all", "--gpu", "h200",
                 "--timeline", str(tmp_path / "no" / "such" / "t.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("minidnn: error: --timeline")


def test_a_traced_step_gives_the_same_timeline(tmp_path):
    """The measured twin (Tracer.timeline, from --trace): every call and copy of one step."""
    import numpy as np

    from minidnn import SGD
    from minidnn.decide import build_executor
    from minidnn.planner.timeline import draw_timeline

    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    with build_executor(net, 4, device="cpu", policy="all", memory_budget="64MiB",
                        trace=True) as ex:
        opt = SGD(ex.parameters(), lr=0.01)
        x = np.random.default_rng(0).standard_normal((4, 3, 16, 16), dtype=np.float32)
        ex.train_step(x, np.arange(4) % 10, opt)
        t = ex.tracer.timeline()
        offloaded = len(ex.decision.offload)
    n = len(net.nodes)
    phases = [c["phase"] for c in t["calls"]]
    assert phases.count("forward") == n and phases.count("backward") == n
    assert len([c for c in t["copies"] if c["stream"] == "offload"]) == offloaded > 0
    assert t["calls"][0]["start"] == 0 and stall_seconds(t) >= 0
    assert t["compute_s"] <= t["step_time_s"]
    draw_timeline([{"title": "tiny_cnn, measured", "timeline": t}], tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"


def test_each_copy_takes_its_directions_latency_before_its_bytes():
    """A copy of a few KB takes microseconds on its stream where its bytes take a part of
    one (Profile.d2h_latency_s / h2d_latency_s): the timeline adds each direction's latency
    to every copy of that direction, and a step of many copies is predicted slower."""
    import dataclasses
    model, ev = model_and_all()
    prof = model.profile    # both directions at full speed at once: a copy's bytes take as long
    prof = dataclasses.replace(prof, duplex_bw=prof.d2h_bw + prof.h2d_bw)
    timelines = []
    for latency in ((0.0, 0.0), (3e-3, 5e-3)):
        m = StepModel(model.net, 8, dataclasses.replace(
            prof, d2h_latency_s=latency[0], h2d_latency_s=latency[1]))
        timelines.append(timeline_data(m, m.evaluate(ev.offload)))
    base, t = timelines
    for before, after in zip(base["copies"], t["copies"]):
        assert before["name"] == after["name"] and before["stream"] == after["stream"]
        latency = 3e-3 if after["stream"] == "offload" else 5e-3
        took = after["end"] - after["start"]
        assert took == pytest.approx(latency + before["end"] - before["start"], rel=1e-6)
    assert t["step_time_s"] > base["step_time_s"] + 5e-3


def test_a_stream_sees_another_streams_event_its_sync_latency_after_it():
    """An offload waits for the call that wrote its map, on another engine: it starts no
    sooner than sync_latency_s after that call ends (Profile.sync_latency_s), and the
    crossings make the step slower."""
    import dataclasses
    model, ev = model_and_all()
    steps = []
    for sync in (0.0, 2e-3):
        m = StepModel(model.net, 8, dataclasses.replace(model.profile, sync_latency_s=sync))
        t = timeline_data(m, m.evaluate(ev.offload))
        steps.append(t["step_time_s"])
    forward_end = {c["layer"]: c["end"] for c in t["calls"] if c["phase"] == "forward"}
    storages = [m.plan.storages[sid] for sid in ev.offload]
    writer = {s.tensors[0]: m.nodes[s.producer].name for s in storages if s.producer >= 0}
    offloads = [c for c in t["copies"] if c["stream"] == "offload" and c["name"] in writer]
    assert len(offloads) >= 4      # the input's copy (written by no call) left out
    for c in offloads:
        assert c["start"] >= forward_end[writer[c["name"]]] + 2e-3 - 1e-12
    assert steps[1] > steps[0] + 2e-3
