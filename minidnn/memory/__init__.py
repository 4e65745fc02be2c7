"""minidnn's memory manager: GPU memory virtualized the way vDNN does it (Rhu et al. 2016).

Reading order, for a learner:

1. plan.py      the LivenessPlan: every buffer of a step (feature maps, aux, gradients), who
                writes and reads it and when, and so when it can be freed.
2. policy.py    what to do with each buffer between forward and backward: the
                MemoryDecision (offload, recompute, conv plans, ...) and the simple policies
                none / all / conv (minidnn/decide.py picks one by name; the planner adds dyn).
3. schedule.py  the step's calls in order, compiled once from the plan and the decision, with
                vDNN's core in one place: offload after the last forward write, evict after
                the last forward read, the prefetch window in backward, recompute, free.
4. manager.py   the MemoryManager walks the schedule at run time: residency and movement
                (device blocks, pinned host copies, streams and events).
5. allocator.py, arena.py, blocks.py, host.py
                where the bytes come from: the allocator contract, the budgeted device arena
                and its free lists, the pinned host slab.
6. layout.py, record.py
                the static layout: every block's address planned before step one, from the
                intervals a dry walk of the schedule records.
7. observer.py  StepObserver: how the tracer and the planner's step model watch a step.

Nothing here imports the executor (minidnn/executor.py) or the planner (minidnn/planner/);
they import this package.
"""
