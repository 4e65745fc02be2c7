"""scripts/bench_dyn.py on the CPU: the same code path as on the GPU, at toy size."""
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_dyn.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_dyn", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_plans_runs_and_reports_every_policy(tmp_path):
    bench = load_script()
    budget = 4 * 2**20
    assert bench.main(["--device", "cpu", "--configs", "tiny_cnn:4,mlp:2048", "--image-size", "16",
                       "--budget", str(budget), "--no-torch", "--warmup", "1", "--steps", "1",
                       "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bench_dyn.json").read_text())
    assert (tmp_path / "bench_dyn.png").stat().st_size > 0
    table = (tmp_path / "bench_dyn.md").read_text()
    rows = results["minidnn"]
    tiny = [r for r in rows if r["network"] == "tiny_cnn"]
    (dyn,) = [r for r in tiny if r["policy"] == "dyn"]
    assert dyn["conv_plans"].startswith("planned (prefetch lookahead ")     # dyn chose it, as --policy dyn
    assert {(r["policy"], r["conv_plans"]) for r in tiny if r is not dyn} == {
        (p, a) for p in ("none", "conv", "all") for a in ("fastest", "memory-optimal")}
    for r in tiny:                   # everything fits 4 MiB here, and every run stayed in it
        assert "step_time_s" in r, r
        assert r["peak_device_bytes"] <= budget
        assert r["bound_s"] > 0 and r["images_per_s"] > 0
    assert any(r["offloaded_bytes"] > 0 for r in tiny if r["policy"] == "all")
    # mlp at batch 2048 does not fit 4 MiB: every configuration is skipped with the reason.
    mlp = [r for r in rows if r["network"] == "mlp"]
    assert mlp and all("skipped" in r for r in mlp)
    assert f"| tiny_cnn | 4 | dyn | {dyn['conv_plans']} |" in table and "skipped" in table
    assert list((tmp_path / "profiles").glob("tiny_cnn-b4-cpu-*.json"))
