"""Liveness plan: which buffers exist in a step, who shares them, and when each one dies.

Computed once per (network, batch) before any compute, from what each layer declares. The
memory manager follows it; policies (offload, ...) read it to decide what to move.

Vocabulary
* tensor: a named value of the step: a node's output ("conv1"), a graph input ("data",
  "label"), an aux buffer ("pool1:argmax"), or a gradient ("grad:conv1").
* storage: a buffer. In-place layers make several tensors share one storage (a ReLU writes
  over its input; a Flatten is a view), so storages, not tensors, are allocated and freed.

The clock: times are positions in the step, integers. Forward of node i is time i, backward
of node i is time 2*len(nodes) - 1 - i, so that every event of a step has one increasing
clock; graph inputs are written at time -1, before node 0. A storage's times (alloc_time,
last_forward_use, backward_uses, free_time) and the memory manager's `time` are on it.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..kernels.mapformat import MapFormat
from ..network import DATA, LABEL, Network

GRAD_PREFIX = "grad:"


def grad_name(tensor: str) -> str:
    """The name of the gradient of tensor `tensor` ("conv1" -> "grad:conv1")."""
    return GRAD_PREFIX + tensor


@dataclass
class StoragePlan:
    """One buffer of the step and its life."""
    id: int
    nbytes: int
    kind: str                      # 'input' | 'feature' | 'aux' | 'grad'
    tensors: list[str] = field(default_factory=list)
    alloc_time: int = 0            # when it is first written
    last_forward_use: int = 0      # last forward read or write
    last_forward_write: int = -1   # last forward write (-1: a graph input, written before node 0);
                                   # an in-place layer writes its input's storage again, so this
                                   # is when the bytes that backward reads are final
    backward_uses: list[int] = field(default_factory=list)  # times of backward reads
    free_time: int = 0             # after this time nobody reads it (training step)
    producer: int = -1             # index of the node that writes it (-1 for graph inputs)
    gradient_from: int | None = None  # a feature map whose buffer takes a gradient over it
                                      # (grad_over_input) from this backward time on

    @property
    def needed_in_backward(self) -> bool:
        return bool(self.backward_uses)

    @property
    def first_backward_use(self) -> int | None:
        return min(self.backward_uses) if self.backward_uses else None


@dataclass
class TensorPlan:
    name: str
    shape: tuple
    dtype: np.dtype
    storage: int


class LivenessPlan:
    """Buffers and lifetimes of one training step of `net` at batch `batch`.

    Attributes: tensors {name: TensorPlan}, storages [StoragePlan], grad_alias {node index:
    True when the node's input gradient shares its output gradient's buffer}, grad_over_input
    {node index: True when the node writes input 0's gradient over input 0's buffer (the
    layer allows it and no other backward reads that buffer)}, inplace {node index: True when
    the node writes its output over input 0's storage}, backward_reads [node index -> sorted
    storage ids its backward reads (retained inputs and output, aux)].

    relu_bits: names of the ReLU nodes that keep one bit per value for backward instead of
    their output (a decision's MemoryDecision.relu_bits; layers/relu.py): what each layer
    keeps for backward is read through `retains_output(i)` and `aux_specs(i)`.
    input_grad: also plan the gradient of the input batch, `grad:data` (the layers reading
    `data` compute it in backward; it lives until the step ends, so it can be read after).
    maps: the MapFormat the feature maps are stored in (kernels/mapformat.py); the manager
    views buffers by it.
    rows [node index -> slice or None]: the rows of its input 0 a node reads, None for all:
    piece j of a layer chunk (minidnn/chunks.py) reads its rows of the run's input, and in
    backward writes its rows of that input's gradient (a buffer of the whole batch, whose
    rows the pieces share out: no piece sums into another's). Such a node never runs in
    place, nor writes that gradient over its input or its output gradient.
    fuse: the step folds the ReLU after a two-input add into the add (minidnn/fusion.py),
    whose backward then reads its output for the ReLU's mask: such an add retains it; a
    batch norm before such an add may apply both, reading the add's other input in its
    forward (residual_reads); and a max pool after a ReLU applies the ReLU's mask in its
    backward (pooled_relus), so that ReLU retains nothing.
    """

    def __init__(self, net: Network, batch: int, relu_bits=frozenset(),
                 input_grad: bool = False, maps: MapFormat | None = None, fuse: bool = True):
        self.net = net
        self.fuse = bool(fuse)
        self.batch = batch
        self.relu_bits = frozenset(relu_bits)
        self.input_grad = bool(input_grad)
        self.maps = maps if maps is not None else MapFormat()
        self._writers = None           # storage id -> writer nodes, built by writers()
        self._liveness_peaks: dict = {}  # kinds -> liveness_peak_bytes
        self._aux_tensors = None         # node index -> aux_tensors(i), built on first use
        self._backward_tensors = None    # node index -> backward_tensors(i), the same way
        self._call_maps: dict = {}       # (node index, phase) -> call_maps, the same way
        shapes = net.infer_shapes(batch)
        self.nodes = net.nodes
        self.num_nodes = len(self.nodes)
        self.tensors: dict[str, TensorPlan] = {}
        self.storages: list[StoragePlan] = []
        self.rows: list[slice | None] = [net.input_rows(node, batch) for node in self.nodes]
        # Feature maps and their gradients in the format's dtype (bf16 under mixed precision);
        # the loss and its gradient stay in the network's dtype.
        self._map_dtype = self.maps.map_dtype(net.dtype)
        index = {node.name: i for i, node in enumerate(self.nodes)}
        # The adds that apply the ReLU after them (`fuse`) retain their output, which that
        # ReLU overwrites in place with its own: found once the in-place writes are known.
        self._masking_adds = frozenset()
        # {ReLU index: max pool index}: the max pools that apply the mask of the ReLU before
        # them in their backward (`fuse`); those ReLUs keep nothing for backward, neither
        # their output nor bits.
        self.pooled_relus = self._relus_before_max_pools(net.consumers(), index) if fuse else {}
        self._forward_tensors(shapes, net.consumers(), index)
        if fuse:
            self._masking_adds = self._adds_before_relus(net.consumers(), index)
        self._uses()
        self._gradients(shapes)
        self._lifetimes(index)
        # {batch norm index: the add's other input}: the batch norms that may apply the add
        # after them and its ReLU (`fuse`), whose forward then reads that input too.
        self.residual_reads = self._bn_adds(net.consumers(), index) if fuse else {}

    def _new_storage(self, name, shape, dt, kind, producer) -> StoragePlan:
        """A storage of its own for tensor `name`, written first by node `producer`."""
        nbytes = math.prod(int(d) for d in shape) * np.dtype(dt).itemsize
        # Graph inputs (producer -1) are written before node 0 runs: time -1.
        s = StoragePlan(len(self.storages), max(nbytes, np.dtype(dt).itemsize), kind,
                        producer=producer, alloc_time=producer)
        self.storages.append(s)
        self.tensors[name] = TensorPlan(name, tuple(shape), np.dtype(dt), s.id)
        s.tensors.append(name)
        return s

    def _forward_tensors(self, shapes: dict, consumers: dict, index: dict) -> None:
        """Graph inputs, node outputs (in place where a layer may overwrite its input), aux."""
        dtype, map_dtype = self.net.dtype, self._map_dtype

        def dtype_of(node):
            return dtype if node.layer.kind == "loss" else map_dtype

        self._new_storage(DATA, shapes[DATA], map_dtype, "input", -1)
        self._new_storage(LABEL, shapes[LABEL], np.int64, "input", -1)
        self.inplace: dict[int, bool] = {}
        for i, node in enumerate(self.nodes):
            layer = node.layer
            shape = shapes[node.name]
            src = node.inputs[0] if node.inputs else None
            if layer.inplace and src is not None and self.rows[i] is None and \
                    self._may_overwrite(i, src, consumers, index):
                s = self.storages[self.tensors[src].storage]
                self.tensors[node.name] = TensorPlan(node.name, shape, dtype_of(node), s.id)
                s.tensors.append(node.name)
                self.inplace[i] = True
            else:
                self._new_storage(node.name, shape, dtype_of(node), "feature", i)
                self.inplace[i] = False
            for aux_name, (aux_shape, aux_dtype) in self.aux_specs(i).items():
                self._new_storage(f"{node.name}:{aux_name}", aux_shape, aux_dtype, "aux", i)

    def _uses(self) -> None:
        """The forward and backward uses of every storage, and what each backward reads."""
        self.backward_reads: list[list[int]] = []
        for i, node in enumerate(self.nodes):
            bt = self.backward_time(i)
            reads = set()
            out = self.storage_of(node.name)
            out.last_forward_use = max(out.last_forward_use, i)
            out.last_forward_write = max(out.last_forward_write, i)
            for k, inp in enumerate(node.inputs):
                s = self.storage_of(inp)
                s.last_forward_use = max(s.last_forward_use, i)
                if k in node.layer.retain_inputs:
                    s.backward_uses.append(bt)
                    reads.add(s.id)
            if self.retains_output(i):
                out.backward_uses.append(bt)
                reads.add(out.id)
            for aux_name in self.aux_specs(i):
                s = self.storage_of(f"{node.name}:{aux_name}")
                # Written by this node's forward; without this an evaluation step, which frees
                # at the last forward use, would keep every aux buffer until the step ends.
                s.last_forward_use = max(s.last_forward_use, i)
                s.last_forward_write = max(s.last_forward_write, i)
                s.backward_uses.append(bt)
                reads.add(s.id)
            self.backward_reads.append(sorted(reads))
        # The loss value is read by the caller after forward; it lives until the step ends.
        n = self.num_nodes
        self.storage_of(self.nodes[-1].name).backward_uses.append(self.backward_time(n - 1))

    def _gradients(self, shapes: dict) -> None:
        """Gradient tensors: the gradient of a node's output is born at its last consumer's
        backward, in a buffer of its own, or over the output gradient (grad_alias) or the
        input itself (grad_over_input)."""
        n, map_dtype = self.num_nodes, self._map_dtype
        self.grad_alias: dict[int, bool] = {}
        self.grad_over_input: dict[int, bool] = {}
        for i in reversed(range(n)):
            node = self.nodes[i]
            if i == n - 1:  # the loss: its "output gradient" is the constant 1
                s = self._new_storage(grad_name(node.name), (), self.net.dtype, "grad", i)
                s.alloc_time = s.free_time = self.backward_time(i)
            for k, inp in enumerate(node.inputs):
                if not self.grad_wanted(node, k):
                    continue
                gname = grad_name(inp)
                if gname in self.tensors:      # a later consumer wrote it first
                    continue
                # Input 0 read whole may share a buffer with its gradient; a chunk's piece
                # writes its rows of the gradient's own buffer, which the first piece in
                # backward (the last piece) takes.
                whole_input = k == 0 and self.rows[i] is None
                if whole_input and node.layer.inplace:
                    # The input gradient overwrites the output gradient (ReLU, Flatten, ...).
                    s = self.storage_of(grad_name(node.name))
                    self.grad_alias[i] = True
                elif whole_input and self._may_take_input(i, inp):
                    # The input's buffer, read by this backward alone, takes its gradient.
                    s = self.storage_of(inp)
                    s.gradient_from = self.backward_time(i)
                    self.grad_over_input[i] = True
                else:
                    s = self._new_storage(gname, shapes[inp], map_dtype, "grad", i)
                    s.alloc_time = self.backward_time(i)
                    continue
                self.tensors[gname] = TensorPlan(gname, shapes[inp], map_dtype, s.id)
                s.tensors.append(gname)

    def _lifetimes(self, index: dict) -> None:
        """When each storage is freed: a map after its last use; the output gradient is last
        read by its node's backward, unless an input gradient took over its buffer, in which
        case the input's producer reads it last."""
        n = self.num_nodes
        for s in self.storages:
            if s.kind != "grad":
                s.free_time = max([s.last_forward_use] + s.backward_uses)
        for name, t in self.tensors.items():
            if not name.startswith(GRAD_PREFIX):
                continue
            s = self.storages[t.storage]
            producer = name[len(GRAD_PREFIX):]
            end = self.backward_time(index[producer]) if producer in index else s.alloc_time
            if producer == DATA:
                end = 2 * n     # after the last backward call: end_step releases it
            s.free_time = max(s.free_time, end)

    # ---- helpers ------------------------------------------------------------------------------
    def retains_output(self, i: int) -> bool:
        """Does node i's backward read its output? (A ReLU that keeps bits does not.)"""
        layer = self.nodes[i].layer
        if layer.kind == "relu":
            return i not in self.pooled_relus and layer.keep_in(self.relu_bits) == "output"
        return layer.retain_output or i in self._masking_adds

    def _relus_before_max_pools(self, consumers, index) -> dict:
        """{ReLU index: max pool index} of the ReLUs whose output (not the network's) one max
        pool alone reads, a pool whose backward may apply their mask (its windows leave the
        argmax a bit for the mark: Layer.masks_relu_before), neither a piece of a layer
        chunk, and the ReLU's input gradient wanted, whole, in its output gradient's buffer
        (grad_alias): the pool's backward writes the masked gradient there, and the ReLU's
        backward has nothing to mask (minidnn/fusion.py). A ReLU the decision has keep bits
        (relu_bits) is one too: it then keeps nothing, which is less."""
        found = {}
        for i, node in enumerate(self.nodes):
            readers = consumers[node.name]
            if node.layer.kind != "relu" or node.piece is not None or len(readers) != 1 \
                    or node.name == self.net.output or self.rows[i] is not None \
                    or not self.grad_wanted(node, 0):
                continue
            pool = readers[0]
            if pool.piece is None and pool.layer.masks_relu_before:
                found[i] = index[pool.name]
        return found

    def _adds_before_relus(self, consumers, index) -> frozenset:
        """Indices of the two-input adds (not the network's output) read by one ReLU alone,
        which runs in place on their output and keeps it: the adds that may apply that ReLU
        and mask their gradient with its output (minidnn/fusion.py). Input 0's gradient must
        be wanted: the fused backward masks the output gradient in place as that gradient
        (grad_alias); an add without it stays unfused and retains nothing."""
        found = set()
        for i, node in enumerate(self.nodes):
            readers = consumers[node.name]
            if node.layer.kind != "add" or len(node.inputs) != 2 or len(readers) != 1 \
                    or node.name == self.net.output or not self.grad_wanted(node, 0):
                continue
            r = index[readers[0].name]
            relu = self.nodes[r]
            if relu.layer.kind == "relu" and relu.piece is None and self.inplace.get(r) \
                    and relu.layer.keep_in(self.relu_bits) == "output":
                found.add(i)
        return frozenset(found)

    def _bn_adds(self, consumers, index) -> dict:
        """{batch norm index: the add's other input} of the adds that apply the ReLU after
        them (_adds_before_relus), whose ReLU's input gradient takes its output gradient's
        buffer (grad_alias), run in place on input 0, and whose input 0 a batch norm writes
        (not a piece of a layer chunk), read by that add alone, the other input written
        before the batch norm runs: the batch norm may then apply the add and the ReLU
        (minidnn/fusion.py), reading the other input in its forward (call_maps)."""
        found = {}
        for a in sorted(self._masking_adds):
            add = self.nodes[a]
            src, other = add.inputs
            b = index.get(src)
            if b is None or not self.inplace.get(a) or \
                    not self.grad_alias.get(index[consumers[add.name][0].name]):
                continue
            bn = self.nodes[b]
            if bn.layer.kind == "batchnorm" and bn.piece is None and \
                    [n.name for n in consumers[src]] == [add.name] and index.get(other, -1) < b:
                found[b] = other
        return found

    def aux_specs(self, i: int) -> dict:
        """{name: (shape, dtype)} of the aux buffers node i's forward fills for backward."""
        layer = self.nodes[i].layer
        if layer.kind != "relu":
            return layer.aux_specs()
        return {} if i in self.pooled_relus else layer.aux_specs(self.relu_bits)

    def aux_tensors(self, i: int) -> tuple:
        """((aux name, its tensor name), ...) of node i, in aux_specs order. Kept once
        worked out: the memory manager asks at every call of every step."""
        if self._aux_tensors is None:
            self._aux_tensors = [tuple((a, f"{node.name}:{a}") for a in self.aux_specs(j))
                                 for j, node in enumerate(self.nodes)]
        return self._aux_tensors[i]

    def backward_tensors(self, i: int) -> tuple:
        """(retained, output, grad_output, grad_inputs) of node i's backward: per input, its
        name if backward reads it, else None; the output's name if retained, else None; the
        output's gradient; per input, its gradient's name if backward writes it, else None.
        Kept once worked out, as aux_tensors."""
        if self._backward_tensors is None:
            self._backward_tensors = [
                (tuple(name if k in node.layer.retain_inputs else None
                       for k, name in enumerate(node.inputs)),
                 node.name if self.retains_output(j) else None,
                 grad_name(node.name),
                 tuple(grad_name(name) if self.grad_wanted(node, k) else None
                       for k, name in enumerate(node.inputs)))
                for j, node in enumerate(self.nodes)]
        return self._backward_tensors[i]

    def call_maps(self, i: int, phase: str) -> list:
        """((shape, dtype), ...) of the arrays node i's `phase` call ('forward', 'recompute' or
        'backward') is handed and writes, in the memory manager's order (its *_buffers): the
        inputs and the output in forward; the retained inputs and output, the output's
        gradient and the input gradients it writes in backward. Input 0 and its gradient
        are the node's rows of them (a piece of a layer chunk). The call's temporaries are
        declared from these (layers/precision.py: temporary_bytes); aux buffers stay in the
        network's dtype and are not among them. Kept once worked out: every executor of
        the plan (the planner makes many) asks for every call."""
        key = (i, "forward" if phase == "recompute" else phase)
        if key not in self._call_maps:
            self._call_maps[key] = tuple(self._maps_of_call(*key))
        return self._call_maps[key]

    def _maps_of_call(self, i: int, phase: str) -> list:
        node, rows = self.nodes[i], self.rows[i]

        def entry(name, k):
            t = self.tensors[name]
            shape = t.shape
            if k == 0 and rows is not None:
                shape = (rows.stop - rows.start,) + tuple(shape[1:])
            return tuple(shape), t.dtype

        if phase == "forward":
            extra = [self.residual_reads[i]] if i in self.residual_reads else []
            return [entry(name, k) for k, name in enumerate(node.inputs)] + \
                [entry(name, None) for name in extra] + [entry(node.name, None)]
        retained, output, grad_output, grad_inputs = self.backward_tensors(i)
        out = [entry(name, k) for k, name in enumerate(retained) if name is not None]
        if output is not None:
            out.append(entry(output, None))
        out.append(entry(grad_output, None))
        return out + [entry(name, k) for k, name in enumerate(grad_inputs) if name is not None]

    def backward_time(self, i: int) -> int:
        return 2 * self.num_nodes - 1 - i

    def storage_of(self, tensor: str) -> StoragePlan:
        return self.storages[self.tensors[tensor].storage]

    def tensor_names(self, sids) -> list[str]:
        """The first tensor of each storage in `sids`, in storage order (for tables)."""
        return [self.storages[s].tensors[0] for s in sorted(sids)]

    def node_at(self, time: int) -> int:
        """The node whose backward runs at `time` (backward_time's inverse)."""
        return 2 * self.num_nodes - 1 - time

    def writers(self, sid: int) -> list[int]:
        """Indices of the nodes whose forward writes storage `sid`, in order: its producer and
        the in-place layers (and views) that share its buffer."""
        if self._writers is None:      # the plan does not change once made: index it once
            self._writers = defaultdict(list)
            for i, node in enumerate(self.nodes):
                self._writers[self.tensors[node.name].storage].append(i)
        return list(self._writers.get(sid, ()))

    @staticmethod
    def wants_grad(node, k: int) -> bool:
        return node.layer.has_grad_inputs and node.inputs[k] not in (DATA, LABEL) and \
            not (node.layer.kind == "loss" and k == 1)

    def grad_wanted(self, node, k: int) -> bool:
        """Does node's backward write the gradient of its input k in this plan (wants_grad,
        and the input batch's too when the plan has input_grad)?"""
        return self.wants_grad(node, k) or (self.input_grad and node.inputs[k] == DATA and
                                            node.layer.has_grad_inputs)

    def _may_take_input(self, i: int, inp: str) -> bool:
        """May node i's backward write the gradient of its input 0, `inp`, over inp's buffer?
        Only if its layer reads that input before writing its gradient (grad_over_input), the
        buffer is a feature map of the same size, and node i's backward is the only backward
        that reads it (a ReLU that keeps bits instead of its output does not)."""
        if not self.nodes[i].layer.grad_over_input or inp in (DATA, LABEL):
            return False
        s = self.storage_of(inp)
        t = self.tensors[inp]
        size = int(np.prod(t.shape, dtype=np.int64)) * t.dtype.itemsize
        return s.kind == "feature" and s.nbytes == size and \
            s.backward_uses == [self.backward_time(i)]

    def _may_overwrite(self, i: int, src: str, consumers, index) -> bool:
        """May node i write its output over tensor `src`'s buffer?

        Only if nothing reads that buffer's old values after node i: `src` is not a graph
        input, node i is its only reader, node i's backward does not read it, and no tensor
        already sharing the buffer is read later or in backward. A reshape overwrites nothing
        and may always share.
        """
        if src in (DATA, LABEL):
            return False
        node = self.nodes[i]
        if node.layer.kind == "reshape" and not (self.maps.layout == "nhwc"
                                                 and len(self.tensors[src].shape) == 4):
            # A reshape (Flatten) is a view: its output is input 0's bytes, unchanged, so
            # sharing the buffer destroys nothing that anyone else reads. A channels-last map
            # is reordered to NCHW order on the way (layers/flatten.py): the rules below.
            return True
        if len(consumers[src]) != 1 or 0 in node.layer.retain_inputs:
            return False
        s = self.storage_of(src)
        for t in s.tensors:
            readers = consumers[t]
            if any(index[r.name] > i for r in readers if r is not node):
                return False
            if any(k in r.layer.retain_inputs
                   for r in readers for k, name in enumerate(r.inputs) if name == t):
                return False
            producer = self.nodes[index[t]] if t in index else None
            if producer is not None and self.retains_output(index[t]):
                return False
        return True

    # ---- the two baselines the paper compares -------------------------------------------------
    def network_wide_bytes(self, kinds=("input", "feature", "aux", "grad")) -> int:
        """Every buffer allocated for the whole step (the 2016 frameworks' allocation)."""
        return sum(s.nbytes for s in self.storages if s.kind in kinds)

    def liveness_peak_bytes(self, kinds=("input", "feature", "aux", "grad")) -> int:
        """Peak bytes when each buffer lives exactly from its first write to its last read.
        Worked out once per `kinds`: every step's memory_stats() reports it, and the plan does
        not change once made."""
        key = tuple(kinds)
        if key not in self._liveness_peaks:
            self._liveness_peaks[key] = self._liveness_peak(key)
        return self._liveness_peaks[key]

    def _liveness_peak(self, kinds) -> int:
        events = []
        for s in self.storages:
            if s.kind in kinds:
                events.append((s.alloc_time, 1, s.nbytes))
                events.append((s.free_time, 2, -s.nbytes))  # frees after allocs at the same time
        cur = peak = 0
        for _, _, delta in sorted(events):
            cur += delta
            peak = max(peak, cur)
        return peak
