"""The training loop: learning, bit-identical resume, reports, and the README's Python example."""
import json
import os
import re

import numpy as np
import pytest

from minidnn import Executor
from minidnn.errors import CheckpointError, ConfigError
from minidnn.report import REQUIRED_FIELDS, steady_images_per_s, steady_steps
from minidnn.train import DivergenceError, TrainConfig, train
from minidnn.decide import build_executor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small(**overrides):
    """A run of the tiny conv net (conv, pool, dropout) on 16x16 shapes that takes ~1 s."""
    cfg = dict(model="tiny_cnn", batch=16, image_size=16, steps=10, device="cpu", lr=0.05,
               momentum=0.9, weight_decay=1e-4, eval_every=0, eval_batches=2, progress=False,
               log_every=4)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def quiet(*args):
    pass


def test_a_small_network_learns():
    report = train(small(model="mlp", steps=100, batch=32, eval_batches=8), log=quiet)
    loss = report["loss"]
    assert len(loss) == 100
    first, last = np.mean(loss[:10]), np.mean(loss[-10:])
    assert first > 2.0                  # about ln(10) at the start
    assert last < 0.5 * first, (first, last)
    assert report["final_eval_accuracy"] > 0.5   # chance is 0.1
    assert report["step_graphs"] is None         # the CPU replays no step


def test_resume_is_bit_identical(tmp_path):
    ckpt = str(tmp_path / "run.npz")
    straight = train(small(steps=12), log=quiet)
    first_half = train(small(steps=6, checkpoint=ckpt), log=quiet)
    resumed = train(small(steps=12, checkpoint=ckpt, resume=True), log=quiet)
    assert resumed["start_step"] == 6 and resumed["steps"] == 12
    assert first_half["loss"] + resumed["loss"] == straight["loss"]
    assert resumed["param_checksum"] == straight["param_checksum"]
    assert first_half["param_checksum"] != straight["param_checksum"]


def test_periodic_checkpoints_and_resume_checks(tmp_path):
    ckpt = str(tmp_path / "run.npz")
    train(small(steps=8, checkpoint=ckpt, checkpoint_every=3), log=quiet)
    from minidnn.checkpoint import load_checkpoint
    assert load_checkpoint(ckpt).step == 8
    with pytest.raises(CheckpointError, match=r"run.npz.*batch=16 \(now 8\)"):
        train(small(steps=10, batch=8, checkpoint=ckpt, resume=True), log=quiet)
    with pytest.raises(CheckpointError, match="for model 'tiny_cnn', not 'mlp'"):
        train(small(model="mlp", steps=10, checkpoint=ckpt, resume=True), log=quiet)
    with pytest.raises(ConfigError, match="--resume needs --checkpoint"):
        train(small(resume=True), log=quiet)


def test_report_fields(tmp_path):
    path = tmp_path / "reports" / "run.json"
    report = train(small(steps=6, report=str(path), eval_every=3), log=quiet)
    on_disk = json.loads(path.read_text())
    for key in REQUIRED_FIELDS:
        assert key in on_disk, key
    assert on_disk["loss"] == report["loss"]
    assert on_disk["model"] == "tiny_cnn" and on_disk["batch"] == 16
    assert on_disk["image_size"] == 16 and on_disk["device"] == "cpu"
    assert on_disk["policy"] == "none" and on_disk["memory_budget_bytes"] is None
    assert on_disk["steps"] == 6 and len(on_disk["step_time_s"]) == 6
    assert all(t > 0 for t in on_disk["step_time_s"])
    assert all(np.isfinite(on_disk["loss"]))
    assert on_disk["images_per_s"] == pytest.approx(16 * 4 / sum(on_disk["step_time_s"][2:]))
    assert re.fullmatch(r"[0-9a-f]{64}", on_disk["param_checksum"])
    assert on_disk["peak_device_bytes"] > 0 and on_disk["peak_feature_map_bytes"] > 0
    assert on_disk["offloaded_bytes"] in (0, None) and on_disk["prefetched_bytes"] in (0, None)
    assert [e["step"] for e in on_disk["eval"]] == [3, 6]
    assert 0 <= on_disk["final_eval_accuracy"] <= 1
    assert on_disk["math_mode"] == "fp32" and on_disk["minidnn_version"]
    assert os.listdir(path.parent) == ["run.json"]


