"""Nobody else joins a run: ranks prove they know the run's secret (an HMAC on the hello),
rank 0 refuses any other connection in one line and waits on, a one-host run listens on
loopback, and every message is a JSON header and raw arrays checked against what the receiver
expects (nothing is unpickled): a malformed one ends the run with one error. Loopback only."""
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from minidnn.distributed import World
from minidnn.distributed import rendezvous
from minidnn.distributed.cpu_collective import SocketGroup
from minidnn.distributed.frames import MAX_HEADER_BYTES, FrameError, recv_frame, send_frame
from minidnn.distributed.handshake import SECRET_ENV, Refused, admit, join
from minidnn.distributed.nccl import unique_id_array
from minidnn.distributed.rendezvous import free_port, listen_host
from minidnn.errors import CollectiveError, ConfigError

from test_distributed import ROOT, SMALL

SECRET = "5" * 64


# ---- frames ------------------------------------------------------------------------------------
def frame_bytes(header) -> bytes:
    data = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("!I", len(data)) + data


def test_a_frame_carries_json_fields_and_raw_arrays():
    a, b = socket.socketpair()
    with a, b:
        x, n = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7], np.int64)
        send_frame(a, "data", {"value": ["abc", 1.5, None]}, [x, n])
        frame = recv_frame(b, ("data",), [x, (np.int64, (1,))])
        assert frame.kind == "data" and frame.fields == {"value": ["abc", 1.5, None]}
        np.testing.assert_array_equal(frame.arrays[0], x)
        assert frame.arrays[1].dtype == np.int64 and frame.arrays[1][0] == 7
        with pytest.raises(FrameError, match="dtype object do not travel"):
            send_frame(a, "data", arrays=[np.array([{}], dtype=object)])


@pytest.mark.parametrize("raw, message", [
    (struct.pack("!I", 2**31), r"a header length of 2147483648 bytes \(expected 1..65536\)"),
    (struct.pack("!I", 0), "a header length of 0 bytes"),
    (frame_bytes(b"\x80\x04not json"), "a header that is not JSON"),
    (frame_bytes([1, 2]), "a header that is a JSON list, not an object"),
    (frame_bytes({"kind": "pickle", "arrays": []}), "a frame of kind 'pickle'"),
    (frame_bytes({"kind": "data", "arrays": [["float64", [3]]]}),
     r'arrays \[\["float64", \[3\]\]\] in a data frame \(expected \[\["float32", \[3\]\]\]\)'),
    (frame_bytes({"kind": "data", "arrays": [["float32", [4]]]}), "expected"),
    (frame_bytes({"kind": "abort", "arrays": [], "rank": "1"}), "an abort frame without"),
], ids=["too long", "empty", "not JSON", "not an object", "unknown kind", "wrong dtype",
        "wrong shape", "bad abort"])
def test_a_malformed_frame_is_refused_before_its_payload(raw, message):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(raw + b"\0" * 64)
        with pytest.raises(FrameError, match=message):
            recv_frame(b, ("data",), [np.zeros(3, np.float32)])
    assert MAX_HEADER_BYTES == 65536


def test_the_nccl_unique_id_travels_as_128_int8_values():
    uid = tuple(range(-128, 0))
    a = unique_id_array(uid)
    assert a.dtype == np.int8 and tuple(a.tolist()) == uid
    with pytest.raises(CollectiveError, match="not 128 bytes"):
        unique_id_array(uid[:5])


# ---- the handshake -----------------------------------------------------------------------------
def meet(server_secret, client_secret, client=None):
    """admit() on one end of a socket pair, join() (or `client`) on the other: (rank admitted
    or the error admit raised, the error join raised or None)."""
    a, b = socket.socketpair()
    a.settimeout(0.5)
    b.settimeout(2)
    out = {}

    def server():
        try:
            out["rank"] = admit(a, server_secret)
        except Exception as e:   # noqa: BLE001 - the test looks at it
            out["rank"] = e
        a.close()

    t = threading.Thread(target=server)
    t.start()
    try:
        (client or (lambda s: join(s, client_secret, 1, 2, "rank 0")))(b)
    except Exception as e:   # noqa: BLE001
        out["client"] = e
    t.join()
    b.close()
    return out["rank"], out.get("client")


def test_a_rank_that_knows_the_secret_is_admitted():
    assert meet(SECRET, SECRET) == (1, None)


def test_a_hello_under_another_secret_is_refused_and_told():
    server, client = meet(SECRET, "6" * 64)
    assert isinstance(server, Refused)
    assert str(server) == "a hello as rank 1 under another secret (not this run's)"
    assert isinstance(client, CollectiveError)
    assert str(client) == (f"rank 1: rank 0 at rank 0 refused this rank: wrong secret "
                           f"({SECRET_ENV} must be the same on every rank)")


