"""Nothing a user did is lost: a checkpoint is replaced only when asked, outputs never collide,
and a run stopped part-way (full disk, no memory, a second Ctrl-C) leaves a partial report.
Each case ends with one `minidnn: error:` line."""
import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from minidnn.checkpoint import load_checkpoint, peek_checkpoint
from minidnn.errors import CheckpointError, ConfigError, HostMemoryError
from minidnn.executor import Executor
from minidnn.outputs import check_not_backward
from minidnn.train import DivergenceError, Interrupted, StopSignals, train

from test_cli import one_error_line, run as cli
from test_faults import quiet, small as faults_small

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ("train", "--model", "mlp", "--image-size", "16", "--batch", "8", "--no-progress",
       "--device", "cpu", "--eval-batches", "1")
MLP = RUN + ("--steps", "3")


def small(**overrides):
    """test_faults' small run, on the MLP at batch 8 (a second or so)."""
    return faults_small(**dict(dict(model="mlp", batch=8, steps=4, eval_batches=1,
                                    log_every=2), **overrides))


# ---- an existing checkpoint ----------------------------------------------------------------------
def test_a_rerun_without_resume_does_not_replace_a_checkpoint(tmp_path):
    ckpt = str(tmp_path / "c.npz")
    train(small(checkpoint=ckpt), log=quiet)
    before = load_checkpoint(ckpt).meta["param_checksum"]
    for model in ("mlp", "tiny_cnn"):   # the same model or another: refused before step one
        with pytest.raises(CheckpointError, match="already holds step 4 of model 'mlp'; "
                                                  "continue it with --resume or replace it "
                                                  "with --overwrite"):
            train(small(model=model, checkpoint=ckpt, steps=2), log=quiet)
    assert load_checkpoint(ckpt).meta["param_checksum"] == before
    train(small(checkpoint=ckpt, steps=2, overwrite=True), log=quiet)
    assert load_checkpoint(ckpt).step == 2


def test_a_diverging_rerun_leaves_a_later_good_checkpoint_alone(tmp_path, capsys):
    """The reported case: a good step-18 checkpoint, then a diverging run with
    --checkpoint-every 1 that used to replace it with its own step 1."""
    ckpt = str(tmp_path / "c.npz")
    train(small(checkpoint=ckpt, steps=18, log_every=18), log=quiet)
    good = load_checkpoint(ckpt).meta["param_checksum"]
    code, out, err = cli(capsys, *RUN, "--steps", "20", "--lr", "1e6", "--checkpoint", ckpt,
                         "--checkpoint-every", "1")
    assert code == 2 and "--resume or replace it with --overwrite" in one_error_line(err)
    assert out == ""
    assert load_checkpoint(ckpt).step == 18
    assert load_checkpoint(ckpt).meta["param_checksum"] == good


def test_a_checkpoint_never_goes_back_in_steps(tmp_path):
    ckpt = str(tmp_path / "c.npz")
    train(small(checkpoint=ckpt, steps=3), log=quiet)
    check_not_backward(ckpt, 3)    # the same step, or a later one, may replace it
    check_not_backward(ckpt, 4)
    with pytest.raises(CheckpointError, match="holds step 3, later than this run's step 1"):
        check_not_backward(ckpt, 1)


def test_a_file_that_is_not_a_checkpoint_is_never_overwritten(tmp_path, capsys):
    important = tmp_path / "important.txt"
    important.write_text("years of work\n")
    for extra in ((), ("--overwrite",)):
        code, out, err = cli(capsys, *MLP, "--checkpoint", str(important), *extra)
        assert code == 2 and "is an existing file that is not a minidnn checkpoint; it is " \
                             "never overwritten" in one_error_line(err)
    assert important.read_text() == "years of work\n"
    assert peek_checkpoint(str(important)) is None


