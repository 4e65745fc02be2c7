"""Gradient all-reduce between GPUs with NCCL, through CuPy's bindings (cupy.cuda.nccl).

One communicator per rank (one GPU per process). Rank 0 draws NCCL's unique id and hands it
to the others over the socket group (cpu_collective.py, as an array of 128 int8 values),
which is how ranks on several hosts find each other. Every all-reduce runs on a
communication stream of its own:

    compute stream   ... backward of layer k+1 | backward of layer k | ...  | optimizer
                                               ^ event                      ^ waits for
    comm stream                                  all-reduce(bucket) ; / N --'  the last bucket

`start(arrays)` records an event behind the backward that produced a bucket's last gradient
and makes the communication stream wait for it, so the bucket travels while backward computes
earlier layers; `finish()` makes the compute stream wait for every bucket before the
optimizer reads the gradients. Gradients are summed (NCCL_SUM, all arrays of a bucket in one
NCCL group call) and then divided by the number of ranks on the same stream (mean.py).

Two more exchanges: `broadcast(arrays)` sends rank 0's BatchNorm buffers to every rank once a
step, on the compute stream (between the finished all-reduce and the update);
`all_reduce_now(arrays)` sums the per-channel figures of --sync-batchnorm on the communication
stream, behind every bucket started, and makes the compute stream wait for it. Every rank
issues its NCCL calls in one order, as NCCL requires.

NCCL's own device buffers are not part of the memory budget: the communicator is made, and
warmed up, before the executor takes its arena, so those buffers are in place by then.
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import CollectiveError
from .mean import divide_by_ranks


def _nccl():
    try:
        from cupy.cuda import nccl
    except Exception as e:   # CuPy without NCCL, or no CuPy at all
        raise CollectiveError(f"--ranks on GPUs needs NCCL through CuPy (cupy.cuda.nccl), "
                              f"which does not import: {e}") from None
    if not getattr(nccl, "available", True):
        raise CollectiveError("CuPy was built without NCCL (cupy.cuda.nccl.available is False)")
    return nccl


#: Bytes of NCCL's unique id (NCCL_UNIQUE_ID_BYTES).
UNIQUE_ID_BYTES = 128


def unique_id_array(uid) -> np.ndarray:
    """NCCL's unique id (CuPy's get_unique_id: a tuple of 128 signed chars) as the int8 array
    that travels to the other ranks (a plain array, checked for its dtype and shape)."""
    a = np.array(uid, dtype=np.int64)
    if a.shape != (UNIQUE_ID_BYTES,) or a.min() < -128 or a.max() > 127:
        raise CollectiveError(f"NCCL's unique id is not {UNIQUE_ID_BYTES} bytes")
    return a.astype(np.int8)


def nccl_dtype(dtype) -> int:
    """The NCCL data type of a NumPy dtype."""
    nccl = _nccl()
    table = {np.dtype(np.float32): "NCCL_FLOAT32", np.dtype(np.float64): "NCCL_FLOAT64",
             np.dtype(np.float16): "NCCL_FLOAT16", np.dtype(np.int64): "NCCL_INT64",
             np.dtype(np.int32): "NCCL_INT32"}
    name = table.get(np.dtype(dtype))
    if name is None and str(dtype) == "bfloat16" and hasattr(nccl, "NCCL_BFLOAT16"):
        name = "NCCL_BFLOAT16"
    if name is None:
        raise CollectiveError(f"no NCCL data type for arrays of dtype {dtype}")
    return getattr(nccl, name)


class NcclReducer:
    """One rank's NCCL communicator and communication stream (see the module docstring).

    control: the run's SocketGroup (hands out the unique id). device: this rank's
    backend.Device (its GPU must be the current CuPy device).
    """

    name = "nccl"

    def __init__(self, control, device):
        nccl = _nccl()
        import cupy
        self.nccl, self.cupy = nccl, cupy
        self.device = device
        self.size = control.size
        # Connect every channel now, before the executor's arena takes the free memory (NCCL
        # 2.22+ would otherwise connect, and allocate, at the first large all-reduce).
        os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")
        uid = unique_id_array(nccl.get_unique_id()) if control.rank == 0 else \
            np.zeros(UNIQUE_ID_BYTES, np.int8)
        control.broadcast_arrays([uid], "the NCCL unique id")
        try:
            self.comm = nccl.NcclCommunicator(control.size, tuple(uid.tolist()), control.rank)
        except Exception as e:
            raise CollectiveError(f"rank {control.rank}: NCCL communicator: {e}") from None
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self._started = False
        self._warm_up()

    def _warm_up(self) -> None:
        """One small and one large all-reduce, so NCCL's buffers exist before the arena."""
        cupy = self.cupy
        for n in (1, 8 * 2**20):
            a = cupy.ones(n, dtype=cupy.float32)
            self._all_reduce([a])
            self.stream.synchronize()
            if float(a[0]) != self.size:
                raise CollectiveError(f"NCCL warm-up all-reduce gave {float(a[0])}, expected "
                                      f"{self.size}")
            del a

    def _all_reduce(self, arrays: list) -> None:
        """Sum in place on the communication stream, all arrays in one NCCL group."""
        nccl, ptr = self.nccl, self.stream.ptr
        nccl.groupStart()
        try:
            for a in arrays:
                self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, nccl_dtype(a.dtype),
                                    nccl.NCCL_SUM, ptr)
        finally:
            nccl.groupEnd()

    def start(self, arrays: list, trace=None) -> None:
        """Mean over ranks of `arrays` (device gradients, contiguous), in place, once the
        compute stream has produced them. trace: (Tracer, span name) or None."""
        ready = self.device.event()
        ready.record(self.device.compute)
        self.stream.wait_event(ready)
        t0 = trace[0].mark(self.stream) if trace else None
        self._all_reduce(arrays)
        with self.stream:
            divide_by_ranks(arrays, self.size)
        if trace:
            trace[0].copy("allreduce", trace[1], t0, trace[0].mark(self.stream),
                          sum(a.nbytes for a in arrays))
        self._started = True

    def all_reduce_now(self, arrays: list) -> None:
        """Sum `arrays` (device arrays, contiguous) over the ranks, in place, for the compute
        stream's next work (the batch statistics of sync_batchnorm.py): on the communication
        stream, behind every bucket started, so each rank's NCCL calls keep one order; the
        compute stream waits for it."""
        ready = self.device.event()
        ready.record(self.device.compute)
        self.stream.wait_event(ready)
        self._all_reduce(arrays)
        done = self.device.event()
        done.record(self.stream)
        self.device.compute.wait_event(done)

    def broadcast(self, arrays: list) -> None:
        """Rank 0's values of `arrays` (device arrays, contiguous) on every rank, in place, on
        the compute stream: behind the forward that wrote them, before the next one reads
        them (all arrays in one NCCL group)."""
        nccl = self.nccl
        nccl.groupStart()
        try:
            for a in arrays:
                self.comm.bcast(a.data.ptr, a.size, nccl_dtype(a.dtype), 0,
                                self.device.compute.ptr)
        finally:
            nccl.groupEnd()

    def finish(self) -> None:
        """The compute stream waits for every all-reduce started (the optimizer comes next)."""
        if not self._started:
            return
        done = self.device.event()
        done.record(self.stream)
        self.device.compute.wait_event(done)
        self._started = False
        self.comm.check_async_error()

    def close(self) -> None:
        if getattr(self, "comm", None) is not None:
            self.stream.synchronize()
            self.comm.destroy()
            self.comm = None

    def abort(self) -> None:
        """End the communicator without waiting (a peer failed: collectives would hang)."""
        if getattr(self, "comm", None) is not None:
            try:
                self.comm.abort()
            finally:
                self.comm = None
