"""A CPU run that would take hours, or more RAM than the machine has, is refused in seconds,
before anything is allocated, with what to run instead.

    check_cpu_run(net, batch=256, steps=200, policy="dyn", budget=None)   # ConfigError

Time: a training step costs about three forward passes (backward computes the gradients of the
inputs and of the weights, each about one forward), so a step is 3 x the forward FLOPs of
`Network.summary_rows`, at the rate this CPU multiplies float32 matrices (measured in 0.1 s;
convolutions are im2col and one matrix product, so that rate is an upper bound, and the
estimate errs towards allowing a run). `--policy dyn` first profiles every layer
(planner/profile.py: one warm-up and two timed calls, about three steps). A run is refused when
the estimate passes MAX_RUN_S, or MAX_STEP_S for one step; `force` runs it anyway.

Memory: parameters with their gradients and momentum, plus the feature maps alive at the
liveness peak (memory/plan.py; at the micro-batch when the step is split), plus the input batch;
`--policy dyn` profiles each layer at the whole batch (its inputs, outputs and their gradients
at once). A run whose need passes the RAM available now is refused, `force` or not: it would
swap or be killed. With a memory budget the arena is checked where it is made instead
(memory/host.check_host_memory), except dyn's profiling, which the budget does not bound.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .errors import ConfigError, HostMemoryError, fmt_bytes
from .planner.profile import DEFAULT_REPEATS

#: Longest whole run (seconds) and longest single step allowed on the CPU without `force`.
MAX_RUN_S = 3600.0
MAX_STEP_S = 300.0
#: Rates no NumPy CPU beats and every one reaches (float32 FLOP/s): runs that pass at the
#: first or fail at the second are decided without measuring.
FASTEST_CPU_FLOPS = 2e12
SLOWEST_CPU_FLOPS = 1e9


def step_flops(net, batch: int) -> float:
    """FLOPs of one training step of `net` at `batch`: 3 x its forward FLOPs."""
    return 3.0 * sum(row["flops"] for row in net.summary_rows(batch))


def measured_cpu_flops(seconds: float = 0.1) -> float:
    """float32 FLOP/s of this CPU's matrix products, over `seconds` of 512 x 512 products."""
    a = np.ones((512, 512), np.float32)
    a @ a   # the first call loads the BLAS library
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < seconds or calls == 0:
        a @ a
        calls += 1
    return 2 * 512 ** 3 * calls / (time.perf_counter() - start)


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} hours"
    if seconds >= 60:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:.0f} s"


def check_cpu_time(net, batch: int, steps: int, policy: str, rate=measured_cpu_flops) -> None:
    """Raise ConfigError when `steps` steps (and dyn's profiling) of `net` at `batch` would
    take more than MAX_RUN_S, or one step more than MAX_STEP_S. rate(): this CPU's FLOP/s,
    called only when the fastest and slowest rates disagree."""
    flops = step_flops(net, batch)
    # dyn's profile calls each layer once to warm up, then DEFAULT_REPEATS times (profile.py)
    calls = steps + (1 + DEFAULT_REPEATS["cpu"] if policy == "dyn" else 0)

    def too_long(flops_per_s):
        return flops / flops_per_s > MAX_STEP_S or flops * calls / flops_per_s > MAX_RUN_S

    if not too_long(SLOWEST_CPU_FLOPS):
        return
    per_s = FASTEST_CPU_FLOPS if too_long(FASTEST_CPU_FLOPS) else rate()
    if not too_long(per_s):
        return
    step_s, run_s = flops / per_s, flops * calls / per_s
    # The batch whose run fits both limits, at the same rate (time grows with the batch).
    fits = max(1, int(batch * min(MAX_STEP_S / step_s, MAX_RUN_S / run_s)))
    raise ConfigError(
        f"on the CPU this run would take about {_duration(run_s)} ({_duration(step_s)} a step: "
        f"{flops / 1e12:.2f} TFLOP at the {per_s / 1e9:.0f} GFLOP/s this CPU multiplies "
        f"matrices); try --batch {fits} or a smaller --image-size, fewer --steps, or a GPU "
        f"(--device gpu); --force runs it anyway")


def _weights_bytes(net) -> int:
    """Parameters, their gradients and momentum: three arrays of every parameter's size."""
    return 3 * net.num_params() * net.dtype.itemsize


def _input_bytes(net, batch: int) -> int:
    """The input batch: `batch` images of the network's input shape."""
    return batch * int(np.prod(net.input_shape)) * net.dtype.itemsize


def cpu_step_bytes(net, batch: int, micro_batches: int | None = None) -> int:
    """Host bytes a CPU training step without a budget holds at its peak: parameters,
    gradients and momentum, the feature maps alive at the liveness peak of a pass, and the
    input batch."""
    from .memory.plan import LivenessPlan
    params = _weights_bytes(net)
    passes = micro_batches or 1
    maps = LivenessPlan(net, max(1, batch // passes)).liveness_peak_bytes()
    return params + maps + _input_bytes(net, batch)


def profile_bytes(net, batch: int) -> int:
    """Host bytes dyn's profiling holds at most: parameters, gradients and momentum, and one
    layer's inputs, outputs and their gradients at the whole batch."""
    params = _weights_bytes(net)
    rows = net.summary_rows(batch)
    out_bytes = {row["name"]: row["bytes"] for row in rows}
    data = _input_bytes(net, batch)
    largest = max(2 * (row["bytes"] + sum(out_bytes.get(i, data) for i in row["inputs"]))
                  for row in rows)
    return params + largest


def check_cpu_memory(net, batch: int, policy: str, budget: int | None,
                     micro_batches: int | None = None, available=None) -> None:
    """Raise HostMemoryError when the step (without a budget) or dyn's profiling needs more
    than the RAM available now. available(): bytes free (memory/host.available_host_bytes)."""
    from .memory import host
    free = (available or host.available_host_bytes)()
    if free is None:
        return
    needs = []
    if budget is None:
        step = lambda b: cpu_step_bytes(net, b, micro_batches and min(micro_batches, b))  # noqa
        needs.append(("a training step", step(batch), step))
    if policy == "dyn":
        profile = lambda b: profile_bytes(net, b)  # noqa: E731
        needs.append(("--policy dyn's profiling of each layer at the whole batch",
                      profile(batch), profile))
    for what, need, at_batch in needs:
        if need > free:
            # Parameters stay whatever the batch; the rest grows with it.
            per_image = (need - at_batch(1)) / max(1, batch - 1)
            fits = math.floor((free - at_batch(1)) / per_image) + 1 if per_image > 0 else 0
            instead = (f"try --batch {fits} or a smaller --image-size" if fits >= 1 else
                       "try a smaller --image-size or model")
            raise HostMemoryError(
                f"out of host memory: on the CPU {what} needs about {fmt_bytes(need)} of "
                f"RAM, but only {fmt_bytes(free)} is available; {instead}, or a GPU "
                f"(--device gpu)")


def check_cpu_run(net, batch: int, steps: int, policy: str, budget: int | None = None,
                  micro_batches: int | None = None, force: bool = False) -> None:
    """Both checks above for a CPU run of `steps` steps (`force`: the time check is skipped)."""
    check_cpu_memory(net, batch, policy, budget, micro_batches)
    if not force:
        check_cpu_time(net, batch, steps, policy)
