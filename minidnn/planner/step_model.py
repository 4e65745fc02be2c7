"""The step model: memory and step time of one memory decision, the real memory manager timed.

Nothing here re-derives when the manager offloads, evicts, prefetches or frees, or where its
static layout puts each block. For every decision a dry-run executor (compute=False) is built
exactly as the run will build it (the same offload set, the same schedule) on a *recording
device*: its three streams and its events are stand-ins that write every `record`,
`wait_event`, copy and layer call into one log in the order the host issues them, and its
allocator logs every allocation and every free with the event the free waits for. The first
training step is walked through it, its blocks recorded on the way and packed into the
static layout a run would pack, with the waits the packed blocks issue put into the log
afterwards (planner/recorded.py: one walk where a run makes two); the later steps walk alike
and are replayed from its log (planner/replay.py); the log is then played against a Profile
(costs.py):

* the host issues the log in order; each layer call costs it the profile's host time (on a
  synchronous device, the CPU, the host also waits for each operation it issues), except in
  a step the run replays from a CUDA graph, which the host issues in one call (`graphs`);
* each stream (compute, offload, prefetch) runs its operations in order, an operation starting
  when the host has issued it, the stream is free and every event it waits on has happened
  (with the static layout, a block's next occupant waits for the copy still reading it);
  layer calls take the profile's device time, copies their direction's fixed latency and
  then bytes / bandwidth (a copy that overlaps a copy in the other direction gets its share
  of the duplex bandwidth for the overlap);
* the device arena is replayed as the GPU sees it: a block freed behind a copy stays in use
  until the copy has finished *by the host's clock*, and an allocation that does not fit the
  budget makes the host wait for the oldest such copy (memory/arena.py does exactly that).
  Each layer call also allocates its cuDNN workspace and temporaries for its duration.

Two peaks come out. `required_bytes` is what must fit for the step not to fail: every level
of the dry run (parameters, gradients, the feature-map region or the live blocks, copies
reclaimed at once) plus the call's workspace and temporaries, plus the optimizer's momentum
and the input batches the data source keeps on the device (the update itself takes no
temporary: optim.py).
`peak_bytes` is what the arena will report. With the static layout the two agree; with
blocks allocated at run time the host runs ahead of the GPU, so blocks behind unfinished
copies pile up until the budget makes the host wait.

The step time is the distance between the compute stream's ends of the last two steps
(back-to-back steps, the host free to run ahead into the next one), as the training loop's
step timer measures it.

A caller that only wants a decision that fits (the planner's pruning, the segments search)
asks `evaluate_if_fits`: one dry walk records the decision's blocks, and when even the most
bytes they have alive at once, with the parameters and the optimizer's share, are over the
budget, nothing more is walked, packed or timed (`least_required`, `Unfit`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..assembly import layout_keep
from ..chunks import as_chunks
from ..data import IMAGE_DTYPE, LABEL_DTYPE
from ..executor import Executor
from ..fusion import add_relu_pairs, add_sum_pairs, bias_relu_pairs, bn_add_pairs, \
    bn_grad_pairs, bn_relu_pairs, conv_relu_pairs, pool_bias_pairs, pool_relu_forward_pairs, \
    pool_relu_pairs, widens_backward
from ..gathered import gathered_bytes, gathered_layers
from ..kernels.mapformat import BF16_OPS, MapFormat
from ..layers.conv import plan_setting
from ..memory.allocator import aligned
from ..memory.layout import StaticLayout, live_peak
from ..memory.policy import CALL_PHASES, MemoryDecision, relu_bits_for
from ..network import DATA, LABEL
from ..spec import StepSpec
from ..step_graph import capturable, loss_ring_bytes
from .collector import collector_paused
from .costs import (ALGOS, Profile, accumulated_share, accumulation_bytes, bias_sums_bytes,
                    gradient_copy_bytes, handed_sums_bytes, numel, param_bytes,
                    transient_bytes, weight_copy_bytes)
from .nearby import StepBlocks, region_bound
from .playback import Timeline
from .recorded import StepRecording, splice
from .recording import Recorder, SymbolicDevice, Wait, dry_executor
from .replay import replay_steps


# The fraction of a budget a plan leaves for fragmentation (search.Planner).
DEFAULT_RESERVE = 0.01
# What is left of a residual add's forward that its batch norm applies (minidnn/fusion.py,
# bn_add): the read of its other input, one of the three maps of the add's own pass.
FUSED_ADD_SHARE = 1 / 3
# What is left of the backward of a ReLU whose max pool applies its mask (minidnn/fusion.py,
# pool_relu) and that added a convolution's bias: the bias gradient's read of the map, one of
# the three maps of its pass (without a bias, or where the pool sums the bias's gradient as it
# writes the map, pool_bias: nothing).
POOLED_RELU_BIAS_SHARE = 1 / 3
# What is left of the measured backward of a residual add that takes over a gradient sum
# (minidnn/fusion.py, add_sum): nothing. The step saves two passes over the map: the memory
# manager's sum (three maps) is gone and the add's pass moves one map more. The manager's
# sums are in no layer's measured time (the profile times layers alone), and the model still
# prices the backward of a ReLU its add applies as a pass of its own, which the add's pass
# does instead (ResNet-50 fp32, held-traced: the ReLUs' and adds' backward priced 6.3 ms, 5.8
# taken); so the two maps come off the add's measured backward, a copy of gy into
# input 1's gradient, two maps. Where the batch norm before the add reads the add's gradient
# on (bn_grad), the add writes one map fewer still, which the model, pricing it at nothing
# already, does not see; nor that such an add may also take that batch norm's sums (bn_sums),
# reading the batch norm's input besides, and the batch norm then reads its gradient once
# (on the H200, ResNet-50 b256 float32: 1.09 ms less of those passes alone, 0.13 in bf16).
SUMMING_ADD_SHARE = 0.0


@dataclass(frozen=True)
class PlanOptions:
    """What a plan weighs besides the step's spec. momentum: SGD keeps one momentum buffer
    per parameter; input_batches: input batches the data source keeps on the device (the
    synthetic source keeps 2 on a GPU); reserve: the fraction of the budget plans leave for
    fragmentation; recompute: the planner may drop maps after forward and run their layers
    again in backward (False: offload only); steps: back-to-back steps simulated (>= 2);
    replay: later steps replayed from the first's log; shortlist and max_evaluations: the
    search's limits (search.Planner); batch_slice: under --deterministic, the images of a
    slice (layers/slices.py; None: not deterministic)."""
    momentum: bool = True
    input_batches: int = 2
    reserve: float = DEFAULT_RESERVE
    recompute: bool = True
    steps: int = 2
    replay: bool = True
    shortlist: int = 6
    max_evaluations: int = 400
    batch_slice: int | None = None


_PASS_WORDS = {"budget": "memory_budget", "prefetch_lookahead": "prefetch_lookahead",
               "static_layout": "static_layout", "micro_batches": "micro_batches",
               "chunks": "chunks", "graphs": "graphs", "fuse": "fuse"}


def pass_spec(batch, settings: dict, options: PlanOptions | None = None) -> tuple:
    """(StepSpec, PlanOptions) of what StepModel and search.Planner are given: a StepSpec (and
    no settings), or the keyword form: a pass batch, budget=, prefetch_lookahead=, static_layout= (default True),
    micro_batches= (passes a step runs), relu_bits= (ReLU names: any keep bit masks),
    maps= (a MapFormat), chunks=, graphs=, fuse= and PlanOptions' fields."""
    if isinstance(batch, StepSpec):
        if settings:
            raise ValueError(f"give {', '.join(sorted(settings))} in the StepSpec or the "
                             f"PlanOptions")
        return batch, options or PlanOptions()
    settings = dict(settings)
    fields = {word: settings.pop(key) for key, word in _PASS_WORDS.items() if key in settings}
    fields.setdefault("static_layout", True)
    k = int(fields.pop("micro_batches", None) or 1)
    maps = settings.pop("maps", None) or MapFormat()
    relu_bits = bool(settings.pop("relu_bits", ()))
    spec = StepSpec(batch=int(batch) * k, micro_batches=k, relu_bits=relu_bits,
                    precision=maps.precision, layout=maps.layout, **fields)
    if settings and options is not None:
        raise ValueError(f"give {', '.join(sorted(settings))} in the PlanOptions")
    return spec, options or PlanOptions(**settings)


