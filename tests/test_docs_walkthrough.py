"""The walk-through (docs/walkthrough.md, scripts/walkthrough.py) and the stream timeline
(scripts/stream_timeline.py): the step's events are the plan's, each tied to a line of code
that really makes that move; the exercises' answers are what `minidnn plan` says; a CPU trace
reads back as the step it traced and draws beside its prediction.
"""
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minidnn.errors import fmt_bytes

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "walkthrough.md").read_text()


sys.path.insert(0, str(ROOT / "scripts"))    # the scripts, importable as modules
import walkthrough  # noqa: E402
import stream_timeline  # noqa: E402




@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One step of the walk-through, traced: (decision, events, memory stats, trace dict)."""
    path = tmp_path_factory.mktemp("walk") / "walk.json"
    decision, events, stats = walkthrough.run_step(str(path))
    return decision, events, stats, json.loads(path.read_text())


def quoted(key: str) -> str:
    return re.search(rf"<!--n:{key}-->(.*?)<!--/n-->", PAGE, re.S).group(1)


def test_the_plan_moves_and_rebuilds_maps(traced):
    decision, _, _, _ = traced
    assert decision.offload and decision.recompute and decision.prefetch_lookahead >= 1
    # the decision `minidnn plan` prints is the one the script runs
    planned = walkthrough.plan()
    offloaded = [r["layer"] for r in planned["layers"] if r["status"].startswith("offload")]
    recomputed = [r["layer"] for r in planned["layers"] if r["status"] == "recompute"]
    assert len(offloaded) == len(decision.offload)
    assert len(recomputed) == len(decision.recompute)
    assert planned["prefetch_lookahead"] == decision.prefetch_lookahead


def test_every_event_kind_happens_in_order(traced):
    _, events, stats, _ = traced
    kinds = [kind for _, kind, _, _ in events]
    for kind in ("forward", "backward", "offload", "evict", "prefetch", "drop", "recompute"):
        assert kind in kinds, f"no {kind} event: {sorted(set(kinds))}"
    assert "fetch on demand" not in kinds
    times = [t for t, _, _, _ in events]
    assert times == sorted(times)
    first = {kind: kinds.index(kind) for kind in set(kinds)}
    assert first["offload"] < first["evict"] < first["backward"] < first["prefetch"] \
        < first["recompute"]
    assert stats["offloaded_bytes"] == stats["prefetched_bytes"] > 0


# The call each kind of event is made by, in the line the script names.
CALLED = {"offload": "_offload(", "evict": "_leave_device(", "drop": "_leave_device(",
          "prefetch": "_fetch(", "forward": "mixed.forward(", "recompute": "mixed.forward(",
          "backward": "_layer_backward("}


def test_every_event_names_the_line_that_issues_it(traced):
    _, events, _, _ = traced
    for _, kind, what, at in events:
        module, function, line = at.split(":")
        path = ROOT / "minidnn" / f"{module}.py"
        assert path.is_file(), at
        source = path.read_text().splitlines()
        assert CALLED[kind] in source[int(line) - 1], f"{kind} {what}: {at} does not call it"
        # the line lies inside the function named
        start = next(k for k, text in enumerate(source)
                     if re.match(rf"\s*def {function}\(", text))
        assert start < int(line) - 1 < start + 200


def test_the_page_quotes_the_schedule_the_script_prints_now(traced):
    _, events, _, _ = traced
    block = re.search(r"<!--block:walk_schedule-->\n(.*?)\n<!--/block-->", PAGE, re.S)
    assert block.group(1) == f"```text\n{walkthrough.format_events(events)}\n```", \
        "run `python3 scripts/make_docs.py`"


def test_the_exercises_answers_are_what_plan_says():
    rows = {r["layer"]: r for r in walkthrough.plan()["layers"]}
    b, size = walkthrough.BATCH, walkthrough.IMAGE_SIZE
    assert rows["conv1_1"]["bytes"] == b * 16 * size * size * 4        # exercise 1 by hand
    assert quoted("ex1_answer") == fmt_bytes(rows["conv1_1"]["bytes"])
    none = walkthrough.plan("--policy", "none")["plan"]["required_bytes"]
    assert quoted("ex2_answer") == fmt_bytes(none)
    assert none > 8 * 2**20                                               # hence the plan
    everything = walkthrough.plan("--policy", "all")["plan"]
    assert quoted("ex3_answer") == fmt_bytes(everything["offloaded_bytes"])
    double = walkthrough.plan("--policy", "none", "--batch", str(2 * b))["plan"][
        "required_bytes"]
    assert quoted("ex4_answer") == fmt_bytes(double)
    assert none < double < 2 * none            # the parameters' bytes do not double


@pytest.mark.slow
def test_the_script_runs_without_matplotlib():
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            "sys.argv = ['walkthrough.py']; runpy.run_path('scripts/walkthrough.py', "
            "run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "prefetch" in done.stdout and "memory/manager:" in done.stdout


# ---- the stream timeline ------------------------------------------------------------------------
def test_a_cpu_trace_reads_back_as_the_step_it_traced(traced):
    _, events, _, trace = traced
    timeline = stream_timeline.measured_timeline(trace)
    calls = [(c["phase"], c["layer"]) for c in timeline["calls"]]
    assert calls == [(kind, what) for _, kind, what, _ in events
                     if kind in ("forward", "recompute", "backward")]
    copies = sorted((c["stream"], c["name"]) for c in timeline["copies"])
    assert copies == [("offload", "data"), ("prefetch", "data")]
    for a, b in zip(timeline["calls"], timeline["calls"][1:]):
        assert a["end"] <= b["start"] + 1e-9 and b["stall"] == pytest.approx(
            b["start"] - a["end"], abs=1e-6)
    assert timeline["step_time_s"] >= timeline["calls"][-1]["end"]


def test_a_wait_is_tied_to_the_copy_it_waited_for():
    timeline = {"step_time_s": 1.0, "copies": [
        {"stream": "prefetch", "name": "conv1", "start": 0.1, "end": 0.5},
        {"stream": "offload", "name": "conv2", "start": 0.0, "end": 0.2}],
        "calls": [{"phase": "forward", "layer": "a", "start": 0.0, "end": 0.3, "stall": 0.0},
                  {"phase": "backward", "layer": "b", "start": 0.5, "end": 0.9,
                   "stall": 0.2}]}
    [(start, end, copy)] = stream_timeline.waits(timeline)
    assert (start, end) == pytest.approx((0.3, 0.5)) and copy["name"] == "conv1"
    with pytest.raises(ValueError):
        stream_timeline.measured_timeline({"traceEvents": []})


def test_the_figure_is_drawn_beside_the_prediction(traced, tmp_path):
    pytest.importorskip("matplotlib")
    _, _, _, trace = traced
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    out = tmp_path / "timeline.png"
    with contextlib.redirect_stdout(io.StringIO()) as said:
        assert stream_timeline.main([str(path), "--out", str(out), "--predict",
                                     " ".join(walkthrough.PLAN_ARGS)]) == 0
    assert out.stat().st_size > 10_000 and "predicted" in said.getvalue()
