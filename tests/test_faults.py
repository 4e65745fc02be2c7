"""The faults and bad inputs a user meets: nothing is lost, every error is one clear line.

Output paths are checked before the first step; a diverged run keeps its last good checkpoint
and reports where it diverged; SIGINT and SIGTERM save the steps done; surprises are said.
"""
import json
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from minidnn.checkpoint import CheckpointLock, load_checkpoint
from minidnn.errors import CheckpointError, ConfigError, DataError
from minidnn.train import DivergenceError, Interrupted, TrainConfig, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NET = ("train", "--model", "mlp", "--image-size", "16", "--batch", "8")
MLP = NET + ("--steps", "3", "--no-progress", "--device", "cpu", "--eval-batches", "1")


def small(**overrides):
    cfg = dict(model="tiny_cnn", batch=16, image_size=16, steps=6, device="cpu", lr=0.05,
               eval_every=0, eval_batches=2, progress=False, log_every=4)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def quiet(*args):
    pass


from test_cli import one_error_line, run as cli  # noqa: E402  (the CLI tests' helpers)


# ---- 1. every output path before the first step ----------------------------------------------------
@pytest.mark.parametrize("option,path,needle", [
    ("--report", "{tmp}", "--report '{tmp}' names a folder"),
    ("--trace", "{tmp}/", "--trace '{tmp}/' names a folder"),
    ("--checkpoint", "{tmp}", "--checkpoint '{tmp}' names a folder"),
    ("--report", "{tmp}/file/r.json", "is a file, not a folder"),
    ("--report", "/proc/minidnn/r.json", "--report: cannot write '/proc/minidnn/r.json'"),
    ("--trace", "/proc/t.json", "cannot create files in '/proc'"),
    ("--plot", "{tmp}/plots/", "--plot '{tmp}/plots/' names a folder"),
    ("--plot", "{tmp}/m.txt", "must end in one of"),
    ("--plot", "{tmp}/m", "got no extension"),
])
def test_an_output_path_that_cannot_be_written_fails_before_the_first_step(
        capsys, tmp_path, option, path, needle):
    pytest.importorskip("matplotlib")
    (tmp_path / "file").write_text("")
    path, needle = path.format(tmp=tmp_path), needle.format(tmp=tmp_path)
    code, out, err = cli(capsys, *MLP, option, path)
    assert code == 2 and needle in one_error_line(err)
    assert out == ""                                      # not even the first line of a run
    assert not (tmp_path / "plots").exists()


# ---- 2. divergence ---------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_diverging_run_keeps_its_last_good_checkpoint_and_reports_the_step(tmp_path):
    ckpt, report = tmp_path / "c.npz", tmp_path / "r.json"
    with pytest.raises(DivergenceError) as info:
        train(small(model="mlp", lr=1e6, steps=20, log_every=10, checkpoint=str(ckpt),
                    checkpoint_every=1, report=str(report)), log=quiet)
    diverged = info.value.step
    assert diverged is not None and 1 < diverged <= 20
    saved = load_checkpoint(str(ckpt))             # loads: the checksum is of finite numbers
    assert saved.step < diverged
    assert all(np.isfinite(v).all() for v in saved.params.values())
    on_disk = json.loads(report.read_text())
    assert on_disk["diverged_at_step"] == diverged
    assert on_disk["steps"] == len(on_disk["loss"]) == diverged - 1
    assert all(np.isfinite(on_disk["loss"]))
    assert on_disk == json.loads(json.dumps(info.value.report, default=float)) or \
        on_disk["param_checksum"] == info.value.report["param_checksum"]


# ---- 3. one line instead of a traceback -------------------------------------------------------------
def test_a_negative_seed_is_an_argument_error(capsys):
    code, out, err = cli(capsys, *MLP, "--seed", "-1")
    assert code == 2 and "argument --seed: expected an integer >= 0, got '-1'" in \
        one_error_line(err)
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        train(small(seed=-1), log=quiet)


def test_host_memory_exhausted_is_one_line(capsys):
    """A 100000-pixel MLP asks NumPy for tens of GiB at once: refused, not a traceback."""
    code, out, err = cli(capsys, "train", "--model", "mlp", "--image-size", "100000",
                         "--steps", "1", "--no-progress", "--device", "cpu")
    assert code == 2 and "out of host memory" in one_error_line(err)
    assert "--image-size" in err


