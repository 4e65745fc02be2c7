"""`minidnn plan`: the per-layer table, the summary, JSON, and predicted against measured."""
import argparse
import json

import pytest

from minidnn.errors import ConfigError, MinidnnError, fmt_bytes
from minidnn.kernels.mapformat import MapFormat
from minidnn.planner import command
from minidnn.planner.planning import ProfileSource
from minidnn.planner.search import InfeasibleBudgetError, budget_to_give


def parse(*argv):
    parser = argparse.ArgumentParser(prog="minidnn")
    command.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["plan", *argv])


def run(*argv) -> str:
    lines = []
    assert command.run(parse(*argv), out=lines.append) == 0
    return "\n".join(lines)


BASE = ("--model", "tiny_cnn", "--batch", "64", "--image-size", "32", "--num-classes", "10",
        "--gpu", "h200")


def plan_json(*argv) -> dict:
    return json.loads(run(*BASE, *argv, "--json"))


def test_the_table_has_a_row_per_layer_and_the_summary():
    loose = plan_json()
    text = run(*BASE, "--memory-budget", str(loose["minimum_budget_bytes"]))
    for column in ("feature map", "keep/offload", "conv plan", "workspace", "fwd ms", "bwd ms",
                   "offload ms", "prefetch ms"):
        assert column in text
    for layer in ("data", "conv1", "relu1", "pool1", "conv2", "fc3", "drop3", "fc4", "loss"):
        assert any(line.startswith(layer + " ") for line in text.splitlines()), layer
    assert "offload" in text.split("plan:")[1].splitlines()[0]
    assert "predicted peak device memory" in text and "predicted step time" in text
    assert f"minimum feasible budget: {fmt_bytes(loose['minimum_budget_bytes'])}" in text
    assert "vDNN_dyn greedy order" in text and "dyn (minidnn planner)" in text
    assert "analytic model of the h200" in text


def test_json_plan_agrees_with_its_table_and_fits():
    loose = plan_json()
    assert loose["plan"]["offload"] == [] and loose["plan"]["fits"]
    assert "no --memory-budget" in " ".join(loose["notes"])
    budget = loose["minimum_budget_bytes"]
    tight = plan_json("--memory-budget", str(budget))
    p = tight["plan"]
    assert p["fits"] and p["required_bytes"] <= tight["usable_bytes"] <= budget
    assert p["offload"] and p["offloaded_bytes"] > 0
    assert p["step_time_s"] >= p["lower_bound_s"] > 0
    from minidnn import models
    nodes = models.build("tiny_cnn", num_classes=10, image_size=32).nodes
    assert [r["layer"] for r in tight["layers"]] == ["data"] + [n.name for n in nodes]
    offloaded_rows = [r["layer"] for r in tight["layers"] if r["status"].startswith("offload")]
    assert set(offloaded_rows) <= set(p["offload"])
    labels = [a["label"] for a in tight["alternatives"]]
    assert labels[0] == "none, fastest plans" and not tight["alternatives"][0]["fits"]


def test_a_relu_its_convolution_applies_takes_no_forward_time_on_a_gpu():
    """float32 maps on the H200: the convolution's cuDNN graph applies the bias and the ReLU
    (minidnn/fusion.py), so the plan gives the ReLU's forward no time; --no-fuse gives it
    its measured pass, and the step is slower by those passes."""
    fused = plan_json("--model", "vgg16", "--batch", "64", "--gpu", "h200")
    apart = plan_json("--model", "vgg16", "--batch", "64", "--gpu", "h200", "--no-fuse")
    relus = {r["layer"]: r for r in fused["layers"] if r["type"] == "ReLU"}
    alone = {r["layer"]: r for r in apart["layers"] if r["type"] == "ReLU"}
    assert relus["relu1_1"]["forward_s"] == 0 < alone["relu1_1"]["forward_s"]
    assert relus["relu6"]["forward_s"] > 0          # after a linear layer: its own pass
    assert relus["relu1_1"]["backward_s"] == alone["relu1_1"]["backward_s"] > 0
    saved = sum(alone[n]["forward_s"] for n in relus if relus[n]["forward_s"] == 0)
    # and a ReLU whose max pool applies its mask and sums its bias's gradient keeps nothing
    # of its backward
    pooled = [n for n in relus if relus[n]["backward_s"] < alone[n]["backward_s"]]
    assert pooled == ["relu1_2", "relu2_2", "relu3_3", "relu4_3", "relu5_3"]
    assert all(relus[n]["backward_s"] == 0 for n in pooled)
    saved += sum(alone[n]["backward_s"] - relus[n]["backward_s"] for n in pooled)
    # and a convolution whose ReLU adds its bias (here in its own epilogue) makes no pass
    # adding it (LayerCost.bias_s); its backward is the same
    convs = {r["layer"]: r for r in fused["layers"] if r["type"] == "Conv2d"}
    plain = {r["layer"]: r for r in apart["layers"] if r["type"] == "Conv2d"}
    assert len(convs) == 13
    assert all(0 < convs[n]["forward_s"] < plain[n]["forward_s"] and
               convs[n]["backward_s"] == plain[n]["backward_s"] for n in convs)
    saved += sum(plain[n]["forward_s"] - convs[n]["forward_s"] for n in convs)
    assert apart["plan"]["compute_time_s"] - fused["plan"]["compute_time_s"] == \
        pytest.approx(saved, rel=1e-6)


