"""Data: datasets that hand out batches by index, and a loader that fetches them in the background.

A dataset has `num_classes`, `image_shape` (C, H, W), `len()` and
`get_batch(indices) -> (x float32 (n, C, H, W), y int64 (n,))`. Every example is a pure
function of its index (and the dataset's seed), and `BatchLoader` makes the batch order a pure
function of (seed, step), so a run resumed at step k sees exactly the batches it would have
seen.

    Shapes          procedurally drawn shapes, the small learnable default (CPU-friendly)
    SyntheticImages random ImageNet-shaped images for speed and memory measurements
    ImageFolder     one subfolder per class (Pillow: resize, centre crop, normalise)
    CIFAR10         the python-pickle batches of CIFAR-10 (data_batch_1..5, test_batch)
    IDXImages       MNIST and Fashion-MNIST from their IDX files (minidnn/idx.py)

A batch loader may also augment each batch (minidnn/augment.py) in its background thread,
with draws that depend only on (seed, step).

`open_data(spec, ...)` turns the CLI's `--data` string into a (train, held-out) pair.
"""
from __future__ import annotations

import os
import pickle
import queue
import threading
from dataclasses import dataclass

import numpy as np

from . import idx
from .augment import AUGMENT_STREAM, Augment
from .errors import ConfigError, DataError

# What every batch is, whatever the maps a step stores: images x and labels y (an executor
# with bf16 maps converts x into its own data buffer). A plan that counts the batches a caller
# holds on the device counts them at these (planner/step_model.py).
IMAGE_DTYPE, LABEL_DTYPE = np.dtype(np.float32), np.dtype(np.int64)


