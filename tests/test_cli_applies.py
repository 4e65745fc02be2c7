"""Flags that would do nothing are refused or warned about, and a CPU run that would take hours
or more RAM than there is is refused in seconds with what to run instead."""
import json
import re
import time

import numpy as np

import pytest

from minidnn import models
from minidnn.cpu_check import (MAX_RUN_S, MAX_STEP_S, check_cpu_memory, check_cpu_time,
                               cpu_step_bytes, step_flops)
from minidnn.errors import CheckpointError, ConfigError, HostMemoryError
from minidnn.memory import host
from minidnn.train import TrainConfig, train

from test_cli import one_error_line, run as cli

MLP = ("train", "--model", "mlp", "--image-size", "16", "--batch", "8", "--steps", "2",
       "--no-progress", "--device", "cpu", "--eval-batches", "1")


# ---- flags that do nothing -----------------------------------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (("--policy", "none", "--prefetch-lookahead", "2"),
     "--prefetch-lookahead applies to feature maps offloaded"),
    (("--policy", "none", "--host-link-gbps", "12"), "--policy none makes no plan"),
    (("--policy", "all", "--host-link-gbps", "12"), "--policy all makes no plan"),
])
def test_a_flag_the_policy_never_reads_is_refused(capsys, argv, needle):
    code, out, err = cli(capsys, *MLP, *argv)
    assert code == 2 and needle in one_error_line(err)
    assert out == ""


def test_the_default_lookahead_is_not_a_choice(capsys):
    code, out, err = cli(capsys, *MLP, "--policy", "none")
    assert code == 0, err


@pytest.mark.parametrize("argv,needle", [
    (("--math", "tf32"), "--math tf32 changes nothing on the CPU"),
])
def test_gpu_only_flags_on_the_cpu_are_warned_about(capsys, argv, needle):
    code, out, err = cli(capsys, *MLP, *argv)
    assert code == 0
    assert err.strip().splitlines() == [f"minidnn: warning: {needle}" + err.split(needle)[1]
                                        .splitlines()[0]]


def test_a_checkpoint_resumes_only_in_its_precision(tmp_path):
    pytest.importorskip("ml_dtypes")
    ckpt = str(tmp_path / "c.npz")
    cfg = dict(model="mlp", image_size=16, batch=8, steps=2, device="cpu", eval_every=0,
               eval_batches=1, progress=False, checkpoint=ckpt)
    train(TrainConfig(**cfg), log=lambda *a: None)
    cfg.update(steps=4, resume=True)
    with pytest.raises(CheckpointError, match="written by a --precision fp32 run; resume it "
                                              "with --precision fp32, not bf16"):
        train(TrainConfig(**cfg, precision="bf16"), log=lambda *a: None)
    assert train(TrainConfig(**cfg), log=lambda *a: None)["steps"] == 4


def test_the_micro_batches_help_says_what_does_not_shrink(capsys):
    code, out, err = cli(capsys, "train", "--help")
    text = " ".join(out.split())
    assert "feature maps of batch/K, while weights, their gradients and momentum do not " \
           "shrink" in text


def test_a_second_pass_sums_convolution_weight_gradients_through_a_temporary():
    """Why --micro-batches 2 can raise the peak (the help says so): every pass after the first
    writes a convolution's weight gradient into a temporary as large as the weight; a fully
    connected layer's gradients are computed once a step from the rows every pass keeps
    (minidnn/gathered.py: less than its weight), so an MLP's passes take no weight-sized
    temporary: they hold the rows."""
    def peaks(model):
        return {k: train(TrainConfig(model=model, image_size=16, batch=8, steps=1,
                                     device="cpu", eval_every=0, eval_batches=1,
                                     progress=False, micro_batches=k),
                         log=lambda *a: None)["memory"] for k in (1, 2)}
    cnn = peaks("tiny_cnn")
    conv2 = 4 * int(np.prod(models.build("tiny_cnn", num_classes=10, image_size=16)
                            .node("conv2").layer.params["weight"].shape))
    assert cnn[2]["peak_device_bytes"] - cnn[1]["device_in_use_bytes"] >= conv2
    mlp = peaks("mlp")
    from minidnn.gathered import held_bytes, weight_bytes
    net = models.build("mlp", num_classes=10, image_size=16)
    net.infer_shapes(8)
    linears = [node.layer for node in net.nodes if node.layer.kind == "linear"]
    rows = [held_bytes(fc, 8, np.dtype(np.float32)) for fc in linears]
    rows = [r for r, fc in zip(rows, linears) if r < weight_bytes(fc)]   # those gathered
    assert rows and mlp[2]["peak_device_bytes"] <= mlp[1]["peak_device_bytes"] + sum(rows)
    assert sum(rows) < max(weight_bytes(fc) for fc in linears)


# ---- a laptop is safe ----------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ("--precision", "bf16"),
    ("--policy", "dyn"),
])
def test_vgg16_at_batch_256_on_the_cpu_is_refused_in_seconds(capsys, argv):
    started = time.perf_counter()
    code, out, err = cli(capsys, "train", "--model", "vgg16", "--data", "synthetic", "--batch",
                         "256", "--device", "cpu", "--no-progress", *argv)
    assert time.perf_counter() - started < 30
    line = one_error_line(err)
    assert code == 2 and "on the CPU this run would take about" in line
    assert "try --batch" in line and "--device gpu" in line and "--force" in line