# ---- colliding outputs ---------------------------------------------------------------------------
@pytest.mark.parametrize("first,second,same", [
    ("--report", "--checkpoint", "r.json"),
    ("--trace", "--plot", "t.png"),
    ("--report", "--trace", "sub/../r.json"),
])
def test_two_outputs_that_name_one_file_are_refused(tmp_path, capsys, first, second, same):
    if "--plot" in (first, second):
        pytest.importorskip("matplotlib")
    (tmp_path / "sub").mkdir()
    code, out, err = cli(capsys, *MLP, first, str(tmp_path / "r.json" if "sub" in same else
                                                   tmp_path / same),
                         second, str(tmp_path / same))
    assert code == 2 and f"{first} and {second} both name" in one_error_line(err)
    assert out == "" and not (tmp_path / "r.json").exists()


def test_a_linked_output_is_the_same_file(tmp_path, capsys):
    ckpt = tmp_path / "c.npz"
    os.symlink(ckpt, tmp_path / "link.json")
    code, out, err = cli(capsys, *MLP, "--checkpoint", str(ckpt), "--report",
                         str(tmp_path / "link.json"))
    assert code == 2 and "both name" in one_error_line(err)


def test_no_other_output_replaces_a_checkpoint(tmp_path, capsys):
    ckpt = str(tmp_path / "c.npz")
    train(small(checkpoint=ckpt, steps=1), log=quiet)
    code, out, err = cli(capsys, *MLP, "--report", ckpt)
    assert code == 2 and "is a minidnn checkpoint; it is not overwritten" in one_error_line(err)
    assert load_checkpoint(ckpt).step == 1


# ---- stopped part-way: a partial report ----------------------------------------------------------
def test_a_full_disk_leaves_a_partial_report_and_one_line(tmp_path, capsys, monkeypatch):
    ckpt, report = tmp_path / "c.npz", tmp_path / "r.json"
    real_savez, calls = np.savez, []

    def savez(f, **arrays):   # the checkpoint of step 2 is written, that of step 4 is not
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_savez(f, **arrays)

    monkeypatch.setattr(np, "savez", savez)
    code, out, err = cli(capsys, *RUN, "--steps", "6", "--checkpoint", str(ckpt),
                         "--checkpoint-every", "2", "--report", str(report))
    line = one_error_line(err)
    assert code == 2 and "No space left on device" in line and "(partial)" in line
    on_disk = json.loads(report.read_text())
    assert on_disk["partial"] is True and "No space left" in on_disk["partial_reason"]
    assert on_disk["steps"] == len(on_disk["loss"]) == 4
    assert load_checkpoint(str(ckpt)).step == 2            # the last good one is kept


@pytest.mark.parametrize("error,needle", [
    (MemoryError(), "out of host memory after step 2"),
    (HostMemoryError("pinned host memory for offloaded maps exhausted"), "exhausted"),
])
def test_exhausted_host_memory_leaves_a_partial_report(tmp_path, capsys, monkeypatch, error,
                                                       needle):
    report = tmp_path / "r.json"
    real_step, calls = Executor.train_step, []

    def train_step(self, *args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise error
        return real_step(self, *args, **kw)

    monkeypatch.setattr(Executor, "train_step", train_step)
    code, out, err = cli(capsys, *RUN, "--steps", "5", "--report", str(report))
    line = one_error_line(err)
    assert code == 2 and needle in line and f"{report}' (partial)" in line
    on_disk = json.loads(report.read_text())
    assert on_disk["partial"] is True and on_disk["steps"] == 2 == len(on_disk["loss"])


def test_a_second_sigint_during_the_shutdown_leaves_a_partial_report(tmp_path, capsys,
                                                                       monkeypatch):
    """Ctrl-C after step 3; a second Ctrl-C while the checkpoint of the interrupt is written."""
    import minidnn.train as train_module
    ckpt, report = tmp_path / "c.npz", tmp_path / "r.json"
    real_step, real_save, steps = Executor.train_step, train_module.save_checkpoint, []

    def train_step(self, *args, **kw):
        steps.append(1)
        loss = real_step(self, *args, **kw)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    def save_checkpoint(path, *args, step, **kw):
        if step == 3:
            os.kill(os.getpid(), signal.SIGINT)   # the handler raises here, mid-write
            time.sleep(1)
        real_save(path, *args, step=step, **kw)

    monkeypatch.setattr(Executor, "train_step", train_step)
    monkeypatch.setattr(train_module, "save_checkpoint", save_checkpoint)
    code, out, err = cli(capsys, *RUN, "--steps", "8", "--checkpoint", str(ckpt),
                         "--checkpoint-every", "2", "--report", str(report))
    line = one_error_line(err)
    assert code == 130
    assert "a second SIGINT stopped the run at once after step 3" in line
    assert "holds step 2" in line and "(partial)" in line
    on_disk = json.loads(report.read_text())
    assert on_disk["partial"] is True and on_disk["interrupted_by"] == "SIGINT"
    assert on_disk["steps"] == 3 and "second SIGINT" in on_disk["partial_reason"]
    assert load_checkpoint(str(ckpt)).step == 2
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]   # no half-written file


