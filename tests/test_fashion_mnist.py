"""Fashion-MNIST and MNIST from IDX files the tests write: reading, errors, grey networks,
epochs with a whole held-out evaluation, augmentation, resume and the curve."""
import gzip
import json
import os
import re
import signal

import numpy as np
import pytest

from minidnn import models
from minidnn.augment import Augment
from minidnn.cli import main
from minidnn.data import BatchLoader, IDXImages, open_data
from minidnn.errors import ConfigError, DataError
from minidnn.idx import read_idx
from minidnn.train import Interrupted, TrainConfig, evaluate, train

N_TRAIN, N_TEST = 48, 13   # 13 test images: batch 8 leaves a partial batch of 5


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic, big-endian sizes, values."""
    header = bytes((0, 0, 8, array.ndim)) + np.asarray(array.shape, ">u4").tobytes()
    return header + np.ascontiguousarray(array, np.uint8).tobytes()


def write_split(folder, prefix, images, labels, gz=True):
    for name, array in ((f"{prefix}-images-idx3-ubyte", images),
                        (f"{prefix}-labels-idx1-ubyte", labels)):
        data = idx_bytes(array)
        path = os.path.join(folder, name + (".gz" if gz else ""))
        with open(path, "wb") as f:
            f.write(gzip.compress(data) if gz else data)


def make_data(folder, gz=True, seed=0):
    """A learnable little data set in IDX files: class k is a bright horizontal band at row
    2k + 4 of a dark noisy 28x28 image."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    for prefix, n in (("train", N_TRAIN), ("t10k", N_TEST)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 60, (n, 28, 28))
        for i, k in enumerate(labels):
            images[i, 2 * k + 4:2 * k + 6, 4:24] = 230
        write_split(folder, prefix, images.astype(np.uint8), labels.astype(np.uint8), gz)
    return str(folder)


@pytest.fixture
def fmnist(tmp_path):
    return make_data(tmp_path / "fmnist")


def test_fashion_mnist_reads_the_official_split_as_one_grey_channel(fmnist):
    sources = open_data(f"fashion-mnist:{fmnist}", 28)
    assert (len(sources.train), len(sources.eval), sources.num_classes) == (N_TRAIN, N_TEST, 10)
    x, y = sources.train.get_batch([0, 13])
    assert x.shape == (2, 1, 28, 28) and x.dtype == np.float32 and list(y) == [0, 3]
    raw = read_idx(os.path.join(fmnist, "train-images-idx3-ubyte.gz"), 3)
    expected = (raw[13] / 255.0 - 0.2860) / 0.3530      # Fashion-MNIST's mean and std
    assert np.allclose(x[1, 0], expected, atol=1e-5)
    assert sources.train.fill == pytest.approx(-0.2860 / 0.3530)
    assert sources.eval.get_batch([12])[1][0] == 2      # the t10k files


def test_mnist_reads_uncompressed_files_with_its_own_statistics(tmp_path):
    folder = make_data(tmp_path / "mnist", gz=False)
    sources = open_data(f"mnist:{folder}", 28)
    x, _ = sources.train.get_batch([0])
    raw = read_idx(os.path.join(folder, "train-images-idx3-ubyte"), 3)
    assert np.allclose(x[0, 0], (raw[0] / 255.0 - 0.1307) / 0.3081, atol=1e-5)


def test_images_are_resized_for_networks_that_need_larger_inputs(fmnist):
    x, _ = IDXImages(fmnist, train=True, image_size=32).get_batch([0, 1])
    assert x.shape == (2, 1, 32, 32)


def test_a_split_resized_once_gives_the_pixels_of_resizing_each_batch(fmnist, monkeypatch):
    import minidnn.data as data
    order = [5, 0, 3, 3, 1]
    cached = IDXImages(fmnist, train=True, image_size=40).get_batch(order)
    monkeypatch.setattr(data, "RESIZED_CACHE_BYTES", 0)        # too big to keep: per batch
    each = IDXImages(fmnist, train=True, image_size=40)
    assert not each._resized._cache
    per_batch = each.get_batch(order)
    assert each._resized._all is None
    np.testing.assert_array_equal(cached[0], per_batch[0])
    np.testing.assert_array_equal(cached[1], per_batch[1])
    assert cached[0].shape == (5, 1, 40, 40)


