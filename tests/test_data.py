"""Datasets and the background batch loader."""
import os
import pickle
import threading
import time

import numpy as np
import pytest

from minidnn.augment import Augment
from minidnn.data import (CIFAR10, IMAGENET_MEAN, IMAGENET_STD, BatchLoader, ImageFolder,
                          Shapes, SyntheticImages, open_data)
from minidnn.errors import ConfigError, DataError


# ---- Shapes --------------------------------------------------------------------------------------

def test_shapes_is_deterministic_and_split():
    a = Shapes(10, 24, n=50, seed=3)
    x1, y1 = a.get_batch([0, 7, 13])
    x2, y2 = Shapes(10, 24, n=50, seed=3).get_batch([0, 7, 13])
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert x1.dtype == np.float32 and x1.shape == (3, 3, 24, 24)
    assert y1.dtype == np.int64 and list(y1) == [0, 7, 3]
    # One example does not depend on which batch it is fetched in.
    assert np.array_equal(a.get_batch([13])[0][0], x1[2])
    other_seed = Shapes(10, 24, n=50, seed=4).get_batch([0])[0]
    held_out = Shapes(10, 24, n=50, seed=3, split="eval").get_batch([0])[0]
    assert not np.array_equal(other_seed[0], x1[0])
    assert not np.array_equal(held_out[0], x1[0])


def test_shapes_are_balanced_and_normalised():
    ds = Shapes(10, 32, n=200, seed=0)
    x, y = ds.get_batch(np.arange(200))
    assert np.bincount(y).tolist() == [20] * 10
    assert abs(float(x.mean())) < 0.15 and 0.8 < float(x.std()) < 1.2


def test_shapes_classes_differ_in_form():
    # Mean images per class over many random draws differ: horizontal vs vertical bars are
    # transposes of each other on average, so they must not be equal.
    ds = Shapes(10, 16, n=400, seed=1)
    x, y = ds.get_batch(np.arange(400))
    gray = x.mean(axis=1)
    horizontal, vertical = gray[y == 0].mean(0), gray[y == 1].mean(0)
    assert np.abs(horizontal - vertical).max() > 0.3
    assert np.abs(horizontal - vertical.T).mean() < np.abs(horizontal - vertical).mean()


def test_shapes_arguments():
    with pytest.raises(ConfigError, match="num_classes must be 2..10"):
        Shapes(num_classes=11)
    with pytest.raises(ConfigError, match="image_size >= 8"):
        Shapes(image_size=4)
    with pytest.raises(IndexError):
        Shapes(n=4).get_batch([4])


# ---- SyntheticImages -----------------------------------------------------------------------------

def test_synthetic_images():
    ds = SyntheticImages(num_classes=5, image_shape=(3, 9, 9), seed=2, n=100)
    x, y = ds.get_batch([1, 3])
    assert x.shape == (2, 3, 9, 9) and x.dtype == np.float32
    assert y.dtype == np.int64 and ((0 <= y) & (y < 5)).all()
    assert np.array_equal(ds.get_batch([3])[0][0], x[1])

    class Cpu:
        is_gpu = False
    pool = ds.device_batches(4, Cpu(), count=2)
    assert len(pool) == 2 and pool[0][0].shape == (4, 3, 9, 9)


# ---- ImageFolder ---------------------------------------------------------------------------------

def _png(path, array):
    from PIL import Image
    Image.fromarray(np.asarray(array, dtype=np.uint8)).save(path)


def _folder(tmp_path, classes=("cat", "dog"), per_class=3):
    root = tmp_path / "images"
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            _png(root / name / f"{i}.png", np.full((10, 14, 3), 40 * c + i, np.uint8))
    return root


def test_image_folder_loads_resizes_and_normalises(tmp_path):
    root = _folder(tmp_path)
    # A wide image whose middle is white and whose outer columns are black: the centre crop
    # keeps only white.
    wide = np.zeros((8, 16, 3), np.uint8)
    wide[:, 4:12] = 255
    _png(root / "dog" / "wide.png", wide)
    (root / "dog" / "notes.txt").write_text("not an image")
    ds = ImageFolder(str(root), image_size=8)
    assert ds.classes == ["cat", "dog"] and ds.num_classes == 2 and len(ds) == 7
    x, y = ds.get_batch(range(len(ds)))
    assert x.shape == (7, 3, 8, 8) and x.dtype == np.float32
    assert y.tolist() == [0, 0, 0, 1, 1, 1, 1]
    mean = np.array(IMAGENET_MEAN, np.float32)[:, None, None]
    std = np.array(IMAGENET_STD, np.float32)[:, None, None]
    np.testing.assert_allclose(x[1], (np.full((3, 8, 8), 1 / 255, np.float32) - mean) / std,
                               rtol=1e-5, atol=1e-5)
    white = (np.ones((3, 8, 8), np.float32) - mean) / std
    np.testing.assert_allclose(x[6], white, atol=1e-5)   # 'wide.png' sorts last


