"""One rank's part in data-parallel training: its share of the batch, its device, and the
gradient all-reduce that keeps every rank's parameters the same.

    dp = DataParallel(world, global_batch=512)        # connects to the other ranks
    device = dp.select_device("auto")                  # GPU `local_rank` when there are GPUs
    dp.connect(device)                                 # NCCL (GPU) or sockets (CPU)
    spec = StepSpec(batch=dp.local_batch, batch_offset=dp.batch_offset, global_batch=512,
                    ranks=dp.size, ...)                # minidnn/spec.py
    ex = build_executor(net, spec, device=device)
    opt = dp.attach(ex, SGD(...))                      # buckets + hook; opt.step() waits for them
    ...                                                # train as one process would
    dp.close()

Every rank runs its own executor, memory budget and memory manager on `local_batch` =
global batch / ranks images: rows `batch_offset` .. `batch_offset + local_batch` of each
global batch. Its loss is the mean over its rows, so its gradients are the mean over its
rows; the all-reduce sums them over the ranks and divides by the number of ranks, which is
the mean over the whole batch: what one process at the global batch computes. All ranks
start from the same parameters (same seed, or the same checkpoint) and apply the same
gradients, so they stay the same; `check_parameters` compares their checksums (at the
start, every `check_every` steps, and at the end).

Buffers (BatchNorm's running mean and variance) are no gradient: each rank moves them with
the statistics of its own rows, so they would drift apart. As PyTorch's
DistributedDataParallel does by default, rank 0's buffers are broadcast to every rank once
per step: in the optimizer wrapper, after the gradient all-reduce has finished and before
the update (`broadcast_buffers`). By then the step's forward has moved them for the last
time (a recomputation in backward leaves them alone), the socket group is free (the buckets'
worker is done), and the next forward, an evaluation, a checkpoint or the final checksum
comparison all see rank 0's values. With `sync_batchnorm` (--sync-batchnorm) the statistics
themselves are the whole global batch's (sync_batchnorm.py): N ranks at a global batch B then
train what one process trains at B; the broadcast stays, and changes nothing.
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from ..backend import Device, gpu_available, select_device
from ..errors import CollectiveError, ConfigError, DeviceError
from .buckets import BUCKET_BYTES, GradientBuckets
from .cpu_collective import DEFAULT_TIMEOUT_S, CpuReducer, SocketGroup
from .rendezvous import World
from .sync_batchnorm import synchronize_batchnorm, unsynchronize

#: Steps between two comparisons of the ranks' parameter checksums.
CHECK_EVERY = 100


def split_batch(global_batch: int, ranks: int) -> int:
    """Images per rank of a global batch; ConfigError when it does not divide evenly."""
    if global_batch % ranks:
        raise ConfigError(f"--batch {global_batch} (the global batch) must divide evenly "
                          f"over {ranks} ranks")
    return global_batch // ranks


class DataParallel:
    """This rank of `world`, training at `global_batch` images per step over all ranks.

    timeout: seconds any collective waits for a peer (and the ranks wait for each other to
    start). check_every: steps between parameter checksum comparisons (0: only at the start
    and by `check_parameters`). bucket_bytes: size of the gradient buckets. sync_batchnorm:
    BatchNorm layers normalize with the statistics of the whole global batch
    (sync_batchnorm.py); False: each rank's own rows, running estimates from rank 0.
    """

    def __init__(self, world: World, global_batch: int, timeout: float = DEFAULT_TIMEOUT_S,
                 check_every: int = CHECK_EVERY, bucket_bytes: int = BUCKET_BYTES,
                 sync_batchnorm: bool = False):
        self.world = world
        self.global_batch = int(global_batch)
        self.local_batch = split_batch(self.global_batch, world.size)
        self.batch_offset = world.rank * self.local_batch
        self.rows = slice(self.batch_offset, self.batch_offset + self.local_batch)
        self.timeout = float(timeout)
        self.check_every = int(check_every)
        self.bucket_bytes = int(bucket_bytes)
        self.sync_batchnorm = bool(sync_batchnorm)
        self.synchronized: list[str] = []   # the BatchNorm layers sync_batchnorm made global
        self.group = SocketGroup(world, self.timeout)
        self.reducer = None
        self.buckets = None
        self.net = None
        self.checksums: list[str] = []   # every rank's, at the last comparison
        self._watchdog = None

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def size(self) -> int:
        return self.world.size

    # ---- set-up ----------------------------------------------------------------------------
    def select_device(self, spec: str = "auto") -> Device:
        """This rank's device: with GPUs (spec 'gpu', or 'auto' where CuPy sees one), GPU
        number local_rank of this host, made CuPy's current device."""
        if spec == "gpu" or (spec == "auto" and gpu_available()):
            import cupy
            count = cupy.cuda.runtime.getDeviceCount()
            if self.world.local_rank >= count:
                raise DeviceError(f"rank {self.world.rank} has local rank "
                                  f"{self.world.local_rank}, but this host has {count} GPU(s):"
                                  f" start at most one rank per GPU")
            cupy.cuda.Device(self.world.local_rank).use()
            return select_device("gpu")
        return select_device(spec)

    def connect(self, device: Device) -> None:
        """The gradient all-reduce for `device`: NCCL between GPUs, the socket group between
        CPUs. On a GPU, call it before the executor exists (NCCL's buffers first)."""
        if device.is_gpu:
            from .nccl import NcclReducer
            self.reducer = NcclReducer(self.group, device)
        else:
            self.reducer = CpuReducer(self.group)

    def attach(self, ex, optimizer):
        """Let the gradient buckets watch `ex`'s backward; returns `optimizer` wrapped so that
        its step() waits for the all-reduce first. Checks that all ranks start alike."""
        if ex.decision.chunks:   # its buckets follow the backward calls of ex.net's nodes
            raise ConfigError("data-parallel training does not run layer chunks yet")
        if self.reducer is None:
            self.connect(ex.device)
        self.net = ex.net
        if self.sync_batchnorm and ex.device.is_gpu and ex.decision.precision == "bf16":
            # Its kernels are built on the fp32 batch-norm kernels; bf16 maps are not tried.
            raise ConfigError("--sync-batchnorm with --precision bf16 on GPUs is not built "
                              "yet: use --precision fp32, or leave --sync-batchnorm out")
        if self.sync_batchnorm:
            self.synchronized = synchronize_batchnorm(ex.net, self.reducer, self.size)
            if not self.synchronized:
                raise ConfigError(f"--sync-batchnorm: network {ex.net.name!r} has no "
                                  f"BatchNorm layer to synchronize")
        self.buckets = GradientBuckets(ex.net, self.reducer, self.bucket_bytes,
                                       tracer=lambda: ex.tracer, passes=ex.micro_batches,
                                       gathered=ex.gathered_nodes())
        ex.add_observer(self.buckets)   # after each backward call: buckets complete
        self.check_parameters("at the start")
        if ex.device.is_gpu:
            self._watchdog = _Watchdog(self.world.rank, self.timeout, self.reducer)
        return SynchronizedOptimizer(optimizer, self)

    # ---- during the run ------------------------------------------------------------------
    def broadcast_buffers(self) -> None:
        """Rank 0's layer buffers (running statistics, counters) on every rank, in place (see
        the module docstring for where in the step and why)."""
        arrays = [b.data for _, b in self.net.buffers()]
        if arrays:
            self.reducer.broadcast(arrays)

    def after_step(self, step: int) -> None:
        """Called by the optimizer wrapper after each update (step: updates so far)."""
        self._alive()
        if self.check_every and step % self.check_every == 0:
            self.check_parameters(f"after step {step}")

    def check_parameters(self, when: str = "") -> list[str]:
        """Every rank's parameter checksum (sha256); CollectiveError when they differ."""
        sums = self.group.gather_objects(self.net.param_checksum(), "the parameter check")
        self.checksums = sums
        self._alive()
        if len(set(sums)) > 1:
            listed = ", ".join(f"rank {r} {c[:12]}" for r, c in enumerate(sums))
            raise CollectiveError(f"ranks hold different parameters {when}: {listed}")
        return sums

    def mean(self, values: list[float]) -> list[float]:
        """The mean over ranks of each value (the ranks' losses: the global batch's loss)."""
        a = np.array(values, dtype=np.float64)
        self.group.all_reduce_sum([a], "the loss mean")
        self._alive()
        return [float(v) for v in a / self.size]

    def combine_eval(self, result: dict) -> dict:
        """A held-out evaluation of every rank's rows, combined: loss and accuracy over all
        the images the ranks evaluated."""
        n = float(result["images"])
        a = np.array([result["loss"] * n, round(result["accuracy"] * n), n], dtype=np.float64)
        self.group.all_reduce_sum([a], "the evaluation")
        self._alive()
        return {"loss": a[0] / a[2], "accuracy": a[1] / a[2], "images": int(a[2])}

    def report_fields(self) -> dict:
        """What the run report says about the ranks (after a final check_parameters)."""
        return {"world_size": self.size, "batch_per_rank": self.local_batch,
                "gradient_buckets": len(self.buckets.buckets) if self.buckets else None,
                "collective": self.reducer.name,
                "sync_batchnorm": self.sync_batchnorm,
                "rank_param_checksums": list(self.checksums),
                "ranks_agree": len(set(self.checksums)) == 1}

    def _alive(self) -> None:
        """Progress: an update, or an exchange every rank took part in (the watchdog's beat)."""
        if self._watchdog is not None:
            self._watchdog.beat()

    # ---- ending ----------------------------------------------------------------------------
    def abort(self, error: BaseException) -> None:
        """This rank failed: tell the others (they end with this error), release NCCL."""
        self._detach()
        if self._watchdog is not None:
            self._watchdog.stop()
        self.group.abort(error)
        if self.reducer is not None and hasattr(self.reducer, "abort"):
            self.reducer.abort()
        elif self.reducer is not None:
            self.reducer.close()

    def close(self) -> None:
        self._detach()
        if self._watchdog is not None:
            self._watchdog.stop()
        if self.reducer is not None:
            self.reducer.close()
        self.group.close()

    def _detach(self) -> None:
        """The network's BatchNorm layers back to their own statistics (the reducer ends)."""
        if self.net is not None and self.synchronized:
            unsynchronize(self.net)