def test_k40_and_h200_plans_differ_in_speed_and_link():
    h200 = plan_json("--memory-budget", "1GiB")
    k40 = json.loads(run(*BASE[:-1], "k40", "--memory-budget", "1GiB", "--json"))
    assert k40["math"] == "fp32" and h200["math"] == "tf32"
    assert k40["plan"]["compute_time_s"] > h200["plan"]["compute_time_s"]
    assert k40["bandwidth"]["d2h"] < h200["bandwidth"]["d2h"] / 4


def test_a_budget_below_the_minimum_is_an_error_with_the_minimum():
    loose = plan_json()
    with pytest.raises(InfeasibleBudgetError) as err:
        run(*BASE, "--memory-budget", str(loose["minimum_budget_bytes"] // 2))
    assert isinstance(err.value, MinidnnError)
    assert f"give --memory-budget {budget_to_give(loose['minimum_budget_bytes'])} or more" \
        in str(err.value)
    # A fixed policy is predicted even where nothing fits, and says so.
    text = run(*BASE, "--memory-budget", str(loose["minimum_budget_bytes"] // 2),
               "--policy", "all")
    assert "DOES NOT FIT" in text and "too small" in text


def test_a_run_report_is_compared_with_the_plan(tmp_path):
    loose = plan_json()
    budget = (loose["minimum_budget_bytes"] + loose["plan"]["required_bytes"]) // 2
    planned = plan_json("--memory-budget", str(budget))["plan"]
    report = {"model": "tiny_cnn", "batch": 64, "image_size": 32, "num_classes": 10,
              "device": "gpu", "device_name": "NVIDIA H200", "policy": "dyn",
              "memory_budget_bytes": budget, "steps": 20, "math_mode": "tf32",
              "peak_device_bytes": int(planned["peak_device_bytes"] * 1.02),
              "images_per_s": 64 / (planned["step_time_s"] * 1.25),
              "offloaded_bytes": planned["offloaded_bytes"],
              "prefetched_bytes": planned["prefetched_bytes"]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    out = json.loads(run("--report", str(path), "--json"))    # no GPU here: the h200 model
    assert out["model"] == "tiny_cnn" and out["batch"] == 64 and out["policy"] == "dyn"
    assert "h200" in out["profile_source"]
    rows = {r["quantity"]: r for r in out["comparison"]["rows"]}
    assert rows["peak device memory"]["relative_error"] == pytest.approx(1 / 1.02 - 1, abs=1e-3)
    assert rows["peak device memory"]["within_target"] is True
    assert rows["step time (s)"]["relative_error"] == pytest.approx(1 / 1.25 - 1, rel=1e-6)
    assert rows["step time (s)"]["within_target"] is False
    text = run("--report", str(path))
    assert "predicted against measured" in text and "within 5%: yes" in text
    assert out["comparison"]["differs"] is None and "not the same step" not in text


def test_a_report_in_micro_batches_moves_each_pass_s_bytes_and_may_be_another_step(tmp_path):
    """A run report's bytes moved are its last pass's (Executor.memory_stats): a step of 4
    passes moves 4 times them. A plan whose step is not the run's says so."""
    planned = plan_json()
    report = {"model": "tiny_cnn", "batch": 64, "image_size": 32, "num_classes": 10,
              "device": "gpu", "device_name": "NVIDIA H200", "policy": "dyn",
              "memory_budget_bytes": None, "steps": 20, "math_mode": "tf32",
              "peak_device_bytes": planned["plan"]["peak_device_bytes"],
              "images_per_s": 1000.0, "micro_batches": 4, "chunks": [],
              "offloaded_bytes": 1000, "prefetched_bytes": 900}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    out = json.loads(run("--report", str(path), "--json", "--micro-batches", "4"))
    rows = {r["quantity"]: r for r in out["comparison"]["rows"]}
    assert rows["offloaded bytes per step"]["measured"] == 4000
    assert rows["prefetched bytes per step"]["measured"] == 3600
    assert out["micro_batches"] == 4 and out["comparison"]["differs"] is None
    # Unconstrained, the plan takes one pass where the run took four.
    out = json.loads(run("--report", str(path), "--json"))
    assert out["micro_batches"] == 1
    assert out["comparison"]["differs"] == "the run took 4 micro-batches, this plan one pass"
    assert "not the same step: the run took 4 micro-batches" in run("--report", str(path))


# A GPU run's report, as train writes it, with what plan --report needs.
GPU_REPORT = {"model": "tiny_cnn", "batch": 64, "image_size": 32, "num_classes": 10,
              "device": "gpu", "device_name": "NVIDIA H200", "policy": "dyn",
              "memory_budget_bytes": None, "math_mode": "tf32", "peak_device_bytes": 1}


def planned_specs(tmp_path, monkeypatch):
    """plan(fields, flags) -> the StepSpec plan --report plans for GPU_REPORT with `fields`
    (a dict) and the command-line `flags`."""
    specs = []
    real = command.plan_step
    monkeypatch.setattr(command, "plan_step",
                        lambda net, spec, *a, **k: specs.append(spec) or real(net, spec, *a, **k))
    path = tmp_path / "run.json"

    def plan(fields, flags=()):
        path.write_text(json.dumps(dict(GPU_REPORT, **fields)))
        plan_json_of(parse("--report", str(path), "--gpu", "h200", "--json", *flags))
        return specs[-1]
    return plan


def test_a_run_without_cuda_graphs_is_predicted_without_them(tmp_path, monkeypatch):
    """A GPU run that replayed no step from a CUDA graph (--no-graphs; its report's
    step_graphs is None) is planned with the host issuing every call (StepSpec.graphs False),
    as plan --no-graphs plans it; a report with graphs replayed, or none said (older
    reports), keeps them."""
    plan = planned_specs(tmp_path, monkeypatch)
    for fields, flags, graphs in [({}, (), True), ({"step_graphs": None}, (), False),
                                  ({"step_graphs": {"captured": 2}}, (), True),
                                  ({"step_graphs": {"captured": 2}}, ("--no-graphs",), False)]:
        assert plan(fields, flags).graphs is graphs, (fields, flags)


def test_a_run_with_no_fusion_or_with_bit_masks_is_planned_as_it_ran(tmp_path, monkeypatch):
    """A run's report says whether it fused (--no-fuse) and kept ReLU bit masks; plan
    --report plans the same step (older reports, which say nothing of fusion, fused)."""
    plan = planned_specs(tmp_path, monkeypatch)
    for fields, flags, fuse, bits in [({}, (), True, False), ({"fuse": False}, (), False, False),
                                      ({"fuse": True}, ("--no-fuse",), False, False),
                                      ({"relu_bits": True}, (), True, True)]:
        spec = plan(fields, flags)
        assert (spec.fuse, spec.relu_bits) == (fuse, bits), (fields, flags)


@pytest.mark.parametrize("math_mode, math, deterministic", [
    ("fp32 deterministic", "fp32", True), ("fp32", "fp32", False),
    ("tf32 deterministic", "tf32", True), ("tf32", "tf32", False), ("unknown", "tf32", False)])
def test_the_math_mode_of_a_report_is_planned_for(tmp_path, math_mode, math, deterministic):
    report = {"model": "tiny_cnn", "batch": 64, "image_size": 32, "num_classes": 10,
              "device": "gpu", "device_name": "NVIDIA H200", "policy": "none",
              "memory_budget_bytes": None, "math_mode": math_mode, "peak_device_bytes": 1}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    args = parse("--report", str(path), "--gpu", "h200", "--json")
    settings = command._settings(args, command._load_report(str(path)))
    assert (settings["math"], settings["deterministic"]) == (math, deterministic)
    assert plan_json_of(args)["math"] == math
    # --math on the command line wins over the report's
    other = "tf32" if math == "fp32" else "fp32"
    assert plan_json_of(parse("--report", str(path), "--gpu", "h200", "--math", other,
                              "--json"))["math"] == other


def plan_json_of(args) -> dict:
    lines = []
    assert command.run(args, out=lines.append) == 0
    return json.loads("\n".join(lines))


def test_a_deterministic_run_is_profiled_with_deterministic_algorithms(tmp_path, monkeypatch):
    """On a GPU the plan measures a profile under the report's math mode: both words of it."""
    import minidnn.backend
    import minidnn.kernels
    from minidnn import models
    from minidnn.planner import profile as profiling
    from minidnn.planner.gpus import analytic_profile
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"model": "tiny_cnn", "batch": 64, "image_size": 32,
                                "num_classes": 10, "policy": "none", "peak_device_bytes": 1,
                                "math_mode": "fp32 deterministic"}))
    args = parse("--report", str(path))
    report = command._load_report(str(path))
    s = command._settings(args, report)
    net = models.build("tiny_cnn", num_classes=10, image_size=32)
    configured = {}

    class FakeKernels:
        @staticmethod
        def configure(math, deterministic):
            configured.update(math=math, deterministic=deterministic)

        @staticmethod
        def math_mode():
            return {"math": "tf32", "deterministic": False}

    def fake_get_profile(net, batch, device, refresh=False, relu_bits=frozenset(), maps=None,
                         **_):
        configured["layout"] = maps.layout
        return analytic_profile(net, batch, "h200", configured["math"], relu_bits)
    with monkeypatch.context() as m:   # a GPU as far as the plan command can tell
        m.setattr(minidnn.backend, "gpu_available", lambda: True)
        m.setattr(minidnn.backend, "Device", lambda kind: kind)
        m.setattr(minidnn.kernels, "for_device", lambda device: FakeKernels)
        m.setattr(profiling, "get_profile", fake_get_profile)
        where, source = command._profile_source(args, s, report)
        prof = where.at(net, 64, maps=MapFormat(s["layout"], s["precision"]))
    # measured in the run's layout: the report has none, so the GPU's default
    assert configured == {"math": "fp32", "deterministic": True, "layout": "nhwc"}
    assert prof.math == "fp32" and "measured profile of this" in source


@pytest.mark.parametrize("reported, flag, planned", [
    (None, None, "nhwc"), ("nchw", None, "nchw"), ("nhwc", None, "nhwc"),
    ("nhwc", "nchw", "nchw")])
def test_the_layout_of_a_report_is_planned_for(tmp_path, reported, flag, planned):
    report = {"model": "tiny_cnn", "batch": 64, "image_size": 32, "num_classes": 10,
              "device": "gpu", "device_name": "NVIDIA H200", "policy": "none",
              "memory_budget_bytes": None, "peak_device_bytes": 1}
    if reported:
        report["layout"] = reported
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    extra = ("--layout", flag) if flag else ()
    assert plan_json_of(parse("--report", str(path), "--gpu", "h200", "--json",
                              *extra))["layout"] == planned


def test_missing_model_and_bad_report_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        run("--gpu", "h200")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError):
        run("--report", str(bad))


