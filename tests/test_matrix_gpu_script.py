"""scripts/matrix_gpu.py at tiny sizes on the CPU: every cell recorded, the table and JSON
written, the time limit honoured."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "matrix_gpu.py")


def matrix(out, *args, timeout=300):
    return subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--device", "cpu",
                           "--batch", "4", "--image-size", "32", "--models", "vgg11",
                           "--precisions", "fp32", "--steps", "2", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


@pytest.mark.slow
def test_the_gpu_matrix_runs_on_the_cpu_at_tiny_sizes(tmp_path):
    r = matrix(tmp_path, "--fractions", "least")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "matrix.json").read_text())
    cells = {c["budget"]: c for c in data["cells"]}
    assert cells["none"]["outcome"] == "ran" and cells["none"]["measured_peak_bytes"] > 0
    probe = cells["4 KiB probe"]
    assert probe["outcome"] == "refused" and probe["least_from_train_bytes"] > 0
    assert probe["least_from_plan_bytes"] > 0
    assert "the least it can train in" in probe["error"]
    assert cells["least"]["outcome"] == "ran"      # the least budget the refusal names trains
    assert cells["least"]["budget_bytes"] == probe["least_from_train_bytes"]
    table = (tmp_path / "matrix.md").read_text()
    assert table.count("| vgg11 | fp32 |") == 3 and "0 cells failed" in table


def test_cells_past_the_time_limit_are_skipped_and_listed(tmp_path):
    r = matrix(tmp_path, "--fractions", "least", "--time-limit", "0")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "matrix.json").read_text())
    assert data["cells"] == [] and data["skipped"] == ["vgg11-fp32-all budgets"]
    assert "Skipped at the time limit (0 s): vgg11-fp32-all budgets." in \
        (tmp_path / "matrix.md").read_text()


def test_a_fraction_that_is_not_one_is_refused(tmp_path):
    r = matrix(tmp_path, "--fractions", "1.5")
    assert r.returncode == 2 and "--fractions: '1.5' is neither" in r.stderr


def test_a_traced_cell_lists_the_layer_kinds_furthest_from_the_model(tmp_path):
    """--trace: the budget cell's last step is traced (plainly on the CPU) and set beside the
    step model's calls; the kinds furthest off are listed under the table, the traced step is
    left out of the measured step."""
    r = matrix(tmp_path, "--fractions", "least", "--trace", "--steps", "3")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "matrix.json").read_text())
    cell = next(c for c in data["cells"] if c["budget"] == "least")
    assert cell["outcome"] == "ran" and not cell.get("trace_error"), cell
    assert cell["timed_steps"] == 0 and cell["held"] is False
    kinds = cell["kinds"]
    assert 0 < len(kinds) <= 4 and {"forward", "backward"} & {k["phase"] for k in kinds}
    gaps = [abs(k["measured_ms"] - k["predicted_ms"]) for k in kinds]
    assert gaps == sorted(gaps, reverse=True) and all(k["measured_ms"] > 0 for k in kinds)
    table = (tmp_path / "matrix.md").read_text()
    assert "Traced cells: the layer kinds furthest" in table
    assert "- vgg11 fp32 least (not held): " in table


@pytest.mark.parametrize("statistics, rows", [
    ("both", ["resnet18-fp32-all budgets", "resnet18-fp32-split-all budgets"]),
    ("split", ["resnet18-fp32-split-all budgets"]),
    ("whole", ["resnet18-fp32-all budgets"])])
def test_statistics_chooses_the_rows_of_a_network_with_batchnorm(tmp_path, statistics, rows):
    r = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path), "--device", "cpu",
                        "--models", "resnet18", "--precisions", "fp32", "--time-limit", "0",
                        "--statistics", statistics], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "matrix.json").read_text())["skipped"] == rows
