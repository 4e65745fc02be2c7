"""scripts/fashion_mnist_vs_pytorch.py on the CPU at tiny size, minidnn alone (--no-torch),
with its budget run, and its summary of runs (time to the target, best accuracy, images/s,
PyTorch's fastest run, the budget run's bits)."""
import json
import math
import os
import runpy
from types import SimpleNamespace

from test_fashion_mnist import make_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script():
    """The script's functions (its module namespace; __main__ does not run)."""
    path = os.path.join(ROOT, "scripts", "fashion_mnist_vs_pytorch.py")
    return SimpleNamespace(**runpy.run_path(path, run_name="fashion_mnist_vs_pytorch"))


def test_the_script_runs_minidnn_on_a_limited_copy_and_writes_its_record(tmp_path, capsys,
                                                                        monkeypatch):
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))   # the budget run's profile
    script = load_script()
    folder = make_data(tmp_path / "fmnist")
    out = tmp_path / "out"
    results = script.main(["--data", f"fashion-mnist:{folder}", "--models", "tiny_cnn",
                           "--epochs", "2", "--batch", "8", "--train-limit", "32",
                           "--test-limit", "11", "--device", "cpu", "--no-torch",
                           "--budget-fraction", "0.9", "--deterministic", "--out", str(out)])
    printed = capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["command"].endswith("--out " + str(out)) and saved["device"] == "cpu"
    run, budget = saved["models"]["tiny_cnn"]["runs"]
    assert run["label"] == "minidnn" and budget["label"] == "minidnn-0.9-budget"
    assert budget["memory_budget_bytes"] == int(0.9 * run["peak_device_bytes"])
    assert [e["epoch"] for e in run["epochs"]] == [1, 2]
    assert [e["step"] for e in run["epochs"]] == [4, 8]          # 32 training images, batch 8
    assert all(e["eval_images"] == 11 for e in run["epochs"])     # the limited test split
    assert run["images_per_s"] == 8 * 8 / run["epochs"][-1]["train_time_s"]
    assert saved["models"]["tiny_cnn"]["recipe"]["lr_schedule"] == "cosine"
    assert saved["models"]["tiny_cnn"]["budget_bit_identical"] == {"minidnn-0.9-budget": True}
    assert "tiny_cnn: final accuracy minidnn-0.9-budget - minidnn: +0.00 points" in printed
    assert (out / "curves_tiny_cnn.png").read_bytes()[:4] == b"\x89PNG"
    assert "tiny_cnn: minidnn-0.9-budget vs minidnn, per-epoch training loss and test " \
           "accuracy: bit-identical" in printed
    assert "tiny_cnn: minidnn" in printed and "torch" not in printed.lower().replace(
        "vs_pytorch", "")


