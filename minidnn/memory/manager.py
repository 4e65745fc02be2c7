"""The memory manager: owns every feature-map buffer of a step, frees each one on time, and
moves the ones its policy chose to host memory between their forward and backward use (vDNN).

The executor asks it for buffers around each layer call; it answers from the liveness plan
(memory/plan.py) and the policy's decision (memory/policy.py). Buffers come from the device
allocator (the arena), are viewed with each tensor's shape and dtype, and go back right after
their last use: in forward when backward does not need them, in backward once consumed.
Gradients of tensors read by several layers (branches) are summed here, so layers only ever
write their own result. The pieces of a layer chunk (plan.rows) read their rows of the run's
input and write their rows of its gradient, views into the whole batch's buffers: disjoint
rows, so nothing is summed.

Offload and prefetch, and the stream/event rules that make them safe without ever blocking
the host (on the CPU every stream and event is a no-op stand-in and copies happen at once, so
the same code gives the exact residency pattern):

* offload (forward): after a storage's last forward write, an event recorded on the compute
  stream behind that layer's kernels; the offload stream waits on it and copies device -> host
  (pinned). When the storage's last forward reader has been issued, it is evicted: its device
  block is released with `free(buf, after=offload_done)`, and the arena hands the block out
  again only once the copy has finished, and every later compute use is ordered after the reader by the
  compute stream itself.
* prefetch (backward): before launching layer i's kernels, the manager copies back the
  offloaded maps of the next `lookahead` layers (stopping at a convolution, as vDNN does) on the
  prefetch stream, which first waits on (a) an event recorded on compute at that moment, since
  the destination block may have been freed by compute work still in flight, and (b) the
  offload that filled the host copy. Layer i's compute then waits on the prefetch events of the
  maps it reads. A map that was not prefetched is fetched on demand (a stall, counted).

Recomputation, the other way to free a map between forward and backward: a storage in the
`recompute` set is dropped after its last forward use: its device block is released as an
evicted one's is, but nothing is copied. Before the backward of its first reader (or of the
first reader of a storage rebuilt from it: a chain comes back at once, schedule.py), the
executor runs its writers' forward again (`recompute_before`, `recompute_buffers`), into a new
block, from inputs that are still on the books then (the prefetch window brings offloaded ones
back as it does for backward) or rebuilt just before.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ..backend import address
from ..errors import MemoryBudgetError
from ..kernels import cpu as _cpu_kernels
from .layout import DynamicBlocks, WorkspaceBlock
from .plan import LivenessPlan, StoragePlan
from .policy import NO_DECISION, MemoryDecision
from .schedule import StepSchedule

# cudaMemcpyKind values (fixed by the CUDA runtime API).
_HOST_TO_DEVICE, _DEVICE_TO_HOST = 1, 2


# FeatureMap.state by (on the device, on the host)
_STATES = {(True, True): "both", (True, False): "device", (False, True): "host",
           (False, False): "freed"}


class FeatureMap:
    """One storage's bytes and where they are (Caffe's SyncedMemory).

    state: 'freed' (nowhere), 'device', 'host' (offloaded and evicted) or 'both'.
    On the GPU 'both' right after an offload means the copy is issued; `offloaded` says when
    it is done. Events (CUDA events on GPU, always-done stand-ins on CPU):
      offloaded    offload stream, after the device -> host copy
      fetched      prefetch stream, after the host -> device copy
      device_busy  the copy that still reads or writes the device block (None once compute
                   has waited on it: from then on compute's own order protects the block)
      host_busy    the copy that still reads or writes the host block
    history: [(time, state)] of this step, for tests and traces.
    """

    __slots__ = ("plan", "sid", "nbytes", "device", "host", "offloaded", "fetched",
                 "device_busy", "host_busy", "compute_waited", "history")

    def __init__(self, plan: StoragePlan):
        self.plan = plan
        # the plan's id and size, read at every block operation of every step
        self.sid, self.nbytes = plan.id, plan.nbytes
        self.device = None
        self.host = None
        self.offloaded = None
        self.fetched = None
        self.device_busy = None
        self.host_busy = None
        self.compute_waited = True
        self.history: list[tuple[int, str]] = []

    @property
    def name(self) -> str:
        return self.plan.tensors[0]

    @property
    def state(self) -> str:
        return _STATES[self.device is not None, self.host is not None]

    def note(self, time: int) -> None:
        self.history.append((time, self.state))

    def __repr__(self) -> str:
        return f"FeatureMap({self.name!r}, {self.nbytes} B, {self.state})"


class Mover:
    """Issues the copies between device and host with the events that order them.

    blocks: where feature-map blocks come from (memory/layout.py: the allocator, or planned
    offsets); host: the pinned host slab. Both take a release with `after=event` and reuse a
    block only once the event is done. Nothing here blocks the host. `dry`: count
    bytes but copy nothing (the buffers are receipts from a CountingAllocator).
    """

    def __init__(self, device, blocks, host, dry: bool = False, observer=None):
        self.device = device
        self.blocks = blocks
        self.host = host
        self.dry = dry
        self.observer = observer      # a memory.observer.StepObserver, or None

    # ---- the two copies --------------------------------------------------------------------------
    def offload(self, fm: FeatureMap, time: int) -> None:
        """Start the device -> host copy of `fm` behind everything compute has been given."""
        dev = self.device
        written = dev.event()
        written.record(dev.compute)          # behind the last writer's kernels
        dev.offload.wait_event(written)
        fm.host = self.host.alloc(fm.nbytes)
        done = self._traced_copy("offload", fm, fm.host, fm.device, _DEVICE_TO_HOST, dev.offload)
        fm.offloaded = fm.device_busy = fm.host_busy = done
        fm.note(time)

    def fetch(self, fm: FeatureMap, time: int, where: str) -> None:
        """Allocate a device block for `fm` and start the host -> device copy into it."""
        dev = self.device
        fm.device = self.blocks.acquire(fm, where, dev.prefetch)
        # The block may have been freed by compute work that is still running; and the host copy
        # must be complete. The prefetch stream waits for both, not the host.
        issued = dev.event()
        issued.record(dev.compute)
        dev.prefetch.wait_event(issued)
        if fm.offloaded is not None:
            dev.prefetch.wait_event(fm.offloaded)
        done = self._traced_copy("prefetch", fm, fm.device, fm.host, _HOST_TO_DEVICE, dev.prefetch)
        fm.fetched = fm.device_busy = fm.host_busy = done
        fm.compute_waited = False
        fm.note(time)

    def _traced_copy(self, track: str, fm: FeatureMap, dst, src, kind: int, stream):
        """Issue the copy on `stream` (marked in the trace); returns the event recorded after it."""
        start = self.observer.begin_copy(stream, track, fm.name, fm.nbytes) \
            if self.observer else None
        self._copy(dst, src, fm.nbytes, kind, stream)
        done = self.device.event()
        done.record(stream)
        if self.observer:
            self.observer.copy(track, fm.name, start, self.observer.mark(stream), fm.nbytes)
        return done

    def wait(self, fm: FeatureMap) -> None:
        """Make compute wait for `fm`'s prefetch (once)."""
        if not fm.compute_waited:
            self.device.compute.wait_event(fm.fetched)
            fm.compute_waited = True
            fm.device_busy = None

    def _copy(self, dst, src, nbytes: int, kind: int, stream) -> None:
        if self.dry:
            return
        if self.device.is_gpu:
            from cupy.cuda import runtime
            if kind == _DEVICE_TO_HOST:
                dst_ptr, src_ptr = dst.ctypes.data, src.data.ptr
            else:
                dst_ptr, src_ptr = dst.data.ptr, src.ctypes.data
            runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, kind, stream.ptr)
        else:
            dst[:nbytes] = src[:nbytes]

    # ---- releasing -----------------------------------------------------------------------------
    def release_device(self, fm: FeatureMap) -> None:
        if fm.device is not None:
            # After an offload the block is reused only once the copy has read it.
            self.blocks.release(fm, after=fm.device_busy)
            fm.device, fm.device_busy = None, None
            fm.fetched, fm.compute_waited = None, True   # the next block is written afresh

    def release_host(self, fm: FeatureMap) -> None:
        if fm.host is not None:
            # A copy may still read (prefetch) or write (offload) the host block.
            self.host.free(fm.host, after=fm.host_busy)
            fm.host, fm.host_busy, fm.offloaded = None, None, None


