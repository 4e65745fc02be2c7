"""The measuring scripts run on a CPU and say what they measured: scripts/soak.py (flat device
bytes and RSS over many steps in a budget) and scripts/layer_times.py (device time per layer
kind)."""
import json
import os
import subprocess
import sys

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
    assert len(err) == 1 and err[0].startswith("soak: error: memory budget exceeded"), err


def test_layer_times_lists_every_layer_kind_and_writes_each_layers_times(tmp_path):
    out = tmp_path / "times.json"
    proc = run("scripts/layer_times.py", "--model", "tiny_cnn", "--batch", "2",
               "--image-size", "16", "--device", "cpu", "--top", "3", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout
    assert text.startswith("tiny_cnn b2 on cpu (fp32, NCHW)")
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