def test_relu_bit_masks_lower_the_least_budget():
    """Unfused, tiny_cnn's ReLUs (each before a max pool) keeping bits lower the least
    budget; fused, their pools apply their masks and they keep nothing, bits or not, which
    is lower still (minidnn/fusion.py)."""
    plain = plan_json("--no-fuse")
    bits = plan_json("--relu-bits", "--no-fuse")
    assert bits["minimum_budget_bytes"] < plain["minimum_budget_bytes"]
    fused = plan_json()
    assert fused["minimum_budget_bytes"] == plan_json("--relu-bits")["minimum_budget_bytes"] \
        <= bits["minimum_budget_bytes"]


def test_bf16_maps_are_planned_at_their_bytes(tmp_path):
    """--precision bf16 (or a bf16 run's report) plans half-size feature maps: a lower least
    budget, the precision said in the JSON and in the header, and a note that the times are
    the profile's."""
    # one pass: split into 64 passes of one image, the least budget is mostly parameters,
    # to which bf16 adds the weights' bf16 copies
    plain = plan_json("--micro-batches", "1")
    half = plan_json("--precision", "bf16", "--micro-batches", "1")
    assert plain["precision"] == "fp32" and half["precision"] == "bf16"
    assert half["minimum_budget_bytes"] < plain["minimum_budget_bytes"]
    assert any("feature maps in bf16" in n for n in half["notes"])
    assert "feature maps bf16" in run(*BASE, "--precision", "bf16").splitlines()[1]
    report = tmp_path / "run.json"     # a bf16 run's report, and --precision over it
    report.write_text(json.dumps({"model": "tiny_cnn", "batch": 64, "image_size": 32,
                                  "num_classes": 10, "policy": "none", "precision": "bf16",
                                  "memory_budget_bytes": None, "peak_device_bytes": 1}))
    for extra, want in (((), "bf16"), (("--precision", "fp32"), "fp32")):
        args = parse("--report", str(report), "--gpu", "h200", "--json", *extra)
        assert plan_json_of(args)["precision"] == want


