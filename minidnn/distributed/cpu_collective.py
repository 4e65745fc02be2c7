"""A simple collective over TCP sockets: all-reduce, broadcast and gather between processes.

It runs on the star that rendezvous.connect_star builds (rank 0 at the centre). An all-reduce
sends every rank's arrays to rank 0, which adds them up in rank order (rank 0 + rank 1 +
rank 2 ...), and sends the sum back. The order of the additions is fixed, so every run and
every rank get the same bits. It is the CPU's data path and, on GPUs, the control path
(losses, checksums, the NCCL unique id).

Every receive has a timeout, so a rank that hangs ends the others with an error instead of a
wait forever. A rank that fails sends an abort message (its rank and error) before it closes;
the others raise RankFailedError with that message, and rank 0 passes it on to the rest.

Frames: a header (kind, payload length) and the payload: DATA (raw array bytes or a pickle)
or ABORT (the failed rank and its message).
"""
from __future__ import annotations

import json
import pickle
import socket
import struct

import numpy as np

from ..errors import CollectiveError, RankFailedError
from .rendezvous import World, _recv_exact, connect_star

_HEADER = struct.Struct("!BQ")
_DATA, _ABORT = 1, 2

#: Default seconds a collective waits for a peer before it gives up.
DEFAULT_TIMEOUT_S = 600.0


class SocketGroup:
    """The ranks of `world`, connected (see the module docstring).

    timeout: seconds every receive may wait; connect_timeout: seconds the ranks may take to
    meet (default: timeout). Use as a context manager or call close(); abort(error) instead
    when this rank failed.
    """

    def __init__(self, world: World, timeout: float = DEFAULT_TIMEOUT_S,
                 connect_timeout: float | None = None):
        if not timeout > 0:
            raise CollectiveError(f"collective timeout must be positive, got {timeout!r}")
        self.world = world
        self.timeout = float(timeout)
        self.peers: dict[int, socket.socket] = connect_star(
            world, self.timeout if connect_timeout is None else float(connect_timeout))
        for sock in self.peers.values():
            sock.settimeout(self.timeout)
        self._closed = False

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def size(self) -> int:
        return self.world.size

    # ---- frames ----------------------------------------------------------------------------
    def _send(self, peer: int, payload, kind: int = _DATA) -> None:
        sock = self.peers[peer]
        data = memoryview(payload).cast("B")
        try:
            sock.sendall(_HEADER.pack(kind, data.nbytes))
            sock.sendall(data)
        except OSError as e:
            raise CollectiveError(f"rank {self.rank}: cannot send to rank {peer}: "
                                  f"{e.strerror or e} (did it fail?)") from None

    def _recv(self, peer: int, what: str) -> bytes:
        sock = self.peers[peer]
        try:
            kind, n = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
            payload = _recv_exact(sock, n)
        except socket.timeout:
            raise CollectiveError(f"rank {self.rank}: rank {peer} sent nothing for "
                                  f"{self.timeout:g} s during {what} (collective timeout; is it "
                                  f"stuck?)") from None
        except (OSError, CollectiveError) as e:
            raise CollectiveError(f"rank {self.rank}: lost the connection to rank {peer} "
                                  f"during {what} ({e}); that rank ended") from None
        if kind == _ABORT:
            info = json.loads(payload.decode())
            raise RankFailedError(info["rank"], info["message"])
        return payload

    # ---- collectives ---------------------------------------------------------------------
    def all_reduce_sum(self, arrays: list, what: str = "all-reduce") -> None:
        """Sum each array over the ranks, in place. Arrays: NumPy, the same shapes and dtypes
        on every rank. Rank 0 adds in rank order, so all ranks get identical bits."""
        if self.size == 1:
            return
        given = arrays
        # A gradient laid out as the maps (channels last) is summed in a contiguous copy,
        # then copied back into the array given.
        arrays = [np.ascontiguousarray(a) if not a.flags.c_contiguous else a for a in arrays]
        if self.rank != 0:
            for a in arrays:
                self._send(0, a)
            for a in arrays:
                _fill(a, self._recv(0, what))
        else:
            incoming = {r: [self._recv(r, what) for _ in arrays] for r in range(1, self.size)}
            for k, a in enumerate(arrays):
                for r in range(1, self.size):
                    a += np.frombuffer(incoming[r][k], dtype=a.dtype).reshape(a.shape)
            for r in range(1, self.size):
                for a in arrays:
                    self._send(r, a)
        for target, summed in zip(given, arrays):
            if summed is not target:
                target[...] = summed

    def broadcast_object(self, obj=None, what: str = "broadcast"):
        """Rank 0's `obj` on every rank (a picklable value; others pass None)."""
        if self.size == 1:
            return obj
        if self.rank == 0:
            data = pickle.dumps(obj)
            for r in range(1, self.size):
                self._send(r, data)
            return obj
        return pickle.loads(self._recv(0, what))

    def gather_objects(self, obj, what: str = "gather") -> list:
        """[rank 0's obj, rank 1's, ...] on every rank."""
        if self.size == 1:
            return [obj]
        if self.rank != 0:
            self._send(0, pickle.dumps(obj))
            return pickle.loads(self._recv(0, what))
        objs = [obj] + [pickle.loads(self._recv(r, what)) for r in range(1, self.size)]
        data = pickle.dumps(objs)
        for r in range(1, self.size):
            self._send(r, data)
        return objs

    def barrier(self, what: str = "barrier") -> None:
        self.gather_objects(None, what)

    # ---- ending ----------------------------------------------------------------------------
    def abort(self, error: BaseException | str) -> None:
        """This rank failed: tell every peer still connected (rank 0 tells all), then close.

        A RankFailedError (another rank's failure) is passed on with that rank's message, so
        every rank ends naming the rank where it started."""
        if self._closed:
            return
        if isinstance(error, RankFailedError):
            rank, message = error.rank, error.message
        else:
            rank, message = self.rank, _one_line(error)
        payload = json.dumps({"rank": rank, "message": message}).encode()
        for peer in list(self.peers):
            try:
                self.peers[peer].settimeout(1.0)
                self._send(peer, payload, _ABORT)
            except (CollectiveError, OSError):
                pass   # that peer is gone already
        self.close()

    def close(self) -> None:
        for sock in self.peers.values():
            try:
                sock.close()
            except OSError:
                pass
        self.peers = {}
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            self.abort(exc)
        else:
            self.close()
        return False


