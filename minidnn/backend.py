"""Device selection, the array module `xp` (NumPy or CuPy), streams and events.

Everything above this file is written once against `xp`; this file is the only place that
decides whether `xp` is NumPy or CuPy. On the CPU, streams and events are no-ops (work runs
immediately, in program order), so the memory manager's logic runs unchanged on both.
"""
from __future__ import annotations

import contextlib

import numpy as np

from .errors import DeviceError

_cupy_error: str = ""
try:  # CuPy is optional: the whole framework runs and is tested without it.
    import cupy as _cupy
except Exception as e:  # ImportError, or a CuPy build that cannot load its CUDA libraries
    _cupy = None
    _cupy_error = f"{type(e).__name__}: {e}"


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return not gpu_unavailable_reason()


def gpu_unavailable_reason() -> str:
    """Why there is no GPU to use ('' when there is one): CuPy missing, or CUDA's answer."""
    if _cupy is None:
        return f"CuPy does not import: {_cupy_error}"
    try:
        if _cupy.cuda.runtime.getDeviceCount() > 0:
            return ""
        return "no CUDA device is present"
    except Exception as e:
        return f"CUDA reports {type(e).__name__}: {e}"


def get_array_module(*arrays):
    """Chainer's idiom: the module (numpy or cupy) that owns these arrays."""
    if _cupy is not None:
        return _cupy.get_array_module(*arrays)
    return np


def to_numpy(a) -> np.ndarray:
    """A NumPy copy (or view, for NumPy input) of a host or device array. A device array laid
    out in another order than C's (a channels-last weight) is copied in the order its bytes
    lie and put back in C order on the host: CuPy's own copy would first make a C-ordered
    copy on the device, an allocation of the array's size that no step counts (under a
    tight budget, after training, it failed)."""
    if _cupy is not None and isinstance(a, _cupy.ndarray):
        order = memory_order(a)
        if order is None:
            return _cupy.asnumpy(a)
        host = _cupy.asnumpy(a.transpose(order))
        return np.ascontiguousarray(host.transpose(np.argsort(order)))
    return np.asarray(a)


def memory_order(a) -> tuple | None:
    """The axes of `a` from its largest stride to its smallest, when `a` viewed in that order
    is C-contiguous and `a` itself is not (a channels-last (N, C, H, W) array: (0, 2, 3, 1));
    else None."""
    if a.ndim < 2 or a.flags.c_contiguous:
        return None
    order = tuple(sorted(range(a.ndim), key=lambda axis: -a.strides[axis]))
    return order if a.transpose(order).flags.c_contiguous else None


def address(a) -> int:
    """The address of an array's first byte (NumPy: host memory; CuPy: device memory)."""
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    return a.data.ptr


def same_memory(a, b) -> bool:
    """True when two arrays start at the same address (an in-place layer got its input's buffer)."""
    if isinstance(a, np.ndarray) != isinstance(b, np.ndarray):
        return False
    return address(a) == address(b)


class _CpuStream:
    """Stand-in for a CUDA stream on the CPU: work is already done when it is issued."""

    name: str

    def __init__(self, name: str):
        self.name = name

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record(self, event=None):
        return event if event is not None else _CpuEvent()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _CpuEvent:
    """Stand-in for a CUDA event: always complete."""

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    @property
    def done(self) -> bool:
        return True


# Alignment of the pieces `Device.allocating_from` carves out of a block (CUDA's own).
CARVE_ALIGNMENT = 256