def test_dyn_chooses_the_prefetch_lookahead_unless_given():
    from minidnn.planner.search import LOOKAHEADS
    loose = plan_json()
    tight = plan_json("--memory-budget", str(loose["minimum_budget_bytes"]))
    assert tight["prefetch_lookahead"] in LOOKAHEADS
    assert any("prefetch lookahead" in n and "chosen" in n for n in tight["notes"])
    fixed = plan_json("--memory-budget", str(2 * loose["minimum_budget_bytes"]),
                      "--prefetch-lookahead", "2")
    assert fixed["prefetch_lookahead"] == 2
    assert not any("chosen" in n for n in fixed["notes"])


def test_a_plan_that_fits_carries_no_note_that_the_budget_is_too_small():
    """At the least budget of the unfused step only lookahead 0 fits; the lookaheads that
    failed must not leave a note that contradicts the plan that was found."""
    least = plan_json("--policy", "dyn", "--no-fuse")["minimum_budget_bytes"]
    out = plan_json("--policy", "dyn", "--memory-budget", str(least), "--no-fuse")
    assert out["plan"]["fits"] and out["prefetch_lookahead"] == 0
    assert not any("too small" in note for note in out["notes"]), out["notes"]
    text = run(*BASE, "--policy", "dyn", "--memory-budget", str(least), "--no-fuse")
    assert "too small" not in text


