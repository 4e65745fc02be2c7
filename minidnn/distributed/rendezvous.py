"""Who this process is among the ranks of a run, and how the ranks first meet.

A data-parallel run is `size` processes ("ranks"), one per GPU. Each knows its `rank` (0 ..
size - 1, over all hosts) and its `local_rank` (its GPU on its host). They come from
arguments or from the environment that `torchrun` (and `minidnn train --ranks N`) sets:

    MASTER_ADDR, MASTER_PORT   where rank 0 listens
    WORLD_SIZE, RANK           the number of ranks and this one
    LOCAL_RANK                 this rank's GPU on its host

Meeting: rank 0 listens on an address and port (`tcp://HOST:PORT`, or MASTER_ADDR and
MASTER_PORT), or on a free port that it writes into a shared file (`file:PATH`, for
clusters where every host sees one file system but no port is agreed beforehand), with the
run's secret, in a file only the user can read. It listens on loopback alone when the address
is this host's loopback (a one-host run), on every interface otherwise. Every other rank
connects to it and proves it belongs to the run (an HMAC under the run's secret,
handshake.py; MINIDNN_RUN_SECRET), which gives a star of TCP connections with rank 0 at the
centre; rank 0 refuses any other connection in one line and goes on waiting. The CPU
collective (cpu_collective.py) runs over that star, and the NCCL unique id (nccl.py) is
handed out over it.
"""
from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field

from ..errors import CollectiveError, ConfigError
from .frames import PeerClosed
from .handshake import HELLO_TIMEOUT_S, Refused, admit, join, new_secret, require_secret, \
    secret_from_env

#: Environment variables of torchrun that describe a rank.
ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK")