def _fill(a: np.ndarray, payload: bytes) -> None:
    a[...] = np.frombuffer(payload, dtype=a.dtype).reshape(a.shape)


def _one_line(error) -> str:
    """An error as the CLI would print it: its message (and its type when it is a bug)."""
    from ..errors import MinidnnError
    if isinstance(error, str):
        return error
    if isinstance(error, MinidnnError):
        return str(error)
    return f"{type(error).__name__}: {error}"


class CpuReducer:
    """Gradient all-reduce for CPU ranks: the mean over ranks (the sum, then divided by the
    number of ranks) of a bucket of arrays, in place, on a worker thread.

    The thread plays the part of a GPU's communication stream: `start` returns at once and
    backward goes on computing earlier layers while the bucket travels; `finish` waits for
    every bucket started (and raises the first error a bucket met).
    """

    name = "sockets"

    def __init__(self, group: SocketGroup):
        from concurrent.futures import ThreadPoolExecutor
        self.group = group
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minidnn-allreduce")
        self._pending: list = []

    def start(self, arrays: list, trace=None) -> None:
        """Start the mean of `arrays` over the ranks; trace: (Tracer, span name) or None."""
        self._pending.append(self._pool.submit(self._reduce, list(arrays), trace))

    def _reduce(self, arrays: list, trace) -> None:
        t0 = trace[0].mark(None) if trace else None
        self.group.all_reduce_sum(arrays, "the gradient all-reduce")
        size = self.group.size
        for a in arrays:
            a /= a.dtype.type(size)
        if trace:
            trace[0].copy("allreduce", trace[1], t0, trace[0].mark(None),
                          sum(a.nbytes for a in arrays))

    def finish(self) -> None:
        pending, self._pending = self._pending, []
        error = None
        for future in pending:   # wait for all of them, even after an error
            try:
                future.result()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
