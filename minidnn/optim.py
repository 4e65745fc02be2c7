"""SGD with momentum and weight decay, in PyTorch's formulation (so results can be compared):

    g = grad + weight_decay * w
    v = momentum * v + g            (v starts at g on the first step)
    w = w - lr * v

Momentum buffers live beside the parameters on the same device; `state_dict()` returns them as
NumPy arrays for checkpoints. Given the executor's allocator (`SGD(..., allocator=ex.allocator)`)
they come out of it, so the memory budget and `peak_device_bytes` count them on the CPU too (on
the GPU every CuPy allocation is routed into the arena anyway). They are then taken when the
optimizer is made, side by side, rather than at the first step: taken there, between the
step's short-lived temporaries, they would leave holes in the arena that every later step's
large cuDNN workspaces could not use. Each buffer is laid out in memory as its parameter is
(NCHW or channels-last: kernels/mapformat.py), so the three arrays of a parameter can be
walked in one order.

The update itself is a kernel op, `sgd_update` (kernels/cpu.py: the NumPy reference, one
array operation at a time; kernels/cuda_sgd.py: all parameters of a dtype in one fused launch,
the same bits). The optimizer takes the kernel module of its device (`kernels=ex.kernels`;
by default the one of the parameters' array module). The first step with momentum, which
has no buffer yet (v = g), builds each buffer in place and then updates through the same
kernel op: on the GPU no step, the first included, takes a temporary the size of a parameter.

The learning rate on the GPU. The fused kernel reads the rate from device memory (the
kernels' DeviceRate, kept in the optimizer's launch cache), so a step replayed from a CUDA
graph (minidnn/step_graph.py) runs at the rate a schedule set for it: the graph does not
depend on the rate (graph_key leaves it out), and `write_lr()` writes it before each replay.
"""
from __future__ import annotations

import numpy as np

from .backend import get_array_module, to_numpy
from .errors import CheckpointError, ConfigError
from .kernels import cpu as _cpu_kernels
from .kernels.cpu import SGD_RATE
from .kernels.mapformat import layout_of, shaped


