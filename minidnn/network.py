"""The layer graph: a DAG of named nodes, shape inference, execution order, parameters.

A network has two graph inputs, `data` (N, C, H, W) and `label` (N,), and ends in a loss node.
Every node runs one layer and produces one tensor named like the node. Nodes are added in an
order where every input already exists, so insertion order is a topological order and is the
execution order of forward (backward runs it in reverse).

    net = Network(input_shape=(3, 32, 32), num_classes=10)
    a = net.add(Conv2d(16, 3, padding=1), name="conv1")           # input: data
    b = net.add(ReLU(), name="relu1")                               # input: previous node
    c = net.add(Conv2d(16, 1), inputs=["data"], name="skip")
    net.add(Add(), inputs=[b, c], name="join")
    ...
    net.add_loss()                                                  # softmax cross-entropy
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import CheckpointError, ConfigError, ShapeError
from .layers.base import Layer
from .layers.loss import SoftmaxCrossEntropy

DATA, LABEL = "data", "label"


@dataclass
class Node:
    """One layer in the graph. Its output tensor has the node's name.

    piece: (j, p) for piece j of p of a layer chunk (minidnn/chunks.py), which runs the
    node's layer on rows j*b .. (j+1)*b of the pass batch (b = batch / p); None otherwise.
    """
    name: str
    layer: Layer
    inputs: list[str]
    piece: tuple | None = None

    @property
    def output(self) -> str:
        return self.name


class Network:
    """A DAG of layers with shape inference. Parameters are created by `init_params`.

    `shapes` ({tensor name: shape}) and `batch` are those of the last `infer_shapes(batch)`,
    the call that sets the layers up; an Executor makes it at its own batch. To read the
    shapes at another batch without changing them, use `shapes_at(batch)` (summaries do).
    """

    def __init__(self, input_shape: tuple, num_classes: int | None = None, name: str = "net",
                 dtype=np.float32):
        input_shape = tuple(int(d) for d in input_shape)
        if len(input_shape) not in (1, 3) or min(input_shape) <= 0:
            raise ShapeError(f"network {name!r}: input_shape must be (C, H, W) or (F,) with "
                             f"positive sizes, got {input_shape}")
        self.input_shape = input_shape
        self.num_classes = num_classes
        self.name = name
        self.dtype = np.dtype(dtype)
        self.nodes: list[Node] = []
        self._by_name: dict[str, Node] = {}
        self.shapes: dict[str, tuple] = {}
        self.batch: int | None = None

    # ---- building --------------------------------------------------------------------------
    def add(self, layer: Layer, inputs: list[str] | str | None = None, name: str | None = None) -> str:
        """Append a node; `inputs` defaults to the previous node (or `data`). Returns its name."""
        if self.nodes and self.nodes[-1].layer.kind == "loss":
            raise ConfigError(f"network {self.name!r}: cannot add {name or layer!r} after the loss")
        if inputs is None:
            inputs = [self.nodes[-1].name if self.nodes else DATA]
        elif isinstance(inputs, str):
            inputs = [inputs]
        name = name or layer.name or f"{type(layer).__name__.lower()}{len(self.nodes) + 1}"
        self._check_node(name, list(inputs))
        layer.name = name
        layer.index = len(self.nodes)
        return self.add_node(Node(name, layer, list(inputs)))

    def add_node(self, node: Node) -> str:
        """Append a node made elsewhere, leaving its layer's name and index as they are (the
        pieces of a layer chunk share the layers of another network: minidnn/chunks.py).
        Returns its name."""
        self._check_node(node.name, node.inputs)
        self.nodes.append(node)
        self._by_name[node.name] = node
        self.batch = None  # shapes must be inferred again
        return node.name

    def _check_node(self, name: str, inputs: list[str]) -> None:
        """ConfigError unless `name` is new and every input is defined before it."""
        if name in self._by_name or name in (DATA, LABEL):
            raise ConfigError(f"network {self.name!r}: duplicate node name {name!r}")
        for i in inputs:
            if i not in self._by_name and i not in (DATA, LABEL):
                raise ConfigError(f"network {self.name!r}: node {name!r} reads {i!r}, which is "
                                  f"not defined before it (known: data, label, "
                                  f"{', '.join(self._by_name) or 'no nodes yet'})")

    def add_loss(self, logits: str | None = None) -> str:
        """Append softmax cross-entropy on `logits` (default: the last node) and `label`."""
        if logits is None and not self.nodes:
            raise ConfigError(f"network {self.name!r} has no layer to compute a loss on")
        logits = logits or self.nodes[-1].name
        return self.add(SoftmaxCrossEntropy(), inputs=[logits, LABEL], name="loss")

    @classmethod
    def sequential(cls, input_shape, layers: list[Layer], num_classes=None, name="net",
                   dtype=np.float32) -> "Network":
        """A chain of layers, each reading the previous one, with the loss added at the end."""
        net = cls(input_shape, num_classes=num_classes, name=name, dtype=dtype)
        for layer in layers:
            net.add(layer)
        if not net.nodes or net.nodes[-1].layer.kind != "loss":
            net.add_loss()
        net.infer_shapes(1)
        return net

    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(f"network {self.name!r} has no node {name!r}") from None

    @property
    def loss_node(self) -> Node:
        if not self.nodes or self.nodes[-1].layer.kind != "loss":
            raise ConfigError(f"network {self.name!r} does not end in a loss layer; "
                              f"call add_loss()")
        return self.nodes[-1]

    @property
    def output(self) -> str:
        """Name of the tensor the loss reads (the logits)."""
        return self.loss_node.inputs[0]

    # ---- shapes ----------------------------------------------------------------------------
    def infer_shapes(self, batch: int) -> dict[str, tuple]:
        """Run every layer's setup for this batch; returns {tensor name: shape}."""
        batch = int(batch)
        if batch <= 0:
            raise ShapeError(f"batch must be positive, got {batch}")
        self.loss_node  # raises if missing
        shapes = {DATA: (batch,) + self.input_shape, LABEL: (batch,)}
        for node in self.nodes:
            ins = [shapes[i] for i in node.inputs]
            rows = self.input_rows(node, batch)
            if rows is not None:        # a chunk's piece sees its rows of the run's input
                ins[0] = (rows.stop - rows.start,) + tuple(ins[0][1:])
            shapes[node.name] = node.layer.setup(ins, self.dtype)
        consumers = self.consumers()
        for node in self.nodes[:-1]:
            if not consumers[node.name]:
                raise ConfigError(f"network {self.name!r}: the output of node {node.name!r} is "
                                  f"never used (every branch must reach the loss)")
        if self.num_classes is not None and shapes[self.output][-1] != self.num_classes:
            raise ShapeError(f"network {self.name!r}: logits {self.output!r} have "
                             f"{shapes[self.output][-1]} classes, expected {self.num_classes}")
        self.shapes, self.batch = shapes, batch
        return shapes

    def shapes_at(self, batch: int) -> dict[str, tuple]:
        """{tensor name: shape} at `batch`, leaving `shapes`, `batch` and the layers' set-up as
        they were (set up again at the previous batch)."""
        previous = self.batch
        shapes = self.infer_shapes(batch)
        if previous is not None and previous != int(batch):
            self.infer_shapes(previous)
        return shapes

    def input_rows(self, node: Node, batch: int) -> slice | None:
        """The rows of its input 0 that `node` reads at this batch, or None for all of them.

        Piece j of p of a layer chunk (minidnn/chunks.py) reads rows j*b .. (j+1)*b
        (b = batch / p) of the run's input, a tensor of the whole batch; the other nodes of
        its piece read tensors of the piece, whole. ShapeError when p does not divide batch.
        """
        if node.piece is None:
            return None
        source = self._by_name.get(node.inputs[0])
        if source is not None and source.piece == node.piece:
            return None
        j, p = node.piece
        if batch % p:
            raise ShapeError(f"network {self.name!r}: node {node.name!r} is piece {j} of {p} "
                             f"of a layer chunk, and {p} does not divide the batch {batch}")
        b = batch // p
        return slice(j * b, (j + 1) * b)

    def consumers(self) -> dict[str, list[Node]]:
        """{tensor name: nodes that read it, in execution order}."""
        out: dict[str, list[Node]] = {DATA: [], LABEL: []}
        for node in self.nodes:
            out[node.name] = []
        for node in self.nodes:
            for i in node.inputs:
                out[i].append(node)
        return out

    def batch_statistics_layers(self) -> list[str]:
        """Names of the layers that normalize with statistics of the whole batch in training
        (BatchNorm): a batch split into micro-batches changes what they compute."""
        return [n.name for n in self.nodes if getattr(n.layer, "batch_statistics", False)]

    # ---- parameters ------------------------------------------------------------------------
    def layers(self) -> list[Layer]:
        """Every layer once, in node order: the pieces of a layer chunk (minidnn/chunks.py)
        share their layers, and so their parameters."""
        seen, out = set(), []
        for n in self.nodes:
            if id(n.layer) not in seen:
                seen.add(id(n.layer))
                out.append(n.layer)
        return out

    def parameters(self) -> list[tuple[str, object]]:
        """[(qualified name 'conv1.weight', Parameter)] in a fixed order (layer order, then
        declaration order), each once. Needs shapes inferred once."""
        if self.batch is None:
            self.infer_shapes(1)
        return [(f"{layer.name}.{k}", p) for layer in self.layers()
                for k, p in layer.params.items()]

    def buffers(self) -> list[tuple[str, object]]:
        """[(qualified name 'bn1.running_mean', Buffer)]: layer state no gradient updates
        (layers/base.py Buffer), in the same order as `parameters()`."""
        if self.batch is None:
            self.infer_shapes(1)
        return [(f"{layer.name}.{k}", b) for layer in self.layers()
                for k, b in layer.buffers.items()]

    def state(self) -> list[tuple[str, object]]:
        """Parameters and buffers in PyTorch's state dict order: by layer, its parameters
        then its buffers."""
        if self.batch is None:
            self.infer_shapes(1)
        return [(f"{layer.name}.{k}", v) for layer in self.layers()
                for k, v in list(layer.params.items()) + list(layer.buffers.items())]

    def num_params(self) -> int:
        return sum(int(np.prod(p.shape)) for _, p in self.parameters())

    def init_params(self, seed: int = 0) -> None:
        """Deterministic initialization: each layer draws from its own stream (seed, index)."""
        for layer in self.layers():
            rng = np.random.default_rng([int(seed), layer.index])
            for p in layer.params.values():
                p.data = p.initial_value(rng, self.dtype)
                p.grad = None
            for b in layer.buffers.values():
                b.data = b.initial_value(self.dtype)

    def state_dict(self) -> dict[str, np.ndarray]:
        """{name: NumPy copy} of every parameter and buffer, PyTorch's names, order and
        layouts (OIHW, (out, in); BatchNorm's running_mean, running_var, num_batches_tracked)."""
        from .backend import to_numpy
        out = {}
        for name, p in self.state():
            if p.data is None:
                raise ConfigError(f"network {self.name!r}: parameters are not initialized; "
                                  f"call init_params(seed) first")
            out[name] = np.array(to_numpy(p.data), copy=True, order="C")  # any device layout
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Copy arrays into the parameters and buffers (on whatever device they live). Checks
        names and shapes."""
        from .backend import get_array_module
        params = dict(self.state())
        missing = [k for k in params if k not in state]
        unexpected = [k for k in state if k not in params]
        if strict and (missing or unexpected):
            raise CheckpointError(f"state dict does not match network {self.name!r}: "
                                  f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
                                  f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}")
        for name, p in params.items():
            if name not in state:
                continue
            value = np.asarray(state[name])
            if tuple(value.shape) != p.shape:
                raise CheckpointError(f"state dict entry {name!r} has shape {tuple(value.shape)}, "
                                      f"network {self.name!r} expects {p.shape}")
            dtype = getattr(p, "dtype", None) or self.dtype   # buffers may have their own
            if p.data is None:
                p.data = value.astype(dtype, copy=True)
            else:
                xp = get_array_module(p.data)
                p.data[...] = xp.asarray(value.astype(p.data.dtype, copy=False))

    def param_checksum(self) -> str:
        """sha256 over every parameter's and buffer's name and bytes (C order) in `state()`
        order: equal checksums mean bit-identical parameters and running statistics."""
        from .checkpoint import params_checksum
        return params_checksum(self.state_dict().items())

    # ---- reporting -------------------------------------------------------------------------
    def summary_rows(self, batch: int) -> list[dict]:
        """One dict per node: name, type, output shape, params, feature-map bytes, forward FLOPs.
        Leaves the network set up at the batch it had (see shapes_at)."""
        previous = self.batch
        shapes = self.infer_shapes(batch)
        try:
            rows = []
            for node in self.nodes:
                layer = node.layer
                shape = shapes[node.name]
                rows.append(dict(
                    name=node.name, type=type(layer).__name__, inputs=list(node.inputs),
                    describe=layer.describe(), shape=shape,
                    params=sum(int(np.prod(p.shape)) for p in layer.params.values()),
                    bytes=int(np.prod(shape)) * self.dtype.itemsize, flops=layer.flops()))
        finally:
            if previous is not None and previous != int(batch):
                self.infer_shapes(previous)
        return rows

    def summary(self, batch: int = 1) -> str:
        """A printable table of the network at this batch size."""
        from .errors import fmt_bytes
        rows = self.summary_rows(batch)
        width = max([14] + [len(r["name"]) + 1 for r in rows])   # 'layer1.0.downsample.0'
        lines = [f"{self.name}: input {(batch,) + self.input_shape}, batch {batch}",
                 f"{'layer':<{width}}{'type':<20}{'output shape':<22}{'params':>13}"
                 f"{'feature map':>14}{'GFLOPs':>10}"]
        lines.append("-" * len(lines[1]))
        for r in rows:
            lines.append(f"{r['name']:<{width}}{r['type']:<20}{str(r['shape']):<22}"
                         f"{r['params']:>13,}{fmt_bytes(r['bytes']):>14}{r['flops'] / 1e9:>10.3f}")
        lines.append("-" * len(lines[1]))
        total_bytes = sum(r["bytes"] for r in rows)
        lines.append(f"total params {sum(r['params'] for r in rows):,}   "
                     f"feature maps {fmt_bytes(total_bytes)}   "
                     f"forward {sum(r['flops'] for r in rows) / 1e9:.2f} GFLOPs")
        return "\n".join(lines)
