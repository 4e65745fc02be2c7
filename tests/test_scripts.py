"""The measuring scripts run on a CPU and say what they measured: scripts/soak.py (flat device
bytes and RSS over many steps in a budget), scripts/layer_times.py (device time per layer
kind) and scripts/model_vs_trace.py (a traced step's calls beside the step model's)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=240):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_a_short_cpu_soak_stays_flat_and_reports_every_check():
    proc = run("scripts/soak.py", "--steps", "40", "--every", "10")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "on demand" in lines[1] and "unplanned" in lines[1] and "fallbacks" in lines[1]
    rows = [ln.split() for ln in lines[2:] if ln.split() and ln.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == [4, 10, 20, 30, 40]
    assert lines[-1] == "soak: flat"


def test_a_soak_that_cannot_run_in_its_budget_fails_with_one_clear_line():
    proc = run("scripts/soak.py", "--steps", "4", "--memory-budget", "1KiB")
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("soak: error: memory budget 1.00 KiB is too "
                                               "small for tiny_cnn"), err


def test_layer_times_lists_every_layer_kind_and_writes_each_layers_times(tmp_path):
    out = tmp_path / "times.json"
    proc = run("scripts/layer_times.py", "--model", "tiny_cnn", "--batch", "2",
               "--image-size", "16", "--device", "cpu", "--top", "3", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert text.startswith("tiny_cnn b2 on cpu (fp32, fp32 maps, NCHW)")
    kinds = [ln.split()[0] for ln in text.split("\n\n")[0].splitlines()[2:]]
    data = json.loads(out.read_text())
    assert set(kinds) == {layer["kind"] for layer in data["layers"]} >= {"conv", "relu", "loss"}
    assert all(layer["forward_s"] > 0 and layer["backward_s"] >= 0 for layer in data["layers"])
    assert "costliest 3 layers" in text


def test_layer_times_names_a_bad_model_in_one_line():
    proc = run("scripts/layer_times.py", "--model", "no_such_net", "--batch", "2",
               "--device", "cpu")
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "unknown model 'no_such_net'" in err[0], err


def test_bench_fraction_measures_both_runs_and_names_a_budget_too_small(tmp_path):
    """scripts/bench_fraction.py on the CPU: the unconstrained run's steady peak sets the
    budget; one that dyn cannot fit ends in minidnn's own one-line reason in the table."""
    out = tmp_path / "f.json"
    proc = run("scripts/bench_fraction.py", str(out), "--models", "tiny_cnn", "--batch", "8",
               "--steps", "3", "--device", "cpu", "--fraction", "0.5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())["results"]["tiny_cnn"]
    free, capped = result["none"], result["dyn"]
    assert free["images_per_s"] > 0 and free["steady_peak_device_bytes"] > 0
    assert "--memory-budget" in capped["command"]
    assert "is too small for tiny_cnn" in capped["error"]
    assert "failed: minidnn: error: memory budget" in proc.stdout


def test_bench_fraction_passes_relu_bits_to_the_capped_run_only(tmp_path):
    out = tmp_path / "f.json"
    proc = run("scripts/bench_fraction.py", str(out), "--models", "tiny_cnn", "--batch", "32",
               "--steps", "3", "--device", "cpu", "--fraction", "0.9", "--relu-bits")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())["results"]["tiny_cnn"]
    assert "--relu-bits" in result["dyn"]["command"] and "error" not in result["dyn"]
    assert "--relu-bits" not in result["none"]["command"]
    assert "ReLU bit masks" in proc.stdout


def test_bench_budget_bf16_reaches_minidnn_and_every_pytorch_configuration():
    """--math bf16: minidnn's spec asks for bf16 maps (TF32 where float32 computes), every
    PyTorch configuration (accumulation, checkpoint_sequential, save_on_cpu) for bf16 autocast,
    and each row says so; the default stays fp32 maps under TF32."""
    import runpy
    from types import SimpleNamespace
    bb = SimpleNamespace(**runpy.run_path(os.path.join(ROOT, "scripts", "bench_budget.py")))
    argv = ["--caps", "6GiB", "--accumulate", "2,4", "--segments", "4"]
    specs = bb.specs_for(bb.parse_args(argv + ["--math", "bf16"]), 6 << 30, 224)
    mini, torch = specs[0], specs[1:]
    assert mini["framework"] == "minidnn" and mini["device"] == "gpu"
    assert {s["precision"] for s in specs} == {"bf16"}
    assert {bb.float32_math(s) for s in specs} == {"tf32"}
    assert bb.describe(mini) == "minidnn dyn --relu-bits --precision bf16"
    assert all(bb.describe(s).endswith(", bf16 autocast") for s in torch)
    assert any(s["segments"] and s["accumulate"] > 1 for s in torch)
    assert any(s["save_on_cpu"] for s in torch)
    plain = bb.specs_for(bb.parse_args(argv), 6 << 30, 224)
    assert {(s["precision"], bb.float32_math(s)) for s in plain} == {("fp32", "tf32")}
    assert not any("bf16" in bb.describe(s) for s in plain)