@dataclass(frozen=True)
class World:
    """One rank's view of the run.

    size: number of ranks; rank: this one (0 .. size - 1); local_rank: its GPU on its host.
    rendezvous: 'tcp://HOST:PORT' or 'file:PATH' (see the module docstring).
    secret: the run's secret (handshake.py), or None: a file rendezvous then carries rank
    0's, a tcp one refuses to start. Never printed (repr leaves it out).
    """
    size: int
    rank: int
    local_rank: int
    rendezvous: str
    secret: str | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.size < 1:
            raise ConfigError(f"world size must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"rank must be in 0..{self.size - 1} (world size {self.size}), "
                              f"got {self.rank}")
        if self.local_rank < 0:
            raise ConfigError(f"local rank must be >= 0, got {self.local_rank}")
        parse_rendezvous(self.rendezvous)

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints progress and writes checkpoints and the report."""
        return self.rank == 0


def _int_env(env, name: str) -> int:
    text = env.get(name)
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ConfigError(f"environment variable {name} must be an integer, got {text!r}") \
            from None


def world_from_env(env=None, rendezvous: str | None = None) -> World | None:
    """The World that torchrun's variables describe, or None when WORLD_SIZE is not set.

    rendezvous: overrides MASTER_ADDR / MASTER_PORT (e.g. 'file:/shared/run.addr').
    LOCAL_RANK defaults to RANK (one host). Under torchrun (TORCHELASTIC_RUN_ID set) rank 0
    listens on MASTER_PORT + 1, since torchrun's own store holds MASTER_PORT.
    """
    env = os.environ if env is None else env
    if "WORLD_SIZE" not in env:
        return None
    size = _int_env(env, "WORLD_SIZE")
    if "RANK" not in env:
        raise ConfigError("WORLD_SIZE is set but RANK is not: a launcher must set both "
                          "(torchrun sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK)")
    rank = _int_env(env, "RANK")
    local = _int_env(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank
    if rendezvous is None:
        if size > 1 and ("MASTER_ADDR" not in env or "MASTER_PORT" not in env):
            raise ConfigError("WORLD_SIZE > 1 needs MASTER_ADDR and MASTER_PORT (where rank 0 "
                              "listens), or --rendezvous file:PATH")
        port = _int_env(env, "MASTER_PORT") if "MASTER_PORT" in env else 0
        if port and "TORCHELASTIC_RUN_ID" in env:
            # torchrun's agent already listens on MASTER_PORT (its own store): take the next.
            port += 1
        rendezvous = f"tcp://{env.get('MASTER_ADDR', '127.0.0.1')}:{port}"
    return World(size, rank, local, rendezvous, secret_from_env(env))


def parse_rendezvous(spec: str) -> tuple:
    """'tcp://HOST:PORT' -> ('tcp', host, port); 'file:PATH' -> ('file', path, None)."""
    spec = str(spec)
    if spec.startswith("file:"):
        path = spec[len("file:"):]
        if not path:
            raise ConfigError("rendezvous 'file:' needs a path (file:/shared/run.addr)")
        return "file", path, None
    rest = spec[len("tcp://"):] if spec.startswith("tcp://") else spec
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"rendezvous must be tcp://HOST:PORT or file:PATH, got {spec!r}")
    return "tcp", host, int(port)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` now (for a launcher choosing MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def connect_star(world: World, timeout: float, warn=None) -> dict:
    """Connect the ranks in a star around rank 0; returns {peer rank: socket}.

    Rank 0 gets one socket per other rank; every other rank one socket, to rank 0 (key 0).
    Every connection proves it belongs to the run first (handshake.py); rank 0 refuses any
    other with one line through `warn` (default: stderr) and keeps waiting. Waits at most
    `timeout` seconds for the others (CollectiveError after that).
    """
    if world.size == 1:
        return {}
    kind, where, port = parse_rendezvous(world.rendezvous)
    deadline = time.monotonic() + timeout
    if world.rank == 0:
        return _accept_all(world, kind, where, port, deadline, timeout, warn or _warn)
    if kind == "file":
        # Re-read on every attempt: a file left by an earlier run names a dead address.
        def from_file():   # the run's secret from the environment, when given, else the file's
            host, port_, secret = _read_address_file(where, deadline, timeout)
            return host, port_, world.secret or secret
        return {0: _connect(world, from_file, deadline, timeout)}
    secret = require_secret(world.secret, world.rendezvous)
    return {0: _connect(world, lambda: (where, port, secret), deadline, timeout)}


def _warn(message: str) -> None:
    print(f"minidnn: warning: {message}", file=sys.stderr, flush=True)


def listen_host(host: str) -> str:
    """The interface rank 0 listens on for a rendezvous at `host`: loopback (127.0.0.1) when
    `host` is this host's loopback name or address, so a one-host run is out of reach of
    every other machine; every interface (0.0.0.0) otherwise, since the other hosts' ranks
    must reach it (the handshake keeps strangers out)."""
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return "0.0.0.0"
    return "127.0.0.1" if ipaddress.ip_address(address).is_loopback else "0.0.0.0"


def _accept_all(world, kind, where, port, deadline, timeout, warn) -> dict:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    peers: dict = {}
    try:
        if kind == "file":
            # MASTER_ADDR, when set, names the interface (a one-host run: 127.0.0.1).
            host = os.environ.get("MASTER_ADDR") or socket.gethostname()
            server.bind((listen_host(host), 0))
            secret = world.secret or new_secret()
            _write_address_file(where, host, server.getsockname()[1], secret)
        else:
            secret = require_secret(world.secret, world.rendezvous)
            try:
                server.bind((listen_host(where), port))
            except OSError as e:
                raise CollectiveError(f"rank 0 cannot listen on port {port}: "
                                      f"{e.strerror or e} (is another run using it?)")
        server.listen(world.size)

        def check(rank, size):   # a proven rank of this run with a wrong place is a mistake
            if size != world.size or not 0 < rank < world.size or rank in peers:
                raise CollectiveError(f"rank 0: a rank of this run connected as rank {rank} "
                                      f"of {size}, expected one of ranks 1..{world.size - 1} "
                                      f"of {world.size} (a rank started twice?)")

        while len(peers) < world.size - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, world.size)) - set(peers))
                raise CollectiveError(f"rank 0: ranks {missing} did not connect within "
                                      f"{timeout:g} s (rendezvous {world.rendezvous})")
            server.settimeout(left)
            try:
                sock, address = server.accept()
            except socket.timeout:
                continue
            sock.settimeout(max(min(deadline - time.monotonic(), HELLO_TIMEOUT_S), 0.1))
            try:
                rank = admit(sock, secret, check)
            except Refused as e:
                sock.close()
                warn(f"rank 0 refused a connection from {address[0]}:{address[1]}: {e}")
                continue
            except BaseException:
                sock.close()
                raise
            _tune(sock)
            peers[rank] = sock
        return peers
    except BaseException:
        for s in peers.values():
            s.close()
        raise
    finally:
        server.close()


def _connect(world, address, deadline, timeout) -> socket.socket:
    """Connect to rank 0 at `address()` -> (host, port, secret), retrying until the deadline
    while nobody listens there; then meet it (handshake.join)."""
    last, host, port = None, "?", 0
    while time.monotonic() < deadline:
        host, port, secret = address()
        try:
            sock = socket.create_connection((host, port), timeout=max(
                min(deadline - time.monotonic(), 5.0), 0.1))
        except OSError as e:   # rank 0 is not listening yet
            last = e
            time.sleep(0.05)
            continue
        _tune(sock)
        sock.settimeout(max(deadline - time.monotonic(), 0.1))
        try:
            join(sock, secret, world.rank, world.size, f"{host}:{port}")
        except socket.timeout:
            sock.close()
            raise CollectiveError(f"rank {world.rank}: the process at {host}:{port} did not "
                                  f"answer within {timeout:g} s") from None
        except OSError as e:
            sock.close()
            raise CollectiveError(f"rank {world.rank}: lost the connection to rank 0 at "
                                  f"{host}:{port} while meeting it ({e})") from None
        except PeerClosed:
            sock.close()
            raise CollectiveError(f"rank {world.rank}: rank 0 at {host}:{port} closed the "
                                  f"connection while meeting this rank (see rank 0's "
                                  f"error)") from None
        except CollectiveError:
            sock.close()
            raise
        return sock
    raise CollectiveError(f"rank {world.rank}: cannot reach rank 0 at {host}:{port} within "
                          f"{timeout:g} s ({last})")


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _write_address_file(path: str, host: str, port: int, secret: str) -> None:
    """Rank 0's address and the run's secret into `path`, readable by this user alone."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)   # whatever the umask, or a tmp file left before
            json.dump({"host": host, "port": port, "secret": secret}, f)
        os.replace(tmp, path)   # readers never see half a file
    except OSError as e:
        raise CollectiveError(f"rank 0 cannot write the rendezvous file {path!r}: "
                              f"{e.strerror or e}") from None


