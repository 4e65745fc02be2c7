"""How a rank proves it belongs to the run, and rank 0 proves it is the run's rank 0.

Every run has a secret that only its ranks know: `minidnn train --ranks N` draws one and hands
it to the ranks it starts in the environment (MINIDNN_RUN_SECRET); ranks started by hand or by
torchrun read the same variable, which the user sets to one value on every host; with
`--rendezvous file:PATH` rank 0 draws one (unless the variable is set) and writes it into the
rendezvous file, which only the user can read (mode 0600).

The secret itself never travels. When a rank connects, rank 0 sends a random challenge; the
rank answers with its rank, the world size, a challenge of its own and an HMAC-SHA256, under
the secret, of both challenges, its rank and the size; rank 0 compares it with the one it
computes (hmac.compare_digest: in constant time) and answers with an HMAC of its own, so the
rank knows it reached the run's rank 0 and not a process that took the port:

    rank 0                                     rank r
       <- connect --------------------------------
       -- challenge {nonce0} -------------------->
       <- hello {rank, size, nonce_r, mac("hello", nonce0, nonce_r, r/size)} --
       -- welcome {mac("welcome", nonce_r, nonce0, r/size)} ---------------->
          or refused {reason}

A connection that sends no hello, garbage, or a hello under another secret is refused
(`Refused`); rank 0 says so in one line and keeps waiting for the run's ranks. The challenges
make every hello good for one connection only: a recorded hello cannot be replayed.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import socket

from ..errors import CollectiveError, ConfigError
from .frames import FrameError, recv_frame, send_frame

#: Environment variable holding the run's secret.
SECRET_ENV = "MINIDNN_RUN_SECRET"

#: Seconds rank 0 waits for a connection's hello (a rank sends it as soon as it is asked).
HELLO_TIMEOUT_S = 5.0

_NONCE_BYTES = 32
_HEX64 = re.compile(r"[0-9a-f]{64}")


class Refused(CollectiveError):
    """A connection that did not prove it is one of this run's ranks."""


def new_secret() -> str:
    """A fresh secret for a run: 256 random bits, as 64 hex digits."""
    return secrets.token_hex(32)


def secret_from_env(env=None) -> str | None:
    """The run's secret from MINIDNN_RUN_SECRET, or None when it is unset or empty."""
    env = os.environ if env is None else env
    return env.get(SECRET_ENV) or None


def require_secret(secret: str | None, rendezvous: str) -> str:
    """`secret`, or a ConfigError saying how to give one (ranks meeting at a tcp address)."""
    if not secret:
        raise ConfigError(f"ranks meeting at {rendezvous} need the run's secret: set "
                          f"{SECRET_ENV} to the same value on every rank (for example the "
                          f"output of `python3 -c 'import secrets; print(secrets.token_hex(32))'`)"
                          f", or meet with --rendezvous file:PATH, whose file carries it")
    return secret


def _mac(secret: str, *parts) -> str:
    """HMAC-SHA256 under `secret` of the parts (bytes or str), as hex."""
    message = b"\0".join(p if isinstance(p, bytes) else str(p).encode() for p in parts)
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _hex64(fields: dict, key: str) -> bytes | None:
    value = fields.get(key)
    return bytes.fromhex(value) if isinstance(value, str) and _HEX64.fullmatch(value) else None


def admit(sock: socket.socket, secret: str, check=None) -> int:
    """Rank 0's side of the meeting on a newly accepted `sock`; returns the peer's rank.

    check(rank, size): called once the hello is proven, before the welcome; it raises (a
    CollectiveError) when the rank cannot join (a wrong size, a rank already there).

    Raises:
        Refused: the peer sent no hello, a malformed one, or one under another secret.
    """
    nonce = secrets.token_bytes(_NONCE_BYTES)
    try:
        send_frame(sock, "challenge", {"nonce": nonce.hex()})
        hello = recv_frame(sock, ("hello",))
    except socket.timeout:
        raise Refused(f"no hello within {sock.gettimeout():g} s") from None
    except FrameError as e:
        raise Refused(f"not a hello: {e}") from None
    except (CollectiveError, OSError):
        raise Refused("closed the connection before its hello") from None
    rank, size, theirs = hello.fields.get("rank"), hello.fields.get("size"), \
        _hex64(hello.fields, "nonce")
    mac = hello.fields.get("mac")
    if not (type(rank) is int and type(size) is int and theirs is not None
            and isinstance(mac, str)):
        raise Refused("a malformed hello")
    if not hmac.compare_digest(_mac(secret, "hello", nonce, theirs, f"{rank}/{size}"), mac):
        try:
            send_frame(sock, "refused", {"reason": "wrong secret"})
        except OSError:
            pass
        raise Refused(f"a hello as rank {rank} under another secret (not this run's)")
    if check is not None:
        check(rank, size)
    send_frame(sock, "welcome", {"mac": _mac(secret, "welcome", theirs, nonce, f"{rank}/{size}")})
    return rank


def join(sock: socket.socket, secret: str, rank: int, size: int, where: str) -> None:
    """Rank `rank`'s side of the meeting with rank 0 at `where` (for messages).

    Raises:
        CollectiveError: rank 0 refused this rank (another secret), or the process at `where`
            did not prove it knows the secret, or sent something else than the meeting's frames.
    """
    try:
        challenge = recv_frame(sock, ("challenge",))
        nonce = _hex64(challenge.fields, "nonce")
        if nonce is None:
            raise FrameError("a challenge without a nonce")
        mine = secrets.token_bytes(_NONCE_BYTES)
        send_frame(sock, "hello", {"rank": rank, "size": size, "nonce": mine.hex(),
                                   "mac": _mac(secret, "hello", nonce, mine, f"{rank}/{size}")})
        reply = recv_frame(sock, ("welcome", "refused"))
    except FrameError as e:
        raise CollectiveError(f"rank {rank}: the process at {where} is not a rank 0 of "
                              f"minidnn: it sent {e}") from None
    if reply.kind == "refused":
        raise CollectiveError(f"rank {rank}: rank 0 at {where} refused this rank: "
                              f"{str(reply.fields.get('reason'))[:200]} ({SECRET_ENV} must "
                              f"be the same on every rank)")
    mac = reply.fields.get("mac")
    if reply.kind == "abort" or not isinstance(mac, str) or not hmac.compare_digest(
            _mac(secret, "welcome", mine, nonce, f"{rank}/{size}"), mac):
        raise CollectiveError(f"rank {rank}: the process at {where} does not know this run's "
                              f"secret: not this run's rank 0")
