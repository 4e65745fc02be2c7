"""The later timed steps of a dry run, replayed from the first step's log instead of walked.

The step model (step_model.py) times back-to-back steps, because a step's time depends on what
the step before left running (copies in flight, blocks freed behind them). Walking the memory
manager through a step is most of what an evaluation costs on a very deep network, and every
step after the first walks exactly the same way:

* the manager starts each step from the same state: `end_step` releases every map (device
  block and host copy) and every call block, and `begin_step` resets its per-step state, so
  the walk of the schedule (deterministic in that state) issues the same calls, copies,
  allocations and frees, in the same order, with the same sizes;
* with a static layout, the planned blocks (memory/layout.py: PlannedBlocks) also start each
  step afresh, except that their `begin_step` first makes the compute and prefetch streams
  wait on every block the last step released behind a copy: the only operations a later
  step issues that the first did not;
* every event a step records is a new one (the streams and the mover record fresh events),
  and the allocator names each block by a new serial.

So a later step's log is that prefix of waits, then the first step's log with each event the
first step recorded replaced by a fresh one and each block renamed (replay_steps). The test
tests/test_planner_replay.py checks the replayed log against the walked one, operation by
operation (the same kinds, streams, sizes and the same pattern of shared events and blocks),
and whole evaluations against the walking model on several networks and budgets.
"""
from __future__ import annotations


def replay_steps(log: list, first: slice, begin_step, new_event, key_shift: int,
                 count: int) -> None:
    """Append to `log` `count` more steps, each the replay of the step at log[first].

    The log's entries are recording.py's (Mark, Record, Wait, Alloc, Free): `records` says
    whether one records an event, `again(events, shift)` gives its copy in a replayed step.
    begin_step(): issues onto `log` what the second step's start issues before its walk
    repeats the first's (the planned blocks' waits on the first step's blocks still read
    by a copy: Waits only); a later step's start waits alike on its own predecessor's.
    new_event(): a fresh event (not yet recorded). key_shift: at least the largest block key
    the log has so far; replay r names the first step's blocks key + r * key_shift.
    """
    at = len(log)
    begin_step()
    prefix = log[at:]
    steps = log[first]
    before: dict = {}       # id of an event the first step records -> the last replay's
    for again in range(1, count + 1):
        if again > 1:       # the waits on the blocks the step before released behind a copy
            log.extend(op.again(before, 0) for op in prefix)
        # Events the first step records are replaced everywhere they appear in it (a wait
        # may name one before its record); any other event (made before the first step,
        # or None) stays.
        fresh = {id(op.event): new_event() for op in steps if op.records}
        shift = again * key_shift
        log.extend(op.again(fresh, shift) for op in steps)
        before = fresh
