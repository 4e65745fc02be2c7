"""What a training step costs, layer by layer: the Profile the planner plans from.

A Profile holds, for one (network, batch, device, math mode), every layer's forward and
backward time under each convolution plan setting ('fastest', 'min_workspace' and, where
measured, workspace limits between them, 'fastest<=BYTES': layers/conv.py), the cuDNN
workspace each setting needs, the host's time to issue each layer call, the optimizer step,
and the copy bandwidths between host and device. It comes from one of two places and looks
the same either way:

* measured on the device (profile.py, cached on disk), or
* computed from an analytic model of a named GPU (gpus.py), so that a plan can be made on a
  laptop for a K40 of 2016 or an H200 of today.

The planner (search.py) and the step-time model (step_model.py) read only this file's types.
Besides the workspace, a few layers allocate temporaries inside a call (the loss works on
vectors, a batch norm writes partial sums, the optimizer's weight decay and update make a
parameter-sized temporary);
`transient_bytes` bounds them from the layer shapes. Random draws (dropout) are not among
them: they are scratch blocks of the memory manager (layers/draws.py), which the dry run
counts, sized with the profile's `generator_bytes`.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace

from ..errors import ConfigError
from ..kernels.batchnorm_sums import partial_sums_bytes
from ..kernels.column_sums import channel_sums_bytes
from ..memory.allocator import aligned
from ..layers.conv import CONV_ALGOS as ALGOS  # noqa: F401 (the planner's name for them)
PHASES = ("forward", "backward")
FORWARD_LIKE = ("forward", "recompute")   # a recomputation is a forward call run again
FORMAT_VERSION = 3   # 2: conv plan settings with workspace limits; 3: generator_bytes


@dataclass
class LayerCost:
    """One layer's costs. Each dict maps a conv plan setting ('fastest', 'min_workspace',
    'fastest<=BYTES') to a value; layers that are not convolutions have only 'fastest' (the
    setting changes nothing).

    forward_s / backward_s: device time of one call (seconds). workspace_forward /
    workspace_backward: the largest cuDNN workspace the call allocates (bytes; the backward's
    data- and filter-gradient convolutions run one after the other, each with its own).
    host_s: {'forward': s, 'backward': s}, the host's time to issue one call (Python, the
    memory manager, kernel launches). A 'recompute' call (forward run again in backward)
    costs what a forward call costs.
    bias_s: of a convolution with a bias, the device time of the pass adding it over its
    output, inside forward_s, which a step whose ReLU adds the bias does not spend (the
    ReLU adds it in its own pass, or on float32 maps the convolution's epilogue:
    minidnn/fusion.py, bias_relu): time(..., own_bias=False) leaves it out of a forward.
    (The sums of the bias's gradient move into the ReLU's backward, or its pool's, which
    the step model prices at the convolution's, where they were measured.)
    """
    forward_s: dict
    backward_s: dict
    workspace_forward: dict = field(default_factory=lambda: {"fastest": 0})
    workspace_backward: dict = field(default_factory=lambda: {"fastest": 0})
    host_s: dict = field(default_factory=lambda: {"forward": 0.0, "backward": 0.0})
    bias_s: float = 0.0

    @staticmethod
    def _pick(table: dict, algo: str):
        return table[algo] if algo in table else table["fastest"]

    def _times(self, phase: str) -> dict:
        return self.forward_s if phase in FORWARD_LIKE else self.backward_s

    def time(self, phase: str, algo: str = "fastest", own_bias: bool = True) -> float:
        """The call's device time on setting `algo`; own_bias=False: a forward less its
        bias's pass (bias_s), for a convolution whose ReLU adds its bias."""
        t = float(self._pick(self._times(phase), algo))
        return t if own_bias or phase not in FORWARD_LIKE else max(t - float(self.bias_s), 0.0)

    def least_time(self, phase: str, own_bias: bool = True) -> float:
        """The call's device time on its fastest setting (no plan setting runs it faster)."""
        return min(self.time(phase, s, own_bias) for s in self._times(phase))

    def workspace(self, phase: str, algo: str = "fastest") -> int:
        table = self.workspace_forward if phase in FORWARD_LIKE else self.workspace_backward
        return int(self._pick(table, algo))

    def host(self, phase: str) -> float:
        return float(self.host_s.get("forward" if phase in FORWARD_LIKE else phase, 0.0))

    def max_workspace(self, setting: str = "fastest") -> int:
        return max(self.workspace("forward", setting), self.workspace("backward", setting))

    def settings(self) -> list:
        """The plan settings costed, most workspace first: 'fastest' first, 'min_workspace'
        last, the workspace limits between them in order."""
        def total(s):
            return self.time("forward", s) + self.time("backward", s)
        return sorted(self.forward_s, key=lambda s: (-self.max_workspace(s), total(s),
                                                     s != "fastest"))

    def leaner(self, setting: str) -> str | None:
        """The next setting needing less workspace than `setting` (None at the end)."""
        order = self.settings()
        k = order.index(setting) if setting in order else 0
        return order[k + 1] if k + 1 < len(order) else None

    def faster(self, setting: str) -> str | None:
        """The previous setting, faster and needing more workspace (None at 'fastest')."""
        order = self.settings()
        k = order.index(setting) if setting in order else 0
        return order[k - 1] if k > 0 else None


@dataclass
class Profile:
    """Costs of one training step of one network at one batch on one device (see module doc).

    source: 'measured' or 'analytic:<gpu>'. device_name: the GPU's name as the driver gives it
    (or the preset's). memory_bytes: the device's memory. d2h_bw / h2d_bw: pinned copy
    bandwidth device -> host and host -> device alone (bytes/s); duplex_bw: both directions at
    once, together. call_gap_s: the device time each layer call takes in a step beyond its
    time alone (the layer times are of each call replayed back to back): a pass's calls in
    sequence, each a different kernel, take microseconds more each (profile.measure_call_gap;
    0 on the CPU, in analytic profiles, whose kernel_s floor stands for it, and in profiles
    measured before it was). d2h_latency_s / h2d_latency_s: the time each copy takes on its
    stream beyond its bytes over the link (a copy of a few KB takes microseconds where its
    bytes take a small part of one; 0 in profiles measured before it was). sync_latency_s: how long
    after an event happens a stream waiting for it on another engine starts (a copy engine's
    end seen by the compute engine, say): a map offloaded after its layer and waited for
    before its memory is reused crosses engines twice. optimizer_s /
    optimizer_host_s: one SGD step, device and host time.
    accumulate_s: device time of adding every parameter's gradient into another once (what a
    micro-batch after a step's first adds, which the per-layer times do not hold); of a
    gradient its layer adds to in place (Layer.adds_in_place), IN_PLACE_ADD_SHARE of that; 0
    in profiles measured before it was. A split step's gathered layers add none
    (accumulated_share: OverFeat in 64 passes of 4 images adds its 16M convolution gradients
    63 times, its 130M fully connected ones never). weight_copy_s: device time of making
    every bf16 copy of a weight that a bf16 step on the GPU makes (WEIGHT_COPY_KINDS), once
    each: a step makes them once, its passes share them, and the layer times hold none
    (profile.py times a product reading a copy made before); 0 on the CPU.
    synchronous: the host does the device's work itself (the CPU): every operation ends
    before the host issues the next. temporaries_in_arena: the layers' and the optimizer's
    temporaries come out of the budget (on a GPU every CuPy allocation is routed into the
    arena; NumPy's temporaries on the CPU are not). generator_bytes: device memory one
    random generator's state takes (backend.Device.generator_bytes: 0 for minidnn's own
    generators; a profile may model one that keeps state), part of each random draw's
    scratch block. key: the
    cache key (profile.py); key_fields: what it was made from.
    """
    source: str
    device_name: str
    math: str
    network: str
    batch: int
    memory_bytes: int
    d2h_bw: float
    h2d_bw: float
    duplex_bw: float
    layers: dict
    d2h_latency_s: float = 0.0
    h2d_latency_s: float = 0.0
    sync_latency_s: float = 0.0
    call_gap_s: float = 0.0
    optimizer_s: float = 0.0
    optimizer_host_s: float = 0.0
    accumulate_s: float = 0.0
    weight_copy_s: float = 0.0
    synchronous: bool = False
    temporaries_in_arena: bool = True
    generator_bytes: int = 0
    key: str = ""
    key_fields: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def layer(self, name: str) -> LayerCost:
        try:
            return self.layers[name]
        except KeyError:
            raise ConfigError(f"profile of {self.network!r} ({self.source}) has no layer "
                              f"{name!r}; it was made for another network (layers: "
                              f"{', '.join(list(self.layers)[:8])}...)") from None

    def link(self, direction: str) -> tuple[float, float]:
        """(latency in seconds, bytes/s) of one copy alone in `direction`: 'offload' (device
        to host) or 'prefetch' (host to device). A copy of n bytes takes latency + n / rate
        (playback.CopyLinks adds the share of the duplex bandwidth while both move bytes)."""
        if direction == "offload":
            return self.d2h_latency_s, self.d2h_bw
        if direction == "prefetch":
            return self.h2d_latency_s, self.h2d_bw
        raise ValueError(f"copy direction must be 'offload' or 'prefetch', got {direction!r}")

    def with_host_link(self, gbps: float | None) -> "Profile":
        """This profile with pinned copies limited to `gbps` GB/s each way (None: as it is).

        For a GPU that shares its host link: data-parallel ranks offloading at the same time
        each get less than one GPU copying alone (scripts/bench_host_link.py measures what
        each gets). Each direction becomes min(its own, gbps) and the duplex figure shrinks
        in the same proportion as the faster direction.
        """
        if gbps is None:
            return self
        if not gbps > 0:
            raise ConfigError(f"host link bandwidth must be positive GB/s, got {gbps!r}")
        link = float(gbps) * 1e9
        d2h, h2d = min(self.d2h_bw, link), min(self.h2d_bw, link)
        scale = max(d2h, h2d) / max(self.d2h_bw, self.h2d_bw)
        return replace(self, d2h_bw=d2h, h2d_bw=h2d, duplex_bw=self.duplex_bw * scale,
                       notes=list(self.notes) + [f"host link limited to {gbps:g} GB/s per "
                                                 f"direction (measured with GPUs sharing it)"])

    def check_matches(self, net, batch: int, relu_bits=frozenset()) -> None:
        """ConfigError unless this profile was made for `net` at `batch` with the ReLUs
        `relu_bits` keeping bit masks."""
        if int(batch) != self.batch:
            raise ConfigError(f"profile ({self.source}, {self.device_name}) is for batch "
                              f"{self.batch}, not {batch}")
        missing = [n.name for n in net.nodes if n.name not in self.layers]
        if missing:
            raise ConfigError(f"profile ({self.source}) does not cover layers "
                              f"{', '.join(missing[:5])} of network {net.name!r}")
        if self.key_fields.get("structure") and \
                self.key_fields["structure"] != structure_hash(net, batch, relu_bits):
            raise ConfigError(f"profile ({self.source}) was made for another structure of "
                              f"network {net.name!r} (layer settings or shapes differ: the "
                              f"image size, the number of classes, or ReLU bit masks, which "
                              f"--relu-bits turns on)")

    # ---- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        d = asdict(self)
        d["format"] = FORMAT_VERSION
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Profile":
        if d.get("format") != FORMAT_VERSION:
            raise ConfigError(f"profile format {d.get('format')!r} is not {FORMAT_VERSION}; "
                              f"measure the profile again")
        d = dict(d)
        d.pop("format")
        d["layers"] = {k: LayerCost(**v) for k, v in d["layers"].items()}
        return cls(**d)


def least_step_s(profile: Profile, micro_batches: int, names, forward_share: dict,
                 backward_share: dict, accumulate_s: float,
                 bias_elsewhere=frozenset()) -> float:
    """No decision at this count is faster: k passes of the fastest device time of every
    layer in `names` (None: every layer of the profile; of a fused layer's forward and
    backward the shares `forward_share` and `backward_share` give, of a convolution in
    `bias_elsewhere` its forward less its bias's pass), the gradient adds of the passes after
    the first (`accumulate_s` each), one optimizer update; the shares, the convolutions and
    the adds are StepModel's."""
    names = list(profile.layers) if names is None else names
    shares = {"forward": forward_share, "backward": backward_share}
    pass_s = sum(profile.layer(n).least_time(phase, n not in bias_elsewhere) *
                 shares[phase].get(n, 1.0) for n in names for phase in PHASES)
    return micro_batches * pass_s + (micro_batches - 1) * accumulate_s + profile.optimizer_s


def structure_hash(net, batch: int, relu_bits=frozenset()) -> str:
    """sha256 of what a layer's cost depends on: every node's type, settings (a ReLU's as
    the decision's `relu_bits` make it: layers/relu.py), inputs and shapes at this batch, the
    dtype and the input shape (not the parameter values)."""
    shapes = net.infer_shapes(batch)
    items = [net.name, list(net.input_shape), str(net.dtype)]
    for node in net.nodes:
        layer = node.layer
        settings = layer.describe(relu_bits) if layer.kind == "relu" else layer.describe()
        items.append([node.name, type(layer).__name__, settings, list(node.inputs),
                      list(shapes[node.name]), [list(s) for s in layer.in_shapes]])
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()


def numel(shape) -> int:
    # math.prod: np.prod's call costs more than the product of a short tuple, and the planner
    # asks for every tensor of every layer of each profile and step model it makes
    return int(math.prod(int(d) for d in shape))


def transient_bytes(layer, phase: str) -> int:
    """Bytes a layer call allocates and drops inside itself, besides the cuDNN workspace.

    From the layers' and the GPU kernels' code: the loss works on (N,) vectors; a batch norm
    makes its partial sums and per-channel coefficients (batchnorm_transient_bytes).
    Everything else (ReLU and the conv bias run as fused kernels on the GPU) writes into the
    buffers it is given; dropout's draws lie in a scratch block of the memory manager, which
    the dry run counts (layers/draws.py).
    """
    kind = layer.kind
    if kind == "loss":
        n = layer.in_shapes[0][0]
        return 4 * 8 * n  # max, sum, arange, picked, log ... of (N,) vectors
    if kind == "batchnorm":
        return batchnorm_transient_bytes(layer.in_shapes[0])
    return 0


def batchnorm_transient_bytes(shape) -> int:
    """What a batch norm call on the GPU allocates inside itself, in any phase, for a map of
    `shape` (N, C, H, W): stage one's partial sums (kernels/batchnorm_sums.py, the count the
    kernels size them with), and at most five per-channel arrays of (C,) and (6, C) values:
    a recomputation's mean and invstd, the variance, the affine or gradient coefficients
    (counted at 8 bytes a value, the widest channel dtype)."""
    c = int(shape[1])
    return _stage_one_bytes(shape) + 3 * aligned(8 * c) + aligned(6 * 8 * c)


def _stage_one_bytes(shape) -> int:
    """The aligned bytes of stage one's partial sums over a map of `shape` (N, C, H, W)
    (kernels/batchnorm_sums.py)."""
    n, c = int(shape[0]), int(shape[1])
    return aligned(partial_sums_bytes(n, c, math.prod(int(d) for d in shape[2:])))


def handed_sums_bytes(batchnorm) -> int:
    """Bytes of the stage-one sums a residual add takes for the batch norm before it
    (minidnn/fusion.py, bn_sums), over that batch norm's input: made in the add's backward,
    they live until the batch norm's, so the add's call counts them too."""
    return _stage_one_bytes(batchnorm.in_shapes[0])


def bias_sums_bytes(layer, layout: str) -> int:
    """Bytes of the partial sums of convolution `layer`'s bias gradient over its output, on
    maps stored in `layout` (kernels/column_sums.py), taken inside the backward that sums
    them: the convolution's, or that of the ReLU that added the bias (minidnn/fusion.py,
    bias_relu). 0 for any other layer or a convolution without a bias."""
    if layer.kind != "conv" or not layer.bias:
        return 0
    return aligned(channel_sums_bytes(layer.out_shape, layout, layer.dtype.itemsize))


def gradient_copy_bytes(layer, phase: str) -> int:
    """Bytes of the bf16 weight gradient a convolution's backward on bf16 maps writes on the
    GPU before widening it into the float32 gradient (kernels/cuda.py,
    conv2d_backward_filter: cuDNN's bf16 plans take one dtype for all three operands), held
    for the call. 0 for every other call. (A step with split batch statistics at its least
    budget, ResNet-50 in 64 micro-batches of 4, failed in layer4.2.conv2's backward asking
    for this copy's 4.5 MiB.)"""
    if layer.kind != "conv" or phase != "backward":
        return 0
    return aligned(2 * numel(layer.params["weight"].shape))


def accumulation_bytes(layer, params, phase: str, micro_batches: int, piece=None,
                       batch_slice: int | None = None, rows: int = 0, in_arena: int = 1) -> int:
    """In a step of several micro-batches, a backward after the first writes its parameter
    gradients into temporaries, all of them at once, and adds them to the accumulated ones
    (executor.py); so does the backward of every piece of a layer chunk but the last (the
    first to run backward: piece (j, p) of a chunk node, minidnn/chunks.py). Those come out
    of the device allocator on every device, one aligned block per gradient; but none for
    the parameters the layer adds to in place (Layer.adds_in_place: a fully connected
    layer's weight, whose product adds to it on the GPU and whose temporary on the CPU is
    NumPy's, outside the budget), in slices too.

    Under --deterministic (batch_slice: the images of a slice) a backward over more rows
    than one slice sums its slices' gradients through one such set of temporaries too
    (layers/slices.sum_in_slices; rows: the call's images), made by the array module: in the
    device allocator where temporaries are (in_arena 1: the GPU's arena), not on the CPU
    (0).

    params: the keys of layer.params whose gradients the call writes (None: all; a
    convolution whose bias a ReLU after it adds leaves that one to the ReLU's call, or its
    max pool's: minidnn/fusion.py)."""
    if phase != "backward":
        return 0
    grads = sum(aligned(max(numel(p.shape) * layer.dtype.itemsize, 1))
                for key, p in layer.params.items()
                if (params is None or key in params) and key not in layer.adds_in_place)
    if micro_batches > 1 or (piece is not None and piece[0] < piece[1] - 1):
        return grads
    return in_arena * grads if batch_slice is not None and rows > batch_slice else 0


#: What adding a gradient its layer adds to in place costs (Layer.adds_in_place), as a share
#: of adding it apart: its product reads it once more, where an add reads two arrays and
#: writes one.
IN_PLACE_ADD_SHARE = 1 / 3


def in_place_gradients(net) -> frozenset:
    """The qualified names (net.parameters()'s) of the parameters whose layer adds their
    gradient in place (Layer.adds_in_place: a fully connected layer's weight)."""
    return frozenset(f"{layer.name}.{key}" for layer in net.layers()
                     for key in layer.adds_in_place)


def accumulated_share(net, left_out=frozenset()) -> float:
    """The share of Profile.accumulate_s that a pass's gradient adds take where the layers
    named in `left_out` add none (a gathered layer's gradients are computed once a step:
    minidnn/gathered.py). The adds are bound by their bytes: each gradient weighs its
    values, a third of them where its layer adds it in place (IN_PLACE_ADD_SHARE), as the
    profile measured them."""
    in_place = in_place_gradients(net)
    weights = [(name.rsplit(".", 1)[0], numel(p.shape)
                * (IN_PLACE_ADD_SHARE if name in in_place else 1.0))
               for name, p in net.parameters()]
    total = sum(w for _, w in weights)
    return sum(w for layer, w in weights if layer not in left_out) / total if total else 1.0


def param_bytes(net) -> int:
    """Bytes of one buffer per parameter taken from the device allocator (SGD's momentum):
    each is a block of its own, rounded up to the allocator's alignment as the run's are."""
    return sum(aligned(max(numel(p.shape) * net.dtype.itemsize, 1))
               for _, p in net.parameters())


#: The layers whose weights the GPU's bf16 products read through bf16 copies, kept through
#: the passes of a batch (kernels/cuda_weights.py).
WEIGHT_COPY_KINDS = ("conv", "linear")


def weight_copy_shapes(net) -> list:
    """Shapes of the weights a bf16 step on the GPU reads through bf16 copies."""
    return [node.layer.params["weight"].shape for node in net.nodes
            if node.layer.kind in WEIGHT_COPY_KINDS]


def weight_copy_bytes(net) -> int:
    """Bytes of the bf16 copies of the weights a bf16 step on the GPU holds (2 per value)."""
    return sum(2 * numel(shape) for shape in weight_copy_shapes(net))