def test_steady_state_throughput():
    assert steady_images_per_s([5.0, 1.0, 0.5, 0.5], batch=10, warmup_steps=2) == 20.0
    assert steady_images_per_s([0.5], batch=10, warmup_steps=2) == 20.0
    assert steady_images_per_s([], batch=10) is None
    # a step captured as a CUDA graph is left out, as a warm-up step is
    assert steady_images_per_s([5.0, 1.0, 3.0, 0.5, 0.5], batch=10, warmup_steps=2,
                               skip=[2]) == 20.0
    assert steady_steps(5, 2, skip=[2]) == [3, 4] and steady_steps(2, 2) == []


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_divergence_is_reported():
    with pytest.raises(DivergenceError, match="diverged.*--lr"):
        train(small(model="mlp", lr=1e6, steps=20, log_every=1), log=quiet)


def test_bad_settings():
    with pytest.raises(ConfigError, match="batch must be an integer >= 1"):
        train(small(batch=0), log=quiet)
    with pytest.raises(ConfigError, match="alexnet.*image_size >= 55"):
        train(small(model="alexnet", image_size=32), log=quiet)


def test_policies_give_identical_parameters():
    if not hasattr(Executor, "memory_stats"):
        pytest.skip("this executor has no offload policies yet")
    base = train(small(steps=4), log=quiet)
    for policy in ("all", "conv"):
        run = train(small(steps=4, policy=policy), log=quiet)
        assert run["param_checksum"] == base["param_checksum"], policy
        assert run["policy"] == policy
        if policy == "all":
            assert run["offloaded_bytes"] > 0


def test_a_budget_counts_only_what_the_arena_holds():
    """The run's input batches live outside the arena (train.py), so a budget a little above
    the unconstrained step's peak (the planner leaves 1% for fragmentation) moves nothing."""
    base = train(small(steps=3), log=quiet)
    budget = int(base["steady_peak_device_bytes"] * 1.02)
    run = train(small(steps=3, policy="dyn", memory_budget=budget), log=quiet)
    assert run["offloaded_bytes"] == 0 and run["micro_batches"] == 1
    assert run["steady_peak_device_bytes"] <= budget
    assert run["param_checksum"] == base["param_checksum"]


