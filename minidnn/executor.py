"""The executor: runs forward and backward of a network layer by layer on one device.

It owns the step's order and nothing else: every buffer comes from the memory manager, every
number from a layer. This is the Python API the training loop and the CLI are built on:

    net = models.build("alexnet", num_classes=10, image_size=64)
    ex = Executor(net, batch=32, device="auto", seed=0)
    loss = ex.forward(x, labels)          # x: (32, 3, 64, 64) float32, labels: (32,) int
    ex.backward()
    grads = ex.gradients()                # {'conv1.weight': ndarray, ...}
"""
from __future__ import annotations

import numpy as np

from .backend import Device, select_device, to_numpy
from .errors import DataError, ShapeError
from . import kernels
from .layers.base import StepContext
from .memory.allocator import SimpleAllocator
from .memory.manager import MemoryManager
from .memory.plan import LivenessPlan
from .network import DATA, LABEL, Network


class Executor:
    """Training and evaluation steps of `net` at a fixed batch size on one device.

    Parameters move to the device here; `net.state_dict()` reads them back.
    """

    def __init__(self, net: Network, batch: int, device: str | Device = "auto", seed: int = 0,
                 memory_budget: int | None = None):
        self.net = net
        self.batch = int(batch)
        self.device = device if isinstance(device, Device) else select_device(device)
        self.xp = self.device.xp
        self.seed = int(seed)
        self.kernels = kernels.for_device(self.device)
        self.plan = LivenessPlan(net, self.batch)
        self.allocator = SimpleAllocator(self.xp, memory_budget)
        params = net.parameters()
        if any(p.data is None for _, p in params):
            net.init_params(self.seed)
        for _, p in params:
            p.data = self.device.asarray(p.data, dtype=net.dtype)
            p.grad = self.xp.zeros_like(p.data)
        self.manager = MemoryManager(self.plan, self.device, self.allocator)
        self.step = 0                  # steps taken; seeds dropout, so resume replays it
        self._outputs = None
        self._in_step = False

    # ---- one step -------------------------------------------------------------------------------
    def _check_batch(self, x, labels) -> None:
        want = (self.batch,) + self.net.input_shape
        if tuple(x.shape) != want:
            raise ShapeError(f"input 'data' of network {self.net.name!r} must have shape {want} "
                             f"(batch, channels, height, width), got {tuple(x.shape)}")
        if tuple(labels.shape) != (self.batch,):
            raise ShapeError(f"input 'label' must have shape ({self.batch},), "
                             f"got {tuple(labels.shape)}")
        if isinstance(labels, np.ndarray):  # device labels come from our own generators
            if not np.issubdtype(labels.dtype, np.integer):
                raise DataError(f"labels must be integers, got dtype {labels.dtype}")
            k = self.plan.tensors[self.net.output].shape[-1]
            if labels.size and (labels.min() < 0 or labels.max() >= k):
                bad = labels[(labels < 0) | (labels >= k)][0]
                raise DataError(f"label {bad} is out of range: network {self.net.name!r} has "
                                f"{k} classes (labels 0..{k - 1})")

    def _ctx(self, train: bool) -> StepContext:
        return StepContext(self.xp, kernels=self.kernels, train=train, step=self.step,
                           seed=self.seed, device=self.device)

    def forward(self, x, labels, train: bool = True, keep_outputs: bool = False):
        """Run forward; returns the mean loss as a 0-d device array (float() reads it).

        With train=True the step stays open for `backward()`. keep_outputs=True keeps the
        logits so that `outputs()` can read them.
        """
        self._check_batch(x, labels)
        if self._in_step:  # a forward without its backward: drop that step's buffers
            self.manager.end_step()
        mm = self.manager
        keep = (self.net.loss_node.name,) + ((self.net.output,) if keep_outputs else ())
        mm.begin_step(train, keep)
        mm.write_input(DATA, x)
        mm.write_input(LABEL, labels)
        ctx = self._ctx(train)
        with self.device.compute:
            for i, node in enumerate(self.plan.nodes):
                xs, y, aux = mm.forward_buffers(i)
                node.layer.forward(xs, y, aux, ctx)
                mm.after_forward(i)
            loss = mm.view(self.net.loss_node.name).copy()
            self._outputs = mm.view(self.net.output).copy() if keep_outputs else None
        self._in_step = train
        if not train:
            mm.end_step()
        return loss

    def backward(self) -> None:
        """Backward of the last training forward: fills every parameter's `.grad`."""
        if not self._in_step:
            raise RuntimeError("backward() needs a forward(..., train=True) before it")
        mm = self.manager
        ctx = self._ctx(True)
        with self.device.compute:
            for i in reversed(range(len(self.plan.nodes))):
                xs, y, gy, gxs, aux = mm.backward_buffers(i)
                self.plan.nodes[i].layer.backward(xs, y, gy, gxs, aux, ctx)
                mm.after_backward(i)
        mm.end_step()
        self._in_step = False

    def train_step(self, x, labels, optimizer):
        """forward, backward, optimizer update; returns the loss (0-d device array)."""
        loss = self.forward(x, labels, train=True)
        self.backward()
        optimizer.step()
        self.step += 1
        return loss

    def evaluate(self, x, labels):
        """(loss, logits as NumPy) in evaluation mode (dropout off)."""
        loss = self.forward(x, labels, train=False, keep_outputs=True)
        return float(loss), self.outputs()

    # ---- reading results ---------------------------------------------------------------------
    def outputs(self) -> np.ndarray:
        """Logits (batch, classes) of the last forward run with keep_outputs=True."""
        if self._outputs is None:
            raise RuntimeError("no outputs kept: call forward(..., keep_outputs=True)")
        return to_numpy(self._outputs)

    def gradients(self) -> dict[str, np.ndarray]:
        """{'conv1.weight': NumPy array, ...} from the last backward."""
        return {name: to_numpy(p.grad) for name, p in self.net.parameters()}

    def parameters(self):
        """[(name, Parameter)] with data and grad on this device."""
        return self.net.parameters()
