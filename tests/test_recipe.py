"""A run's evaluation follows its length in TrainConfig itself (recipe.evaluation_defaults),
so `minidnn train --epochs N` and `train(TrainConfig(epochs=N))` evaluate alike: the whole
held-out set at the end of every epoch."""
import json

import pytest

from minidnn.cli import main
from minidnn.recipe import AUTO, EVAL_BATCHES_OF_STEPS, EVAL_EVERY_OF_STEPS, evaluation_defaults
from minidnn.train import TrainConfig, train
from test_fashion_mnist import N_TEST, make_data


def test_evaluation_follows_the_run_length_unless_told():
    assert (TrainConfig().eval_every, TrainConfig().eval_batches) == (AUTO, AUTO)
    assert evaluation_defaults(TrainConfig()) == {"eval_every": EVAL_EVERY_OF_STEPS,
                                                  "eval_batches": EVAL_BATCHES_OF_STEPS}
    assert evaluation_defaults(TrainConfig(epochs=3)) == {"eval_every": 0, "eval_batches": None}
    assert evaluation_defaults(TrainConfig(epochs=3, eval_every=5, eval_batches=2)) == \
        {"eval_every": 5, "eval_batches": 2}
    assert evaluation_defaults(TrainConfig(eval_batches=None)) == \
        {"eval_every": EVAL_EVERY_OF_STEPS, "eval_batches": None}


@pytest.mark.parametrize("value", ["often", -1])
def test_a_bad_evaluation_setting_is_still_refused(value):
    from minidnn.errors import ConfigError
    with pytest.raises(ConfigError, match="eval-every must be an integer"):
        train(TrainConfig(eval_every=value, device="cpu", progress=False))


def test_the_api_and_the_cli_evaluate_an_epoch_run_alike(tmp_path):
    folder = make_data(tmp_path / "fmnist")
    settings = dict(model="tiny_cnn", data=f"fashion-mnist:{folder}", batch=8, epochs=2,
                    device="cpu")
    api = train(TrainConfig(progress=False, **settings), log=lambda *_: None)
    report = tmp_path / "cli.json"
    argv = ["train", "--no-progress", "--report", str(report)]
    for key, value in settings.items():
        argv += ["--" + key.replace("_", "-"), str(value)]
    assert main(argv) == 0
    cli = json.loads(report.read_text())
    assert [(e["step"], e["images"]) for e in api["eval"]] == [(6, N_TEST), (12, N_TEST)]
    assert cli["eval"] == json.loads(json.dumps(api["eval"]))
    assert cli["param_checksum"] == api["param_checksum"]