def test_a_refused_fraction_falls_back_to_the_least_budget_then_a_pair_holds_it_to_its_bits(
        tmp_path, capsys, monkeypatch):
    """--budget-fraction 0.05 is less than the parameters, gradients, momentum and inputs
    take: the refusal is recorded, the whole run made at the least budget it names, and
    --budget-epochs 1 adds a pair of 1-epoch deterministic runs without and with that budget."""
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    script = load_script()
    folder = make_data(tmp_path / "fmnist")
    results = script.main(["--data", f"fashion-mnist:{folder}", "--models", "tiny_cnn",
                           "--epochs", "2", "--batch", "8", "--train-limit", "32",
                           "--test-limit", "11", "--device", "cpu", "--no-torch",
                           "--budget-fraction", "0.05", "--budget-epochs", "1",
                           "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    runs = results["models"]["tiny_cnn"]["runs"]
    assert [r["label"] for r in runs] == [
        "minidnn", "minidnn-0.05-budget", "minidnn-least-budget", "minidnn-deterministic",
        "minidnn-deterministic-budget"]
    run, refused, least, pair, budget = runs
    assert refused["memory_budget_bytes"] == int(0.05 * run["peak_device_bytes"])
    assert "is too small" in refused["error"] and "epochs" not in refused
    assert refused["memory_budget_bytes"] < refused["least_budget"] < run["peak_device_bytes"]
    assert least["memory_budget_bytes"] == budget["memory_budget_bytes"] == \
        refused["least_budget"]
    assert len(run["epochs"]) == len(least["epochs"]) == 2
    assert len(pair["epochs"]) == len(budget["epochs"]) == 1
    assert pair["deterministic"] and budget["deterministic"] and not least["deterministic"]
    assert results["models"]["tiny_cnn"]["budget_bit_identical"] == {
        "minidnn-deterministic-budget": True}
    assert "tiny_cnn: minidnn-0.05-budget refused before the first step; minidnn-least-budget " \
           "ran at the least budget the refusal names" in printed
    assert "is refused; the same run at the least budget the refusal names" in printed
    assert "tiny_cnn: final accuracy minidnn-least-budget - minidnn: " in printed
    assert "tiny_cnn: minidnn-deterministic-budget vs minidnn-deterministic, per-epoch " \
           "training loss and test accuracy: bit-identical" in printed
    assert "minidnn-least-budget vs" not in printed        # not deterministic: no bit check


def test_a_run_cut_short_keeps_the_epochs_it_finished(tmp_path, monkeypatch):
    """A time limit ends the script in PyTorch's run: results.json and the figure still hold
    minidnn's run and the epochs PyTorch finished, marked incomplete."""
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    script = load_script()

    def cut(label, model, recipe, args, data, compiled, epoch_limit=None, records=None):
        records.append({"epoch": 1, "step": 4, "train_loss": 2.0, "accuracy": 0.25,
                        "train_time_s": 1.0})
        raise SystemExit(143)            # what the SIGTERM handler raises

    script.main.__globals__["run_torch"] = cut
    folder = make_data(tmp_path / "fmnist")
    out = tmp_path / "out"
    try:
        script.main(["--data", f"fashion-mnist:{folder}", "--models", "tiny_cnn", "--epochs", "1",
                     "--batch", "8", "--train-limit", "32", "--test-limit", "11", "--device",
                     "cpu", "--budget-fraction", "0", "--out", str(out)])
        raise AssertionError("the run was not cut")
    except SystemExit as e:
        assert e.code == 143
    saved = json.loads((out / "results.json").read_text())
    ours, eager = saved["models"]["tiny_cnn"]["runs"]
    assert ours["label"] == "minidnn" and len(ours["epochs"]) == 1
    assert eager["label"] == "pytorch-eager" and eager["complete"] is False
    assert eager["epochs"][0]["accuracy"] == 0.25
    assert (out / "curves_tiny_cnn.png").read_bytes()[:4] == b"\x89PNG"


def epochs(*points):
    """Epoch records of (accuracy, training seconds, training loss), a step of 10 each."""
    return [{"epoch": k + 1, "step": 10 * (k + 1), "accuracy": a, "train_time_s": t,
             "train_loss": loss} for k, (a, t, loss) in enumerate(points)]


def test_time_to_accuracy_and_the_comparison_lines():
    script = load_script()
    ours = {"label": "minidnn", "images_per_s": 640.0,
            "epochs": epochs((0.90, 10.0, 0.5), (0.945, 20.0, 0.4), (0.944, 30.0, 0.3))}
    eager = {"label": "pytorch-eager", "compile_s": None, "images_per_s": 400.0,
             "epochs": epochs((0.93, 15.0, 0.5), (0.941, 30.0, 0.4), (0.942, 45.0, 0.3))}
    compiled = {"label": "pytorch-compiled", "compile_s": 42.0,
                "epochs": epochs((0.941, 12.5, 0.5), (0.942, 25.0, 0.4), (0.943, 37.5, 0.3))}
    # the same accuracies, a training loss one bit apart in the third epoch
    budget = {"label": "minidnn-0.25-budget", "epochs": ours["epochs"][:2] + epochs(
        (0, 0, 0), (0, 0, 0), (0.944, 31.0, math.nextafter(0.3, 1)))[2:]}
    assert script.time_to(ours, 0.94) == 20.0 and script.time_to(eager, 0.95) is None
    assert script.best_accuracy(ours) == 0.945 and script.best_accuracy({"epochs": []}) is None
    assert script.images_per_s(ours["epochs"], 64) == 30 * 64 / 30.0
    assert script.fastest_torch([ours, eager, compiled], 0.94) == (compiled, 12.5)
    lines = script.summary("resnet18", [ours, budget, eager, compiled], 0.94, deterministic=True)
    assert lines[1].split() == ["resnet18:", "minidnn", "0.9440", "0.9450", "30.0", "20.0", "-",
                                "640"]
    assert lines[4].split()[-3:] == ["12.5", "42.0", "-"]    # compile time apart; no images/s
    assert "resnet18: time to 94%: minidnn 20.0 s, PyTorch's fastest (pytorch-compiled) " \
           "12.5 s: minidnn 0.62x as fast" in lines
    assert "resnet18: final accuracy minidnn - pytorch-eager: +0.20 points" in lines
    assert "resnet18: final accuracy minidnn-0.25-budget - minidnn: +0.00 points" in lines
    assert "resnet18: minidnn-0.25-budget vs minidnn, per-epoch training loss and test " \
           "accuracy: NOT bit-identical (from epoch 3)" in lines
    same = dict(budget, epochs=ours["epochs"])
    assert any(line.endswith("accuracy: bit-identical")
               for line in script.summary("resnet18", [ours, same], 0.94, deterministic=True))
    assert not any("bit-identical" in line
                   for line in script.summary("resnet18", [ours, same], 0.94))
    cut = dict(eager, epochs=eager["epochs"][:1])          # --eager-epochs 1: no final gap
    assert not any("final accuracy minidnn - pytorch-eager" in line
                   for line in script.summary("resnet18", [ours, cut], 0.94))
    slow = dict(ours, epochs=epochs((0.5, 10.0, 1.0)))
    assert "resnet18: time to 94%: minidnn did not reach it; PyTorch's fastest " \
           "(pytorch-compiled) 12.5 s" in script.summary("resnet18", [slow, compiled], 0.94)


def test_the_script_imports_torch_only_in_its_pytorch_part():
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, 'scripts'); import fashion_mnist_vs_pytorch; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "False"


def test_eager_and_compiled_epochs_cut_each_pytorch_run(tmp_path, monkeypatch):
    """--eager-epochs / --compiled-epochs reach each PyTorch run as its epoch limit."""
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    script = load_script()
    limits = {}

    def record(label, model, recipe, args, data, compiled, epoch_limit=None, records=None):
        limits[label] = (compiled, epoch_limit)
        return {"label": label, "epochs": []}

    script.main.__globals__["run_torch"] = record
    folder = make_data(tmp_path / "fmnist")
    script.main(["--data", f"fashion-mnist:{folder}", "--models", "tiny_cnn", "--epochs", "1",
                 "--batch", "8", "--train-limit", "16", "--test-limit", "11", "--device", "cpu",
                 "--budget-fraction", "0", "--compiled-epochs", "2", "--out", str(tmp_path)])
    assert limits == {"pytorch-eager": (False, None), "pytorch-compiled": (True, 2)}
