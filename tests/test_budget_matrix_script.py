"""scripts/matrix_gpu.py's step and peak columns: the measured step is the median of the
steady steps (the warm-up and the steps captured as CUDA graphs left out), set beside the
step model's as predicted/measured with a pass or fail against the issue's tolerances (peak
within 3%, step within 10%)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def script():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import matrix_gpu
    finally:
        sys.path.pop(0)
    return matrix_gpu


def test_the_timed_steps_leave_out_the_warm_up_and_the_captures(script):
    report = {"step_time_s": [2.0, 0.9, 0.8, 0.11, 0.1, 0.12, 0.1],
              "step_graphs": {"captured_at": [2], "replayed_steps": 4}}
    assert script.timed_steps(report) == [0.11, 0.1, 0.12, 0.1]
    assert script.median(script.timed_steps(report)) == pytest.approx(0.105)
    plain = {"step_time_s": [2.0, 0.9, 0.3, 0.1, 0.2], "step_graphs": None}
    assert script.median(script.timed_steps(plain)) == 0.2
    assert script.timed_steps({"step_time_s": [1.0, 2.0]}) == []


def test_predicted_over_measured_passes_within_the_tolerances(script):
    c = script.compared(1030, 1000, 0.095, 0.1, 9)
    assert c["peak_ratio"] == pytest.approx(1.03) and c["peak_verdict"] == "pass"
    assert c["step_ratio"] == pytest.approx(0.95) and c["step_verdict"] == "pass"
    c = script.compared(960, 1000, 0.12, 0.1, 9)
    assert c["peak_verdict"] == "fail" and c["step_verdict"] == "fail"
    assert c["peak_within_target"] is False and c["step_within_target"] is False
    c = script.compared(1000, 1000, 0.1, None, 0)
    assert c["step_ratio"] is None and c["step_verdict"] is None


def test_the_table_shows_the_ratios_and_verdicts(script):
    cell = dict(model="vgg16", precision="bf16", split_batch_statistics=False, budget="50%",
                budget_bytes=2**30, outcome="ran",
                **script.compared(2**30, int(2**30 * 1.01), 0.05, 0.06, 9))
    data = {"settings": {"batch": 256, "steps": 12, "device": "gpu", "relu_bits": True,
                         "time_limit": 230.0},
            "cells": [cell], "skipped": ["overfeat-fp32-all budgets"]}
    table = script.markdown(data)
    assert "predicted/measured peak" in table and "predicted/measured step" in table
    assert "| 0.990 pass |" in table and "| 0.833 fail |" in table
    assert "60.0 ms (9)" in table
    assert "1 ran outside the peak or step target" in table
    assert "Skipped at the time limit (230 s): overfeat-fp32-all budgets." in table


@pytest.mark.parametrize("line, outcome", [
    ("memory budget 4.00 KiB is too small for vgg16 at batch 256: the least it can train in "
     "is 2.05GiB (...)", "refused"),
    ("memory budget exceeded in feature maps (static layout): requested 1.00 GiB", "refused"),
    ("memory budget exceeded in parameter fc6.weight: requested 392.00 MiB", "refused"),
    ("memory budget exceeded in backward of layer4.2.conv2: requested 4.50 MiB", "failed mid-run"),
    ("memory budget exceeded in gradient of conv1_2 (summed): requested 144.00 KiB",
     "failed mid-run"),
    ("memory budget exceeded: requested 2.25 MiB, in use 2.63 GiB", "failed mid-run"),
    ("memory budget exceeded in code at minidnn/backend.py:57 (to_numpy): requested 144.00 KiB",
     "failed mid-run"),
])
def test_a_budget_error_outside_the_set_up_is_a_failure_mid_run(script, line, outcome):
    """Only the set-up's allocations (parameters, their gradients, the static layout's region)
    fail before step one; an error between layer calls (named by nothing, or by the code
    that asked) came in a step, and the matrix says so."""
    assert script.outcome({"returncode": 2, "stderr": f"minidnn: error: {line}"}) == outcome