class FakeMeasured(ProfileSource):
    """A source that 'measures': the h200's analytic profile at every batch, the profiles
    measured at a pass's batch (`measured_at`, listed in `measured`) with every layer's time
    multiplied by `speed`."""

    def __init__(self, speed: float = 1.0, **fields):
        super().__init__(**fields)
        self.speed, self.measured = speed, []

    def at(self, net, batch, relu_bits=frozenset(), maps=None):
        from minidnn.planner.gpus import analytic_profile
        return analytic_profile(net, batch, "h200", "tf32", relu_bits)

    def measured_at(self, net, batch, relu_bits=frozenset(), maps=None):
        from dataclasses import replace
        self.measured.append(batch)
        prof, k = self.at(net, batch, relu_bits, maps), self.speed
        return replace(prof, layers={
            name: replace(cost, forward_s={a: v * k for a, v in cost.forward_s.items()},
                          backward_s={a: v * k for a, v in cost.backward_s.items()})
            for name, cost in prof.layers.items()})


def test_on_a_gpu_the_chosen_count_is_planned_again_from_its_own_measured_profile(monkeypatch):
    """As a run's dyn policy does: the micro-batch count chosen from the step's profile, scaled,
    is planned again from a profile measured at the pass's batch."""
    loose = plan_json()
    tight = plan_json("--memory-budget", str(loose["minimum_budget_bytes"]))
    assert tight["micro_batches"] > 1
    source = FakeMeasured(device="gpu")
    monkeypatch.setattr(command, "_profile_source", lambda args, s, report: (
        source, "measured (test)"))
    again = plan_json("--memory-budget", str(loose["minimum_budget_bytes"]))
    assert source.measured and set(source.measured) == {64 // tight["micro_batches"]}
    assert again["micro_batches"] == tight["micro_batches"]
    assert any("planned again from profiles measured" in n for n in again["notes"])


@pytest.mark.parametrize("split", [False, True])
def test_a_report_that_split_batch_statistics_is_planned_split(tmp_path, split):
    """A run allowed to split BatchNorm's batch (train --split-batch-statistics) says so in
    its report, and `plan --report` plans that run's passes; without it the split is refused."""
    report = {"model": "resnet18", "batch": 8, "image_size": 16, "num_classes": 10,
              "device": "gpu", "device_name": "NVIDIA H200", "policy": "dyn",
              "memory_budget_bytes": None, "peak_device_bytes": 1,
              "split_batch_statistics": split}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    args = parse("--report", str(path), "--gpu", "h200", "--json", "--micro-batches", "2")
    if split:
        assert plan_json_of(args)["micro_batches"] == 2
    else:
        with pytest.raises(ConfigError, match="split-batch-statistics"):
            plan_json_of(args)


@pytest.mark.parametrize("speed, runs", [(0.1, 2), (2.0, 1)])
def test_a_split_option_close_to_the_chosen_one_pass_is_measured_and_runs_where_faster(
        monkeypatch, speed, runs):
    """The scaled profile chooses one pass; two passes predicted within REMEASURE_WITHIN of
    it are planned again from profiles measured at their own batch, and run where those
    predict them faster (here the pass batch's layers take `speed` times the scaled time):
    the profile at the pass's batch decides, not the scaled one."""
    from minidnn.planner import planning
    monkeypatch.setattr(planning, "REMEASURE_WITHIN", 10.0)   # every split option is close
    # A budget just under the unconstrained peak: one pass fits moving nothing, and two
    # passes are planned too.
    budget = int(plan_json()["plan"]["peak_device_bytes"] * 0.95)
    source = FakeMeasured(device="gpu", speed=speed)
    monkeypatch.setattr(command, "_profile_source", lambda args, s, report: (
        source, "measured (test)"))
    out = plan_json("--memory-budget", str(budget), "--chunks", "none")
    assert source.measured == [32]
    assert out["micro_batches"] == runs
    said = [n for n in out["notes"] if "planned again from profiles measured" in n]
    assert bool(said) == (runs > 1)
    if runs > 1:
        assert "faster than one pass of 64, the scaled profile's choice" in said[0], said
    marked = [o["micro_batches"] for o in out["micro_batch_options"] if o["chosen"]]
    assert marked == [runs]      # the table marks the option the step runs


def test_the_report_of_a_cpu_run_is_planned_on_the_cpu(tmp_path, capsys):
    """`minidnn plan --report RUN.json` of a CPU run measures this CPU, as the run planned:
    the least budget `train` named on the CPU fits (the H200's model, which a GPU-less
    machine plans with otherwise, counts the GPU's temporaries and refused it)."""
    from minidnn.cli import main
    from minidnn.train import TrainConfig, train
    common = dict(model="vgg11", image_size=32, batch=4, device="cpu", data="synthetic",
                  policy="dyn", relu_bits=True, eval_every=0, eval_batches=1,
                  progress=False)
    with pytest.raises(InfeasibleBudgetError) as refused:
        train(TrainConfig(steps=1, memory_budget=4096, **common), log=lambda *a: None)
    report = tmp_path / "run.json"
    train(TrainConfig(steps=2, memory_budget=int(refused.value.minimum),
                      report=str(report), **common), log=lambda *a: None)
    capsys.readouterr()
    assert main(["plan", "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "measured profile of this CPU" in out
    peak = next(line for line in out.splitlines() if line.strip().startswith("peak device"))
    assert "within 5%: yes" in peak


def test_a_vdnn_policy_in_micro_batches_is_planned_from_the_pass_batchs_own_profile(monkeypatch):
    """A vDNN policy's one decision in K passes is priced from a profile measured at the pass's
    batch, as dyn's chosen split is: scaled from the step's, its layers' times (a fully
    connected layer reads its weights whatever the batch) came out other than a run's. Here
    the pass batch's layers take `speed` times the analytic model's time."""
    compute = {}
    for speed in (1.0, 3.0):
        source = FakeMeasured(device="gpu", speed=speed)
        monkeypatch.setattr(command, "_profile_source", lambda args, s, report: (
            source, "measured (test)"))
        out = plan_json("--policy", "none", "--micro-batches", "4")
        assert set(source.measured) == {16}
        compute[speed] = out["plan"]["compute_time_s"]
    assert compute[3.0] > 2 * compute[1.0], compute