@dataclass
class Evaluation:
    """The model's prediction for one decision (offload set, recompute set, conv plan per
    conv layer).

    required_bytes: device memory the step needs to run at all (see module doc); peak_bytes:
    the arena peak the run will report; fits: required_bytes <= the usable budget.
    held_bytes: what the executor takes before step one (parameters, gradients and, with the
    static layout, the feature-map region of `region_bytes`). step_time_s: predicted
    steady-state step; compute_s: the compute stream's busy time in a step (layers and
    optimizer); offloaded_bytes / prefetched_bytes per step (on-demand fetches included).
    levels: {(phase, node index): bytes needed during that call}; fm_levels: {(phase, node
    index): feature-map bytes on the device then}; resident: {(phase, node index): their
    storage ids}; peak_point: the call of required_bytes (or 'optimizer' / 'allocation');
    fm_peak_point: the call with the most feature-map bytes. calls: {(phase, node index):
    (start, end, stall)} of the last step, seconds from its start, stall = time the compute
    stream sat idle right before the call; copies: [(stream, storage name, start, end)] of
    the last step's copies on the 'offload' and 'prefetch' streams, seconds from its start
    (planner/timeline.py draws both); host_wait_s: host time spent waiting for copies
    to free memory.
    """
    offload: frozenset
    conv_algo: dict
    required_bytes: int
    peak_bytes: int
    fits: bool
    step_time_s: float
    compute_s: float
    offloaded_bytes: int
    prefetched_bytes: int
    on_demand_fetches: int
    avg_feature_map_bytes: float
    held_bytes: int = 0
    region_bytes: int = 0
    levels: dict = field(repr=False, default_factory=dict)
    fm_levels: dict = field(repr=False, default_factory=dict)
    resident: Mapping = field(repr=False, default_factory=dict)
    peak_point: object = None
    fm_peak_point: object = None
    calls: dict = field(repr=False, default_factory=dict)
    copies: list = field(repr=False, default_factory=list)
    host_wait_s: float = 0.0
    over_budget: bool = False
    workspace: dict = field(repr=False, default_factory=dict)
    recompute: frozenset = frozenset()
    chunks: tuple = ()

    @property
    def decision(self) -> MemoryDecision:
        """The decision to run. Its workspace blocks are planned for the profile's plans, so a
        'fastest' setting is pinned to the workspace it was planned with ('fastest<=BYTES'): a
        run that measures its plans again then cannot pick a fastest plan needing more."""
        settings = dict(self.conv_algo)
        for name, setting in settings.items():
            planned = max(self.workspace.get((name, phase), 0) for phase in CALL_PHASES)
            if setting == "fastest" and planned:
                settings[name] = plan_setting("fastest", planned)
        return MemoryDecision(offload=frozenset(self.offload), conv_algo=settings,
                              workspace=dict(self.workspace),
                              recompute=frozenset(self.recompute), chunks=self.chunks)

    def level_at(self, point) -> int:
        return self.levels.get(point, 0)


