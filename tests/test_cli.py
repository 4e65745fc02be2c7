"""The command line, run in-process: every bad input is one clear line and exit status 2."""
import json
import os

import pytest

from minidnn.backend import gpu_available
from minidnn.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("minidnn: error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("argv,needle", [
    (["train", "--model", "resnet9"], "unknown model 'resnet9'"),
    (["train", "--memory-budget", "12XB"], "argument --memory-budget: cannot read a memory size "
                                           "from '12XB'"),
    (["train", "--batch", "0"], "argument --batch: expected a positive integer, got '0'"),
    (["train", "--batch", "many"], "argument --batch: expected a positive integer, got 'many'"),
    (["train", "--lr", "-1"], "argument --lr: expected a positive finite number"),
    (["train", "--lr", "inf"], "argument --lr: expected a positive finite number, got 'inf'"),
    (["train", "--lr", "nan"], "argument --lr: expected a positive finite number, got 'nan'"),
    (["train", "--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["train", "--data", "/no/such/folder"], "data folder '/no/such/folder' does not exist"),
    (["train", "--data", "imagenet"], "--data 'imagenet': expected shapes, synthetic"),
    (["train", "--model", "alexnet", "--image-size", "40"], "'alexnet' needs image_size >= 55"),
    (["train", "--resume"], "--resume needs --checkpoint"),
    (["train", "--model", "mlp", "--image-size", "16", "--memory-budget", "64KiB",
      "--no-progress"], "memory budget 64.00 KiB is too small for mlp"),
    (["train", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["summary"], "the following arguments are required: --model"),
    (["launch"], "argument COMMAND: invalid choice: 'launch'"),
])
def test_bad_inputs_give_one_clear_line(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in one_error_line(err)


@pytest.mark.skipif(gpu_available(), reason="this machine has a GPU")
def test_gpu_asked_for_without_one(capsys):
    code, _, err = run(capsys, "train", "--device", "gpu", "--model", "mlp")
    assert code == 2 and "CuPy sees no CUDA device" in one_error_line(err)


def test_corrupt_and_missing_checkpoints(capsys, tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 this is not a checkpoint")
    code, _, err = run(capsys, "train", "--model", "mlp", "--checkpoint", str(bad), "--resume",
                       "--no-progress")
    assert code == 2 and "bad.npz" in one_error_line(err) and "corrupt" in err
    code, _, err = run(capsys, "train", "--model", "mlp", "--checkpoint",
                       str(tmp_path / "none.npz"), "--resume", "--no-progress")
    assert code == 2 and "none.npz' does not exist" in one_error_line(err)


def test_missing_cifar_file(capsys, tmp_path):
    code, _, err = run(capsys, "train", "--model", "mlp", "--data", f"cifar10:{tmp_path}",
                       "--no-progress")
    assert code == 2 and "data_batch_1" in one_error_line(err)


def test_train_writes_report_and_checkpoint(capsys, tmp_path):
    report, ckpt = tmp_path / "r.json", tmp_path / "c.npz"
    code, out, err = run(capsys, "train", "--model", "mlp", "--image-size", "16", "--steps", "6",
                         "--batch", "8", "--eval-every", "3", "--report", str(report),
                         "--checkpoint", str(ckpt), "--no-progress", "--device", "cpu")
    assert code == 0, err
    data = json.loads(report.read_text())
    assert data["steps"] == 6 and data["model"] == "mlp" and len(data["loss"]) == 6
    assert ckpt.exists()
    assert "held-out accuracy" in out and "step 3/6" in out and f"report: {report}" in out
    code, out, err = run(capsys, "train", "--model", "mlp", "--image-size", "16", "--steps", "8",
                         "--batch", "8", "--checkpoint", str(ckpt), "--resume", "--no-progress",
                         "--device", "cpu")
    assert code == 0, err
    assert "resuming at step 6" in out


def test_outputs_in_new_folders_and_an_unwritable_report(capsys, tmp_path):
    """The README's `--report runs/... --trace runs/...` with no runs/ folder yet."""
    pytest.importorskip("matplotlib")
    runs = tmp_path / "runs"
    common = ("train", "--model", "mlp", "--image-size", "16", "--steps", "2", "--batch", "8",
              "--no-progress", "--device", "cpu")
    code, out, err = run(capsys, *common, "--report", str(runs / "r.json"),
                         "--trace", str(runs / "t.json"), "--plot", str(runs / "p" / "m.png"))
    assert code == 0, err
    assert {p.name for p in runs.rglob("*")} == {"r.json", "t.json", "p", "m.png"}
    (tmp_path / "file").write_text("")
    code, _, err = run(capsys, *common, "--report", str(tmp_path / "file" / "r.json"))
    assert code == 2 and "--report: cannot write" in one_error_line(err)


def test_summary_and_models(capsys):
    code, out, _ = run(capsys, "summary", "--model", "alexnet", "--batch", "2")
    assert code == 0
    assert "conv1" in out and "fc8" in out and "60,965,224" in out
    assert "network-wide" in out and "liveness peak" in out
    code, out, _ = run(capsys, "models")
    assert code == 0 and "vgg416" in out and "overfeat" in out


def test_help_and_no_command(capsys):
    code, out, _ = run(capsys, "train", "--help")
    assert code == 0 and "--memory-budget" in out and "--resume" in out
    text = " ".join(out.split())             # argparse wraps the help
    assert "dyn (vDNN_dyn" in text and "see 'minidnn plan'" in text
    code, out, _ = run(capsys, )
    assert code == 2 and "train" in out and "summary" in out


def test_readme_quickstart_matches_ci():
    """The Quickstart block holds exactly two commands; .ci/run runs the second one verbatim."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    block = readme.split("## Quickstart", 1)[1].split("```", 2)[1]
    commands = [line.strip() for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert commands[0].endswith("minidnn train") and "pip install ." in commands[0]
    assert "pytest" in commands[1]
    assert commands[1] in [line.strip() for line in ci.splitlines()]