@pytest.mark.parametrize("client, reason", [
    (lambda s: s.close(), "closed the connection before its hello"),
    (lambda s: s.sendall(b"GET / HTTP/1.0\r\n\r\n"), "not a hello: a header length of"),
    (lambda s: s.sendall(frame_bytes({"kind": "hello", "arrays": [], "rank": 1})),
     "a malformed hello"),
    (lambda s: time.sleep(0.8), "no hello within 0.5 s"),
], ids=["no hello", "garbage", "malformed hello", "silent"])
def test_a_stranger_is_refused(client, reason):
    server, _ = meet(SECRET, None, client)
    assert isinstance(server, Refused) and str(server).startswith(reason)


def test_a_rank_refuses_a_rank_0_that_does_not_know_the_secret():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(frame_bytes({"kind": "challenge", "arrays": [], "nonce": "ab" * 32}))
        a.sendall(frame_bytes({"kind": "welcome", "arrays": [], "mac": "00" * 32}))
        with pytest.raises(CollectiveError, match="does not know this run's secret"):
            join(b, SECRET, 1, 2, "127.0.0.1:1")


# ---- rank 0 refuses, waits on, and the run goes on -------------------------------------------
def test_a_one_host_rendezvous_listens_on_loopback_only():
    assert listen_host("127.0.0.1") == "127.0.0.1"
    assert listen_host("localhost") == "127.0.0.1"
    assert listen_host("10.1.2.3") == "0.0.0.0"     # other hosts' ranks must reach it


def test_ranks_meeting_at_an_address_need_the_secret():
    with pytest.raises(ConfigError, match=f"need the run's secret: set {SECRET_ENV}"):
        SocketGroup(World(2, 1, 1, f"tcp://127.0.0.1:{free_port()}"), timeout=1)
    assert "secret" not in repr(World(2, 1, 1, "tcp://h:1", SECRET))


def start_rank0(rendezvous_spec, secret, warnings):
    out = {}

    def run():
        try:
            out["group"] = SocketGroup(World(2, 0, 0, rendezvous_spec, secret), timeout=10,
                                       warn=warnings.append)
        except Exception as e:   # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def connect(port):
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def listening_addresses(port) -> list:
    """The local IPv4 addresses (hex, as the kernel lists them) listening on `port`."""
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [r[1].split(":")[0] for r in rows
            if r[3] == "0A" and int(r[1].split(":")[1], 16) == port]


def test_strangers_are_refused_in_one_line_each_while_rank_0_waits_for_its_rank(monkeypatch):
    monkeypatch.setattr(rendezvous, "HELLO_TIMEOUT_S", 0.3)
    port, warnings = free_port(), []
    t, out = start_rank0(f"tcp://127.0.0.1:{port}", SECRET, warnings)
    connect(port).close()                                      # no hello
    if os.path.exists("/proc/net/tcp"):                       # Linux: who may connect
        assert listening_addresses(port) == ["0100007F"]       # 127.0.0.1, not 0.0.0.0
    with connect(port) as s:
        s.sendall(b"\x00\x00\x00\x05hello")                     # garbage
        time.sleep(0.1)
    with connect(port) as s:                                   # says nothing
        time.sleep(0.5)
    with connect(port) as s, pytest.raises(CollectiveError, match="refused this rank"):
        s.settimeout(5)
        join(s, "7" * 64, 1, 2, "rank 0")                      # another secret
    peer = SocketGroup(World(2, 1, 1, f"tcp://127.0.0.1:{port}", SECRET), timeout=10)
    t.join()
    assert "error" not in out, out
    group = out["group"]
    assert len(warnings) == 4 and all("\n" not in w for w in warnings)
    assert all(w.startswith("rank 0 refused a connection from 127.0.0.1:") for w in warnings)
    reasons = [w.split(": ", 1)[1] for w in warnings]
    assert reasons[0] == "closed the connection before its hello"
    assert reasons[1].startswith("not a hello: a header that is not JSON")
    assert reasons[2] == "no hello within 0.3 s"
    assert reasons[3] == "a hello as rank 1 under another secret (not this run's)"
    # The run goes on: the admitted rank and rank 0 add up, into the arrays given even where
    # they are not contiguous (a gradient laid out channels last).
    a = np.arange(6.0).reshape(2, 3).T
    t2 = threading.Thread(target=group.all_reduce_sum, args=([a],))
    t2.start()
    b = 10 * np.arange(6.0).reshape(2, 3).T
    peer.all_reduce_sum([b])
    t2.join()
    np.testing.assert_array_equal(a, 11 * np.arange(6.0).reshape(2, 3).T)
    np.testing.assert_array_equal(b, a)
    group.close()
    peer.close()