def corrupt(folder, name, data):
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.mark.parametrize("name,data,message", [
    ("train-images-idx3-ubyte.gz", idx_bytes(np.zeros((4, 28, 28)))[:-100],
     "is cut short: 3,052 bytes, the header's shape \\(4, 28, 28\\) needs 3,152"),
    ("train-images-idx3-ubyte.gz", b"\x00\x00\x08\x01" + bytes(20),
     "has magic number 0x00000801, expected 0x00000803"),
    ("train-labels-idx1-ubyte.gz", idx_bytes(np.zeros(5)), "holds 48 images but .* 5 labels"),
    ("train-labels-idx1-ubyte.gz", idx_bytes(np.full(48, 12)), "has label 12; expected 0..9"),
    ("train-images-idx3-ubyte.gz", b"\x1f\x8b\x08\x00 not really gzip",
     "cannot be read: BadGzipFile|cannot be read: EOFError|cannot be read: error"),
    ("train-images-idx3-ubyte.gz", idx_bytes(np.zeros((2, 3, 3))) + b"extra",
     "is longer than its header says"),
])
def test_a_malformed_file_is_a_data_error_naming_it(fmnist, name, data, message):
    gzipped = data if data[:2] == b"\x1f\x8b" else gzip.compress(data)
    path = corrupt(fmnist, name, gzipped)
    with pytest.raises(DataError, match=message) as e:
        open_data(f"fashion-mnist:{fmnist}", 28)
    assert repr(path) in str(e.value)