@dataclass
class _Walk:
    """A decision's first step, walked (StepModel._walk): the recording device and its log,
    the dry executor, its recorder, the step's memory_stats(), the bytes held before the step
    and the allocator's peak in it (both without a static layout's region, not taken yet),
    the planned workspaces {(conv name, phase): bytes} and, with the static layout, the
    blocks recorded (recorded.StepRecording)."""
    device: SymbolicDevice
    ex: Executor
    rec: Recorder
    stats: dict
    held: int
    peak: int
    planned: dict
    recording: StepRecording | None


@dataclass
class Unfit:
    """A decision shown not to fit the budget by a lower bound on what it needs
    (StepModel.least_required) before its full evaluation: `least` bytes at least."""
    offload: frozenset
    conv_algo: dict
    recompute: frozenset
    least: int
    fits: bool = False


# ---- the model -----------------------------------------------------------------------------------
class StepModel:
    """Predicts memory and step time of memory decisions for one network, step and profile.

    spec: the StepSpec of the step (minidnn/spec.py): its batch (the whole step's: with
    `micro_batches` k the model walks one pass of batch / k images, planner/split.py), its
    budget, prefetch lookahead, static layout, ReLU bit masks, precision and layout (default
    NCHW), layer chunks and CUDA graphs; or a pass batch with the keyword form of
    `pass_spec`. options: PlanOptions (momentum, input batches, steps simulated, replay).
    usable: the part of the budget plans may fill (default: all of it). profile: of one
    pass (with chunks: the chunked step's, planner/chunking.chunk_profile).

    With k micro-batches the input batches are the whole step's, a layer with parameters
    takes a gradient-sized temporary in backward (to add into the accumulated gradient; none
    for a gradient its product adds in place: costs.accumulation_bytes), a
    dropout draws its pass's rows of the step's random numbers (in its scratch block, sized
    as the layer declares: layers/draws.py); an Evaluation's
    step time, compute time and bytes moved are the whole step's (k passes, one optimizer
    update), its memory that of one pass (every pass is alike). replay: only the first step
    is walked through the memory manager, the later ones are replays of its log
    (planner/replay.py). shares_with: a StepModel of the same step at another prefetch
    lookahead: a decision that offloads nothing prefetches nothing, so such decisions are
    evaluated once for both models. graphs: the run replays its steps from CUDA graphs
    where the executor can (minidnn/step_graph.py): the host then issues a step in one
    call, so such a decision's layer calls cost the host nothing. With chunks the model
    walks the chunked network, whose storage ids the decisions name; convolution plan
    settings and workspaces stay per convolution layer (`conv_names`).
    """

    def __init__(self, net, spec: StepSpec | int, profile: Profile,
                 options: PlanOptions | None = None, usable: int | None = None,
                 shares_with=None, **settings):
        spec, options = pass_spec(spec, settings, options)
        self.spec, self.options = spec, options
        self.relu_bits = relu_bits_for(net) if spec.relu_bits else frozenset()
        self.maps = MapFormat(spec.layout or "nchw", spec.precision)
        self.micro_batches = spec.micro_batches or 1
        batch = spec.batch // self.micro_batches      # one pass's images
        profile.check_matches(net, batch, self.relu_bits)
        self.chunks = as_chunks(spec.chunks or ())
        if self.chunks and profile.key_fields.get("chunks") != repr(self.chunks):
            raise ValueError(f"the profile is not that of the step chunked as {self.chunks} "
                             f"(planner/chunking.chunk_profile makes it)")
        self.net, self.batch, self.profile = net, batch, profile
        self.step_batch = spec.batch   # images per step
        self.budget = spec.memory_budget
        self.usable = usable if usable is not None else self.budget
        self.steps = max(2, int(options.steps))
        self.replay = bool(options.replay)
        self.lookahead = spec.prefetch_lookahead
        self.static_layout = spec.static_layout
        self.graphs = spec.graphs and not profile.synchronous
        momentum, input_batches = options.momentum, options.input_batches
        self.plan = None
        probe = self.dry_executor(self._device(), static_layout=False)
        self.plan = probe.plan      # storage ids are the same in every executor of (net, batch)
        self.scratch = dict(probe.manager.scratch)   # random draws' blocks: every decision's
        self.nodes = self.plan.nodes
        self.index = {node.name: i for i, node in enumerate(self.nodes)}
        # {convolution layer name: the node indices that run it} (a chunk's pieces share it)
        self.conv_nodes: dict = {}
        for i, node in enumerate(self.nodes):
            if node.layer.kind == "conv":
                self.conv_nodes.setdefault(node.layer.name, []).append(i)
        self.conv_names = list(self.conv_nodes)
        self.param_grad_bytes = int(probe.allocator.in_use)
        # the storages a run's static layout holds to the step's end (recorded.py)
        self._layout_kept = frozenset(self.plan.tensors[t].storage for t in layout_keep(net))
        self.momentum_bytes = param_bytes(net) if momentum else 0
        # The batches a caller holds are float32 images and int64 labels, whatever the maps'
        # precision (counted at bf16 maps' bytes, ResNet-50 bf16 in 6 GiB ran 147 MiB short).
        data, label = self.plan.tensors[DATA], self.plan.tensors[LABEL]
        self.input_batch_bytes = numel(data.shape) * IMAGE_DTYPE.itemsize + \
            numel(label.shape) * LABEL_DTYPE.itemsize
        self.input_bytes = int(input_batches) * self.input_batch_bytes * self.micro_batches
        counted = 1 if profile.temporaries_in_arena else 0
        # bf16 maps on the GPU: the products read bf16 copies of the weights, kept all step
        self.weight_copy_bytes = counted * weight_copy_bytes(net) \
            if self.maps.precision == "bf16" else 0
        # ... made once a step, which the passes share (the layer times hold none)
        self.weight_copy_s = profile.weight_copy_s if self.weight_copy_bytes else 0.0
        k = self.micro_batches
        loss_dtype = self.plan.tensors[net.loss_node.name].dtype
        # Each pass's loss is copied out and held to the step's end (executor.mean_of_passes):
        # the last pass holds the k - 1 before its own. A step replayed from CUDA graphs
        # copies its loss into a ring made at the first capture (step_graph.py).
        self.loss_bytes = counted * (k - 1) * aligned(loss_dtype.itemsize) + \
            (loss_ring_bytes(loss_dtype) if self.graphs else 0)
        # A split step holds the rows its fully connected layers' gradients are computed from
        # once, after the last pass (minidnn/gathered.py), in blocks of the allocator.
        self.gathered = gathered_layers(self.plan, k, spec)
        self.gathered_bytes = gathered_bytes(self.plan, self.gathered, self.step_batch)
        self.extra_bytes = self.momentum_bytes + self.input_bytes + self.weight_copy_bytes + \
            self.loss_bytes + self.gathered_bytes
        # bf16 maps on the GPU: a convolution's weight gradient is written in bf16 first
        copies = counted if self.maps.precision == "bf16" else 0
        biased = bias_relu_pairs(self.plan)          # {ReLU: the convolution whose bias it adds}
        sliced = options.batch_slice is not None
        pooled = self._pool_bias(sliced) if spec.fuse else {}   # {ReLU: its pool}
        # {convolution: the node whose backward sums its bias's gradient}: the ReLU that adds
        # the bias, or the max pool after that ReLU.
        summed_by = {conv: pooled.get(relu, relu) for relu, conv in biased.items()} \
            if spec.fuse else {}
        sums = self._bias_sums(summed_by)
        # That node's call also writes, and adds, the bias's gradient (the executor's
        # temporaries): {node index: (the layer of the parameters it writes, their keys)}.
        written = {}
        for conv, summer in summed_by.items():
            layer = self.plan.net.node(conv).layer
            written[self.index[conv]] = (layer, ("weight",))
            written[self.index[summer]] = (layer, ("bias",))

        def accumulated(i, node, phase) -> int:
            layer, keys = written.get(i, (node.layer, None))
            return accumulation_bytes(layer, keys, phase, k, node.piece, options.batch_slice,
                                      batch // node.piece[1] if node.piece else batch, counted)
        # bn_sums (minidnn/fusion.py): an add may take its batch norm's sums, which live on
        # into that batch norm's call; counted wherever the pair may fuse, whatever the
        # decision moves (a bound: a moved input, or statistics of each slice, leave the
        # pair unfused; the sums are at most 2 MiB).
        if spec.fuse:
            for bn, add in bn_grad_pairs(self.plan).items():
                i = self.index[add]
                sums[i] = sums.get(i, 0) + handed_sums_bytes(self.plan.net.node(bn).layer)
        self._transient = {(phase, i): counted * transient_bytes(node.layer, phase)
                           + copies * gradient_copy_bytes(node.layer, phase)
                           + (counted * sums.get(i, 0) if phase == "backward" else 0)
                           + accumulated(i, node, phase)
                           for i, node in enumerate(self.nodes) for phase in CALL_PHASES}
        # What of a layer's measured forward a fused step still spends (minidnn/fusion.py;
        # the profile times the layers apart), by node name; 1 where it is absent. A ReLU
        # its convolution applies (conv_relu): nothing, the fused graph takes the
        # convolution's own time (the H200's TF32 plans: benchmarks/runs/wave15/call2/
        # probe.txt). A ReLU its max pool applies (pool_relu_forward): nothing, the pool reads
        # the ReLU's input as it would have read its output. A ReLU its batch norm or its add
        # applies (bn_relu, add_relu): nothing, that layer's pass writes max(v, 0) where it
        # wrote v (ResNet-50 fp32 at 50% of its peak: its 49 ReLUs' forwards and 36 recomputed
        # ones, 6.7 ms of a predicted 82.0 against 74.2 measured, took 0.1 ms held-traced).
        # An add its batch norm applies (bn_add): the read of its other input in the batch
        # norm's pass, FUSED_ADD_SHARE.
        # The CPU still runs every pass. Of a backward, backward_share: a ReLU whose max pool
        # applies its mask (pool_relu), its bias's gradient if it added one and the pool
        # does not sum it (pool_bias), POOLED_RELU_BIAS_SHARE, else nothing (the pool's pass
        # moves the same bytes with the sums); an add that takes over a gradient sum
        # (add_sum), SUMMING_ADD_SHARE.
        fused = spec.fuse and not profile.synchronous
        # A convolution whose ReLU adds its bias runs its forward without the bias's pass:
        # the ReLU adds it in its own pass, or on float32 maps the convolution's epilogue
        # (LayerCost.bias_s).
        self.bias_elsewhere = frozenset(summed_by) if fused else frozenset()
        self.forward_share = {
            **{relu: 0.0 for relu in conv_relu_pairs(self.plan, sliced)},
            **{relu: 0.0 for relu in pool_relu_forward_pairs(self.plan, sliced)},
            **{relu: 0.0 for relu in bn_relu_pairs(self.plan)},
            **{relu: 0.0 for relu in add_relu_pairs(self.plan)},
            **{add: FUSED_ADD_SHARE for add in bn_add_pairs(self.plan)}} if fused else {}
        self.backward_share = {
            **{relu: POOLED_RELU_BIAS_SHARE if relu in biased and relu not in pooled else 0.0
               for relu in pool_relu_pairs(self.plan)},
            **{add: SUMMING_ADD_SHARE
               for add in add_sum_pairs(self.plan)}} if fused else {}
        # A gathered layer's backward in a pass writes its input gradient only, a product like
        # its forward's; its parameter gradients take one call a step (gathered_s), priced as
        # one pass's weight-gradient product (its backward less its forward): at a pass's
        # few rows that product is bound by the gradient's bytes, which it writes once.
        self.gathered_s = 0.0
        # A pass after the first adds the gradients of every layer but the gathered ones.
        self.accumulate_s = profile.accumulate_s * accumulated_share(self.plan.net,
                                                                     self.gathered)
        for name in self.gathered:
            cost = profile.layer(name)
            fwd, bwd = cost.time("forward", "fastest"), cost.time("backward", "fastest")
            if bwd > 0:
                self.backward_share[name] = min(1.0, fwd / bwd)
                self.gathered_s += max(bwd - fwd, 0.0)
        self.cache: dict = {}
        self._workspace_cache: dict = {}    # see workspace_blocks
        self._cost_cache: dict = {}         # see _call_costs
        self._fixed_costs = None            # see _call_costs: the calls of other layers
        self._conv_calls: list = []         # see _call_costs: (phase, i, name, temporaries)
        self._blocks: dict = {}             # cache key -> StepBlocks of its layout (_least_from)
        # (cache key, _Walk) of the last least_required: when that decision is evaluated
        # next (it fits the bound), its walk is packed and timed instead of walked again
        self._walked = None
        # cache key -> (Evaluation, its StepBlocks) of the decisions that offload nothing,
        # shared with every model of this step at another lookahead (shares_with)
        self._unmoved: dict = {}
        if shares_with is not None:
            if shares_with._step_options() != self._step_options():
                raise ValueError("shares_with must model the same step, at another lookahead "
                                 "at most")
            self._unmoved = shares_with._unmoved

    def dry_executor(self, device, offload=frozenset(), workspace=None, recompute=frozenset(),
                     static_layout: bool | None = None, blocks=None) -> Executor:
        """A dry executor of this step (recording.dry_executor) on `device` (a SymbolicDevice)
        for the decision that offloads `offload`, plans `workspace` ({(conv node name,
        phase): bytes}) into the static layout and recomputes `recompute`; static_layout:
        None for the model's. It shares the model's liveness plan once there is one."""
        decision = MemoryDecision(offload=frozenset(offload), workspace=dict(workspace or {}),
                                  recompute=frozenset(recompute), relu_bits=self.relu_bits,
                                  prefetch_lookahead=self.lookahead, policy="fixed",
                                  precision=self.maps.precision, layout=self.maps.layout,
                                  chunks=self.chunks)
        spec = StepSpec(batch=self.batch, global_batch=self.step_batch, fuse=self.spec.fuse,
                        static_layout=self.static_layout if static_layout is None
                        else static_layout)
        return dry_executor(self.net, spec, decision, device, self.plan, blocks)

    def _step_options(self) -> tuple:
        """What a walk depends on besides the decision and the prefetch lookahead."""
        return (self.net, self.batch, self.profile, self.micro_batches, self.budget,
                self.usable, self.steps, self.replay, self.static_layout, self.relu_bits,
                self.maps, self.extra_bytes, self.input_bytes, self.graphs, self.chunks,
                self.spec.fuse)

    def _device(self) -> SymbolicDevice:
        """A recording device for one dry run, with the profile's generator size."""
        return SymbolicDevice(self.profile.generator_bytes,
                              "cpu" if self.profile.synchronous else "gpu")

    # ---- decisions ---------------------------------------------------------------------------
    def key(self, offload, conv_algo, recompute=frozenset()) -> tuple:
        return (frozenset(offload), tuple(conv_algo.get(n, "fastest") for n in self.conv_names),
                frozenset(recompute))

    def conv_cost(self, name: str):
        """The LayerCost of one call of convolution layer `name` (of its first piece, in a
        chunk: every piece costs the same)."""
        return self.profile.layer(self.nodes[self.conv_nodes[name][0]].name)

    def algos(self, algo: str) -> dict:
        """Every convolution on one plan setting."""
        if algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
        return {n: algo for n in self.conv_names}

    def evaluate(self, offload, conv_algo: dict | None = None,
                 recompute=frozenset()) -> Evaluation:
        """The prediction for offloading `offload` and recomputing `recompute` (storage ids)
        with these conv plans (missing convolutions: 'fastest'). Cached."""
        conv_algo = {n: (conv_algo or {}).get(n, "fastest") for n in self.conv_names}
        key = self.key(offload, conv_algo, recompute)
        hit = self.cache.get(key)
        if hit is None or isinstance(hit, Unfit):
            hit = self.cache[key] = self._evaluate(frozenset(offload), conv_algo,
                                                   frozenset(recompute))
        return hit

    def evaluate_if_fits(self, offload, conv_algo: dict | None = None,
                         recompute=frozenset(), near: Evaluation | None = None
                         ) -> Evaluation | None:
        """evaluate(), for a caller that only wants a decision that fits: None when it does
        not. A decision whose least possible need (`least_required`) is over the budget is
        not walked further: the cache keeps it as Unfit (it counts as evaluated, as it would
        have been), and evaluate() finishes it when asked.

        Args:
            offload, conv_algo, recompute: as evaluate().
            near: an Evaluation of this model that the decision undoes one move of (pruning
                asks this way): its blocks bound the decision's need first, without a walk
                (planner/nearby.py); the walk is made only when that bound fits.
        Returns:
            The Evaluation when the decision fits the usable budget, else None.
        """
        conv_algo = {n: (conv_algo or {}).get(n, "fastest") for n in self.conv_names}
        key = self.key(offload, conv_algo, recompute)
        hit = self.cache.get(key)
        if hit is None:
            offload, recompute = frozenset(offload), frozenset(recompute)
            least = None            # evaluated at another lookahead: nothing to bound
            if key not in self._unmoved:
                least = self._least_from(near, key) if near is not None else None
                if least is None or self.usable is None or least <= self.usable:
                    least = self.least_required(offload, conv_algo, recompute)
            if self.usable is not None and least is not None and least > self.usable:
                hit = self.cache[key] = Unfit(offload, conv_algo, recompute, least)
            else:
                hit = self.cache[key] = self._evaluate(offload, conv_algo, recompute)
        return hit if hit.fits else None

    def _least_from(self, near: Evaluation, key: tuple) -> int | None:
        """least_required of the decision of cache key `key`, bounded from the recorded
        blocks of `near` (planner/nearby.py) without a walk; None when they do not tell."""
        near_key = self.key(near.offload, near.conv_algo, near.recompute)
        blocks = self._blocks.get(near_key)
        if blocks is None:
            return None
        offload, algos, recompute = key
        workspace = None
        if algos != near_key[1]:
            settings = dict(zip(self.conv_names, algos))
            workspace = {(i, phase): nbytes for (name, phase), nbytes
                         in self.workspace_blocks(settings, recompute).items()
                         for i in self.conv_nodes[name]}
        region = region_bound(blocks, self.plan, (near_key[0], near_key[2], near_key[1]),
                              (offload, recompute, algos), workspace)
        if region is None:
            return None
        return self.param_grad_bytes + aligned(max(region, 1)) + self.extra_bytes

    def least_required(self, offload: frozenset, conv_algo: dict,
                       recompute: frozenset) -> int | None:
        """A lower bound on the decision's required_bytes from its static layout's intervals
        alone (one dry walk of the step, no packing, no timing; the walk is kept for the
        evaluation that follows when the bound fits): the step
        holds the parameters, their gradients and the feature-map region, and the region is
        at least the most bytes its blocks have alive at once; the momentum and the input
        batches add theirs. None without a static layout."""
        if not self.static_layout:
            return None
        with collector_paused():
            walk = self._walk(offload, conv_algo, recompute)
        self._walked = (self.key(offload, conv_algo, recompute), walk)
        region = live_peak(walk.recording.intervals)
        return self.param_grad_bytes + aligned(max(region, 1)) + self.extra_bytes

    def workspace_blocks(self, conv_algo: dict, recompute=frozenset()) -> dict:
        """{(conv name, phase): bytes} the static layout plans for these plan settings (none
        without a static layout: then the kernels allocate workspaces beside the region); a
        convolution run again to rebuild a recomputed map gets its forward's workspace."""
        if not self.static_layout:
            return {}
        rerun = frozenset(self.nodes[j].layer.name for sid in recompute
                          for j in self.plan.writers(sid))
        key = (tuple(conv_algo.get(name, "fastest") for name in self.conv_names), rerun)
        blocks = self._workspace_cache.get(key)
        if blocks is None:      # the bound and the full evaluation of a decision both ask
            blocks = self._workspace_cache[key] = {}
            for name in self.conv_names:
                cost = self.conv_cost(name)
                for phase in CALL_PHASES:
                    if phase == "recompute" and name not in rerun:
                        continue
                    nbytes = cost.workspace(phase, conv_algo.get(name, "fastest"))
                    if nbytes:
                        blocks[(name, phase)] = int(nbytes)
        return dict(blocks)

    def _walk(self, offload: frozenset, conv_algo: dict, recompute: frozenset) -> "_Walk":
        """The decision's first step walked through a dry executor, logged; with the static
        layout its blocks are recorded on the way, for the layout (planner/recorded.py)."""
        device = self._device()
        planned = self.workspace_blocks(conv_algo, recompute)
        recording = StepRecording(device.log.__len__) if self.static_layout else None
        ex = self.dry_executor(device, offload, planned, recompute, blocks=recording)
        held = int(ex.allocator.in_use)
        device.log.clear()     # parameters were taken before the step: `held`
        rec = Recorder(device.log, ex.manager, self.index)
        ex.watch(rec)
        stats = ex.simulate_step()
        rec.sampling = False
        rec.optimizer_and_step_end()
        if recording is not None:
            recording.hold_to_end(self._layout_kept)
        return _Walk(device, ex, rec, stats, held, int(ex.allocator.peak), planned, recording)

    def _evaluate(self, offload: frozenset, conv_algo: dict, recompute: frozenset) -> Evaluation:
        key = self.key(offload, conv_algo, recompute)
        shared = self._unmoved.get(key)
        if shared is not None:      # evaluated by a model of this step at another lookahead
            self._walked = None
            ev, self._blocks[key] = shared
            return ev
        with collector_paused():
            ev = self._evaluate_now(offload, conv_algo, recompute)
        if not offload:
            self._unmoved[key] = (ev, self._blocks.get(key))
        return ev

    def _evaluate_now(self, offload: frozenset, conv_algo: dict,
                      recompute: frozenset) -> Evaluation:
        key = self.key(offload, conv_algo, recompute)
        walked, self._walked = self._walked, None      # the bound's walk, used once
        walk = walked[1] if walked is not None and walked[0] == key else \
            self._walk(offload, conv_algo, recompute)
        device, ex, rec, stats, planned = walk.device, walk.ex, walk.rec, walk.stats, walk.planned
        log = device.log
        layout, blocks, region = None, ex.manager.blocks, 0
        if walk.recording is not None:
            layout = StaticLayout(walk.recording.intervals)
            waits: list = []
            blocks = walk.recording.planned_blocks(layout, waits)
            splice(log, [(at, Wait(stream, event)) for at, stream, event in waits])
            # what the executor's allocator takes for the region, before the step
            region = aligned(max(layout.size, 1))
            self._blocks[key] = StepBlocks.of(layout.intervals.values())   # for _least_from
        held = walk.held + region
        # Each step's peak is its own (the executor resets it): every step's is the first's.
        dry_peak = walk.peak + region
        if self.replay:     # the later steps walk as the first did (planner/replay.py)
            replay_steps(log, slice(0, len(log)), lambda: blocks.begin_step(device),
                         device.event, ex.allocator.serials, self.steps - 1)
        else:
            ex.manager.use_blocks(blocks)       # the later steps at the packed addresses
            for _ in range(self.steps - 1):
                stats = ex.simulate_step()
                rec.optimizer_and_step_end()
            dry_peak = int(ex.allocator.peak) + region

        costs = self._call_costs(conv_algo, planned)
        levels, fm_levels = {}, {}
        for phase, i, in_use, fm_bytes, _ in rec.samples:
            levels[(phase, i)] = in_use + region + costs[(phase, i)][2] + self.extra_bytes
            fm_levels[(phase, i)] = fm_bytes
        resident = rec.residency()
        candidates = dict(levels)
        candidates["optimizer"] = held + self.extra_bytes
        candidates["allocation"] = dry_peak + self.extra_bytes
        peak_point = max(candidates, key=lambda k: candidates[k])
        required = int(candidates[peak_point])
        levels["optimizer"] = candidates["optimizer"]

        replayed = self.graphs and capturable(bool(offload), self.static_layout)
        t = Timeline(self.profile, self.budget, held + self.extra_bytes,
                     issued=not replayed).play(log, costs)
        fits = self.usable is None or required <= self.usable
        k, opt = self.micro_batches, self.profile.optimizer_s
        # The timeline steps are passes, each with its optimizer update; a step has k passes,
        # the gradient adds of the k - 1 after the first, the gathered layers' gradients, the
        # bf16 weight copies and one update.
        between = (k - 1) * (self.accumulate_s - opt) + self.gathered_s + \
            self.weight_copy_s
        step, compute = k * t["step"] + between, k * t["compute"] + between
        return Evaluation(workspace=planned, recompute=recompute, chunks=self.chunks,
            offload=offload, conv_algo=dict(conv_algo), required_bytes=required,
            peak_bytes=int(t["peak"]), fits=fits, step_time_s=step,
            compute_s=compute, offloaded_bytes=k * int(stats["offloaded_bytes"]),
            prefetched_bytes=k * int(stats["prefetched_bytes"]),
            on_demand_fetches=int(stats["on_demand_fetches"]),
            avg_feature_map_bytes=float(stats["avg_feature_map_bytes"]), held_bytes=held,
            region_bytes=int(layout.size) if layout is not None else 0, levels=levels,
            fm_levels=fm_levels, resident=resident, peak_point=peak_point,
            fm_peak_point=max(fm_levels, key=lambda k: fm_levels[k]), calls=t["calls"],
            copies=t["copies"], host_wait_s=t["host_wait"], over_budget=t["over_budget"])

    # ---- playing the log ---------------------------------------------------------------------
    def _pool_bias(self, sliced: bool) -> dict:
        """The pool_bias pairs (minidnn/fusion.py) the step runs fused: {ReLU: max pool}, but
        where the pool's backward widens bf16 maps on the planned device (the CPU's), whose
        ReLU then sums (Assembly._pool_bias_sums)."""
        ops = BF16_OPS["cpu" if self.profile.synchronous else "gpu"]
        return {relu: pool for relu, pool in pool_bias_pairs(self.plan, sliced).items()
                if not widens_backward(self.plan, self.index[pool], ops)}

    def _bias_sums(self, summed_by: dict) -> dict:
        """{node index: bytes of the partial sums of a convolution's bias gradient its
        backward takes} (costs.bias_sums_bytes): the convolution's own, or, where
        `summed_by` ({convolution: node}, the step's fused pairs) names one, that node's (the
        ReLU that adds the bias, or the max pool after it)."""
        sums = {}
        for node in self.nodes:
            nbytes = bias_sums_bytes(node.layer, self.maps.layout)
            if nbytes:
                sums[self.index[summed_by.get(node.name, node.name)]] = nbytes
        return sums

    def _call_costs(self, conv_algo: dict, planned: dict) -> dict:
        """{(phase, node index): (host s, device s, bytes taken for the call)} of every layer
        call under these plan settings. The device time is the call's time alone (its share
        of it where it is fused) and the gap a call takes among a pass's others
        (Profile.call_gap_s). The bytes are its workspace unless the static layout plans it
        (`planned`: then it is inside the region) and its temporaries. Only a
        convolution's entries depend on the settings; the others are worked out once per
        model, and a convolution's once per (call, setting, planned or not): every decision
        asks, and a very deep network has thousands of calls."""
        gap = self.profile.call_gap_s      # each call's among a pass's others
        if self._fixed_costs is None:
            convs = set(self.conv_names)
            self._fixed_costs = {}
            for (phase, i), transient in self._transient.items():
                name = self.nodes[i].name
                if self.nodes[i].layer.name in convs:
                    self._conv_calls.append((phase, i, name, transient))
                else:
                    host, dur, ws = self._cost_of(phase, i, name, "fastest")
                    share = (self.backward_share if phase == "backward" else
                             self.forward_share).get(name, 1.0)
                    # A call priced at nothing runs inside another's kernel: no gap of its own.
                    dur = dur * share + (gap if share else 0.0)
                    self._fixed_costs[(phase, i)] = (host, dur, ws + transient)
        out = dict(self._fixed_costs)
        cache = self._cost_cache
        for phase, i, name, transient in self._conv_calls:
            layer = self.nodes[i].layer.name        # a chunk's pieces run their layer's setting
            algo = conv_algo.get(layer, "fastest")
            inside = (layer, phase) in planned
            got = cache.get((phase, i, algo, inside))
            if got is None:
                host, dur, ws = self._cost_of(phase, i, name, algo)
                got = cache[(phase, i, algo, inside)] = (host, dur + gap,
                                                         (0 if inside else ws) + transient)
            out[(phase, i)] = got
        return out

    def _cost_of(self, phase: str, i: int, name: str, algo: str) -> tuple:
        """(host s, device s alone, workspace bytes) of node i's `phase` call on `algo`."""
        cost = self.profile.layer(name)
        return cost.host(phase), self.layer_time(name, phase, algo), cost.workspace(phase, algo)

    def layer_time(self, name: str, phase: str, algo: str = "fastest") -> float:
        """The device time alone of node `name`'s `phase` call on `algo` as this step makes
        it: a convolution whose ReLU adds its bias without the bias's pass (bias_elsewhere)."""
        return self.profile.layer(name).time(phase, algo, name not in self.bias_elsewhere)

    # ---- helpers for reports -----------------------------------------------------------------
    def copy_seconds(self, nbytes: int, direction: str) -> float:
        """One copy of nbytes alone in `direction` ('offload' or 'prefetch'): its latency
        and its bytes over the link (Profile.link)."""
        latency, rate = self.profile.link(direction)
        return latency + nbytes / rate

    def lower_bound_s(self, ev: Evaluation) -> float:
        """max(compute, bytes that cross PCIe / bandwidth): no schedule of these copies and
        this compute can be faster. Each direction is limited by its own bandwidth and both
        together by the duplex one (measured on an H200: pinned copies 55 GB/s each way,
        100 GB/s both at once)."""
        p = self.profile
        copies = max(ev.offloaded_bytes / p.d2h_bw, ev.prefetched_bytes / p.h2d_bw,
                     (ev.offloaded_bytes + ev.prefetched_bytes) / p.duplex_bw)
        return max(ev.compute_s, copies)