def _carved(nbytes: int) -> int:
    return -(-int(nbytes) // CARVE_ALIGNMENT) * CARVE_ALIGNMENT


class Device:
    """One compute device: its array module and the three streams of the memory manager.

    `compute` runs every layer, `offload` copies device to host, `prefetch` host to device.
    On the CPU all three are no-op stand-ins.
    """

    def __init__(self, kind: str):
        if kind not in ("cpu", "gpu"):
            raise DeviceError(f"device must be 'cpu' or 'gpu', got {kind!r}")
        self.kind = kind
        self._generator_bytes = 0
        if kind == "gpu":
            reason = gpu_unavailable_reason()
            if reason:
                raise DeviceError(f"--device gpu was asked for, but CuPy sees no CUDA device "
                                  f"({reason}); install the 'gpu' extra on a machine with a "
                                  f"CUDA GPU, or use --device cpu / auto")
            self.xp = _cupy
            # The compute stream is a blocking stream: work on CuPy's legacy default stream
            # (reading a loss with float(), copying a state dict in or out) is ordered with
            # it both ways, so results are never read early nor parameters written late. The
            # copy streams are non-blocking: nothing on the legacy stream holds them back, and
            # they overlap compute.
            self.compute = _cupy.cuda.Stream(non_blocking=False)
            self.offload = _cupy.cuda.Stream(non_blocking=True)
            self.prefetch = _cupy.cuda.Stream(non_blocking=True)
            self.name = _cupy.cuda.runtime.getDeviceProperties(
                _cupy.cuda.Device().id)["name"].decode()
        else:
            self.xp = np
            self.compute = _CpuStream("compute")
            self.offload = _CpuStream("offload")
            self.prefetch = _CpuStream("prefetch")
            self.name = "cpu"

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"

    def event(self):
        """A new event (CUDA event on GPU, always-complete stand-in on CPU)."""
        if self.is_gpu:
            return _cupy.cuda.Event(block=False, disable_timing=True)
        return _CpuEvent()

    def timing_event(self):
        """An event that can time (for the tracer); on CPU the stand-in."""
        if self.is_gpu:
            return _cupy.cuda.Event(block=False, disable_timing=False)
        return _CpuEvent()

    def asarray(self, a, dtype=None):
        """Host array -> array on this device (a copy on GPU, issued on the compute stream)."""
        if self.is_gpu:
            with self.compute:
                return _cupy.asarray(a, dtype=dtype)
        return np.asarray(a, dtype=dtype)

    def synchronize(self) -> None:
        if self.is_gpu:
            self.compute.synchronize()
            self.offload.synchronize()
            self.prefetch.synchronize()

    @property
    def generator_bytes(self) -> int:
        """Device bytes that making one of the step's random generators (StepContext.rng)
        allocates: 0 on both devices. NumPy's lives in host objects; the GPU's is
        counter-based (kernels/cuda_random.py) and keeps no state. (Kept as a figure of the
        device so that plans and tests can model a generator that does keep one.)"""
        return self._generator_bytes

    @contextlib.contextmanager
    def allocating_from(self, block):
        """`with device.allocating_from(block):` every CuPy allocation inside is carved out of
        `block` (a flat uint8 device array), one after the other, so that what a library call
        allocates for itself (a random generator's state) lies in memory the caller planned.
        Past the block's end, allocations come from CuPy's allocator as before. On the CPU (or
        with no block) nothing is routed."""
        if not self.is_gpu or block is None:
            yield
            return
        outer = _cupy.cuda.get_allocator()
        base, size, used = block.data.ptr, int(block.nbytes), [0]
        device_id = _cupy.cuda.Device().id

        def carve(nbytes):
            if used[0] + nbytes > size:
                return outer(nbytes)
            start = used[0]
            used[0] = min(size, start + _carved(nbytes))
            mem = _cupy.cuda.UnownedMemory(base + start, nbytes, block, device_id)
            return _cupy.cuda.MemoryPointer(mem, 0)

        with _cupy.cuda.using_allocator(carve):
            yield

    def __repr__(self) -> str:
        return f"Device({self.kind!r}, {self.name!r})"


def select_device(spec: str = "auto") -> Device:
    """'auto' -> GPU when CuPy sees one, else CPU; 'cpu' and 'gpu' force the choice."""
    if spec == "auto":
        return Device("gpu" if gpu_available() else "cpu")
    if spec in ("cpu", "gpu"):
        return Device(spec)
    raise DeviceError(f"--device must be one of auto, cpu, gpu; got {spec!r}")
