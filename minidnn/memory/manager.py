"""The memory manager: owns every feature-map buffer of a step and frees each one on time.

The executor asks it for buffers around each layer call; it answers from the liveness plan
(memory/plan.py). Buffers come from the allocator, are viewed with each tensor's shape and
dtype, and go back to the allocator right after their last use: in forward when backward
does not need them, in backward once consumed. Gradients of tensors read by several layers
(branches) are summed here, so layers only ever write their own result.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..network import DATA, LABEL
from .plan import LivenessPlan


class MemoryManager:
    """Runtime side of a LivenessPlan.

    Call order for one step (the executor does this):
        begin_step(train) ; write_input(DATA, x) ; write_input(LABEL, y)
        for i in forward order:   forward_buffers(i) -> compute -> after_forward(i)
        for i in reverse order:   backward_buffers(i) -> compute -> after_backward(i)
        end_step()
    """

    def __init__(self, plan: LivenessPlan, device, allocator):
        self.plan = plan
        self.device = device
        self.xp = device.xp
        self.allocator = allocator
        self.bufs: dict[int, object] = {}          # storage id -> flat uint8 device buffer
        self.train = True
        self.keep: set[int] = set()
        self.live_bytes = 0                        # feature maps, aux, grads, inputs
        self.peak_bytes = 0
        n = plan.num_nodes
        # Storages that die at each time of the step, for training and for evaluation.
        self._frees_train: dict[int, list[int]] = defaultdict(list)
        self._frees_eval: dict[int, list[int]] = defaultdict(list)
        for s in plan.storages:
            self._frees_train[s.free_time].append(s.id)
            if s.kind != "grad":
                self._frees_eval[s.last_forward_use].append(s.id)
        self._last_time = 2 * n - 1
        self._grad_written: set[str] = set()
        self._pending_sums: list[tuple[object, object]] = []

    # ---- buffers ------------------------------------------------------------------------------
    def _ensure(self, sid: int, where: str):
        buf = self.bufs.get(sid)
        if buf is None:
            s = self.plan.storages[sid]
            buf = self.allocator.alloc(s.nbytes, where)
            self.bufs[sid] = buf
            self.live_bytes += s.nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return buf

    def _release(self, sid: int) -> None:
        buf = self.bufs.pop(sid, None)
        if buf is not None:
            self.allocator.free(buf)
            self.live_bytes -= self.plan.storages[sid].nbytes

    def view(self, tensor: str, where: str = ""):
        """The tensor as an array of its shape and dtype (allocating its storage if needed)."""
        t = self.plan.tensors[tensor]
        buf = self._ensure(t.storage, where or tensor)
        n = int(np.prod(t.shape, dtype=np.int64)) * t.dtype.itemsize
        return buf[:n].view(t.dtype).reshape(t.shape)

    def has(self, tensor: str) -> bool:
        return self.plan.tensors[tensor].storage in self.bufs

    # ---- step ---------------------------------------------------------------------------------
    def begin_step(self, train: bool = True, keep: tuple[str, ...] = ()) -> None:
        """Start a step. `keep`: tensors to hold until end_step (outputs the caller reads)."""
        self.train = train
        self.keep = {self.plan.tensors[k].storage for k in keep}
        self._grad_written.clear()

    def write_input(self, name: str, host_array) -> None:
        """Copy a host (or device) batch into the `data` / `label` buffer."""
        dst = self.view(name)
        if self.device.is_gpu and isinstance(host_array, np.ndarray):
            dst.set(np.ascontiguousarray(host_array, dtype=dst.dtype), stream=self.device.compute)
        else:
            with self.device.compute:
                dst[...] = host_array

    def forward_buffers(self, i: int):
        """(inputs, output, aux) of node i for its forward."""
        node = self.plan.nodes[i]
        xs = [self.view(name) for name in node.inputs]
        y = self.view(node.name, where=f"forward of {node.name}")
        aux = {a: self.view(f"{node.name}:{a}", where=f"forward of {node.name}")
               for a in node.layer.aux_specs()}
        return xs, y, aux

    def after_forward(self, i: int) -> None:
        frees = self._frees_train[i] if self.train else self._frees_eval[i]
        for sid in frees:
            if sid not in self.keep:
                self._release(sid)

    def backward_buffers(self, i: int):
        """(retained inputs, retained output, grad output, grad inputs, aux) of node i."""
        node = self.plan.nodes[i]
        layer = node.layer
        where = f"backward of {node.name}"
        xs = [self.view(name) if k in layer.retain_inputs else None
              for k, name in enumerate(node.inputs)]
        y = self.view(node.name) if layer.retain_output else None
        aux = {a: self.view(f"{node.name}:{a}") for a in layer.aux_specs()}
        gy = self.view(f"grad:{node.name}", where)
        if i == self.plan.num_nodes - 1:
            gy[...] = 1  # d loss / d loss
        gxs = []
        self._pending_sums = []
        for k, name in enumerate(node.inputs):
            if not self.plan.wants_grad(node, k):
                gxs.append(None)
                continue
            gname = f"grad:{name}"
            if gname not in self._grad_written:
                self._grad_written.add(gname)
                gxs.append(self.view(gname, where))
            else:
                # A second reader of `name` (a branch): write into a temporary, sum after.
                t = self.plan.tensors[gname]
                tmp, tmp_buf = self.allocator.empty(t.shape, t.dtype, where)
                self._pending_sums.append((self.view(gname), tmp, tmp_buf))
                gxs.append(tmp)
        return xs, y, gy, gxs, aux

    def after_backward(self, i: int) -> None:
        for acc, tmp, tmp_buf in self._pending_sums:
            acc += tmp
            self.allocator.free(tmp_buf)
        self._pending_sums = []
        for sid in self._frees_train[self.plan.backward_time(i)]:
            if sid not in self.keep:
                self._release(sid)

    def end_step(self) -> None:
        """Free whatever is still held (the loss value, kept outputs)."""
        for sid in list(self.bufs):
            self._release(sid)
        self.keep = set()
