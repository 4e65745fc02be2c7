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
large cuDNN workspaces could not use.
"""
from __future__ import annotations

import numpy as np

from .backend import get_array_module, to_numpy
from .errors import CheckpointError, ConfigError


class SGD:
    def __init__(self, params, lr: float = 0.01, momentum: float = 0.9, weight_decay: float = 0.0,
                 allocator=None):
        """params: [(name, Parameter)] as `Network.parameters()` returns them; allocator: where
        momentum buffers come from (anything with `empty(shape, dtype, where) -> (array, buf)`,
        e.g. `Executor.allocator`); None: the parameters' array module."""
        if lr <= 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ConfigError(f"SGD needs lr > 0, 0 <= momentum < 1, weight_decay >= 0; got "
                              f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}")
        self.params = list(params)
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.allocator = allocator
        self.velocity: dict[str, object] = {}
        self._buffers: dict[str, object] = {}   # allocator buffers behind `velocity`
        self._slots: dict[str, object] = {}     # name -> momentum array, taken up front
        if allocator is not None and self.momentum:
            for name, p in self.params:
                if p.data is not None:
                    self._slots[name], self._buffers[name] = allocator.empty(
                        p.data.shape, p.data.dtype, f"momentum of {name}")

    def _new_velocity(self, name: str, like, values):
        """A momentum buffer shaped like `like`, holding `values`."""
        if self.allocator is None:
            xp = get_array_module(like)
            return xp.array(values, copy=True)
        v = self._slots.get(name)
        if v is None or v.shape != like.shape or v.dtype != like.dtype:
            if name in self._buffers:
                self.allocator.free(self._buffers[name])
            v, self._buffers[name] = self.allocator.empty(like.shape, like.dtype,
                                                          f"momentum of {name}")
            self._slots[name] = v
        v[...] = values
        return v

    def step(self) -> None:
        # One temporary the size of the parameter, alive at a time (the largest counts against
        # the memory budget: planner/costs.py): it holds grad + wd * w, then lr * v. The
        # operations, and so the bits, are those of the formulas in the module docstring.
        for name, p in self.params:
            w, scalar = p.data, p.data.dtype.type
            g, tmp = p.grad, None
            if self.weight_decay:
                tmp = w * scalar(self.weight_decay)
                tmp += g
                g = tmp
            if self.momentum:
                v = self.velocity.get(name)
                if v is None:
                    v = self.velocity[name] = self._new_velocity(name, w, g)
                else:
                    v *= scalar(self.momentum)
                    v += g
                g = v
            if tmp is None:
                tmp = g * scalar(self.lr)
            else:
                get_array_module(w).multiply(g, scalar(self.lr), out=tmp)
            w -= tmp

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
