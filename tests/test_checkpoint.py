"""Checkpoints: round trip, atomic writes, and a clear error for every kind of bad file."""
import os
import zipfile

import numpy as np
import pytest

from minidnn import SGD, models
from minidnn.checkpoint import (atomic_write, load_checkpoint, restore, save_checkpoint)
from minidnn.data import Shapes
from minidnn.errors import CheckpointError
from minidnn.decide import build_executor


def trained_mlp(steps=2, num_classes=10, seed=0):
    net = models.build("mlp", num_classes=num_classes, image_size=8)
    ex = build_executor(net, 4, device="cpu", seed=seed)
    opt = SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    x, y = Shapes(num_classes, 8, n=8, seed=seed).get_batch(np.arange(4))
    for _ in range(steps):
        ex.train_step(x, y, opt)
    return net, opt


def test_round_trip(tmp_path):
    net, opt = trained_mlp()
    path = str(tmp_path / "run.npz")
    save_checkpoint(path, net, opt, step=2, model="mlp", seed=0, config={"batch": 4})
    ckpt = load_checkpoint(path)
    assert ckpt.step == 2 and ckpt.model == "mlp" and ckpt.meta["config"] == {"batch": 4}
    assert ckpt.meta["param_checksum"] == net.param_checksum()
    assert [n for n, _ in ckpt.meta["params"]] == [n for n, _ in net.parameters()]

    fresh = models.build("mlp", num_classes=10, image_size=8)
    fresh.init_params(seed=123)
    fresh_opt = SGD(fresh.parameters(), lr=0.5, momentum=0.5)
    restore(ckpt, fresh, fresh_opt, model="mlp")
    assert fresh.param_checksum() == net.param_checksum()
    for name, value in net.state_dict().items():
        assert np.array_equal(fresh.state_dict()[name], value)
    assert (fresh_opt.lr, fresh_opt.momentum, fresh_opt.weight_decay) == (0.05, 0.9, 1e-4)
    for name, v in opt.state_dict()["velocity"].items():
        assert np.array_equal(fresh_opt.state_dict()["velocity"][name], v)


def test_a_failed_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    net, opt = trained_mlp(steps=1)
    path = str(tmp_path / "run.npz")
    save_checkpoint(path, net, opt, step=1, model="mlp")
    before = open(path, "rb").read()

    net2, opt2 = trained_mlp(steps=3)

    def failing_savez(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")   # some bytes reach the disk, then the write dies
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(np, "savez", failing_savez)
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*No space left"):
        save_checkpoint(path, net2, opt2, step=3, model="mlp")
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["run.npz"]            # no temporary file left behind
    assert load_checkpoint(path).step == 1


def test_atomic_write_replaces_only_on_success(tmp_path):
    path = tmp_path / "f.txt"
    atomic_write(str(path), lambda f: f.write(b"old"))

    def boom(f):
        f.write(b"new but incomplete")
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        atomic_write(str(path), boom)
    assert path.read_bytes() == b"old"
    atomic_write(str(path), lambda f: f.write(b"new"))
    assert path.read_bytes() == b"new" and os.listdir(tmp_path) == ["f.txt"]


@pytest.fixture
def saved(tmp_path):
    net, opt = trained_mlp()
    path = tmp_path / "run.npz"
    save_checkpoint(str(path), net, opt, step=2, model="mlp")
    return path


def test_missing_and_truncated_files(tmp_path, saved):
    with pytest.raises(CheckpointError, match="nothing.npz.*does not exist"):
        load_checkpoint(str(tmp_path / "nothing.npz"))
    data = saved.read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.npz"):
        load_checkpoint(str(cut))
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.npz.*corrupt or truncated"):
        load_checkpoint(str(empty))
    text = tmp_path / "text.npz"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="text.npz"):
        load_checkpoint(str(text))


def test_flipped_bytes_in_an_entry_are_caught(tmp_path, saved):
    data = bytearray(saved.read_bytes())
    with zipfile.ZipFile(saved) as z:
        info = z.getinfo("param/fc2.weight.npy")
    # Past the local header and the .npy header, into the array bytes.
    offset = info.header_offset + 30 + len(info.filename) + 200
    data[offset] ^= 0xFF
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="flipped.npz.*param/fc2.weight"):
        load_checkpoint(str(bad))


def test_missing_entry_and_meta(tmp_path, saved):
    with np.load(saved) as npz:
        arrays = {k: npz[k] for k in npz.files}
    partial = tmp_path / "partial.npz"
    np.savez(partial, **{k: v for k, v in arrays.items() if k != "param/fc1.bias"})
    with pytest.raises(CheckpointError, match="partial.npz.*missing the entry 'param/fc1.bias'"):
        load_checkpoint(str(partial))
    no_meta = tmp_path / "nometa.npz"
    np.savez(no_meta, **{k: v for k, v in arrays.items() if k != "meta.json"})
    with pytest.raises(CheckpointError, match="nometa.npz.*'meta.json'"):
        load_checkpoint(str(no_meta))
    arrays["meta.json"] = np.frombuffer(b"{not json", np.uint8)
    bad_meta = tmp_path / "badmeta.npz"
    np.savez(bad_meta, **arrays)
    with pytest.raises(CheckpointError, match="badmeta.npz.*'meta.json' is corrupt"):
        load_checkpoint(str(bad_meta))


def test_wrong_model_and_shape_mismatch(saved):
    ckpt = load_checkpoint(str(saved))
    other = models.build("mlp", num_classes=10, image_size=8)
    with pytest.raises(CheckpointError, match="run.npz.*for model 'mlp', not 'tiny_cnn'"):
        restore(ckpt, other, model="tiny_cnn")
    five = models.build("mlp", num_classes=5, image_size=8)
    with pytest.raises(CheckpointError, match=r"run.npz.*'param/fc3.weight' has shape \(10, 64\)"
                                              r".*expects \(5, 64\)"):
        restore(ckpt, five, model="mlp")
    cnn = models.build("tiny_cnn", num_classes=10, image_size=8)
    with pytest.raises(CheckpointError, match="run.npz.*missing the entry 'param/conv1.weight'"):
        restore(ckpt, cnn)