def test_image_folder_split(tmp_path):
    root = _folder(tmp_path, per_class=12)
    train = ImageFolder(str(root), 8, split="train", eval_every=4)
    held_out = ImageFolder(str(root), 8, split="eval", eval_every=4)
    assert len(train) == 18 and len(held_out) == 6
    assert not {p for p, _ in train.samples} & {p for p, _ in held_out.samples}


def test_image_folder_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        ImageFolder(str(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="empty.*no class folders"):
        ImageFolder(str(empty))
    (empty / "cls").mkdir()
    with pytest.raises(DataError, match="cls.*has no images"):
        ImageFolder(str(empty))
    root = _folder(tmp_path)
    (root / "cat" / "broken.png").write_bytes(b"\x89PNG not really")
    ds = ImageFolder(str(root), 8)
    index = [p for p, _ in ds.samples].index(str(root / "cat" / "broken.png"))
    with pytest.raises(DataError, match="cannot read image .*broken.png"):
        ds.get_batch([index])


# ---- CIFAR-10 ------------------------------------------------------------------------------------

def _cifar(tmp_path, n=6):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, n)]
        with open(root / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f)
    return tmp_path


def test_cifar10_reads_the_python_batches(tmp_path):
    parent = _cifar(tmp_path)
    train = CIFAR10(str(parent), train=True)
    test = CIFAR10(str(parent / "cifar-10-batches-py"), train=False)
    assert len(train) == 30 and len(test) == 6 and train.num_classes == 10
    x, y = train.get_batch([0, 29])
    assert x.shape == (2, 3, 32, 32) and x.dtype == np.float32 and y.dtype == np.int64
    with open(parent / "cifar-10-batches-py" / "data_batch_1", "rb") as f:
        raw = pickle.load(f, encoding="bytes")
    assert y[0] == raw[b"labels"][0]
    pixel = raw[b"data"][0].reshape(3, 32, 32)[:, 5, 7] / 255.0
    expected = (pixel - np.array([0.4914, 0.4822, 0.4465])) / np.array([0.2470, 0.2435, 0.2616])
    np.testing.assert_allclose(x[0, :, 5, 7], expected, rtol=1e-5)
    big = CIFAR10(str(parent), train=False, image_size=40)
    assert big.get_batch([1])[0].shape == (1, 3, 40, 40)


def test_cifar10_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        CIFAR10(str(tmp_path / "nope"))
    parent = _cifar(tmp_path)
    root = parent / "cifar-10-batches-py"
    os.remove(root / "data_batch_3")
    with pytest.raises(DataError, match="data_batch_3.*missing"):
        CIFAR10(str(parent))
    with pytest.raises(DataError, match="test_batch.*corrupt"):
        (root / "test_batch").write_bytes(b"\x80\x04garbage")
        CIFAR10(str(parent), train=False)
    # A pickle that would call a function is refused, not run.
    (root / "test_batch").write_bytes(pickle.dumps(os.getcwd))
    with pytest.raises(DataError, match="test_batch.*refusing"):
        CIFAR10(str(parent), train=False)
    with open(root / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DataError, match="entry 'data'"):
        CIFAR10(str(parent), train=False)


# ---- BatchLoader ---------------------------------------------------------------------------------

class Numbered:
    """A dataset whose example i is the number i; records the threads that load it."""
    num_classes = 10
    image_shape = (1, 1, 1)

    def __init__(self, n, delay=0.0, fail_at=None):
        self.n, self.delay, self.fail_at = n, delay, fail_at
        self.threads = set()
        self.loaded = []

    def __len__(self):
        return self.n

    def get_batch(self, indices):
        self.threads.add(threading.current_thread().name)
        idx = np.asarray(indices)
        if self.fail_at is not None and self.fail_at in idx:
            raise DataError(f"example {self.fail_at} is broken")
        time.sleep(self.delay)
        self.loaded.append(idx.copy())
        return idx.astype(np.float32).reshape(-1, 1, 1, 1), idx % 10


