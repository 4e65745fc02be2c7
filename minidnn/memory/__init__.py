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
                and its free lists (best fit from below for a call's blocks, the top for the
                blocks that outlive their call: Allocator.lasting), the pinned host slab.
6. layout.py, record.py
                the static layout: every block's address planned before step one, from the
                intervals a dry walk of the schedule records.
7. observer.py  StepObserver: how the tracer and the planner's step model watch a step.
8. graph_pool.py
                the arena memory a step replayed as a CUDA graph keeps between replays
                (minidnn/step_graph.py captures and replays the step).

Vocabulary, used in this sense throughout the package (docs/glossary.md repeats it word for
word, beside the planner's words: needs, peak, least budget, bound):

* storage      a buffer of the step (plan.py); in-place layers make several tensors share one.
* time         the plan's integer clock: forward of node i happens at time i, backward of node
               i at time 2n-1-i (n nodes), so every event of a step has one increasing number
               (-1: before the step; graph inputs are written then).
* release      hand a block back to the allocator it came from (device arena or host slab),
               `free(buf, after=event)`: with an event, the allocator reuses the block only
               once the copy still reading it has finished (asked without blocking; while a
               step is captured as a CUDA graph, by a stream wait instead: ordered_frees).
               Evict, drop and free below are releases.
* offload      copy a storage's device block to the host slab (after its last forward write).
* evict        release the device block of an offloaded storage after its last forward
               read; the host copy stays, and a prefetch brings it back for backward.
* drop         release the device block of a storage to be recomputed after its last
               forward use; nothing is kept anywhere, and backward rebuilds it by running
               its writers' forward again (recompute), with the dropped storages it is
               rebuilt from before it (a chain, schedule.py).
* prefetch     copy an offloaded storage back to the device before the backward call that
               reads it, on the prefetch stream (the prefetch window, schedule.py); a fetch
               on demand is one nobody prefetched in time, and compute waits for it.
* rows         the rows of its input a piece of a layer chunk reads (plan.rows; the chunked
               network is minidnn/chunks.py's): a view of a whole-batch map along the batch
               axis, whose gradient the pieces write row by row, with no sum.
* sum          a map read by several layers gets a gradient part from each backward: the
               first to run writes the gradient's buffer, each later one a temporary that
               the manager adds into it after that backward (or keeps for a residual add's
               backward, which adds it in its own pass: deferred_sums, minidnn/fusion.py).
* free         a storage is dead: after its last read (liveness, plan.py) its device block
               and its host copy, wherever they are, are released for good.

Nothing here imports the executor (minidnn/executor.py) or the planner (minidnn/planner/);
they import this package.
"""
