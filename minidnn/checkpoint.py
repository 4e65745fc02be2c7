"""Checkpoints: parameters, optimizer state, step and run settings in one .npz file.

Layout of the file (a zip of .npy arrays, read with allow_pickle=False, so loading a
checkpoint never runs code):

    meta.json              uint8 bytes of a JSON object: format, minidnn version, model,
                           num_classes, image_size, step, seed, optimizer settings, parameter
                           names and shapes in network order, param_checksum, run config
    param/<name>           every parameter and buffer, e.g. param/conv1.weight (OIHW, float32),
                           param/bn1.running_mean (the network's state dict)
    momentum/<name>        SGD momentum buffers that exist

Writes are atomic (`atomic_write`: temp file in the same folder, fsync, os.replace), so a
failed or interrupted write leaves the previous checkpoint as it was; the file gets the mode the
user's umask gives new files. A run holds `CheckpointLock` on its checkpoint while it trains, so
a second run writing the same file is refused instead of silently overwriting it; taking the
lock removes the temporary files that a killed writer left behind. Every problem on load
(missing, truncated or corrupt file, a missing entry, another model, a shape mismatch) is a
CheckpointError naming the file and the entry.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import BinaryIO, Callable

import numpy as np

from .errors import CheckpointError
from .version import __version__

FORMAT = "minidnn-checkpoint"
FORMAT_VERSION = 1
META = "meta.json"


def atomic_write(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write a file through `write(f)` so that `path` is either the old file or the new one.

    The bytes go to a temporary file beside `path` (same file system, so os.replace is atomic),
    are flushed to disk, and only then replace `path`. On any error the temporary file is
    removed and the error is raised; `path` is untouched.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a new file gets the umask's mode
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}."


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the temporary files that `atomic_write` calls for `path` left behind (a writer
    killed mid-write); returns their paths. Call it only while no one writes `path`."""
    directory = os.path.dirname(os.path.abspath(path))
    pattern = os.path.join(glob.escape(directory), glob.escape(_temp_prefix(path)) + "*.tmp")
    removed = []
    for tmp in glob.glob(pattern):
        with contextlib.suppress(OSError):
            os.unlink(tmp)
            removed.append(tmp)
    return removed


class CheckpointLock:
    """While held, no other run (process) can hold the lock of the same checkpoint path.

    An advisory lock (flock) on a hidden file beside the checkpoint, `.NAME.lock`; the
    operating system drops it when the process ends, however it ends, so a killed run never
    leaves the checkpoint locked. Taking the lock removes stale temporary files of `path`.

        with CheckpointLock("runs/alexnet.npz"):
            ...   # train and write the checkpoint
    """

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self.lock_path = os.path.join(os.path.dirname(os.path.abspath(self.path)),
                                      f".{os.path.basename(self.path)}.lock")
        self._fd = None

    def acquire(self) -> None:
        import fcntl
        os.makedirs(os.path.dirname(self.lock_path), exist_ok=True)
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoint {self.path!r}: "
                                  f"{e.strerror or e}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise CheckpointError(f"checkpoint {self.path!r} is in use by another run "
                                  f"(process {holder}); give each run its own --checkpoint"
                                  ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        remove_stale_temporaries(self.path)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.lock_path)   # before closing: the lock is still ours
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


def params_checksum(named_arrays) -> str:
    """sha256 over (name, float32 C-order bytes) pairs, as Network.param_checksum computes it."""
    h = hashlib.sha256()
    for name, arr in named_arrays:
        h.update(name.encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


@dataclass
class Checkpoint:
    """A loaded checkpoint. params / momentum: {parameter name: NumPy array}."""
    path: str
    meta: dict
    params: dict = field(default_factory=dict)
    momentum: dict = field(default_factory=dict)

    @property
    def step(self) -> int:
        return int(self.meta["step"])

    @property
    def model(self) -> str:
        return str(self.meta["model"])


def save_checkpoint(path: str, net, optimizer=None, step: int = 0, model: str | None = None,
                    seed: int = 0, config: dict | None = None, extra: dict | None = None) -> None:
    """Write net's parameters, the optimizer's momentum and the run's settings to `path`.

    model: the name or path the network was built from (checked on resume); config: the run's
    settings (JSON-serialisable); extra: more metadata fields.
    """
    state = net.state_dict()
    names = list(state)   # parameters and buffers (BatchNorm's running statistics)
    opt_state = optimizer.state_dict() if optimizer is not None else None
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "minidnn_version": __version__,
        "model": model if model is not None else net.name,
        "network": net.name,
        "num_classes": net.num_classes,
        "input_shape": list(net.input_shape),
        "step": int(step), "seed": int(seed),
        "params": [[n, list(state[n].shape)] for n in names],
        "param_checksum": params_checksum((n, state[n]) for n in names),
        "optimizer": None if opt_state is None else
        {k: v for k, v in opt_state.items() if k != "velocity"},
        "config": config or {},
    }
    meta.update(extra or {})
    arrays = {META: np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)}
    for n in names:
        arrays[f"param/{n}"] = state[n]
    if opt_state is not None:
        for n, v in opt_state["velocity"].items():
            arrays[f"momentum/{n}"] = v
    try:
        atomic_write(path, lambda f: np.savez(f, **arrays))
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint {path!r}: {e.strerror or e}") from e