class SynchronizedOptimizer:
    """An optimizer whose step() first waits for the gradient all-reduce (every bucket), then
    updates, then lets the DataParallel count the step. Everything else is the optimizer's."""

    def __init__(self, optimizer, dp: DataParallel):
        self.optimizer = optimizer
        self.dp = dp
        self.updates = 0

    def step(self) -> None:
        self.dp.buckets.finish()
        self.dp.broadcast_buffers()
        self.optimizer.step()
        self.updates += 1
        self.dp.after_step(self.updates)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


class _Watchdog:
    """Ends this rank when no step has finished for `timeout` seconds (GPU ranks).

    An NCCL all-reduce whose peer died never completes, and the host then waits on the
    device forever; the socket collective's timeouts cannot see that. The watchdog can.
    """

    def __init__(self, rank: int, timeout: float, reducer):
        self.rank, self.timeout, self.reducer = rank, timeout, reducer
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="minidnn-watchdog",
                                        daemon=True)
        self._thread.start()

    def beat(self) -> None:
        self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(min(self.timeout / 4, 5.0)):
            if time.monotonic() - self._last > self.timeout:
                from .launch import record_rank_error
                message = (f"rank {self.rank}: no training step finished for "
                           f"{self.timeout:g} s (collective timeout): a peer failed or hangs")
                record_rank_error(message, secondary=True)
                print(f"minidnn: error: {message}", file=sys.stderr, flush=True)
                try:
                    self.reducer.abort()
                finally:
                    os._exit(2)

    def stop(self) -> None:
        self._stop.set()