class SGD:
    def __init__(self, params, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 0.0,
                 allocator=None, kernels=None):
        """params: [(name, Parameter)] as `Network.parameters()` returns them; allocator: where
        momentum buffers come from (anything with `empty(shape, dtype, where) -> (array, buf)`,
        e.g. `Executor.allocator`); None: the parameters' array module. kernels: the kernel
        module whose `sgd_update` makes the steps (e.g. `Executor.kernels`); None: kernels/cpu.py
        for NumPy parameters, kernels/cuda.py for CuPy ones."""
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ConfigError(f"SGD needs lr > 0, 0 <= momentum < 1, weight_decay >= 0; got "
                              f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}")
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.allocator = allocator
        self.kernels = kernels
        self.velocity: dict[str, object] = {}
        self._buffers: dict[str, object] = {}   # allocator buffers behind `velocity`
        self._slots: dict[str, object] = {}     # name -> momentum array, taken up front
        self._launches: dict = {}               # sgd_update's cache (the GPU's launch table)
        if allocator is not None and self.momentum:
            for name, p in self.params:
                if p.data is not None:
                    self._slots[name], self._buffers[name] = self._take_slot(name, p.data)

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next steps (a schedule sets it before each step)."""
        self.lr = float(lr)

    def write_lr(self) -> None:
        """Write the learning rate where the GPU's update reads it (its DeviceRate), on the
        current stream: what a step replayed from a CUDA graph needs before its launch (a
        plain step writes it itself). Nothing to do on the CPU, or before the first step."""
        rate = self._launches.get(SGD_RATE)
        if rate is not None:
            rate.write(self.lr)

    def graph_key(self) -> tuple:
        """What an update replayed from a CUDA graph depends on (minidnn/step_graph.py): the
        momentum and weight decay, and where every weight, gradient and momentum buffer lies.
        Not the learning rate, which the kernel reads from device memory (write_lr), unless
        the last update took some parameter through the reference's operations, which are
        captured with the host's number."""
        rate = self._launches.get(SGD_RATE)
        lr = () if rate is not None and rate.alone else (self.lr,)
        return lr + (self.momentum, self.weight_decay,
                     tuple((p.data.data.ptr, p.grad.data.ptr) for _, p in self.params),
                     tuple(v.data.ptr for v in self.velocity.values()))

    def _take_slot(self, name: str, like):
        """(array, buffer): a momentum buffer from the allocator, shaped and laid out in
        memory like `like` (the array is None from a counting allocator)."""
        v, buf = self.allocator.empty(like.shape, like.dtype, f"momentum of {name}")
        if v is not None and _layout(like) == "nhwc":
            v = shaped(buf, like.shape, like.dtype, "nhwc")
        return v, buf

    def _new_velocity(self, name: str, like, values):
        """A momentum buffer shaped like `like`, holding `values`."""
        if self.allocator is None:
            v = get_array_module(like).empty_like(like)   # like's layout too
            v[...] = values
            return v
        v = self._slots.get(name)
        if v is None or v.shape != like.shape or v.dtype != like.dtype or \
                _layout(v) != _layout(like):
            if name in self._buffers:
                self.allocator.free(self._buffers[name])
            v, self._buffers[name] = self._take_slot(name, like)
            self._slots[name] = v
        v[...] = values
        return v

    def _sgd_update(self, array):
        """The `sgd_update` of the kernels given, or else of `array`'s array module's."""
        return (self.kernels or _default_kernels(array)).sgd_update

    def step(self) -> None:
        """Update every parameter in place: one `sgd_update` call for all that have their
        momentum buffer (all of them after the first step), then the first step of the others."""
        ready, first = [], []
        for name, p in self.params:
            v = None
            if self.momentum:
                v = self.velocity.get(name)
                if v is None:
                    first.append((name, p))
                    continue
            ready.append((p.data, p.grad, v))
        if ready:
            update = self._sgd_update(ready[0][0])
            update(ready, self.lr, self.momentum, self.weight_decay, cache=self._launches)
        if first:
            self._first_step(first)

    def _first_step(self, first) -> None:
        """The step of the parameters [(name, Parameter)] that have no momentum buffer yet:
        v = grad + wd * w, computed in the buffer itself (w * wd, then + grad: the operations
        of a later step), then w -= lr * v by `sgd_update` without momentum or weight decay.
        No temporary on the GPU, whose update is one fused launch: the first step takes the
        memory of every later one (the step model counts no optimizer temporary)."""
        steps = []
        for name, p in first:
            w, g = p.data, p.grad
            if self.weight_decay:
                v = self._new_velocity(name, w, w)
                v *= w.dtype.type(self.weight_decay)
                v += g
            else:
                v = self._new_velocity(name, w, g)
            self.velocity[name] = v
            steps.append((w, v, None))
        self._sgd_update(steps[0][0])(steps, self.lr, 0.0, 0.0)

    def state_dict(self) -> dict:
        return {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay,
                "velocity": {k: np.array(to_numpy(v), copy=True) for k, v in self.velocity.items()}}

    def load_state_dict(self, state: dict) -> None:
        names = {n for n, _ in self.params}
        unknown = set(state.get("velocity", {})) - names
        if unknown:
            raise CheckpointError(f"optimizer state has momentum for unknown parameters "
                                  f"{sorted(unknown)[:5]}")
        self.lr = float(state["lr"])
        self.momentum = float(state["momentum"])
        self.weight_decay = float(state["weight_decay"])
        self.velocity = {}   # the slots stay: _new_velocity refills them
        for name, p in self.params:
            if name in state["velocity"]:
                v = np.asarray(state["velocity"][name])
                if v.shape != tuple(p.data.shape):
                    raise CheckpointError(f"momentum of {name!r} has shape {v.shape}, "
                                          f"parameter has {tuple(p.data.shape)}")
                xp = get_array_module(p.data)
                self.velocity[name] = self._new_velocity(name, p.data,
                                                         xp.asarray(v.astype(p.data.dtype)))


def _layout(a) -> str:
    """'nchw' or 'nhwc' (kernels/mapformat.py); 'nchw' for any other strides, which a new
    buffer then takes (the update runs through the reference's operations there)."""
    try:
        return layout_of(a)
    except ValueError:
        return "nchw"


def _default_kernels(array):
    """The kernel module for parameters like `array`: kernels/cpu.py for NumPy arrays,
    kernels/cuda.py for CuPy ones (cpu.py, whose operations also run on CuPy arrays, when
    the GPU kernels cannot be imported)."""
    if array is None or get_array_module(array) is np:
        return _cpu_kernels
    try:
        from .kernels import cuda
    except ImportError:
        return _cpu_kernels
    return cuda
