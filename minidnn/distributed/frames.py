"""The messages ranks send each other: a JSON header and raw array bytes, nothing executable.

Every message between ranks (the hello that proves a rank belongs to the run, the arrays of a
collective, a JSON value such as a checksum, an abort) is one frame:

    4 bytes     H, the header's length (big-endian unsigned), at most MAX_HEADER_BYTES
    H bytes     the header: a UTF-8 JSON object
                    {"kind": "data", "arrays": [["float32", [64, 3, 3, 3]], ...], ...fields}
    payload     the arrays' bytes in C order, one after another; their length follows from
                the dtypes and shapes of the header, so no second length can disagree

The kinds of frame: the meeting's (challenge, hello, welcome, refused: handshake.py), then a
run's data and its abort message. The receiver says what it expects: the kinds it accepts
and the dtype and shape of each array (an all-reduce knows its own arrays; the NCCL unique
id is 128 int8 values). Anything else (a header too long or not JSON, an unknown kind, a
dtype or shape other than expected, fields of the wrong type) raises FrameError before a
byte of payload is read. Nothing received is ever unpickled or evaluated: JSON gives only
numbers, strings, lists and dicts, and arrays are read with np.frombuffer into the expected
dtype.
"""
from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import CollectiveError

_LENGTH = struct.Struct("!I")

#: The longest header accepted (a header names dtypes and shapes, a checksum, a nonce).
MAX_HEADER_BYTES = 64 * 1024

#: dtypes an array may travel in.
DTYPES = ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool")


class PeerClosed(CollectiveError):
    """The peer closed the connection before a whole message came."""


class FrameError(CollectiveError):
    """A frame that is not what the receiver expects (see the module docstring)."""


@dataclass
class Frame:
    """A received frame: kind, its JSON fields (without 'kind' and 'arrays'), its arrays."""
    kind: str
    fields: dict = field(default_factory=dict)
    arrays: list = field(default_factory=list)


def _spec(x) -> list:
    """[dtype name, shape] of an array or of a (dtype, shape) pair, as a header lists it."""
    dtype, shape = x if isinstance(x, tuple) else (x.dtype, x.shape)
    return [np.dtype(dtype).name, [int(d) for d in shape]]


def send_frame(sock: socket.socket, kind: str, fields: dict | None = None,
               arrays: list = ()) -> None:
    """Send one frame. fields: JSON values (not 'kind' or 'arrays'); arrays: NumPy arrays of
    the dtypes in DTYPES. Raises OSError when the peer is gone."""
    for a in arrays:
        check_dtype(a)
    header = dict(fields or {}, kind=kind, arrays=[_spec(a) for a in arrays])
    data = json.dumps(header, separators=(",", ":")).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise FrameError(f"a {kind} frame's header of {len(data)} bytes is longer than "
                         f"{MAX_HEADER_BYTES}")
    sock.sendall(_LENGTH.pack(len(data)) + data)
    for a in arrays:
        sock.sendall(memoryview(np.ascontiguousarray(a)).cast("B"))


def recv_frame(sock: socket.socket, kinds: tuple, like: list = ()) -> Frame:
    """Receive one frame of one of `kinds` whose arrays have the dtypes and shapes of `like`
    (arrays, or (dtype, shape) pairs). An 'abort' frame is always accepted (its fields
    checked: rank, an int, and message, a string).

    Raises:
        FrameError: the frame is malformed or not what was expected.
        CollectiveError: the connection closed part-way; socket.timeout: nothing came.
    """
    (n,) = _LENGTH.unpack(recv_exact(sock, _LENGTH.size))
    if not 0 < n <= MAX_HEADER_BYTES:
        raise FrameError(f"a header length of {n} bytes (expected 1..{MAX_HEADER_BYTES})")
    try:
        header = json.loads(recv_exact(sock, n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise FrameError("a header that is not JSON") from None
    if not isinstance(header, dict):
        raise FrameError(f"a header that is a JSON {type(header).__name__}, not an object")
    kind = header.pop("kind", None)
    if kind not in kinds and kind != "abort":
        raise FrameError(f"a frame of kind {str(kind)[:40]!r} (expected "
                         f"{' or '.join(kinds)})")
    specs = header.pop("arrays", None)
    expected = [_spec(x) for x in (() if kind == "abort" else like)]
    if specs != expected:
        raise FrameError(f"arrays {_shorten(specs)} in a {kind} frame (expected "
                         f"{_shorten(expected)})")
    if kind == "abort" and not (isinstance(header.get("rank"), int)
                                and isinstance(header.get("message"), str)):
        raise FrameError("an abort frame without an integer rank and a message")
    arrays = []
    for dtype, shape in expected:
        a = np.empty(shape, dtype)
        recv_into_exact(sock, memoryview(a).cast("B") if a.nbytes else memoryview(b""))
        arrays.append(a)
    return Frame(kind, header, arrays)


def _shorten(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_dtype(a) -> None:
    """FrameError when array `a` cannot travel in a frame (its dtype is not in DTYPES)."""
    if np.dtype(a.dtype).name not in DTYPES:
        raise FrameError(f"arrays of dtype {a.dtype} do not travel between ranks "
                         f"(only {', '.join(DTYPES)})")


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """n bytes from sock (CollectiveError when the peer closes first)."""
    out = bytearray(n)
    recv_into_exact(sock, memoryview(out))
    return bytes(out)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from sock (PeerClosed when the peer closes first)."""
    got, n = 0, view.nbytes
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise PeerClosed("connection closed")
        got += k
