"""The observer interface: how anything watches a step without changing it.

The executor and the memory manager tell one StepObserver about every layer call, copy and
memory level of a step (as Caffe's before/after-forward callbacks and Chainer's FunctionHook
do). The tracer (minidnn/trace.py) turns that into a timeline, the planner's step model
(planner/step_model.py) into a log it plays against measured costs. Every method does nothing
here; an observer overrides what it wants.
"""
from __future__ import annotations


class StepObserver:
    """Watches the steps of one executor (Executor.watch)."""

    def mark(self, stream):
        """A point in time on `stream`, taken after each layer call and copy (and, through
        the two methods below, before it); what it returns comes back as `start` / `end`."""
        return None

    def begin_layer(self, stream, phase: str, name: str, index: int):
        """Node `index` ('name') is about to run its `phase` call on `stream`: the mark that
        comes back as `start` in layer() (an observer that logs marks learns their meaning
        here, before anything else is issued)."""
        return self.mark(stream)

    def begin_copy(self, stream, track: str, name: str, nbytes: int):
        """A copy of `nbytes` of storage `name` is about to be issued on `stream` ('offload'
        or 'prefetch' track): the mark that comes back as `start` in copy()."""
        return self.mark(stream)

    def begin_step(self, step: int) -> None:
        """A step (its forward, or a whole dry step) begins; `step` counts training steps."""

    def layer(self, phase: str, name: str, index: int, start, end) -> None:
        """Node `index` ('name') ran its `phase` call ('forward', 'recompute', 'backward')
        on the compute stream between the marks `start` and `end`."""

    def copy(self, track: str, name: str, start, end, nbytes: int) -> None:
        """A copy of `nbytes` of storage `name` on the 'offload' or 'prefetch' stream."""

    def memory(self, at, phase: str, layer: str, when: str, device_bytes: int,
               feature_map_bytes: int) -> None:
        """Bytes in use at mark `at`, at the 'start' or 'end' of a layer call: everything in
        the device allocator, and the feature maps the manager holds on the device."""


class ObserverGroup(StepObserver):
    """Several observers watching as one: each gets every call, with its own marks (a mark of
    the group is the tuple of its members' marks)."""

    def __init__(self, observers):
        self.observers = [o for o in observers if o is not None]

    def mark(self, stream):
        return tuple(o.mark(stream) for o in self.observers)

    def begin_layer(self, stream, phase: str, name: str, index: int):
        return tuple(o.begin_layer(stream, phase, name, index) for o in self.observers)

    def begin_copy(self, stream, track: str, name: str, nbytes: int):
        return tuple(o.begin_copy(stream, track, name, nbytes) for o in self.observers)

    def begin_step(self, step: int) -> None:
        for o in self.observers:
            o.begin_step(step)

    def layer(self, phase: str, name: str, index: int, start, end) -> None:
        for o, s, e in zip(self.observers, start, end):
            o.layer(phase, name, index, s, e)

    def copy(self, track: str, name: str, start, end, nbytes: int) -> None:
        for o, s, e in zip(self.observers, start, end):
            o.copy(track, name, s, e, nbytes)

    def memory(self, at, phase: str, layer: str, when: str, device_bytes: int,
               feature_map_bytes: int) -> None:
        for o, a in zip(self.observers, at):
            o.memory(a, phase, layer, when, device_bytes, feature_map_bytes)
