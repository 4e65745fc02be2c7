"""The recording device: stand-ins for a GPU's streams, events and allocator that write what
the host issues into one log, for the step model (planner/step_model.py) to play against a
Profile (planner/playback.py).

A dry-run executor (compute=False) is built on a SymbolicDevice exactly as a run builds its
executor; its three streams and its events write every `record`, `wait_event`, copy and layer
call into the log in the order the host issues them, and its RecordingAllocator logs every
allocation and every free with the event the free waits for. The log's entries: Mark (a
layer call, a copy, the optimizer, a step's end), Record, Wait, Alloc, Free. The Recorder
(a StepObserver) marks the layer calls and copies and samples the memory levels; Residency
reads which maps have a device block at each call off the log.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping

import numpy as np

from ..assembly import Assembly, DryParts
from ..backend import Device
from ..executor import Executor
from ..memory.allocator import CountingAllocator
from ..memory.observer import StepObserver
from ..memory.policy import MemoryDecision


class Mark:
    """An operation on a stream: a layer call or a copy (kind; the observer's begin_layer /
    begin_copy says which before the call is issued), the optimizer step or a step boundary,
    or a zero-length marker (the end of a call or copy)."""
    __slots__ = ("stream", "kind", "label", "nbytes")
    records = False

    def __init__(self, stream: str, kind: str = "marker", label=None, nbytes: int = 0):
        self.stream, self.kind, self.label, self.nbytes = stream, kind, label, nbytes

    def again(self, events: dict, shift: int) -> "Mark":
        """This entry in a replayed step (planner/replay.py): events renamed by `events`
        ({id: new event}; others stay), block keys moved by `shift`. A mark is only read."""
        return self


class _EventEntry:
    """An entry naming a stream and an event: Record (the stream records it) or Wait (the
    stream waits for it)."""
    __slots__ = ("stream", "event")
    records = False

    def __init__(self, stream: str, event):
        self.stream, self.event = stream, event

    def again(self, events: dict, shift: int):
        return type(self)(self.stream, events.get(id(self.event), self.event))


class Record(_EventEntry):
    __slots__ = ()
    records = True


class Wait(_EventEntry):
    __slots__ = ()


class Alloc:
    __slots__ = ("key", "nbytes")
    records = False

    def __init__(self, key: int, nbytes: int):
        self.key, self.nbytes = key, nbytes

    def again(self, events: dict, shift: int) -> "Alloc":
        return Alloc(self.key + shift, self.nbytes)


class Free:
    __slots__ = ("key", "event")
    records = False

    def __init__(self, key: int, event):
        self.key, self.event = key, event

    def again(self, events: dict, shift: int) -> "Free":
        return Free(self.key + shift, events.get(id(self.event), self.event))


class SymbolicEvent:
    """A CUDA event stand-in that logs where it is recorded, in the log of the stream that
    records it (it holds no log itself: the log holds it). Always `done` for the dry run's
    own bookkeeping (its frees happen at once); the timeline gives it a real time and the
    stream that last recorded it."""
    __slots__ = ("time", "stream")

    def __init__(self):
        self.time = 0.0
        self.stream = None

    def record(self, stream) -> None:
        stream.log.append(Record(stream.name, self))

    @property
    def done(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class SymbolicStream:
    """A CUDA stream stand-in that logs what is issued on it."""

    def __init__(self, name: str, log: list):
        self.name = name
        self.log = log

    def wait_event(self, event) -> None:
        self.log.append(Wait(self.name, event))

    def record(self, event=None):
        event = event if event is not None else SymbolicEvent()
        event.record(self)
        return event

    def synchronize(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class SymbolicDevice(Device):
    """A Device whose streams and events log, for the dry run. Its arrays are NumPy's (the dry
    run makes none) and it is not a GPU, so the executor picks the CPU kernels (never run).
    generator_bytes: the planned device's (Profile.generator_bytes), which sizes the scratch
    blocks of random draws. planned_kind: the planned device's kind ('gpu' or 'cpu'), whose
    kernels decide which bf16 maps a call widens into its scratch block (layers/precision.py)."""

    def __init__(self, generator_bytes: int = 0, planned_kind: str = "cpu"):
        # no Device.__init__: nothing to open
        self._generator_bytes = int(generator_bytes)
        self.planned_kind = planned_kind
        self.kind = "cpu"
        self.xp = np
        self.name = "symbolic"
        self.log: list = []
        self.compute = SymbolicStream("compute", self.log)
        self.offload = SymbolicStream("offload", self.log)
        self.prefetch = SymbolicStream("prefetch", self.log)

    def event(self):
        return SymbolicEvent()

    timing_event = event

    def synchronize(self) -> None:
        pass


class RecordingAllocator(CountingAllocator):
    """The dry run's device allocator (receipts, no budget), logging allocations and frees."""

    def __init__(self, log: list):
        super().__init__(None)
        self.log = log
        self._serial: dict[int, int] = {}   # id of a live receipt -> its allocation number
        self._count = 0

    def alloc(self, nbytes: int, where: str = ""):
        buf = super().alloc(nbytes, where)
        # Receipts die once freed and Python reuses their ids: the log names blocks by serial.
        self._count += 1
        self._serial[id(buf)] = self._count
        self.log.append(Alloc(self._count, buf.nbytes))
        return buf

    def free(self, buf, after=None) -> None:
        super().free(buf, after)
        self.log.append(Free(self._serial.pop(id(buf)), after))

    @property
    def serials(self) -> int:
        """Allocations made so far: every block's serial is at most this."""
        return self._count