@dataclass
class StepMemoryStats:
    """What one step did with memory (reset by begin_step).

    samples: one (phase, node index, bytes) per layer call, phase 'forward' or 'backward',
    bytes = feature maps + aux + gradient maps resident on the device during that call.
    prefetched_bytes counts every host -> device copy, on-demand ones included.
    """
    offloaded_bytes: int = 0
    prefetched_bytes: int = 0
    on_demand_fetches: int = 0
    on_demand_bytes: int = 0
    deferred_prefetches: int = 0
    peak_feature_map_bytes: int = 0
    samples: list = field(default_factory=list)

    @property
    def avg_feature_map_bytes(self) -> float:
        """The paper's average: mean over the step's layer calls of resident feature-map bytes."""
        return float(np.mean([b for _, _, b in self.samples])) if self.samples else 0.0

    def phase_bytes(self, phase: str) -> list[int]:
        return [b for p, _, b in self.samples if p == phase]


class MemoryManager:
    """Runtime side of a LivenessPlan and a policy's offload set.

    One step (the executor does this; the order of the calls is the schedule's,
    memory/schedule.py):
        begin_step(train) ; write_input(DATA, x) ; write_input(LABEL, y)
        for call in schedule.walk(manager.schedule, manager, train):
            buffers(call) -> compute -> after(call)
        end_step()

    decision: the MemoryDecision carried out (memory/policy.py; None: keep everything,
    prefetch one layer ahead): its `offload` storage ids move to host between forward and
    backward, its `recompute` ones are dropped after forward and rebuilt in backward
    (training steps only), and backward brings offloaded maps back `prefetch_lookahead`
    layers ahead (0: only on demand). host: the pinned host slab (alloc/free). dry: buffers are receipts, nothing is
    copied and views are None (for simulate_step). workspace: {(node index, phase): bytes}
    of cuDNN workspace blocks that the static layout plans (acquire_workspace before the
    call, release_call_blocks after it); without a static layout the kernels allocate their
    workspaces themselves.
    scratch: {(node index, phase): bytes} of the scratch blocks of calls that draw random
    numbers (layers/draws.py; acquire_scratch, the same way): planned in a static layout,
    from the allocator otherwise, so that they are always counted. add: the kernels' add
    (out = a + b), which sums a branch's gradient into the one already written.
    extra_inputs: {node index: (tensor name, ...)}: maps a node's forward reads after its
    own inputs (a batch norm that applies the add after it reads the add's other input:
    minidnn/fusion.py). Each is on the device then, its last forward reader coming later.
    deferred_sums: {(node index, gradient name): add node index}: that node's backward writes
    its part of the gradient into a temporary as a second reader does, but the add's backward
    adds it (`addend`), not after_backward; the temporary is freed after the add's backward
    (minidnn/fusion.py, add_sum).
    """

    def __init__(self, plan: LivenessPlan, device, allocator, host=None,
                 decision: MemoryDecision | None = None, dry: bool = False, blocks=None,
                 workspace: dict | None = None, scratch: dict | None = None, add=None,
                 extra_inputs: dict | None = None, deferred_sums: dict | None = None):
        decision = NO_DECISION if decision is None else decision
        offload, recompute = decision.offload, decision.recompute
        prefetch_lookahead = 1 if decision.prefetch_lookahead is None \
            else decision.prefetch_lookahead
        if prefetch_lookahead < 0:
            raise ValueError(f"prefetch_lookahead must be >= 0, got {prefetch_lookahead}")
        self.plan = plan
        self.device = device
        self.xp = device.xp
        # add(a, b, out): sums a second reader's gradient into the first's (the kernels' add)
        self.add = add if add is not None else _cpu_kernels.add
        self.allocator = allocator
        if host is None:
            from .allocator import SimpleAllocator
            host = SimpleAllocator(np)
        self.host = host
        self.dry = dry
        self.prefetch_lookahead = int(prefetch_lookahead)
        self.maps = [FeatureMap(s) for s in plan.storages]
        self.blocks = blocks if blocks is not None else DynamicBlocks(allocator)
        self.mover = Mover(device, self.blocks, host, dry=dry)
        self.workspace = dict(workspace or {})
        self.scratch = dict(scratch or {})
        # What each node's forward reads, its extra inputs after its own (asked at every call)
        extra = extra_inputs or {}
        self._forward_reads = [(*node.inputs, *extra.get(i, ()))
                               for i, node in enumerate(plan.nodes)]
        self._call_blocks: list = []   # workspace and scratch blocks held during a call
        self.observer = None           # a StepObserver (memory/observer.py) set by the executor
        self.train = True
        self.loss_gradient = 1.0
        self.keep: set[int] = set()
        # The plan's integer clock (memory/plan.py): forward of node i is time i, backward of
        # node i is 2n-1-i; -1 before the step. Every log entry and history note carries it.
        self.time = -1
        self.resident_bytes = 0                    # feature maps, aux, grads, inputs on device
        self.stats = StepMemoryStats()
        # (time, 'alloc'|'free'|'offload'|'evict'|'drop'|'fetch', sid)
        self.log: list[tuple[int, str, int]] = []
        self._last_time = 2 * plan.num_nodes - 1
        self._grad_written: set[str] = set()
        self._grad_rows: dict[str, list] = {}   # gradient -> rows written by chunk pieces
        self._pending_sums: list[tuple[object, object, object, int]] = []
        self._deferred_sums = dict(deferred_sums or {})
        # add node index -> (the part it adds, its buffer, its bytes): deferred_sums kept
        self._addends: dict[int, tuple[object, object, int]] = {}
        self._window_at = None
        # (tensor, address) -> the array view of it there, when the allocator carves its
        # buffers out of one block (Allocator.carves). A layer call asks for several views and
        # each costs array-module calls on the host (on the GPU about 25 us); a storage comes
        # back to the same address step after step, so the views are made once.
        self._views: dict | None = {} if allocator.carves else None
        self._views_limit = 4 * len(plan.tensors)
        self.set_offload(offload, recompute)

    @property
    def observer(self):
        """The StepObserver told about every copy (memory/observer.py), or None."""
        return self._observer

    @observer.setter
    def observer(self, observer) -> None:
        self._observer = observer
        self.mover.observer = observer

    def set_offload(self, offload, recompute=()) -> None:
        """Choose the storages to offload and to recompute (applies from the next step on):
        the step's schedule is compiled for them (memory/schedule.py, which checks them)."""
        self.schedule = StepSchedule(self.plan, offload, recompute)
        self.offload, self.recompute = self.schedule.offload, self.schedule.recompute

    def use_blocks(self, blocks) -> None:
        """Take feature-map blocks from `blocks` from the next step on (the planner's step
        model records a dry step's blocks, packs them, then walks later steps at the packed
        addresses: planner/recorded.py)."""
        self.blocks = self.mover.blocks = blocks

    # ---- buffers ------------------------------------------------------------------------------
    def _ensure(self, sid: int, where: str):
        fm = self.maps[sid]
        if fm.device is None:
            if fm.host is not None:  # offloaded and needed again before anyone prefetched it
                self._fetch(fm, where, on_demand=True)
            else:
                fm.device = self.blocks.acquire(fm, where, self.device.compute)
                self._count(fm.nbytes)
                self.log.append((self.time, "alloc", sid))
                fm.note(self.time)
        return fm.device

    def _count(self, delta: int) -> None:
        self.resident_bytes += delta
        if self.resident_bytes > self.stats.peak_feature_map_bytes:
            self.stats.peak_feature_map_bytes = self.resident_bytes

    def _release(self, sid: int) -> None:
        fm = self.maps[sid]
        if fm.device is None and fm.host is None:
            return
        if fm.device is not None:
            self.mover.release_device(fm)
            self._count(-fm.nbytes)
            self.log.append((self.time, "free", sid))
        self.mover.release_host(fm)
        fm.note(self.time)

    def _view(self, fm: FeatureMap, tensor: str):
        if self.dry:
            return None
        t = self.plan.tensors[tensor]
        if self._views is None:
            return self.plan.maps.view(fm.device, t.shape, t.dtype)
        key = (tensor, address(fm.device))
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= self._views_limit:   # addresses that moved: start afresh
                self._views.clear()
            view = self._views[key] = self.plan.maps.view(fm.device, t.shape, t.dtype)
        return view

    def view(self, tensor: str, where: str = ""):
        """The tensor as an array of its shape and dtype (allocating its storage if needed;
        None in a dry run)."""
        sid = self.plan.tensors[tensor].storage
        fm = self.maps[sid]
        if fm.device is None:
            self._ensure(sid, where or tensor)
        return None if self.dry else self._view(fm, tensor)

    def resident_view(self, tensor: str):
        """The tensor's view (as `view`), which must be on the device now: a map a call reads
        beside its own buffers, that the step keeps there (minidnn/fusion.py, bn_sums).
        RuntimeError when it is not: offloaded or dropped, its bytes are elsewhere or gone."""
        fm = self.maps[self.plan.tensors[tensor].storage]
        if fm.device is None:
            raise RuntimeError(f"{tensor!r} is not on the device at {self.time}: a decision "
                               f"read it where the step does not keep it")
        return None if self.dry else self._view(fm, tensor)

    # ---- moving -----------------------------------------------------------------------------
    def _offload(self, sid: int) -> None:
        fm = self.maps[sid]
        self.mover.offload(fm, self.time)
        self.stats.offloaded_bytes += fm.nbytes
        self.log.append((self.time, "offload", sid))

    def _leave_device(self, sid: int, why: str) -> None:
        """Release the device block of a storage backward needs again: 'evict' (offloaded; the
        block is reused once its copy is done) or 'drop' (backward will recompute it)."""
        fm = self.maps[sid]
        if fm.device is not None:
            self.mover.release_device(fm)
            self._count(-fm.nbytes)
            self.log.append((self.time, why, sid))
            fm.note(self.time)

    def _fetch(self, fm: FeatureMap, where: str, on_demand: bool) -> None:
        self.mover.fetch(fm, self.time, where)
        self._count(fm.nbytes)
        self.stats.prefetched_bytes += fm.nbytes
        if on_demand:
            self.stats.on_demand_fetches += 1
            self.stats.on_demand_bytes += fm.nbytes
        self.log.append((self.time, "fetch", fm.sid))

    def _offloading(self, sid: int) -> bool:
        return self.train and sid not in self.keep

    def _prefetch_window(self, i: int) -> None:
        """vDNN's prefetch: bring back the offloaded maps of the next layers of backward.

        Looks at nodes i-1, i-2, ... (at most `prefetch_lookahead` of them) and stops after the
        first convolution, so that maps do not come back long before they are needed. A prefetch
        that does not fit the budget now is left for later (it will be fetched on demand).
        Issued once per backward call (a call with recomputations issues it before them).
        """
        if self._window_at == i:
            return
        self._window_at = i
        for j in range(i - 1, max(i - 1 - self.prefetch_lookahead, -1), -1):
            for sid in self.schedule.window_reads[j]:
                fm = self.maps[sid]
                if fm.device is None and fm.host is not None:
                    try:
                        self._fetch(fm, f"prefetch for backward of {self.plan.nodes[j].name}",
                                    on_demand=False)
                    except MemoryBudgetError:
                        self.stats.deferred_prefetches += 1
                        return
            if self.plan.nodes[j].layer.kind == "conv":
                return

    # ---- step ---------------------------------------------------------------------------------
    def begin_step(self, train: bool = True, keep: tuple[str, ...] = (),
                   loss_gradient: float = 1.0) -> None:
        """Start a step. `keep`: tensors to hold until end_step (outputs the caller reads).
        loss_gradient: d(step loss) / d(this pass's loss), where backward starts (1/k for
        each of k equal micro-batches, whose mean losses average to the step's)."""
        self.train = train
        self.loss_gradient = loss_gradient
        self.keep = {self.plan.tensors[k].storage for k in keep}
        self._grad_written.clear()
        self._grad_rows.clear()
        self.blocks.begin_step(self.device)
        self.stats = StepMemoryStats(peak_feature_map_bytes=self.resident_bytes)
        self.log = []
        self.time = -1
        self._window_at = None         # the backward call whose prefetch window is issued
        for fm in self.maps:
            fm.history = []

    def write_input(self, name: str, array) -> None:
        """Copy a host (or device) batch into the `data` / `label` buffer (None: only allocate)."""
        dst = self.view(name, where=f"input {name}")
        if array is None or self.dry:
            return
        if self.device.is_gpu and isinstance(array, np.ndarray):
            # Straight into the buffer, in its memory order: reordered on the device, a batch
            # would take a temporary of its own size that no plan counts. A channels-last
            # batch not already in that order (BatchLoader gives it so) is reordered here.
            if not dst.flags.c_contiguous:          # channels last
                dst, array = dst.transpose(0, 2, 3, 1), array.transpose(0, 2, 3, 1)
            dst.set(np.ascontiguousarray(array, dtype=dst.dtype), stream=self.device.compute)
        else:
            with self.device.compute:
                dst[...] = array

    def forward_buffers(self, i: int):
        """(inputs, output, aux) of node i for its forward."""
        self.time = i
        if i == 0 and self.train:
            # Graph inputs were written before the first layer: start their offloads now, so
            # the copy overlaps the first layer's compute.
            for sid in self.schedule.offload_after.get(-1, ()):
                if self._offloading(sid) and self.maps[sid].device is not None:
                    self._offload(sid)
        node = self.plan.nodes[i]
        where = f"forward of {node.name}"
        xs = self._rows(i, [self.view(name, where) for name in self._forward_reads[i]])
        y = self.view(node.name, where)
        aux = {a: self.view(t, where) for a, t in self.plan.aux_tensors(i)}
        self.stats.samples.append(("forward", i, self.resident_bytes))
        return xs, y, aux

    def after_forward(self, i: int) -> None:
        if self.train:
            for sid in self.schedule.offload_after.get(i, ()):
                if self._offloading(sid):
                    self._offload(sid)
        sched = self.schedule
        frees = (sched.frees_train if self.train else sched.frees_eval).get(i, ())
        for sid in frees:
            if sid not in self.keep:
                self._release(sid)
        if self.train:
            for sid in self.schedule.evict_after.get(i, ()):
                if self._offloading(sid) and self.maps[sid].host is not None:
                    self._leave_device(sid, "evict")
            for sid in self.schedule.drop_after.get(i, ()):
                if self._offloading(sid):
                    self._leave_device(sid, "drop")

    def recompute_before(self, i: int) -> list[int]:
        """Nodes to run forward again, in order, before node i's backward: the writers of the
        dropped storages the schedule rebuilds there (those node i's backward is the first to
        read, and the storages they are rebuilt from that are dropped too). Their inputs that
        are not rebuilt are put on their way first, then the prefetch window of node i's
        backward is issued, so its copies overlap the recomputation."""
        if not self.train:
            return []
        sched = self.schedule
        sids = [sid for sid in sched.recompute_at.get(i, ()) if sid not in self.keep]
        if not sids:
            return []
        self.time = self.plan.backward_time(i)
        where = f"recompute for backward of {self.plan.nodes[i].name}"
        for sid in sids:
            for t in sched.rebuild[sid][1]:
                self._ensure(t, where)
        self._prefetch_window(i)
        return sched.writers_to_rerun(i, skip=self.keep)

    def recompute_buffers(self, j: int):
        """(inputs, output) of node j for its forward run again in backward."""
        node = self.plan.nodes[j]
        where = f"recompute of {node.name}"
        reads = self._forward_reads[j]
        for name in reads:
            sid = self.plan.tensors[name].storage
            self._ensure(sid, where)
            self.mover.wait(self.maps[sid])
        xs = self._rows(j, [self.view(name, where) for name in reads])
        y = self.view(node.name, where)
        self.stats.samples.append(("recompute", j, self.resident_bytes))
        return xs, y

    def backward_buffers(self, i: int):
        """(retained inputs, retained output, grad output, grad inputs, aux) of node i."""
        self.time = self.plan.backward_time(i)
        where = f"backward of {self.plan.nodes[i].name}"
        retained, output, grad_output, grad_inputs = self.plan.backward_tensors(i)
        reads = self.plan.backward_reads[i]
        for sid in reads:  # what this layer reads must be on its way before anything else
            self._ensure(sid, where)
        self._prefetch_window(i)
        for sid in reads:
            self.mover.wait(self.maps[sid])
        xs = self._rows(i, [None if name is None else self.view(name) for name in retained])
        y = None if output is None else self.view(output)
        aux = {a: self.view(t) for a, t in self.plan.aux_tensors(i)}
        gy = self.view(grad_output, where)
        if i == self.plan.num_nodes - 1 and not self.dry:
            gy[...] = self.loss_gradient  # d loss / d loss
        gxs = []
        self._pending_sums = []
        for k, gname in enumerate(grad_inputs):
            if gname is None:
                gxs.append(None)
                continue
            rows = self.plan.rows[i] if k == 0 else None
            if self._first_write(gname, rows):
                gxs.append(self._cut(self.view(gname, where), rows))
            else:
                # A second reader of `name` (a branch): write into a temporary, sum after.
                t = self.plan.tensors[gname]
                shape = t.shape if rows is None else (rows.stop - rows.start,) + t.shape[1:]
                add = self._deferred_sums.get((i, gname))   # None: summed after this call
                # By best fit, also one the add keeps for a few calls: from the top of the
                # arena (Allocator.lasting), it and the calls' high-water mark below would add
                # up in a step captured as a CUDA graph, which holds every address its blocks
                # took (ResNet-50 bf16: 392 MiB more; benchmarks/RESULTS.md, wave 20).
                tmp, tmp_buf = self.allocator.empty(shape, t.dtype, where)
                if tmp is not None:  # laid out as the gradient it is added to
                    tmp = self.plan.maps.view(tmp_buf, shape, t.dtype)
                nbytes = int(np.prod(shape, dtype=np.int64)) * t.dtype.itemsize
                self._count(nbytes)
                if add is not None:
                    self._addends[add] = (tmp, tmp_buf, nbytes)
                else:
                    self._pending_sums.append((self._cut(self.view(gname), rows), tmp,
                                               tmp_buf, nbytes))
                gxs.append(tmp)
        self.stats.samples.append(("backward", i, self.resident_bytes))
        return xs, y, gy, gxs, aux

    def _rows(self, i: int, arrays: list) -> list:
        """Node i's inputs (`arrays`), input 0 cut to the rows it reads when node i is a piece
        of a layer chunk (plan.rows)."""
        if arrays:
            arrays[0] = self._cut(arrays[0], self.plan.rows[i])
        return arrays

    @staticmethod
    def _cut(array, rows: slice | None):
        """array[rows], a view along the batch axis (axis 0 in either layout: contiguous
        rows of a contiguous map); the array itself for rows None, None in a dry run."""
        return array if rows is None or array is None else array[rows]

    def _first_write(self, gname: str, rows: slice | None) -> bool:
        """Is this the first write of gradient `gname` (of these rows of it, for a piece of
        a layer chunk) in the step? Then it goes straight into the gradient's buffer; else
        into a temporary that after_backward adds to it."""
        if gname not in self._grad_written:
            self._grad_written.add(gname)
            if rows is not None:
                self._grad_rows[gname] = [rows]
            return True
        written = self._grad_rows.get(gname)   # None: a whole reader wrote it
        if rows is None or written is None or \
                any(rows.start < r.stop and r.start < rows.stop for r in written):
            return False
        written.append(rows)
        return True

    def buffers(self, call):
        """The buffers of a schedule call (memory/schedule.Call): forward_buffers,
        recompute_buffers or backward_buffers of its node."""
        if call.phase == "forward":
            return self.forward_buffers(call.index)
        if call.phase == "recompute":
            return self.recompute_buffers(call.index)
        return self.backward_buffers(call.index)

    def after(self, call) -> None:
        """What follows a schedule call: after_forward, after_backward (nothing after a
        recomputation: its output stays for the backward it serves)."""
        if call.phase == "forward":
            self.after_forward(call.index)
        elif call.phase == "backward":
            self.after_backward(call.index)

    def acquire_workspace(self, i: int, phase: str):
        """The planned workspace block of node i's `phase` call (a flat uint8 device array;
        None when none is planned, or in a dry run). Held until release_call_blocks()."""
        if not self.blocks.plans_workspace:
            return None
        return self._acquire_call_block(self.workspace, i, phase, "workspace", "workspace")

    def acquire_scratch(self, i: int, phase: str):
        """The scratch block of node i's `phase` call (a flat uint8 device array; None when the
        call draws nothing, or in a dry run, which still counts it). Held until
        release_call_blocks()."""
        if (i, phase) not in self.scratch:      # most calls draw nothing: no call made
            return None
        return self._acquire_call_block(self.scratch, i, phase, "scratch", "random draws")

    def _acquire_call_block(self, sizes: dict, i: int, phase: str, kind: str, what: str):
        """A block of `sizes[(i, phase)]` bytes that lives for node i's `phase` call."""
        nbytes = sizes.get((i, phase), 0)
        if not nbytes:
            return None
        block = WorkspaceBlock(i, phase, nbytes, kind=kind)
        where = f"{what} of {self.plan.nodes[i].name} ({phase})"
        block.device = self.blocks.acquire(block, where, self.device.compute)
        self._call_blocks.append(block)
        return None if self.dry else block.device[:nbytes]

    def release_call_blocks(self) -> None:
        """Give the blocks held for a call (its workspace and scratch) back, the last taken
        first. Their users all ran on the compute stream, so later occupants need no event:
        compute work is ordered, and a prefetch into those addresses first waits for
        everything compute was given before it (Mover.fetch)."""
        while self._call_blocks:
            self.blocks.release(self._call_blocks.pop(), after=None)

    def addend(self, i: int):
        """The part of its output gradient that node i's backward adds itself (a view; None in
        a dry run, or when there is none): a deferred sum (deferred_sums)."""
        entry = self._addends.get(i)
        return None if entry is None else entry[0]

    def after_backward(self, i: int) -> None:
        for acc, tmp, tmp_buf, nbytes in self._pending_sums:
            if not self.dry:
                self.add(acc, tmp, acc)
            self.allocator.free(tmp_buf)
            self._count(-nbytes)
        self._pending_sums = []
        if i in self._addends:
            self._free_addend(i)
        for sid in self.schedule.frees_train.get(self.plan.backward_time(i), ()):
            if sid not in self.keep:
                self._release(sid)

    def _free_addend(self, i: int) -> None:
        _, buf, nbytes = self._addends.pop(i)
        self.allocator.free(buf)
        self._count(-nbytes)

    def end_step(self) -> None:
        """Free whatever is still held (kept outputs; everything, after an interrupted step)."""
        self.time = self._last_time + 1
        self.release_call_blocks()     # held still only after a call that raised
        for acc, tmp, tmp_buf, nbytes in self._pending_sums:
            self.allocator.free(tmp_buf)
            self._count(-nbytes)
        self._pending_sums = []
        for i in list(self._addends):
            self._free_addend(i)
        for fm in self.maps:
            self._release(fm.sid)
        self.keep = set()

    def close(self) -> None:
        """Release everything (blocks behind copies in flight are reclaimed by their owners)."""
        self.end_step()

    @contextlib.contextmanager
    def ordered_by_streams(self):
        """Inside: the step's copies are ordered by stream waits alone, never by asking an
        event whether it is done, for a step captured as a CUDA graph (minidnn/step_graph.py):
        nothing of it has run. A block freed behind a copy makes the stream that next writes
        such memory wait for the copy: compute for the device (the prefetch stream starts
        behind compute), the offload stream for the pinned host slab. The caller has waited
        for the device, so the events kept from earlier steps are dropped before; those
        recorded in the capture are dropped after (a replay ends with all its copies done)."""
        self.blocks.settle()
        try:
            with self.allocator.ordered_frees(self.device.compute), \
                    self.host.ordered_frees(self.device.offload):
                yield
        finally:
            self.blocks.settle()

    # ---- reporting --------------------------------------------------------------------------------
    def resident(self) -> list[FeatureMap]:
        """The storages whose bytes are on the device now."""
        return [fm for fm in self.maps if fm.device is not None]