class Dataset:
    """Base of the datasets: indexable examples of one image shape. `fill`: the value of a
    black pixel as get_batch gives it (0 where images are not normalised; a normalising
    dataset sets its own, per channel (C, 1, 1) or one float), what a crop pads with."""

    num_classes: int
    image_shape: tuple
    fill = 0.0

    def __len__(self) -> int:
        raise NotImplementedError

    def get_batch(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """x: float32 (len(indices), C, H, W); y: int64 (len(indices),)."""
        raise NotImplementedError


# ---- Shapes: the learnable default ---------------------------------------------------------------

SHAPE_CLASSES = ("horizontal bar", "vertical bar", "diagonal bar", "anti-diagonal bar", "disc",
                 "ring", "checkerboard", "cross", "square frame", "triangle")


class Shapes(Dataset):
    """Ten classes of drawn shapes (SHAPE_CLASSES) in random colours, places and sizes, with noise.

    Example i of a split is drawn from a generator seeded by (seed, split, i), so the data need
    no storage and are the same on every machine. Labels cycle through the classes (balanced).
    The class is the shape alone: colour, position, size and noise vary within a class, so a
    network has to learn orientation and form. Pixels are normalised to about mean 0, std 1.
    """

    _SPLITS = {"train": 0, "eval": 1}
    # Mean and standard deviation of the drawn pixels (measured over 500 images).
    PIXEL_MEAN, PIXEL_STD = np.float32(0.27), np.float32(0.245)

    def __init__(self, num_classes: int = 10, image_size: int = 32, n: int = 4096, seed: int = 0,
                 split: str = "train"):
        if not 2 <= int(num_classes) <= len(SHAPE_CLASSES):
            raise ConfigError(f"Shapes has {len(SHAPE_CLASSES)} shape classes; num_classes must "
                              f"be 2..{len(SHAPE_CLASSES)}, got {num_classes}")
        if int(image_size) < 8:
            raise ConfigError(f"Shapes needs image_size >= 8 to draw shapes, got {image_size}")
        if split not in self._SPLITS:
            raise ConfigError(f"Shapes split must be 'train' or 'eval', got {split!r}")
        if int(n) < 1:
            raise ConfigError(f"Shapes needs n >= 1 examples, got {n}")
        self.num_classes = int(num_classes)
        self.size = int(image_size)
        self.image_shape = (3, self.size, self.size)
        self.n = int(n)
        self.seed = int(seed)
        self.split = split
        # Pixel centres in [0, 1]; shared by every drawing.
        c = (np.arange(self.size, dtype=np.float32) + 0.5) / self.size
        self._yy, self._xx = np.meshgrid(c, c, indexing="ij")

    def __len__(self) -> int:
        return self.n

    def label(self, index: int) -> int:
        return int(index) % self.num_classes

    def get_batch(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        x = np.empty((len(indices),) + self.image_shape, dtype=IMAGE_DTYPE)
        y = np.empty(len(indices), dtype=LABEL_DTYPE)
        for j, i in enumerate(indices):
            if not 0 <= i < self.n:
                raise IndexError(f"Shapes({self.split}) has {self.n} examples, asked for {i}")
            y[j] = self.label(i)
            x[j] = self._draw(int(i), int(y[j]))
        return x, y

    def _draw(self, index: int, label: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self._SPLITS[self.split], index])
        cx, cy = rng.uniform(0.3, 0.7, 2)
        r = rng.uniform(0.2, 0.3)             # half the shape's extent, in image widths
        w = rng.uniform(0.06, 0.09)           # half a stroke's thickness
        dx, dy = self._xx - cx, self._yy - cy
        mask = _shape_mask(label, dx, dy, r, w)
        background = rng.uniform(0.0, 0.4, 3).astype(np.float32)
        foreground = rng.uniform(0.6, 1.0, 3).astype(np.float32)
        img = background[:, None, None] + (foreground - background)[:, None, None] * mask
        img += rng.standard_normal(img.shape, dtype=np.float32) * np.float32(0.1)
        return (img - self.PIXEL_MEAN) / self.PIXEL_STD


def _shape_mask(label: int, dx, dy, r: float, w: float) -> np.ndarray:
    """1.0 inside shape `label` centred at offsets (dx, dy) = 0, else 0.0; float32 (H, W)."""
    a, b = (dx + dy) / np.sqrt(2), (dx - dy) / np.sqrt(2)   # axes rotated by 45 degrees
    ax, ay = np.abs(dx), np.abs(dy)
    if label == 0:
        m = (ay < w) & (ax < r)
    elif label == 1:
        m = (ax < w) & (ay < r)
    elif label == 2:
        m = (np.abs(a) < w) & (np.abs(b) < r)
    elif label == 3:
        m = (np.abs(b) < w) & (np.abs(a) < r)
    elif label == 4:
        m = dx * dx + dy * dy < r * r
    elif label == 5:
        m = np.abs(np.sqrt(dx * dx + dy * dy) - r) < 0.6 * w
    elif label == 6:
        cell = r / 2
        m = (ax < r) & (ay < r) & ((np.floor(dx / cell) + np.floor(dy / cell)) % 2 == 0)
    elif label == 7:
        m = ((ax < w) & (ay < r)) | ((ay < w) & (ax < r))
    elif label == 8:
        edge = np.maximum(ax, ay)
        m = (edge < r) & (edge > r - 1.2 * w)
    else:  # triangle, apex up
        m = (dy > -r) & (dy < r) & (ax < (dy + r) / 2)
    return m.astype(np.float32)


# ---- SyntheticImages: for speed and memory -------------------------------------------------------

class SyntheticImages(Dataset):
    """Random standard-normal images with uniform random labels (nothing to learn).

    For measuring speed and memory at ImageNet shapes. `get_batch` draws example i from a
    generator seeded by (seed, i). `device_batches` makes a few batches directly on a GPU
    (no host copy inside the timed loop).
    """

    def __init__(self, num_classes: int = 1000, image_shape=(3, 224, 224), seed: int = 0,
                 n: int = 100_000):
        image_shape = tuple(int(d) for d in image_shape)
        if len(image_shape) != 3 or min(image_shape) < 1:
            raise ConfigError(f"SyntheticImages image_shape must be (C, H, W), got {image_shape}")
        if int(num_classes) < 1:
            raise ConfigError(f"num_classes must be positive, got {num_classes}")
        self.num_classes = int(num_classes)
        self.image_shape = image_shape
        self.seed = int(seed)
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def get_batch(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        x = np.empty((len(indices),) + self.image_shape, dtype=IMAGE_DTYPE)
        y = np.empty(len(indices), dtype=LABEL_DTYPE)
        for j, i in enumerate(indices):
            rng = np.random.default_rng([self.seed, int(i)])
            y[j] = rng.integers(self.num_classes)
            x[j] = rng.standard_normal(self.image_shape, dtype=np.float32)
        return x, y

    def device_batches(self, batch: int, device, count: int = 2) -> list:
        """`count` batches (x, y) made on `device` (on its compute stream, so the layers that
        read them are ordered after them). On the CPU they are `get_batch` batches."""
        if not device.is_gpu:
            return [self.get_batch(np.arange(k * batch, (k + 1) * batch) % self.n)
                    for k in range(count)]
        xp = device.xp
        out = []
        with device.compute:
            for k in range(count):
                rs = xp.random.RandomState(self.seed * 1000003 + k)
                x = rs.standard_normal((batch,) + self.image_shape, dtype=IMAGE_DTYPE)
                y = rs.randint(0, self.num_classes, size=(batch,)).astype(LABEL_DTYPE)
                out.append((x, y))
        return out


# ---- ImageFolder ---------------------------------------------------------------------------------

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff",
                    ".webp")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageFolder(Dataset):
    """Images in `path/<class name>/<file>`; classes are the sorted subfolder names.

    Each image is converted to RGB, resized so its shorter side is `image_size` (bilinear),
    centre-cropped to image_size x image_size, scaled to [0, 1] and normalised per channel with
    `mean` and `std` (ImageNet's by default).

    split: 'all'; or 'train' / 'eval', which hold out every `eval_every`-th image of each class
    (in sorted file order) for evaluation.
    """

    def __init__(self, path: str, image_size: int = 224, split: str = "all", eval_every: int = 10,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.root = str(path)
        if not os.path.exists(self.root):
            raise DataError(f"data folder {self.root!r} does not exist")
        if not os.path.isdir(self.root):
            raise DataError(f"data path {self.root!r} is not a folder (expected one subfolder "
                            f"of images per class)")
        if split not in ("all", "train", "eval"):
            raise ConfigError(f"ImageFolder split must be 'all', 'train' or 'eval', got {split!r}")
        self.size = int(image_size)
        self.image_shape = (3, self.size, self.size)
        self.mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
        self.fill = -self.mean / self.std        # black, normalised per channel
        self.classes = sorted(d for d in os.listdir(self.root) if not d.startswith(".")
                              and os.path.isdir(os.path.join(self.root, d)))
        if not self.classes:
            raise DataError(f"data folder {self.root!r} has no class folders (expected one "
                            f"subfolder per class holding its images)")
        self.num_classes = len(self.classes)
        self.samples: list[tuple[str, int]] = []
        for label, cls in enumerate(self.classes):
            folder = os.path.join(self.root, cls)
            files = sorted(f for f in os.listdir(folder)
                           if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith("."))
            if not files:
                raise DataError(f"class folder {folder!r} has no images (looked for "
                                f"{', '.join(IMAGE_EXTENSIONS)})")
            for j, f in enumerate(files):
                held_out = j % eval_every == eval_every - 1
                if split == "all" or (split == "eval") == held_out:
                    self.samples.append((os.path.join(folder, f), label))
        if not self.samples:
            raise DataError(f"data folder {self.root!r} has no images in its {split!r} split "
                            f"(every {eval_every}th image of a class is held out for eval)")

    def __len__(self) -> int:
        return len(self.samples)

    def load(self, path: str) -> np.ndarray:
        """One image as float32 (3, S, S), normalised. DataError naming the file if unreadable."""
        from PIL import Image
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
                w, h = img.size
                scale = self.size / min(w, h)
                nw, nh = max(self.size, round(w * scale)), max(self.size, round(h * scale))
                img = img.resize((nw, nh), Image.BILINEAR)
                left, top = (nw - self.size) // 2, (nh - self.size) // 2
                img = img.crop((left, top, left + self.size, top + self.size))
                arr = np.asarray(img, dtype=np.float32)
        except Exception as e:  # Pillow raises OSError, SyntaxError, ValueError ... for bad files
            raise DataError(f"cannot read image {path!r}: {type(e).__name__}: {e}") from None
        arr = arr.transpose(2, 0, 1) / np.float32(255.0)
        return (arr - self.mean) / self.std

    def get_batch(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        x = np.empty((len(indices),) + self.image_shape, dtype=IMAGE_DTYPE)
        y = np.empty(len(indices), dtype=LABEL_DTYPE)
        for j, i in enumerate(indices):
            path, y[j] = self.samples[int(i)]
            x[j] = self.load(path)
        return x, y


# ---- resizing a whole in-memory split once -------------------------------------------------------

#: The most bytes of resized uint8 images a split keeps (a split whose resized images would take
#: more is resized batch by batch, as it is read). Fashion-MNIST's 60,000 training images at
#: 56x56 take 188 MB: resized once at the first batch (about 2 s), then every batch is a slice.
RESIZED_CACHE_BYTES = 1 << 30


def _resize_images(images, size: int):
    """Bilinear resize (Pillow's) of uint8 images (n, H, W) or (n, H, W, C) to (n, size, size)
    or (n, size, size, C)."""
    from PIL import Image
    return np.stack([np.asarray(Image.fromarray(im).resize((size, size), Image.BILINEAR))
                     for im in images])


class _Resized:
    """A split's uint8 images at `size` x `size`, resized once on first use when they fit in
    RESIZED_CACHE_BYTES, else image by image for each batch: the same pixels either way.

    images: uint8 (n, H, W) or (n, H, W, C) (channels last, as Pillow takes them)."""

    def __init__(self, images, size: int):
        self.images, self.size = images, int(size)
        self._all = None
        per_image = self.size * self.size * int(np.prod(images.shape[3:], dtype=np.int64))
        self._cache = per_image * len(images) <= RESIZED_CACHE_BYTES
        self._lock = threading.Lock()

    def take(self, indices):
        """uint8 images `indices` at the split's size."""
        if self.images.shape[1:3] == (self.size, self.size):
            return self.images[indices]
        if not self._cache:
            return _resize_images(self.images[indices], self.size)
        with self._lock:                    # the loader's thread and an evaluation may race
            if self._all is None:
                self._all = _resize_images(self.images, self.size)
        return self._all[indices]


# ---- CIFAR-10 ------------------------------------------------------------------------------------

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


class _ArrayUnpickler(pickle.Unpickler):
    """Reads pickles of plain containers and NumPy arrays only: a data file cannot run code."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"),
                ("numpy._core.multiarray", "_reconstruct"), ("numpy", "dtype"),
                ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar")}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


class CIFAR10(Dataset):
    """CIFAR-10 from the python-pickle batches (the 'CIFAR-10 python version' archive, unpacked).

    path: the folder holding data_batch_1..5 and test_batch (or its parent holding
    cifar-10-batches-py). train=True reads the five training batches, False the test batch.
    image_size: resize the 32x32 images (bilinear) for networks that need larger inputs.
    """

    TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
    TEST_FILES = ("test_batch",)

    def __init__(self, path: str, train: bool = True, image_size: int = 32):
        root = str(path)
        if os.path.isdir(os.path.join(root, "cifar-10-batches-py")):
            root = os.path.join(root, "cifar-10-batches-py")
        if not os.path.isdir(root):
            raise DataError(f"CIFAR-10 folder {root!r} does not exist")
        self.root = root
        self.num_classes = 10
        self.size = int(image_size)
        self.image_shape = (3, self.size, self.size)
        images, labels = [], []
        for name in self.TRAIN_FILES if train else self.TEST_FILES:
            data, lab = self._read(os.path.join(root, name))
            images.append(data)
            labels.append(lab)
        self.images = np.concatenate(images)          # uint8 (N, 3, 32, 32): 150 MB for train
        self.labels = np.concatenate(labels)
        self._resized = _Resized(self.images.transpose(0, 2, 3, 1), self.size)
        self.mean = np.asarray(CIFAR_MEAN, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.asarray(CIFAR_STD, dtype=np.float32).reshape(3, 1, 1)
        self.fill = -self.mean / self.std        # black, normalised per channel

    @staticmethod
    def _read(path: str):
        if not os.path.isfile(path):
            raise DataError(f"CIFAR-10 file {path!r} is missing (expected data_batch_1..5 and "
                            f"test_batch from the python version of CIFAR-10)")
        try:
            with open(path, "rb") as f:
                d = _ArrayUnpickler(f, encoding="bytes").load()
        except Exception as e:
            raise DataError(f"CIFAR-10 file {path!r} is corrupt: {type(e).__name__}: {e}") from None
        if not isinstance(d, dict) or b"data" not in d or b"labels" not in d:
            raise DataError(f"CIFAR-10 file {path!r} lacks the 'data' and 'labels' entries")
        data = np.asarray(d[b"data"])
        labels = np.asarray(d[b"labels"], dtype=np.int64)
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise DataError(f"CIFAR-10 file {path!r}: entry 'data' must be uint8 (N, 3072), got "
                            f"{data.dtype} {data.shape}")
        if labels.shape != (data.shape[0],) or (labels.size and
                                                (labels.min() < 0 or labels.max() > 9)):
            raise DataError(f"CIFAR-10 file {path!r}: entry 'labels' must be {data.shape[0]} "
                            f"integers in 0..9")
        return data.reshape(-1, 3, 32, 32), labels

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        raw = self._resized.take(indices).transpose(0, 3, 1, 2)
        x = (raw.astype(np.float32) / np.float32(255.0) - self.mean) / self.std
        return np.ascontiguousarray(x, dtype=np.float32), self.labels[indices].copy()


# ---- MNIST and Fashion-MNIST (IDX files) --------------------------------------------------------

class IDXImages(Dataset):
    """One split of MNIST or Fashion-MNIST from its IDX files (minidnn/idx.py).

    folder: the four files' folder; train=True: the 60,000 training images, False: the
    10,000 test images (t10k). name: 'fashion-mnist' or 'mnist' (whose pixel statistics
    normalise the images). image_size: resize the 28x28 images (bilinear) for networks that
    need larger inputs. get_batch gives x float32 (n, 1, S, S), normalised to about mean 0
    and std 1, and y int64 (n,) in 0..9. `fill` is the normalised value of a black pixel (the
    background an augmentation pads with).
    """

    def __init__(self, folder: str, train: bool = True, name: str = "fashion-mnist",
                 image_size: int = 28):
        self.root, self.name, self.train = str(folder), name, bool(train)
        self.images, self.labels = idx.read_split(self.root, self.train, name)
        self.num_classes = idx.NUM_CLASSES
        self.size = int(image_size)
        self._resized = _Resized(self.images, self.size)
        self.image_shape = (1, self.size, self.size)
        mean, std = idx.PIXEL_STATS[name]
        self.mean, self.std = np.float32(mean), np.float32(std)
        self.fill = float(-self.mean / self.std)

    def __len__(self) -> int:
        return len(self.labels)

    def get_batch(self, indices):
        indices = np.asarray(indices, dtype=np.int64)
        raw = self._resized.take(indices)
        x = (raw.astype(np.float32) / np.float32(255.0) - self.mean) / self.std
        return np.ascontiguousarray(x[:, None], dtype=np.float32), self.labels[indices].copy()


# ---- loading batches in the background -----------------------------------------------------------

class BatchLoader:
    """Batches of a dataset in a fixed order, fetched ahead by a background thread.

    The batch for `step` is a pure function of (seed, step): epoch e = step // batches_per_epoch
    uses the permutation drawn from (seed, e) (or index order without shuffle), so a run that
    starts at `start_step` sees exactly the batches a run from 0 sees at those steps.

    Iterating yields (x float32 (N, C, H, W), y int64 (N,)) for start_step, start_step + 1, ...
    (stopping after `steps` batches when given, else after one pass over the data without
    shuffle, else never). A thread fills a queue of at most `prefetch` batches; an error in
    the thread is raised in the consumer. Use as a context manager or call `close()`.

    rows: load only these rows of each batch (a slice; one rank's share of a global batch in
    data-parallel training, so that the ranks together see exactly the batches one process
    would). Default: the whole batch.

    augment: an augment.Augment applied to every batch in the loading thread, its draws
    seeded by (seed, AUGMENT_STREAM, step) for the whole batch (then cut to `rows`), padding
    with the dataset's `fill` (its normalised black).

    layout: the executor's feature-map layout (kernels/mapformat.py); x (N, C, H, W) arrives
    laid out as its maps are ('nhwc': the view of a C-contiguous (N, H, W, C) array),
    reordered in the loading thread, so that the executor copies a batch into its input
    buffer as it is (reordered on the device, it would take a temporary the size of the
    batch).
    """

    def __init__(self, dataset: Dataset, batch: int, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = True, start_step: int = 0, steps: int | None = None,
                 prefetch: int = 2, rows: slice | None = None, augment: Augment | None = None,
                 layout: str = "nchw"):
        if int(batch) < 1:
            raise ConfigError(f"batch must be a positive integer, got {batch}")
        n = len(dataset)
        if drop_last and n < batch:
            raise DataError(f"dataset has {n} examples, fewer than one batch of {batch}")
        if n < 1:
            raise DataError("dataset is empty")
        self.dataset = dataset
        self.batch = int(batch)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.start_step = int(start_step)
        self.batches_per_epoch = n // self.batch if drop_last else -(-n // self.batch)
        if steps is None and not shuffle:
            steps = max(self.batches_per_epoch - self.start_step, 0)
        self.steps = steps
        self.prefetch = max(int(prefetch), 1)
        self.rows = rows if rows is not None else slice(None)
        self.augment = augment
        self.layout = layout
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._perm_cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.batches_per_epoch

    def indices(self, step: int) -> np.ndarray:
        """Dataset indices of the batch at `step`."""
        epoch, b = divmod(int(step), self.batches_per_epoch)
        if self.shuffle:
            cache = self._perm_cache  # one read: the loader thread may swap it meanwhile
            if cache is None or cache[0] != epoch:
                cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(
                    len(self.dataset)))
                self._perm_cache = cache
            order = cache[1]
        else:
            order = np.arange(len(self.dataset))
        return order[b * self.batch:(b + 1) * self.batch]

    def batch_at(self, step: int):
        """The batch at `step` (its `rows`), loaded (and augmented) in the calling thread."""
        indices = self.indices(step)
        x, y = self.dataset.get_batch(indices[self.rows])
        if self.augment:
            rng = np.random.default_rng([self.seed, AUGMENT_STREAM, int(step)])
            draws = {k: v[self.rows] for k, v in self.augment.draw(rng, len(indices)).items()}
            x = self.augment.apply(x, draws, self.dataset.fill)
        if self.layout == "nhwc" and x.ndim == 4:    # channels last (kernels/mapformat.py)
            x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        return x, y

    def _work(self) -> None:
        step = self.start_step
        end = None if self.steps is None else self.start_step + self.steps
        try:
            while not self._stop.is_set() and (end is None or step < end):
                item = ("batch", self.batch_at(step))
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                step += 1
            self._put_final(("end", None))
        except BaseException as e:  # handed to the consumer, who raises it
            self._put_final(("error", e))

    def _put_final(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        self.close()
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        self.thread = threading.Thread(target=self._work, name="minidnn-batch-loader", daemon=True)
        self.thread.start()
        return self._consume()

    def _consume(self):
        try:
            while True:
                kind, value = self._queue.get()
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            self.close()

    def close(self) -> None:
        """Stop the background thread (it finishes the batch it is loading)."""
        self._stop.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join()
        self.thread = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- --data strings ------------------------------------------------------------------------------

@dataclass
class DataSources:
    """What `open_data` returns: the training set, a held-out set (or None) and the class count."""
    train: Dataset
    eval: Dataset | None
    num_classes: int
    description: str


def open_data(spec: str, image_size: int, seed: int = 0, num_classes: int | None = None,
              train_size: int = 4096, eval_size: int = 512) -> DataSources:
    """`--data` -> datasets. spec: 'shapes', 'synthetic', 'cifar10:PATH', 'fashion-mnist',
    'fashion-mnist:DIR', 'mnist:DIR' or an image folder PATH.

    num_classes: for shapes (default 10) and synthetic (default 1000); image folders,
    CIFAR-10 and the IDX data sets have their own and it must match them if given. Held-out
    sets: a second Shapes split; the folder's every-10th images; CIFAR-10's test batch; the
    IDX data sets' official test split (t10k); none for synthetic data.
    """
    spec = str(spec)
    named = idx.parse_spec(spec)
    if named is not None:
        name, folder = named
        train = IDXImages(folder, train=True, name=name, image_size=image_size)
        held_out = IDXImages(folder, train=False, name=name, image_size=image_size)
        _check_classes(num_classes, 10, spec)
        return DataSources(train, held_out, 10,
                           f"{name} at {folder} ({len(train):,} training, {len(held_out):,} "
                           f"test images, 1 channel)")
    if spec == "shapes":
        k = 10 if num_classes is None else num_classes
        return DataSources(Shapes(k, image_size, train_size, seed, "train"),
                           Shapes(k, image_size, eval_size, seed, "eval"), k,
                           f"shapes ({k} classes, {train_size} training images)")
    if spec == "synthetic":
        k = 1000 if num_classes is None else num_classes
        if k < 2:
            raise ConfigError(f"--num-classes {k}: a classifier needs at least two classes")
        return DataSources(SyntheticImages(k, (3, image_size, image_size), seed), None, k,
                           f"synthetic ({k} classes, random pixels)")
    if spec.startswith("cifar10:"):
        path = spec[len("cifar10:"):]
        train = CIFAR10(path, train=True, image_size=image_size)
        held_out = CIFAR10(path, train=False, image_size=image_size)
        _check_classes(num_classes, 10, spec)
        return DataSources(train, held_out, 10, f"CIFAR-10 at {train.root}")
    if not os.path.exists(spec) and os.sep not in spec and "/" not in spec:
        raise DataError(f"--data {spec!r}: expected shapes, synthetic, cifar10:PATH, "
                        f"fashion-mnist[:DIR], mnist:DIR or the path of an image folder (no "
                        f"such folder)")
    train = ImageFolder(spec, image_size, split="train")
    try:
        held_out = ImageFolder(spec, image_size, split="eval")
    except DataError:  # too few images to hold any out
        held_out = None
    _check_classes(num_classes, train.num_classes, spec)
    if train.num_classes < 2:
        # One class: the loss is 0 from the first step and nothing is learned.
        raise DataError(f"data folder {train.root!r} has one class folder "
                        f"({train.classes[0]!r}); a classifier needs at least two (one "
                        f"subfolder per class)")
    return DataSources(train, held_out, train.num_classes,
                       f"image folder {spec} ({train.num_classes} classes, {len(train)} images)")


def _check_classes(asked: int | None, has: int, spec: str) -> None:
    if asked is not None and asked != has:
        raise ConfigError(f"--num-classes {asked} does not match --data {spec!r}, which has "
                          f"{has} classes")