def test_a_missing_file_or_folder_is_one_error_line(fmnist, tmp_path, capsys):
    os.remove(os.path.join(fmnist, "t10k-labels-idx1-ubyte.gz"))
    for spec, message in ((f"fashion-mnist:{fmnist}",
                           "t10k-labels-idx1-ubyte'\\[.gz\\] is missing"),
                          (f"mnist:{tmp_path / 'none'}", "mnist folder .* does not exist"),
                          ("mnist", "--data mnist needs the folder")):
        code = main(["train", "--model", "mlp", "--data", spec, "--steps", "1"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("minidnn: error: "), err
        assert re.search(message, err[0]), err[0]


def test_networks_take_their_input_channels_from_the_data():
    net = models.build("resnet18", num_classes=10, image_size=28, in_channels=1)
    assert net.input_shape == (1, 28, 28)
    assert dict(net.parameters())["conv1.weight"].shape == (64, 1, 7, 7)
    assert models.build("tiny_cnn", 10, 28, in_channels=1).input_shape == (1, 28, 28)
    with pytest.raises(ConfigError, match="in_channels must be a positive integer"):
        models.build("tiny_cnn", 10, 28, in_channels=0)


def test_a_model_file_for_grey_data_must_accept_in_channels(tmp_path, fmnist):
    rgb_only = tmp_path / "rgbnet.py"
    rgb_only.write_text("from minidnn.builder import NetBuilder\n"
                        "def build(num_classes, image_size):\n"
                        "    b = NetBuilder('rgbnet', image_size, num_classes)\n"
                        "    b.flatten(); b.linear('fc', num_classes)\n"
                        "    return b.finish()\n")
    with pytest.raises(ConfigError, match="the data has 1 channel.*must accept in_channels="):
        train(TrainConfig(model=str(rgb_only), data=f"fashion-mnist:{fmnist}", steps=1,
                          batch=8, device="cpu", progress=False), log=lambda *_: None)
    grey = tmp_path / "greynet.py"
    grey.write_text(rgb_only.read_text().replace("image_size):", "image_size, in_channels=3):")
                    .replace("num_classes)\n    b.flat", "num_classes, in_channels)\n    b.flat"))
    report = train(TrainConfig(model=str(grey), data=f"fashion-mnist:{fmnist}", steps=2,
                               batch=8, device="cpu", progress=False), log=lambda *_: None)
    assert report["num_params"] == 28 * 28 * 10 + 10


def test_the_whole_held_out_set_is_scored_with_its_partial_last_batch(fmnist):
    """Batch 8 over 13 images (one full batch, one of 5 filled up with repeats) scores what
    batch 13 scores in one full batch: the same accuracy and, to rounding, the same loss."""
    from minidnn.decide import build_executor
    sources = open_data(f"fashion-mnist:{fmnist}", 28)
    results = {}
    for batch in (8, 13):
        net = models.build("tiny_cnn", 10, 28, in_channels=1)
        net.init_params(1)
        net.nodes[-1].layer.label_smoothing = 0.1
        ex = build_executor(net, batch, device="cpu", seed=0)
        try:
            results[batch] = evaluate(ex, sources.eval, batch, None)
        finally:
            ex.close()
    assert results[8]["images"] == results[13]["images"] == N_TEST
    assert results[8]["accuracy"] == results[13]["accuracy"]
    assert results[8]["loss"] == pytest.approx(results[13]["loss"], rel=1e-5)


def test_augmentation_depends_only_on_seed_and_step_and_moves_pixels():
    x = np.random.default_rng(0).standard_normal((6, 1, 8, 8)).astype(np.float32)
    aug = Augment.parse("crop:2,flip")
    assert (aug.crop_padding, aug.flip) == (2, True) and str(aug) == "crop:2,flip"
    draws = aug.draw(np.random.default_rng([1, 2]), 6)
    out = aug.apply(x, draws, fill=-9.0)
    again = aug.apply(x, aug.draw(np.random.default_rng([1, 2]), 6), fill=-9.0)
    assert np.array_equal(out, again)
    for i in range(6):   # each image: x padded with -9, cut at the offset, maybe mirrored
        padded = np.pad(x[i], ((0, 0), (2, 2), (2, 2)), constant_values=-9.0)
        top, left = draws["offsets"][i]
        want = padded[:, top:top + 8, left:left + 8]
        assert np.array_equal(out[i], want[..., ::-1] if draws["flips"][i] else want)
    assert not np.array_equal(out, x)
    with pytest.raises(ConfigError, match="unknown augmentation 'rotate'"):
        Augment.parse("crop,rotate")
    assert not Augment.parse("none")


def test_the_loader_augments_by_seed_and_step_and_a_ranks_rows_match(fmnist):
    data = IDXImages(fmnist)
    aug = Augment.parse("crop,flip")
    whole = BatchLoader(data, 8, seed=3, augment=aug)
    plain = BatchLoader(data, 8, seed=3)
    x2, _ = whole.batch_at(2)
    assert np.array_equal(x2, BatchLoader(data, 8, seed=3, augment=aug).batch_at(2)[0])
    assert not np.array_equal(x2, plain.batch_at(2)[0])
    rank = BatchLoader(data, 8, seed=3, augment=aug, rows=slice(4, 8))
    assert np.array_equal(rank.batch_at(2)[0], x2[4:8])
    with BatchLoader(data, 8, seed=3, augment=aug, start_step=2, steps=1) as loader:
        assert np.array_equal(next(iter(loader))[0], x2)   # the background thread's batch


def recipe_run(fmnist, **overrides):
    cfg = dict(model="tiny_cnn", data=f"fashion-mnist:{fmnist}", batch=8, epochs=2,
               device="cpu", lr=0.05, lr_schedule="cosine", lr_warmup_steps=3,
               label_smoothing=0.1, augment="crop,flip", eval_every=0, eval_batches=None,
               progress=False, log_every=2)
    cfg.update(overrides)
    return TrainConfig(**cfg)


def test_epochs_evaluate_everything_every_epoch_and_resume_bit_identically(fmnist, tmp_path):
    lines = []
    straight = train(recipe_run(fmnist), log=lines.append)
    assert straight["steps"] == 12 and straight["steps_per_epoch"] == 6   # floor(48 / 8)
    assert [r["epoch"] for r in straight["epochs"]] == [1, 2]
    assert all(r["eval_images"] == N_TEST for r in straight["epochs"])
    assert straight["epochs"][0]["train_loss"] == pytest.approx(np.mean(straight["loss"][:6]))
    assert straight["epochs"][1]["lr"] < straight["epochs"][0]["lr"] < 0.05   # cosine
    assert any(line.startswith("epoch 2/2 (step 12/12): training loss") and "(13 images)" in line
               for line in lines), lines
    assert "recipe: 2 epochs of 6 steps; lr cosine from 0.05 over 12 steps, 3 of warm-up; " \
           "label smoothing 0.1; augmentation crop:4,flip" in lines

    # Ctrl-C after the first epoch: the run checkpoints step 6 and stops; resumed, it
    # continues the same schedule and augmentation to the same bits.
    ckpt = str(tmp_path / "run.npz")

    def interrupt_after_epoch_1(line):
        if line.startswith("epoch 1/2"):
            os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(Interrupted):
        train(recipe_run(fmnist, checkpoint=ckpt), log=interrupt_after_epoch_1)
    resumed = train(recipe_run(fmnist, checkpoint=ckpt, resume=True), log=lambda *_: None)
    assert resumed["start_step"] == 6 and [r["epoch"] for r in resumed["epochs"]] == [2]
    assert resumed["loss"] == straight["loss"][6:]
    assert resumed["param_checksum"] == straight["param_checksum"]
    assert resumed["epochs"][0]["accuracy"] == straight["epochs"][1]["accuracy"]


def test_a_resume_with_another_recipe_is_refused(fmnist, tmp_path):
    from minidnn.errors import CheckpointError
    ckpt = str(tmp_path / "run.npz")
    train(recipe_run(fmnist, epochs=1, checkpoint=ckpt), log=lambda *_: None)
    with pytest.raises(CheckpointError, match="augment='crop:4,flip' \\(now 'none'\\)"):
        train(recipe_run(fmnist, checkpoint=ckpt, resume=True, augment="none"),
              log=lambda *_: None)


def test_the_command_line_trains_epochs_and_draws_the_curve(fmnist, tmp_path, capsys):
    report, curve = tmp_path / "r.json", tmp_path / "curve.png"
    code = main(["train", "--model", "mlp", "--data", f"fashion-mnist:{fmnist}",
                 "--batch", "8", "--epochs", "2", "--lr", "0.05", "--lr-schedule", "step",
                 "--warmup-epochs", "1", "--label-smoothing", "0.05", "--augment", "flip",
                 "--no-progress", "--device", "cpu", "--report", str(report),
                 "--curve", str(curve)])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    assert (data["lr_warmup_steps"], data["lr_schedule"], data["augment"]) == (6, "step", "flip")
    assert [e["eval_images"] for e in data["epochs"]] == [N_TEST, N_TEST]
    assert len(data["eval"]) == 2     # every epoch, nothing else
    assert curve.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"training curve: {curve}" in out


@pytest.mark.parametrize("argv,message", [
    (["--epochs", "2", "--steps", "5"], "--epochs 2 and --steps 5: give one of them"),
    (["--steps", "5", "--curve", "c.png"], "draws one point per epoch: it needs --epochs N"),
    (["--epochs", "1", "--warmup-steps", "2", "--warmup-epochs", "1"],
     "warm-up in steps or in epochs, not both"),
    (["--epochs", "1", "--augment", "crop:0"], "crop:P needs a padding P >= 1"),
    (["--epochs", "1", "--lr-schedule", "linear"], "invalid choice: 'linear'"),
])
def test_recipe_errors_are_one_line(fmnist, capsys, argv, message):
    code = main(["train", "--model", "mlp", "--data", f"fashion-mnist:{fmnist}",
                 "--device", "cpu", "--no-progress"] + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("minidnn: error: ")
    assert message in err[0], err[0]


def test_a_crop_pads_each_channel_with_its_own_black():
    """A dataset normalised per channel (CIFAR-10, image folders) pads with its black of each
    channel, (C, 1, 1); here a crop offset of 0 shows the padding rows."""
    from minidnn.augment import Augment
    aug = Augment.parse("crop:2")
    x = np.ones((1, 3, 4, 4), np.float32)
    fill = np.array([-1.0, -2.0, -3.0], np.float32).reshape(3, 1, 1)
    out = aug.apply(x, {"offsets": [(0, 0)]}, fill)
    for c in range(3):
        assert (out[0, c, :2, :] == fill[c, 0, 0]).all() and (out[0, c, 2:, 2:] == 1).all()
