"""A simple collective over TCP sockets: all-reduce, broadcast and gather between processes.

It runs on the star that rendezvous.connect_star builds (rank 0 at the centre). An all-reduce
sends every rank's arrays to rank 0, which adds them up in rank order (rank 0 + rank 1 +
rank 2 ...), and sends the sum back. The order of the additions is fixed, so every run and
every rank get the same bits. It is the CPU's data path and, on GPUs, the control path
(losses, checksums, the NCCL unique id).

Every receive has a timeout, so a rank that hangs ends the others with an error instead of a
wait forever. A rank that fails sends an abort message (its rank and error) before it closes;
the others raise RankFailedError with that message, and rank 0 passes it on to the rest.

Messages are frames (frames.py): a JSON header and raw array bytes, checked against what the
receiver expects. Arrays travel as arrays, other values (checksums, the losses' count) as
JSON; nothing received is unpickled. A frame that is not what was expected ends the run with
one error naming the rank that sent it.
"""
from __future__ import annotations

import socket

from ..errors import CollectiveError, RankFailedError
from .frames import Frame, FrameError, recv_frame, send_frame
from .mean import divide_by_ranks
from .rendezvous import World, connect_star

#: Default seconds a collective waits for a peer before it gives up.
DEFAULT_TIMEOUT_S = 600.0
#: The longest error message an abort carries to the other ranks.
ABORT_MESSAGE_CHARS = 4000


class SocketGroup:
    """The ranks of `world`, connected (see the module docstring).

    timeout: seconds every receive may wait; connect_timeout: seconds the ranks may take to
    meet (default: timeout); warn: where rank 0 says it refused a connection that is not one
    of the run's ranks (one line; default stderr). Use as a context manager or call close();
    abort(error) instead when this rank failed.
    """

    def __init__(self, world: World, timeout: float = DEFAULT_TIMEOUT_S,
                 connect_timeout: float | None = None, warn=None):
        if not timeout > 0:
            raise CollectiveError(f"collective timeout must be positive, got {timeout!r}")
        self.world = world
        self.timeout = float(timeout)
        self.peers: dict[int, socket.socket] = connect_star(
            world, self.timeout if connect_timeout is None else float(connect_timeout), warn)
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
    def _send(self, peer: int, kind: str = "data", fields: dict | None = None,
              arrays: list = ()) -> None:
        try:
            send_frame(self.peers[peer], kind, fields, arrays)
        except OSError as e:
            raise CollectiveError(f"rank {self.rank}: cannot send to rank {peer}: "
                                  f"{e.strerror or e} (did it fail?)") from None

    def _recv(self, peer: int, what: str, like: list = ()) -> Frame:
        """A data frame from `peer` whose arrays are like `like` (see frames.recv_frame)."""
        try:
            frame = recv_frame(self.peers[peer], ("data",), like)
        except socket.timeout:
            raise CollectiveError(f"rank {self.rank}: rank {peer} sent nothing for "
                                  f"{self.timeout:g} s during {what} (collective timeout; is it "
                                  f"stuck?)") from None
        except FrameError as e:
            raise CollectiveError(f"rank {self.rank}: rank {peer} sent a malformed message "
                                  f"during {what}: {e}") from None
        except (OSError, CollectiveError) as e:
            raise CollectiveError(f"rank {self.rank}: lost the connection to rank {peer} "
                                  f"during {what} ({e}); that rank ended") from None
        if frame.kind == "abort":
            raise RankFailedError(frame.fields["rank"], frame.fields["message"])
        return frame

    def _recv_value(self, peer: int, what: str):
        frame = self._recv(peer, what)
        if set(frame.fields) != {"value"}:
            raise CollectiveError(f"rank {self.rank}: rank {peer} sent a malformed message "
                                  f"during {what}: fields {sorted(frame.fields)[:5]} (expected "
                                  f"'value')")
        return frame.fields["value"]

    # ---- collectives ---------------------------------------------------------------------
    def all_reduce_sum(self, arrays: list, what: str = "all-reduce") -> None:
        """Sum each array over the ranks, in place. Arrays: NumPy, the same shapes and dtypes
        on every rank. Rank 0 adds in rank order, so all ranks get identical bits."""
        if self.size == 1:
            return
        if self.rank != 0:
            self._send(0, arrays=arrays)
        else:
            incoming = {r: self._recv(r, what, arrays).arrays for r in range(1, self.size)}
            for k, a in enumerate(arrays):
                for r in range(1, self.size):
                    a += incoming[r][k]
        self.broadcast_arrays(arrays, what)   # rank 0's sums to every rank

    def broadcast_arrays(self, arrays: list, what: str = "broadcast") -> None:
        """Rank 0's values of `arrays` (NumPy, the same shapes and dtypes on every rank) into
        every rank's, in place."""
        if self.size == 1:
            return
        if self.rank == 0:
            for r in range(1, self.size):
                self._send(r, arrays=arrays)
            return
        for a, value in zip(arrays, self._recv(0, what, arrays).arrays):
            a[...] = value

    def broadcast_object(self, obj=None, what: str = "broadcast"):
        """Rank 0's `obj` on every rank (a JSON value: None, numbers, strings, lists, dicts
        with string keys; others pass None). Tuples arrive as lists."""
        if self.size == 1:
            return obj
        if self.rank == 0:
            for r in range(1, self.size):
                self._send(r, fields={"value": obj})
            return obj
        return self._recv_value(0, what)

    def gather_objects(self, obj, what: str = "gather") -> list:
        """[rank 0's obj, rank 1's, ...] on every rank (JSON values, as broadcast_object)."""
        if self.size == 1:
            return [obj]
        if self.rank != 0:
            self._send(0, fields={"value": obj})
            objs = self._recv_value(0, what)
            if not isinstance(objs, list) or len(objs) != self.size:
                raise CollectiveError(f"rank {self.rank}: rank 0 sent a malformed message "
                                      f"during {what}: not a list of {self.size} values")
            return objs
        objs = [obj] + [self._recv_value(r, what) for r in range(1, self.size)]
        for r in range(1, self.size):
            self._send(r, fields={"value": objs})
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
        message = message[:ABORT_MESSAGE_CHARS]   # a header has room for it
        for peer in list(self.peers):
            try:
                self.peers[peer].settimeout(1.0)
                self._send(peer, "abort", {"rank": rank, "message": message})
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
        divide_by_ranks(arrays, self.group.size)
        if trace:
            trace[0].copy("allreduce", trace[1], t0, trace[0].mark(None),
                          sum(a.nbytes for a in arrays))

    def all_reduce_now(self, arrays: list) -> None:
        """Sum `arrays` over the ranks, in place, and return when done (the batch statistics
        of sync_batchnorm.py). It runs on the buckets' worker after every bucket already
        started, so each rank makes its exchanges in one order and none interleave."""
        self._pool.submit(self.group.all_reduce_sum, list(arrays),
                          "the batch statistics").result()

    def broadcast(self, arrays: list) -> None:
        """Rank 0's values of `arrays` on every rank, in place, now (between steps: no bucket
        is travelling then, so the socket group is free)."""
        self.group.broadcast_arrays(arrays, "the buffer broadcast")

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