def test_output_into_a_pipe_that_closes_does_not_stop_the_training(tmp_path):
    report = tmp_path / "r.json"
    child = subprocess.Popen(
        [sys.executable, "-u", "-m", "minidnn", *NET, "--steps", "60", "--eval-every", "1",
         "--eval-batches", "1", "--no-progress", "--device", "cpu", "--report", str(report)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = child.stdout.readline()                  # `| head -1`
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 2, err
    assert first.startswith(b"mlp: ")
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert "minidnn: error: standard output was closed" in err
    assert json.loads(report.read_text())["steps"] == 60     # the run went on to the end


# ---- 5. interrupts ---------------------------------------------------------------------------------
def test_sigint_saves_the_steps_done_and_resume_continues_bit_for_bit(tmp_path):
    ckpt, report = tmp_path / "c.npz", tmp_path / "r.json"

    def press_ctrl_c(message):
        if message.startswith("step 2/"):            # the evaluation line after step 2
            os.kill(os.getpid(), signal.SIGINT)
    # As in a terminal (a background job starts with SIGINT ignored, and keeps it so).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted) as info:
            train(small(steps=8, eval_every=2, checkpoint=str(ckpt), report=str(report)),
                  log=press_ctrl_c)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # given back
    finally:
        signal.signal(signal.SIGINT, previous)
    assert info.value.status == 130 and info.value.step == 2
    assert load_checkpoint(str(ckpt)).step == 2
    on_disk = json.loads(report.read_text())
    assert on_disk["steps"] == 2 and on_disk["interrupted_by"] == "SIGINT"
    resumed = train(small(steps=8, checkpoint=str(ckpt), resume=True), log=quiet)
    straight = train(small(steps=8), log=quiet)
    assert resumed["param_checksum"] == straight["param_checksum"]
    assert on_disk["loss"] + resumed["loss"] == straight["loss"]


def test_an_ignored_sigint_stays_ignored():
    from minidnn.train import StopSignals
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigterm_saves_checkpoint_and_report_and_exits_143(tmp_path):
    ckpt, report = tmp_path / "c.npz", tmp_path / "r.json"
    child = subprocess.Popen(
        [sys.executable, "-m", "minidnn", *NET, "--steps", "100000", "--no-progress",
         "--device", "cpu", "--checkpoint", str(ckpt), "--checkpoint-every", "5",
         "--report", str(report)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not ckpt.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 143, err
    assert "minidnn: interrupted by SIGTERM after step" in err and "Traceback" not in err
    on_disk = json.loads(report.read_text())
    assert on_disk["interrupted_by"] == "SIGTERM"
    assert on_disk["steps"] == load_checkpoint(str(ckpt)).step >= 5
    assert sorted(os.listdir(tmp_path)) == ["c.npz", "r.json"]    # no temp or lock file left


def test_a_killed_writers_temporary_file_is_removed(tmp_path):
    ckpt = tmp_path / "c.npz"
    stale = tmp_path / ".c.npz.x1y2z3.tmp"         # what atomic_write leaves after SIGKILL
    stale.write_bytes(b"half a checkpoint")
    other = tmp_path / ".d.npz.x1y2z3.tmp"         # another checkpoint's: not ours to remove
    other.write_bytes(b"")
    train(small(steps=2, checkpoint=str(ckpt)), log=quiet)
    assert not stale.exists() and other.exists() and ckpt.exists()


# ---- 6. nothing silent -----------------------------------------------------------------------------
def test_checkpoint_every_needs_a_checkpoint(capsys):
    code, _, err = cli(capsys, *MLP, "--checkpoint-every", "2")
    assert code == 2 and "--checkpoint-every 2 needs --checkpoint" in one_error_line(err)


def test_resume_with_nothing_left_to_train_says_so(tmp_path):
    ckpt = str(tmp_path / "c.npz")
    train(small(steps=4, checkpoint=ckpt), log=quiet)
    for steps in (4, 3):
        with pytest.raises(ConfigError, match=f"--steps {steps} is not past the checkpoint.*"
                                              f"at step 4: nothing to train"):
            train(small(steps=steps, checkpoint=ckpt, resume=True), log=quiet)


def test_a_one_class_folder_is_refused(tmp_path):
    from PIL import Image
    (tmp_path / "cats").mkdir()
    for i in range(20):
        Image.fromarray(np.full((8, 8, 3), i, np.uint8)).save(tmp_path / "cats" / f"{i}.png")
    with pytest.raises(DataError, match="has one class folder \\('cats'\\); a classifier needs "
                                        "at least two"):
        train(small(model="mlp", data=str(tmp_path), batch=4, image_size=8), log=quiet)
    with pytest.raises(ConfigError, match="at least two classes"):
        train(small(model="mlp", data="synthetic", num_classes=1, image_size=8), log=quiet)


def test_a_decimal_budget_says_what_it_is_in_bytes(capsys):
    code, out, err = cli(capsys, *MLP, "--memory-budget", "64M")
    assert code == 0, err
    assert "memory budget 61.04 MiB (64,000,000 bytes)" in out


def test_outputs_get_the_users_umask_not_0600(tmp_path):
    old = os.umask(0o027)
    try:
        train(small(steps=2, checkpoint=str(tmp_path / "c.npz"), report=str(tmp_path / "r.json")),
              log=quiet)
    finally:
        os.umask(old)
    for name in ("c.npz", "r.json"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o640, name


def test_two_runs_cannot_write_one_checkpoint(tmp_path):
    ckpt = str(tmp_path / "c.npz")
    with CheckpointLock(ckpt):                     # another run is writing it
        with pytest.raises(CheckpointError, match=f"checkpoint '{ckpt}' is in use by another "
                                                  f"run \\(process {os.getpid()}\\)"):
            train(small(steps=2, checkpoint=ckpt), log=lambda m: pytest.fail("started"))
    assert not os.path.exists(ckpt)
    train(small(steps=2, checkpoint=ckpt), log=quiet)  # free again once the other run ends
    assert load_checkpoint(ckpt).step == 2
