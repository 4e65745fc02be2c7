"""IDX files: the format of MNIST and Fashion-MNIST (28x28 grey images, 10 classes).

An IDX file is a big-endian header and then the raw values:

    bytes 0-1   0, 0
    byte  2     the value type (0x08: unsigned bytes, the only one these data sets use)
    byte  3     the number of dimensions d (3 for images, 1 for labels)
    d x 4 bytes the size of each dimension (uint32, big-endian)
    the values, row-major

so images read as `np.frombuffer(data, np.uint8, offset=16).reshape(n, 28, 28)` and labels
with offset=8. Each data set is four files, optionally gzipped:

    train-images-idx3-ubyte[.gz]   60,000 training images
    train-labels-idx1-ubyte[.gz]
    t10k-images-idx3-ubyte[.gz]    10,000 test images
    t10k-labels-idx1-ubyte[.gz]

`read_split(folder, train)` reads one split's images and labels (data.IDXImages makes it a
Dataset of one grey channel); a file that is missing, gzipped badly, has the wrong magic
number or sizes, or is cut short is a DataError naming the file and what was wrong.
"""
from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from .errors import DataError

#: Where Debian's package dataset-fashion-mnist puts the four files.
DEBIAN_FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

#: Pixel mean and standard deviation of each data set's training images (scaled to [0, 1]).
PIXEL_STATS = {"fashion-mnist": (0.2860, 0.3530), "mnist": (0.1307, 0.3081)}


NUM_CLASSES = 10
_UNSIGNED_BYTE = 0x08
_SPLIT_FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def find_file(folder: str, name: str) -> str:
    """The path of `name` or `name.gz` in `folder`; DataError when neither is there."""
    for candidate in (name + ".gz", name):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    raise DataError(f"IDX file {os.path.join(folder, name)!r}[.gz] is missing (expected "
                    f"train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte "
                    f"and t10k-labels-idx1-ubyte, gzipped or not)")


def read_idx(path: str, dims: int) -> np.ndarray:
    """The uint8 array of an IDX file of `dims` dimensions (gzipped when it says so itself).

    Raises DataError for an unreadable or corrupt gzip stream, a wrong magic number (not an
    IDX file of unsigned bytes with `dims` dimensions), or a size that disagrees with the
    header (a file cut short or with bytes after its values).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":   # gzip's magic number, whatever the name says
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"IDX file {path!r} cannot be read: {type(e).__name__}: {e}") from None
    header = 4 + 4 * dims
    magic = bytes((0, 0, _UNSIGNED_BYTE, dims))
    if raw[:4] != magic:
        raise DataError(f"IDX file {path!r} has magic number 0x{raw[:4].hex() or 'empty'}, "
                        f"expected 0x{magic.hex()} (unsigned bytes, {dims} dimension"
                        f"{'s' if dims > 1 else ''})")
    if len(raw) < header:
        raise DataError(f"IDX file {path!r} is cut short: {len(raw)} bytes, its header alone "
                        f"takes {header}")
    shape = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=dims, offset=4))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        what = "cut short" if len(raw) < expected else "longer than its header says"
        raise DataError(f"IDX file {path!r} is {what}: {len(raw):,} bytes, the header's shape "
                        f"{shape} needs {expected:,}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def read_split(folder: str, train: bool = True, name: str = "fashion-mnist"):
    """(images uint8 (N, H, W), labels int64 (N,)) of the training (or t10k test) files in
    `folder`, checked: as many labels as images, each in 0..9, at least one image."""
    if not os.path.isdir(folder):
        raise DataError(f"{name} folder {folder!r} does not exist"
                        + (" (Debian's package dataset-fashion-mnist installs it)"
                           if folder == DEBIAN_FASHION_MNIST else ""))
    images_name, labels_name = _SPLIT_FILES[bool(train)]
    images_path = find_file(folder, images_name)
    labels_path = find_file(folder, labels_name)
    images = read_idx(images_path, 3)
    labels = read_idx(labels_path, 1).astype(np.int64)
    if len(images) != len(labels):
        raise DataError(f"{images_path!r} holds {len(images)} images but {labels_path!r} "
                        f"{len(labels)} labels")
    if len(images) == 0:
        raise DataError(f"IDX file {images_path!r} holds no images")
    if labels.max() >= NUM_CLASSES:
        raise DataError(f"IDX file {labels_path!r} has label {int(labels.max())}; expected "
                        f"0..{NUM_CLASSES - 1}")
    return images, labels


def parse_spec(spec: str) -> tuple[str, str] | None:
    """(data set name, folder) for 'fashion-mnist', 'fashion-mnist:DIR' or 'mnist:DIR'; None
    for any other --data string."""
    if spec == "fashion-mnist":
        return "fashion-mnist", DEBIAN_FASHION_MNIST
    for name in ("fashion-mnist", "mnist"):
        if spec.startswith(name + ":"):
            folder = spec[len(name) + 1:]
            if not folder:
                raise DataError(f"--data {spec!r}: give the folder of the IDX files after "
                                f"'{name}:'")
            return name, folder
    if spec == "mnist":
        raise DataError("--data mnist needs the folder of its IDX files: mnist:DIR")
    return None