@pytest.mark.parametrize("bad, message", [
    (struct.pack("!I", 2**30), "a header length of 1073741824 bytes"),
    (frame_bytes(b"{not json"), "a header that is not JSON"),
    (frame_bytes({"kind": "data", "arrays": [["float64", [3]]]}), 'arrays [["float64"'),
], ids=["bad length", "bad JSON", "wrong dtype"])
def test_a_malformed_message_of_an_admitted_rank_ends_the_collective_with_one_line(bad, message):
    port = free_port()
    t, out = start_rank0(f"tcp://127.0.0.1:{port}", SECRET, [])
    with connect(port) as s:
        s.settimeout(5)
        join(s, SECRET, 1, 2, "rank 0")
        t.join()
        group = out["group"]
        s.sendall(bad + b"\0" * 64)
        with pytest.raises(CollectiveError) as e:
            group.all_reduce_sum([np.zeros(3, np.float32)], "the gradient all-reduce")
        group.close()
    text = str(e.value)
    assert text.startswith("rank 0: rank 1 sent a malformed message during the gradient "
                           "all-reduce: ") and message in text and "\n" not in text


def test_the_rendezvous_file_carries_the_secret_for_this_user_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")   # the interface: loopback in tests
    path = tmp_path / "run.addr"
    spec = f"file:{path}"
    t, out = start_rank0(spec, None, [])
    peer = SocketGroup(World(2, 1, 1, spec), timeout=10)   # reads the secret from the file
    t.join()
    entry = json.loads(path.read_text())
    assert entry["host"] == "127.0.0.1" and len(entry["secret"]) == 64
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    t2 = threading.Thread(target=out["group"].barrier)
    t2.start()
    peer.barrier()
    t2.join()
    out["group"].close()
    peer.close()


# ---- the command line ------------------------------------------------------------------------
def start_minidnn(*args, secret=SECRET):
    env = dict(os.environ, PYTHONPATH=ROOT)
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", SECRET_ENV):
        env.pop(var, None)
    if secret:
        env[SECRET_ENV] = secret
    return subprocess.Popen([sys.executable, "-m", "minidnn", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_run_started_by_hand_refuses_strangers_and_trains():
    port = free_port()
    where = ["--ranks", "2", "--rendezvous", f"tcp://127.0.0.1:{port}", "--steps", "2"]
    rank0 = start_minidnn(*SMALL, *where, "--rank", "0")
    try:
        connect(port).close()
        with connect(port) as s, pytest.raises(CollectiveError, match="refused this rank"):
            s.settimeout(20)
            join(s, "8" * 64, 1, 2, "rank 0")
        rank1 = start_minidnn(*SMALL, *where, "--rank", "1")
        assert rank1.wait(120) == 0, rank1.stderr.read()
        assert rank0.wait(60) == 0
    finally:
        rank0.kill()
    err = rank0.stderr.read()
    refused = [line for line in err.splitlines() if "refused a connection" in line]
    assert len(refused) == 2, err
    assert refused[1].endswith("a hello as rank 1 under another secret (not this run's)")
    assert "error" not in err
    assert "2 ranks of 8 images" in rank0.stdout.read()


def test_a_malformed_message_ends_the_run_with_one_error():
    port = free_port()
    rank0 = start_minidnn(*SMALL, "--ranks", "2", "--rendezvous", f"tcp://127.0.0.1:{port}",
                          "--steps", "2", "--rank", "0", "--collective-timeout", "20")
    try:
        with connect(port) as s:
            s.settimeout(20)
            join(s, SECRET, 1, 2, "rank 0")
            s.sendall(frame_bytes({"kind": "data", "arrays": [["float64", [2**40]]]}))
            assert rank0.wait(60) == 2
    finally:
        rank0.kill()
    err = rank0.stderr.read().strip()
    assert err.count("\n") == 0 and err.startswith("minidnn: error: rank 0: rank 1 sent a "
                                                   "malformed message during the parameter "
                                                   "check: arrays"), err


def test_a_tcp_rendezvous_without_the_secret_is_one_error():
    p = start_minidnn(*SMALL, "--ranks", "2", "--rank", "1", "--rendezvous",
                      f"tcp://127.0.0.1:{free_port()}", "--steps", "1", secret=None)
    assert p.wait(60) == 2
    err = p.stderr.read().strip()
    assert err.startswith("minidnn: error: ranks meeting at tcp://127.0.0.1:") and \
        SECRET_ENV in err and err.count("\n") == 0