def test_trace_and_plot(tmp_path):
    import inspect
    if "trace" not in inspect.signature(Executor).parameters:
        pytest.skip("this executor has no tracer yet")
    pytest.importorskip("matplotlib")
    trace, plot = tmp_path / "t.json", tmp_path / "m.png"
    train(small(steps=3, trace=str(trace), plot=str(plot)), log=quiet)
    assert "traceEvents" in json.loads(trace.read_text())
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_readme_python_example_runs(tmp_path, monkeypatch):
    text = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README.md has no ```python block"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})


# ---- output files --------------------------------------------------------------------------------
def test_outputs_go_into_folders_that_do_not_exist_yet(tmp_path):
    pytest.importorskip("matplotlib")
    report, trace = tmp_path / "runs" / "r.json", tmp_path / "runs" / "traces" / "t.json"
    plot = tmp_path / "plots" / "m.png"
    train(small(steps=2, report=str(report), trace=str(trace), plot=str(plot)), log=quiet)
    assert json.loads(report.read_text())["steps"] == 2
    assert "traceEvents" in json.loads(trace.read_text())
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_an_output_that_cannot_be_written_is_a_config_error_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    bad = str(blocker / "t.json")
    report = tmp_path / "r.json"
    started = lambda msg: pytest.fail(f"training started: {msg}")   # noqa: E731
    for option in ("trace", "report", "checkpoint"):
        with pytest.raises(ConfigError, match=f"--{option}: cannot write {re.escape(repr(bad))}"
                                              f".*is a file, not a folder"):
            train(small(steps=2, **{"report": str(report), option: bad}), log=started)
    assert not report.exists()


def test_plot_without_matplotlib_fails_before_training(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # import matplotlib now fails
    with pytest.raises(ConfigError, match=r"--plot 'm.png' needs matplotlib.*minidnn\[plot\]"):
        train(small(plot="m.png"), log=lambda msg: pytest.fail(f"training started: {msg}"))


def test_an_import_error_while_writing_names_the_option(tmp_path):
    from minidnn.train import write_output

    def draw(path):
        raise ImportError("No module named 'matplotlib'")
    path = str(tmp_path / "new" / "m.png")
    with pytest.raises(ConfigError, match="--plot: cannot write .*m.png.*matplotlib"):
        write_output("--plot", path, draw)
    assert (tmp_path / "new").is_dir()


# ---- evaluation ----------------------------------------------------------------------------------
def test_evaluating_less_than_one_batch_is_a_data_error():
    from minidnn import models
    from minidnn.data import Shapes
    from minidnn.errors import DataError
    from minidnn.train import evaluate
    net = models.build("mlp", num_classes=10, image_size=8)
    ex = build_executor(net, 16, device="cpu")
    try:
        with pytest.raises(DataError, match="held-out set has 8 images, batch 16"):
            evaluate(ex, Shapes(10, 8, n=8), batch=16, max_batches=4)
        with pytest.raises(DataError, match="max_batches 0"):
            evaluate(ex, Shapes(10, 8, n=64), batch=16, max_batches=0)
        assert evaluate(ex, Shapes(10, 8, n=64), batch=16, max_batches=1)["images"] == 16
    finally:
        ex.close()


# ---- SGD -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("momentum, weight_decay", [(0.9, 1e-2), (0.9, 0.0), (0.0, 1e-2),
                                                    (0.0, 0.0)])
def test_sgd_is_pytorchs_formula_bit_for_bit(momentum, weight_decay):
    from minidnn import SGD
    from minidnn.layers.base import Parameter
    rng = np.random.default_rng(0)
    p = Parameter((64, 33), "zeros")
    p.data = rng.standard_normal(p.shape, dtype=np.float32)
    w, v = p.data.copy(), None
    f32 = np.float32
    opt = SGD([("w", p)], lr=0.1, momentum=momentum, weight_decay=weight_decay)
    for _ in range(4):
        p.grad = rng.standard_normal(p.shape, dtype=np.float32)
        opt.step()
        g = p.grad + f32(weight_decay) * w if weight_decay else p.grad
        if momentum:
            v = g.copy() if v is None else f32(momentum) * v + g
            g = v
        w = w - f32(0.1) * g
        assert p.data.dtype == np.float32
        assert np.array_equal(p.data, w)


@pytest.mark.parametrize("momentum, weight_decay", [(0.9, 5e-4), (0.9, 0.0), (0.0, 5e-4),
                                                    (0.0, 0.0)])
def test_sgd_makes_one_parameter_sized_temporary(momentum, weight_decay):
    import tracemalloc
    from minidnn import SGD
    from minidnn.layers.base import Parameter
    p = Parameter((1024, 1024), "zeros")
    p.data = np.ones(p.shape, np.float32)
    p.grad = np.full(p.shape, 1e-3, np.float32)
    opt = SGD([("w", p)], lr=0.1, momentum=momentum, weight_decay=weight_decay)
    opt.step()                                   # makes the momentum buffer, if any
    nbytes = p.data.nbytes
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        opt.step()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert nbytes <= peak < 1.5 * nbytes
