"""A network whose BatchNorm layers keep its step to one pass (whole-batch statistics) under a
budget is told what --split-batch-statistics would give, where that is much faster: by the
planner (DynPolicy.notes, `minidnn plan`'s notes) and by `minidnn train` as a note line."""
import json

from minidnn import models
from minidnn.cli import main
from minidnn.decide import decide
from minidnn.planner.dyn import RUN_INPUT_BATCHES, DynPolicy
from minidnn.planner.planning import SPLIT_STATISTICS_GAIN
from minidnn.spec import StepSpec


def _plan(capsys, *flags):
    assert main(["plan", "--model", "resnet50", "--batch", "256", "--gpu", "h200",
                 "--policy", "dyn", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_whole_batch_step_in_a_small_budget_is_told_what_splitting_gives(capsys):
    whole = _plan(capsys, "--memory-budget", "6GiB")
    split = _plan(capsys, "--memory-budget", "6GiB", "--split-batch-statistics")
    note = next(n for n in whole["notes"] if "--split-batch-statistics (" in n)
    whole_ms = whole["plan"]["step_time_s"] * 1e3
    split_ms = split["plan"]["step_time_s"] * 1e3
    assert whole_ms > SPLIT_STATISTICS_GAIN * split_ms
    # The note names the split `plan --split-batch-statistics` plans, and both predictions.
    assert f"predicted {whole_ms:.1f} ms" in note and f"predicts {split_ms:.1f} ms" in note
    assert f"{split['micro_batches']} micro-batches" in note
    # The same line from the policy a run plans with.
    policy = DynPolicy(gpu="h200", input_batches=RUN_INPUT_BATCHES)   # as a run's
    net = models.build("resnet50", num_classes=1000)
    decide(net, StepSpec(batch=256, policy=policy, memory_budget="6GiB", layout="nhwc"))
    assert policy.notes == (note,)


def test_no_such_note_where_the_whole_batch_fits_or_a_split_is_allowed(capsys):
    roomy = _plan(capsys, "--memory-budget", "18GiB")
    assert not any("--split-batch-statistics (" in n for n in roomy["notes"])
    assert any(n.startswith("not split into micro-batches") for n in roomy["notes"])
    split = _plan(capsys, "--memory-budget", "6GiB", "--split-batch-statistics")
    assert not any("BatchNorm" in n for n in split["notes"])


def test_train_prints_the_policys_notes(monkeypatch):
    """`minidnn train` prints what the planning policy found worth saying, one note a line
    (here a stand-in note: the real one needs a budget that a split beats by 20%)."""
    from minidnn.planner import planning
    from minidnn.train import TrainConfig, train
    monkeypatch.setattr(planning, "statistics_note", lambda *a, **k: "a stand-in note")
    lines = []
    train(TrainConfig(model="resnet18", image_size=16, batch=4, steps=1, device="cpu",
                      eval_every=0, eval_batches=1, progress=False, policy="dyn",
                      memory_budget=256 * 2**20), log=lines.append)
    assert "note: a stand-in note" in lines
