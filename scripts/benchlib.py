"""What the benchmark scripts share, written once: the worker protocol, the H200's memory
bandwidth, three device timers and the classes of GPU kernels by name.

Each configuration runs in a child process of its own, so that two frameworks' allocators
never share the card and a crash or a hang costs one row. The child prints one line
`RESULT {json}`; the parent runs it with a timeout and reads that line, or, when there is
none, the last lines of the child's output as the reason.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import time

PREFIX = "RESULT "

#: The H200 SXM's HBM3e bandwidth (datasheet), the floor of every pass over memory.
HBM_BYTES_PER_S = 4.8e12

# Kernel classes by name, tried in order (a convolution's name says gemm too; a batch norm's
# kernel from Inductor says fused and batch_norm): what a step spends outside its products.
KERNEL_CLASSES = (
    ("batch norm", ("batch_norm", "batchnorm", "bn_", "welford")),
    ("convolution", ("conv", "fprop", "dgrad", "wgrad", "implicit_gemm", "cudnn")),
    ("matrix product", ("gemm", "nvjet", "cublas")),
    ("copy and fill", ("memcpy", "memset", "copy", "fill")),
)


def kernel_class(name: str) -> str:
    """The class of a GPU kernel by its name (KERNEL_CLASSES), else 'pointwise and other'."""
    low = name.lower()
    return next((cls for cls, words in KERNEL_CLASSES if any(w in low for w in words)),
                "pointwise and other")


class CachedEmpty:
    """The CuPy module with `empty` answered from a cache, one array per (shape, dtype): a
    kernel wrapper that allocates its scratch (the batch norm's partial sums) then allocates
    nothing after its first call, so that its calls can be captured in a CUDA graph. Calls
    run in order on one stream, so reusing the arrays is safe. Install it as the wrapper
    module's `cp` (`module.cp = CachedEmpty(cupy)`)."""

    def __init__(self, cp):
        self._cp = cp
        self._cache = {}

    def empty(self, shape, dtype=float):
        key = (tuple(shape) if not isinstance(shape, int) else (shape,), str(dtype))
        if key not in self._cache:
            self._cache[key] = self._cp.empty(shape, dtype)
        return self._cache[key]

    def __getattr__(self, name):
        return getattr(self._cp, name)


def graph_seconds(cp, call, repeats: int, replays: int = 5) -> float:
    """Seconds per call of `call` on the GPU with no host time in them: one warm-up call,
    then `repeats` calls captured in one CUDA graph, replayed once to warm it and then
    `replays` times between two CUDA events. `call` must allocate nothing once warm (see
    CachedEmpty). Below tens of microseconds a call, event_seconds times the host's launches
    instead."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        call()
        stream.synchronize()
        stream.begin_capture()
        for _ in range(repeats):
            call()
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(replays):
            graph.launch(stream)
        stop.record(stream)
        stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / (repeats * replays)


def event_seconds(cp, call, repeats: int) -> float:
    """Seconds per call of `call` on the GPU: one warm-up call, then `repeats` calls
    back-to-back between two CUDA events on the current stream (cp: the CuPy module)."""
    call()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        call()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / 1e3 / repeats


def median_event_seconds(cp, call, repeats: int) -> float:
    """Seconds of one call of `call` on the GPU: one warm-up call, then the median of
    `repeats` calls, each between two CUDA events of its own on the current stream and waited
    for (cp: the CuPy module): a figure the launches between calls do not blur."""
    call()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def emit(result: dict) -> None:
    """Child side: print the result line (flushed: the parent may be reading a pipe)."""
    print(PREFIX + json.dumps(result), flush=True)


def parse(output: str) -> dict | None:
    """The result in a child's standard output, or None when it printed none."""
    line = next((ln for ln in output.splitlines() if ln.startswith(PREFIX)), None)
    return None if line is None else json.loads(line[len(PREFIX):])


def warm_up(step, warmup: int, compiled: bool, synchronize) -> tuple[list, float | None]:
    """Worker side: the untimed steps before the timed ones. A compiled step compiles in its
    first call: that call is timed apart (paid once, in no timed step), and one more step
    follows it whatever `warmup` says.

    Returns:
        (what each step returned, the seconds the first step took when `compiled`, else None).
    """
    t0 = time.perf_counter()
    out = [step()]
    synchronize()
    compile_s = time.perf_counter() - t0 if compiled else None
    out += [step() for _ in range(max(warmup - 1, 1 if compiled else 0))]
    synchronize()
    return out, compile_s


def _text(stream) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")


def run_worker(cmd: list, timeout: float, tail: int = 6) -> tuple[dict | None, str]:
    """Parent side: run `cmd` (argv) for at most `timeout` seconds.

    Returns:
        (result, "") when the child printed a result line, else (None, why): its last
        `tail` lines of output joined with ' | ' (or its exit status), and on a timeout
        'timed out after N s' after them.
    """
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        out, err, code = _text(exc.stdout), _text(exc.stderr), None
    result = parse(out)
    if result is not None:
        return result, ""
    lines = (out + err).strip().splitlines()[-tail:]
    if code is None:
        lines.append(f"timed out after {timeout:g} s")
    return None, " | ".join(lines) or f"exit status {code}"