def _read_address_file(path: str, deadline: float, timeout: float) -> tuple:
    """(host, port, secret) from rank 0's rendezvous file, waiting for it until the deadline."""
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                entry = json.load(f)
            host, port, secret = entry["host"], entry["port"], entry["secret"]
            if isinstance(host, str) and type(port) is int and isinstance(secret, str):
                return host, port, secret
        except (OSError, ValueError, KeyError, TypeError):
            pass   # not written yet (or a file of an earlier minidnn): wait for rank 0's
        time.sleep(0.05)
    raise CollectiveError(f"rendezvous file {path!r} did not get rank 0's address within "
                          f"{timeout:g} s")


def resolve_world(ranks: int | None = None, rank: int | None = None,
                  local_rank: int | None = None, rendezvous: str | None = None,
                  env=None) -> World | None:
    """This process's World, from arguments or the environment; None when it is not one rank
    of a run (a single process, or a launcher about to start `ranks` processes).

    rank given: one rank of `ranks` started by hand (on each host), meeting at `rendezvous`
    (or MASTER_ADDR / MASTER_PORT); local_rank defaults to rank. Otherwise WORLD_SIZE in the
    environment (torchrun, or `minidnn train --ranks N`) describes it; `ranks`, when given,
    must agree with WORLD_SIZE.
    """
    env = os.environ if env is None else env
    if rank is not None:
        if ranks is None:
            raise ConfigError("--rank needs --ranks N (the number of ranks in the run)")
        if rendezvous is None:
            if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
                raise ConfigError("--rank needs --rendezvous tcp://HOST:PORT or file:PATH (or "
                                  "MASTER_ADDR and MASTER_PORT in the environment)")
            rendezvous = f"tcp://{env['MASTER_ADDR']}:{_int_env(env, 'MASTER_PORT')}"
        return World(int(ranks), int(rank), int(rank if local_rank is None else local_rank),
                     rendezvous, secret_from_env(env))
    world = world_from_env(env, rendezvous)
    if world is not None and ranks is not None and ranks != world.size:
        raise ConfigError(f"--ranks {ranks} disagrees with WORLD_SIZE={world.size} from the "
                          f"launcher")
    return world