def test_the_time_estimate_against_a_known_rate():
    net = models.build("vgg16", num_classes=1000, image_size=224)
    flops = step_flops(net, 256)
    assert 23e12 < flops < 25e12           # 3 x VGG-16's 15.5 GMAC forward, x 256 images
    with pytest.raises(ConfigError, match=r"try --batch (\d+)") as info:
        check_cpu_time(net, 256, 200, "none", rate=lambda: 1e10)
    fits = int(re.search(r"try --batch (\d+)", str(info.value)).group(1))
    # The suggested batch fits both limits at that rate; twice it would not.
    small = step_flops(net, fits)
    assert small / 1e10 <= MAX_STEP_S and small * 200 / 1e10 <= MAX_RUN_S
    check_cpu_time(net, fits, 200, "none", rate=lambda: 1e10)
    # dyn profiles first: three more steps' worth.
    one_run = int(MAX_RUN_S * 1e10 / step_flops(net, 1))
    check_cpu_time(net, 1, one_run, "none", rate=lambda: 1e10)
    with pytest.raises(ConfigError):
        check_cpu_time(net, 1, one_run, "dyn", rate=lambda: 1e10)


def test_a_small_run_is_not_even_measured():
    net = models.build("mlp", num_classes=10, image_size=16)

    def rate():
        raise AssertionError("no need to measure")
    check_cpu_time(net, 8, 200, "dyn", rate=rate)


def test_more_ram_than_there_is_is_refused_even_with_force(capsys, monkeypatch):
    net = models.build("mlp", num_classes=10, image_size=16)
    need = cpu_step_bytes(net, 64)
    check_cpu_memory(net, 64, "none", None, available=lambda: need)
    half = (need + cpu_step_bytes(net, 1)) // 2    # about what batch 32 needs
    with pytest.raises(HostMemoryError, match=r"try --batch (\d+)") as info:
        check_cpu_memory(net, 64, "none", None, available=lambda: half)
    fits = int(re.search(r"try --batch (\d+)", str(info.value)).group(1))
    assert 24 <= fits <= 40
    check_cpu_memory(net, fits, "none", None, available=lambda: half)   # it does fit
    with pytest.raises(HostMemoryError):
        check_cpu_memory(net, fits + 2, "none", None, available=lambda: half)
    monkeypatch.setattr(host, "available_host_bytes", lambda: half)
    code, out, err = cli(capsys, *MLP, "--batch", "64", "--force")
    assert code == 2 and "out of host memory: on the CPU a training step needs" in \
        one_error_line(err)


# ---- the trace and the plot count steps from 1 -------------------------------------------------
def test_the_trace_of_a_3_step_run_says_step_3(tmp_path):
    trace = tmp_path / "t.json"
    train(TrainConfig(model="mlp", image_size=16, batch=8, steps=3, device="cpu",
                      eval_every=0, eval_batches=1, progress=False, trace=str(trace)),
          log=lambda *a: None)
    steps = {e["args"]["step"] for e in json.loads(trace.read_text())["traceEvents"]
             if e["ph"] == "X"}
    assert steps == {3}


def test_a_traced_step_is_not_counted_in_the_steady_speed(tmp_path):
    """The traced step issues its calls one by one with events around each (a held one
    slower still): the report's images/s leaves it out, as it leaves out the warm-up."""
    from minidnn.report import steady_images_per_s
    report = train(TrainConfig(model="mlp", image_size=16, batch=8, steps=5, device="cpu",
                               eval_every=0, eval_batches=1, progress=False,
                               trace=str(tmp_path / "t.json")), log=lambda *a: None)
    times = report["step_time_s"]
    assert report["images_per_s"] == pytest.approx(8 * 2 / sum(times[2:4]))
    assert report["images_per_s"] != steady_images_per_s(times, 8, 2)
    assert report["steady_steps"] == 2


def test_a_run_with_no_steady_step_says_its_speed_is_of_every_step(tmp_path):
    """Three steps, two of warm-up and the last traced: none is steady. The speed is of all
    three, and the report and the summary say so."""
    from minidnn.train import summary_lines
    report = train(TrainConfig(model="mlp", image_size=16, batch=8, steps=3, device="cpu",
                               eval_every=0, eval_batches=1, progress=False,
                               trace=str(tmp_path / "t.json")), log=lambda *a: None)
    assert report["steady_steps"] == 0
    assert report["images_per_s"] == pytest.approx(8 * 3 / sum(report["step_time_s"]))
    line = [s for s in summary_lines(report) if "images/s" in s][0]
    assert "over all 3 steps: none was steady" in line and "steady state" not in line


@pytest.mark.parametrize("argv,needle", [
    (("--trace-held",), "--trace-held holds the steps that --trace records"),
    (("--trace-held", "--trace", "t.json"), "--trace-held holds a GPU stream"),
])
def test_a_held_trace_needs_a_trace_and_a_gpu(capsys, tmp_path, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, *MLP, *argv)
    assert code == 2 and needle in one_error_line(err)
    assert not (tmp_path / "t.json").exists()


def test_the_plot_title_says_the_last_step(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    titles = []
    real_savefig = plt.Figure.savefig

    def savefig(fig, *args, **kw):
        titles.extend(ax.get_title() for ax in fig.axes)
        return real_savefig(fig, *args, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    train(TrainConfig(model="mlp", image_size=16, batch=8, steps=3, device="cpu",
                      eval_every=0, eval_batches=1, progress=False,
                      plot=str(tmp_path / "m.png")), log=lambda *a: None)
    assert any("over step 3 " in t for t in titles), titles


def test_augmenting_synthetic_data_is_refused(capsys):
    code, out, err = cli(capsys, "train", "--model", "mlp", "--data", "synthetic",
                         "--image-size", "16", "--batch", "4", "--steps", "1",
                         "--augment", "flip", "--no-progress", "--device", "cpu")
    assert code == 2 and "--augment flip: synthetic data" in one_error_line(err)