def test_a_signal_while_setting_up_stops_at_once(monkeypatch, tmp_path):
    """Profiling (--policy dyn) can take minutes on a CPU: Ctrl-C must not wait for it."""
    from minidnn.planner import profile

    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path))   # no cached profile: it must measure

    def measure_layers(*args, **kw):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)   # a long profile: the signal ends it at once
        raise AssertionError("the profile went on after Ctrl-C")

    monkeypatch.setattr(profile, "measure_layers", measure_layers)
    started = time.perf_counter()
    with pytest.raises(Interrupted, match="before the first step") as info:
        train(small(policy="dyn", memory_budget=2**30), log=quiet)
    assert time.perf_counter() - started < 20
    assert info.value.status == 130


def test_after_the_first_step_a_signal_waits_for_the_step():
    with StopSignals() as stop:
        stop.arm()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM        # noted, not raised
        with pytest.raises(KeyboardInterrupt):      # a second one does not wait
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert stop.second == signal.SIGTERM


# ---- one line, or quiet ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [("summary", "--model", "alexnet"), ("models",),
                                  ("plan", "--model", "tiny_cnn", "--batch", "4")])
def test_a_closed_pipe_ends_printing_commands_quietly(argv):
    child = subprocess.Popen([sys.executable, "-m", "minidnn", *argv], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()        # `| head -0`: the reader is gone before the first line
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0, err
    assert err == ""


def test_a_rendezvous_file_in_a_missing_folder_is_one_line(capsys):
    code, out, err = cli(capsys, *MLP, "--ranks", "2", "--rank", "0", "--rendezvous",
                         "file:/nonexistent/x.addr")
    assert code == 2 and "the folder '/nonexistent' does not exist" in one_error_line(err)


def test_a_plan_figure_matplotlib_cannot_write_is_one_line(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, out, err = cli(capsys, "plan", "--model", "tiny_cnn", "--batch", "4", "--timeline",
                         str(tmp_path / "x.txt"))
    assert code == 2 and "--timeline" in one_error_line(err) and "must end in one of" in err
    assert out == ""


def test_ctrl_c_while_the_command_imports_is_one_line():
    """The handler minidnn/__init__.py installs for the command: a SIGINT that arrives while
    the package is still importing ends it with status 130 and no traceback."""
    code = ("import os, signal, sys, time; sys.argv = ['minidnn']; import minidnn; "
            "os.kill(os.getpid(), signal.SIGINT); time.sleep(5); print('went on')")
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert child.returncode == 130 and child.stdout == ""
    assert child.stderr == "minidnn: interrupted\n"


def test_a_library_import_keeps_its_own_ctrl_c():
    code = ("import signal, sys; sys.argv = ['my_script.py']; import minidnn; "
            "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert child.stdout.strip() == "True", child.stderr


def test_an_infinite_lr_is_refused_like_nan():
    for lr in (float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="lr must be a positive finite number"):
            train(small(lr=lr), log=quiet)


def test_no_runtime_warning_comes_before_the_divergence_message():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DivergenceError):
            train(small(lr=1e6, steps=20, log_every=1), log=quiet)
    assert [w for w in caught if issubclass(w.category, RuntimeWarning)] == []
