"""scripts/fashion_mnist_vs_pytorch.py on the CPU at tiny size, minidnn alone (--no-torch)."""
import json
import os
import runpy
from types import SimpleNamespace

from test_fashion_mnist import make_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script():
    """The script's functions (its module namespace; __main__ does not run)."""
    path = os.path.join(ROOT, "scripts", "fashion_mnist_vs_pytorch.py")
    return SimpleNamespace(**runpy.run_path(path, run_name="fashion_mnist_vs_pytorch"))


def test_the_script_runs_minidnn_on_a_limited_copy_and_writes_its_record(tmp_path, capsys):
    script = load_script()
    folder = make_data(tmp_path / "fmnist")
    out = tmp_path / "out"
    results = script.main(["--data", f"fashion-mnist:{folder}", "--models", "tiny_cnn",
                           "--epochs", "2", "--batch", "8", "--train-limit", "32",
                           "--test-limit", "11", "--device", "cpu", "--no-torch",
                           "--out", str(out)])
    printed = capsys.readouterr().out
    saved = json.loads((out / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["command"].endswith("--out " + str(out)) and saved["device"] == "cpu"
    run, = saved["models"]["tiny_cnn"]["runs"]
    assert run["label"] == "minidnn"
    assert [e["epoch"] for e in run["epochs"]] == [1, 2]
    assert [e["step"] for e in run["epochs"]] == [4, 8]          # 32 training images, batch 8
    assert all(e["eval_images"] == 11 for e in run["epochs"])     # the limited test split
    assert saved["models"]["tiny_cnn"]["recipe"]["lr_schedule"] == "cosine"
    assert (out / "curves_tiny_cnn.png").read_bytes()[:4] == b"\x89PNG"
    assert "tiny_cnn: minidnn" in printed and "torch" not in printed.lower().replace(
        "vs_pytorch", "")


def test_time_to_accuracy_and_the_comparison_lines():
    script = load_script()
    ours = {"label": "minidnn", "epochs": [
        {"epoch": 1, "accuracy": 0.90, "train_time_s": 10.0},
        {"epoch": 2, "accuracy": 0.945, "train_time_s": 20.0}]}
    theirs = {"label": "pytorch-eager", "compile_s": None, "epochs": [
        {"epoch": 1, "accuracy": 0.93, "train_time_s": 15.0},
        {"epoch": 2, "accuracy": 0.941, "train_time_s": 30.0}]}
    assert script.time_to(ours, 0.94) == 20.0 and script.time_to(theirs, 0.95) is None
    lines = script.summary("resnet18", [ours, theirs], 0.94)
    assert "resnet18: time to 94%: minidnn 1.50x as fast as pytorch-eager" in lines
    assert "resnet18: final accuracy minidnn - pytorch-eager: +0.40 points" in lines


def test_the_script_imports_torch_only_in_its_pytorch_part():
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, 'scripts'); import fashion_mnist_vs_pytorch; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "False"