class Recorder(StepObserver):
    """The observer interface (memory/observer.py) turned into log entries, plus, at the start of
    every layer call of the first step, the allocator's bytes in use, the feature-map bytes
    on the device and where the manager's log of the step stands (which storages are on the
    device then: `residency()`)."""

    def __init__(self, log: list, manager, index: dict):
        self.log = log
        # weakly: the manager holds its observer, and a cycle would leave every walk's
        # objects to the cyclic collector, paused while a decision is evaluated (collector.py)
        self.manager = weakref.proxy(manager)
        self.index = index
        self.samples: list = []      # (phase, node index, device bytes, fm bytes, log position)
        self.sampling = True
        self._log, self._base, self._start = None, 0, frozenset()   # see _position

    def mark(self, stream, kind: str = "marker", label=None, nbytes: int = 0):
        m = Mark(stream.name, kind, label, nbytes)
        self.log.append(m)
        return m

    def begin_layer(self, stream, phase, name, index):
        m = Mark(stream.name, "layer", (phase, index))     # as mark() would, a call fewer
        self.log.append(m)
        return m

    def begin_copy(self, stream, track, name, nbytes):
        return self.mark(stream, "copy", name, int(nbytes))

    def memory(self, at, phase, layer, when, device_bytes, feature_map_bytes) -> None:
        if self.sampling and when == "start":
            self.samples.append((phase, self.index[layer], int(device_bytes),
                                 int(feature_map_bytes), self._position()))

    def _position(self) -> int:
        """Where the manager's log of the step stands now; at the step's first sample, also
        which storages have a device block (one scan of every map)."""
        log = self.manager.log
        if log is not self._log:
            self._log, self._base = log, len(log)
            self._start = frozenset(fm.plan.id for fm in self.manager.maps
                                    if fm.device is not None)
        return len(log)

    def residency(self) -> "Residency":
        """{(phase, node index): storage ids on the device at the start of that call} of the
        sampled step."""
        return Residency(self._start, self._log or [], self._base,
                         {(phase, i): pos for phase, i, _, _, pos in self.samples})

    def optimizer_and_step_end(self) -> None:
        self.log.append(Mark("compute", "optimizer"))
        self.log.append(Mark("compute", "step_end"))


def dry_executor(net, spec, decision: MemoryDecision, device: SymbolicDevice, plan=None,
                 blocks=None) -> Executor:
    """A dry-run executor of `decision` for `spec` (its batch is one pass's, its global batch
    the step's: random draws are the step's) on the recording device, with the recording
    allocator. With the static layout its feature-map region is packed for the decision's
    offload set, exactly as a real run's would be. plan: the LivenessPlan to share (None:
    the executor makes one). blocks: the feature-map blocks to take instead of a packed
    layout (recorded.StepRecording)."""
    dry = DryParts(allocator=RecordingAllocator(device.log), host=CountingAllocator(None),
                   plan=plan, blocks=blocks)
    return Executor.assembled(Assembly(net, spec, decision, device, compute=False, dry=dry))


class Residency(Mapping):
    """{(phase, node index): frozenset of the storage ids with a device block at the start of
    that call}, read off the manager's log of the step when asked: the planner asks at one
    or two calls of a decision, and a set per call of a deep network costs calls x maps.

    start: the storages on the device at the step's first sample, `base` entries into `log`;
    at: {call: the log's length at its sample}.
    """

    # What the manager's log of a step says about a map's device block: it took one (alloc,
    # fetch) or gave it up (free, evict, drop); an offload copies and keeps it.
    _TAKES = {"alloc": True, "fetch": True, "free": False, "evict": False, "drop": False}

    def __init__(self, start: frozenset, log: list, base: int, at: dict):
        self._start, self._log, self._base, self._at = start, log, base, at
        self._sets: dict = {}

    def __getitem__(self, point) -> frozenset:
        got = self._sets.get(point)
        if got is None:
            now = set(self._start)
            for _, what, sid in self._log[self._base:self._at[point]]:
                takes = self._TAKES.get(what)
                if takes:
                    now.add(sid)
                elif takes is not None:
                    now.discard(sid)
            got = self._sets[point] = frozenset(now)
        return got

    def __iter__(self):
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)