def load_checkpoint(path: str) -> Checkpoint:
    """Read and verify a checkpoint file (entries present, shapes as recorded, checksum)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":  # every .npz is a zip archive
        raise CheckpointError(f"checkpoint {path!r} is corrupt or truncated: "
                              f"{'it is empty' if not magic else 'not an .npz archive'}")
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise CheckpointError(f"checkpoint {path!r} is corrupt or truncated (not a readable "
                              f".npz archive: {e})") from None
    with npz:
        entries = set(npz.files)
        meta = _read_meta(npz, entries, path)
        ckpt = Checkpoint(path, meta)
        shapes = {name: tuple(shape) for name, shape in meta["params"]}
        for name, shape in shapes.items():
            ckpt.params[name] = _read_entry(npz, entries, f"param/{name}", path, shape)
        for key in sorted(entries):
            if key.startswith("momentum/"):
                name = key[len("momentum/"):]
                shape = shapes.get(name)
                if shape is None:
                    raise CheckpointError(f"checkpoint {path!r}: entry {key!r} belongs to no "
                                          f"parameter listed in {META}")
                ckpt.momentum[name] = _read_entry(npz, entries, key, path, shape)
    got = params_checksum((n, ckpt.params[n]) for n, _ in meta["params"])
    if got != meta["param_checksum"]:
        raise CheckpointError(f"checkpoint {path!r}: parameter entries do not match the checksum "
                              f"recorded in {META} (the file is corrupt)")
    return ckpt


def peek_checkpoint(path: str) -> dict | None:
    """The meta.json of the minidnn checkpoint at `path` (its step, model, config...), read
    without the parameters and without verifying them; None when `path` is missing or is not
    a minidnn checkpoint (any other file)."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                return None
        with np.load(path, allow_pickle=False) as npz:
            meta = json.loads(npz[META].tobytes().decode())
    except Exception:   # unreadable, not a zip, no meta.json, bad JSON: not ours
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _read_meta(npz, entries, path) -> dict:
    if META not in entries:
        raise CheckpointError(f"checkpoint {path!r} has no {META!r} entry: not a minidnn "
                              f"checkpoint, or a truncated one")
    try:
        meta = json.loads(npz[META].tobytes().decode())
    except Exception as e:
        raise CheckpointError(f"checkpoint {path!r}: entry {META!r} is corrupt: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path!r}: entry {META!r} does not describe a "
                              f"minidnn checkpoint")
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path!r} has format version "
                              f"{meta.get('format_version')}, this minidnn reads {FORMAT_VERSION}")
    for key in ("model", "step", "seed", "params", "param_checksum"):
        if key not in meta:
            raise CheckpointError(f"checkpoint {path!r}: entry {META!r} lacks the field {key!r}")
    return meta


def _read_entry(npz, entries, key, path, shape) -> np.ndarray:
    if key not in entries:
        raise CheckpointError(f"checkpoint {path!r} is missing the entry {key!r}")
    try:
        arr = npz[key]
    except Exception as e:  # bad CRC, truncated member, malformed .npy header
        raise CheckpointError(f"checkpoint {path!r}: entry {key!r} is corrupt: {e}") from None
    if tuple(arr.shape) != shape:
        raise CheckpointError(f"checkpoint {path!r}: entry {key!r} has shape {tuple(arr.shape)}, "
                              f"{META} records {shape}")
    return arr


def restore(ckpt: Checkpoint, net, optimizer=None, model: str | None = None) -> None:
    """Load a checkpoint into a network (and optimizer), checking that it belongs to them.

    model: the name the network was built from; a checkpoint of another model is refused.
    Parameters must match by name and shape exactly.
    """
    path = ckpt.path
    if model is not None and ckpt.model != model:
        raise CheckpointError(f"checkpoint {path!r} is for model {ckpt.model!r}, not {model!r}")
    own = {n: p for n, p in net.state()}
    for name, p in own.items():
        if name not in ckpt.params:
            raise CheckpointError(f"checkpoint {path!r} is missing the entry 'param/{name}' "
                                  f"that network {net.name!r} needs")
        got = tuple(ckpt.params[name].shape)
        if got != tuple(p.shape):
            raise CheckpointError(f"checkpoint {path!r}: entry 'param/{name}' has shape {got}, "
                                  f"network {net.name!r} expects {tuple(p.shape)}")
    extra = sorted(set(ckpt.params) - set(own))
    if extra:
        raise CheckpointError(f"checkpoint {path!r} has entries the network {net.name!r} lacks: "
                              f"{', '.join('param/' + n for n in extra[:5])}")
    net.load_state_dict(ckpt.params)
    if optimizer is not None:
        restore_optimizer(ckpt, optimizer)


def restore_optimizer(ckpt: Checkpoint, optimizer) -> None:
    """Load the checkpoint's SGD settings and momentum buffers into `optimizer`."""
    settings = ckpt.meta.get("optimizer") or {}
    state = {"lr": settings.get("lr", optimizer.lr),
             "momentum": settings.get("momentum", optimizer.momentum),
             "weight_decay": settings.get("weight_decay", optimizer.weight_decay),
             "velocity": ckpt.momentum}
    optimizer.load_state_dict(state)