def test_bench_budget_refuses_a_time_limit_no_configuration_could_start_in(capsys):
    """A configuration is not started with less than MIN_RUN_S left: a --time-limit of that or
    less would skip every one, so it is refused before anything runs."""
    import runpy
    from types import SimpleNamespace
    bb = SimpleNamespace(**runpy.run_path(os.path.join(ROOT, "scripts", "bench_budget.py")))
    with pytest.raises(SystemExit):
        bb.parse_args(["--time-limit", str(bb.MIN_RUN_S)])
    assert "--time-limit" in capsys.readouterr().err
    assert bb.parse_args(["--time-limit", str(bb.MIN_RUN_S + 1)]).time_limit == bb.MIN_RUN_S + 1


def test_bench_budget_on_the_cpu_plans_and_runs_bf16_maps(tmp_path):
    """minidnn's worker on the CPU: dyn decides for the precision asked, and the table's title
    says bf16. (On the CPU every layer widens bf16 maps to float32 copies, which the plan
    counts: a bf16 step there plans more bytes than an fp32 one, not fewer.)"""
    peaks = {}
    for math in ("fp32", "bf16"):
        out = tmp_path / math
        proc = run("scripts/bench_budget.py", "--model", "tiny_cnn", "--batch", "8",
                   "--caps", "64MiB", "--only", "minidnn", "--device", "cpu", "--math", math,
                   "--warmup", "1", "--steps", "2", "--out", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        data = json.loads((out / "bench_budget.json").read_text())
        row = data["caps"]["64MiB"][0]
        assert data["precision"] == row["planned_precision"] == ("bf16" if math == "bf16"
                                                                 else "fp32"), row
        assert row["images_per_s"] > 0
        peaks[math] = row["predicted_peak_bytes"]
    assert peaks["bf16"] > peaks["fp32"]
    assert "bf16 mixed precision" in proc.stdout and "--precision bf16" in proc.stdout
    refused = run("scripts/bench_budget.py", "--device", "cpu")
    assert refused.returncode == 2 and "--only minidnn" in refused.stderr


def test_model_vs_trace_sets_each_traced_call_beside_the_step_models(tmp_path):
    """Two passes of tiny_cnn traced on the CPU: each row averages the pass's calls, the
    totals are the trace's and the plan's, and a plan of other micro-batches is refused."""
    trace, report, out = tmp_path / "t.json", tmp_path / "r.json", tmp_path / "c.json"
    proc = subprocess.run([sys.executable, "-m", "minidnn", "train", "--model", "tiny_cnn",
                           "--batch", "8", "--steps", "2", "--device", "cpu", "--data",
                           "synthetic", "--micro-batches", "2", "--eval-every", "0",
                           "--no-progress", "--trace", str(trace), "--report", str(report)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    proc = run("scripts/model_vs_trace.py", str(trace), "--report", str(report),
               "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("tiny_cnn b8, fp32, 2 pass(es) of 4")
    rows = json.loads(out.read_text())
    events = json.loads(trace.read_text())["traceEvents"]
    last = max(e["args"]["step"] for e in events if e.get("ph") == "X" and e["tid"] == 1)
    traced = sum(e["dur"] / 1e6 for e in events
                 if e.get("ph") == "X" and e["tid"] == 1 and e["args"]["step"] == last)
    assert abs(sum(r["measured"] for r in rows["by_kind"]) - traced / 2) < 1e-9
    calls = rows["plan"]["timeline"]["calls"]
    assert abs(sum(r["predicted"] for r in rows["by_kind"])
               - sum(c["end"] - c["start"] for c in calls)) < 1e-12
    assert {r["kind"] for r in rows["by_kind"]} >= {"conv", "relu", "loss"}
    assert "measure the host" not in proc.stdout
    # Two steps, both of warm-up (the second traced too): no steady step to compare with.
    assert "the run has no steady step" in proc.stdout
    # A replayed step far shorter than its traced calls: they timed the host issuing them.
    fast = tmp_path / "fast.json"
    runs = json.loads(report.read_text())
    fast.write_text(json.dumps(dict(runs, step_time_s=[traced / 10] * len(runs["step_time_s"]),
                                    warmup_steps=0, traced_steps=[])))
    proc = run("scripts/model_vs_trace.py", str(trace), "--report", str(fast))
    assert proc.returncode == 0, proc.stderr
    assert "measure the host's time to issue them" in proc.stdout
    other = tmp_path / "p.json"
    other.write_text(json.dumps(dict(rows["plan"], micro_batches=1)))
    proc = run("scripts/model_vs_trace.py", str(trace), "--report", str(report),
               "--plan", str(other))
    assert proc.returncode == 2
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "not the same plan" in err[0], err