def _indices(loader, steps):
    with loader:
        return [x[:, 0, 0, 0].astype(int).tolist() for x, _ in loader][:steps]


def test_batch_order_is_a_function_of_seed_and_step():
    full = _indices(BatchLoader(Numbered(20), 4, seed=5, steps=12), 12)
    resumed = _indices(BatchLoader(Numbered(20), 4, seed=5, start_step=7, steps=5), 5)
    assert resumed == full[7:]
    again = _indices(BatchLoader(Numbered(20), 4, seed=5, steps=12), 12)
    assert again == full
    other = _indices(BatchLoader(Numbered(20), 4, seed=6, steps=12), 12)
    assert other != full
    # Each epoch (5 batches of 4 out of 20) is a permutation of the whole dataset.
    for epoch in range(2):
        seen = sorted(i for b in full[5 * epoch:5 * epoch + 5] for i in b)
        assert seen == list(range(20))
    assert full[:5] != full[5:10]
    loader = BatchLoader(Numbered(20), 4, seed=5)
    assert loader.indices(8).tolist() == full[8]


def test_no_shuffle_and_drop_last():
    plain = _indices(BatchLoader(Numbered(10), 4, shuffle=False), 10)
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7]]            # one pass, the last 2 dropped
    keep = _indices(BatchLoader(Numbered(10), 4, shuffle=False, drop_last=False), 10)
    assert keep == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(DataError, match="fewer than one batch"):
        BatchLoader(Numbered(3), 4)


def test_loading_happens_in_a_bounded_background_thread():
    data = Numbered(400)
    loader = BatchLoader(data, 2, seed=0, steps=100, prefetch=3)
    it = iter(loader)
    next(it)
    time.sleep(0.3)  # the thread fills the queue, then must wait for the consumer
    assert data.threads == {"minidnn-batch-loader"}
    # consumed 1, queue of 3, one batch in the thread's hands: at most 5 loaded
    assert len(data.loaded) <= 5
    loader.close()
    assert loader.thread is None
    assert not any(t.name == "minidnn-batch-loader" and t.is_alive()
                   for t in threading.enumerate())


def test_a_channels_last_loader_gives_the_same_values_in_nhwc_memory_order():
    """BatchLoader(layout='nhwc'): each batch holds the values of the plain loader's,
    as the (N, C, H, W) view of a C-contiguous (N, H, W, C) array (what a channels-last input
    buffer is copied from as it is); augmentation and a rank's rows come first."""
    data = Shapes(10, 12, n=40, seed=1)
    kw = dict(seed=3, steps=3, rows=slice(1, 5), augment=Augment.parse("crop:2,flip"))
    with BatchLoader(data, 6, **kw) as plain, \
            BatchLoader(data, 6, layout="nhwc", **kw) as last:
        for (x, y), (xl, yl) in zip(plain, last):
            assert x.flags.c_contiguous and not xl.flags.c_contiguous
            assert xl.shape == x.shape == (4, 3, 12, 12)
            assert xl.transpose(0, 2, 3, 1).flags.c_contiguous
            assert np.array_equal(xl, x) and np.array_equal(yl, y)


def test_loader_errors_reach_the_consumer():
    loader = BatchLoader(Numbered(40, fail_at=17), 4, shuffle=False, steps=10)
    with pytest.raises(DataError, match="example 17 is broken"):
        with loader:
            for _ in loader:
                pass


def test_open_data(tmp_path):
    shapes = open_data("shapes", 16, seed=1)
    assert shapes.num_classes == 10 and shapes.eval is not None
    assert shapes.train.image_shape == (3, 16, 16)
    synthetic = open_data("synthetic", 8, num_classes=3)
    assert synthetic.num_classes == 3 and synthetic.eval is None
    cifar = open_data(f"cifar10:{_cifar(tmp_path)}", 32)
    assert len(cifar.train) == 30 and len(cifar.eval) == 6
    folder = open_data(str(_folder(tmp_path, per_class=10)), 8)
    assert folder.num_classes == 2 and len(folder.eval) == 2
    with pytest.raises(DataError, match="expected shapes, synthetic"):
        open_data("imagenet", 8)
    with pytest.raises(ConfigError, match="does not match"):
        open_data(f"cifar10:{tmp_path}", 32, num_classes=5)
