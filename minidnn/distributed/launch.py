"""`minidnn train --ranks N`: start N ranks on this host and watch over them.

Each rank is `python -m minidnn train ...` with the same arguments and the environment
torchrun would give it (MASTER_ADDR=127.0.0.1, a free MASTER_PORT, WORLD_SIZE=N, RANK=r,
LOCAL_RANK=r), so it uses GPU r, and a secret drawn for this run (MINIDNN_RUN_SECRET); the
ranks meet by themselves on loopback, and rank 0 admits only those that prove they know the
secret (rendezvous.py, handshake.py). Rank 0 prints progress and writes the checkpoint and
the report; the others print nothing.

Supervision: a rank that fails writes its one-line error into a file the launcher gave it
(MINIDNN_ERROR_FILE) instead of printing it, and exits; the other ranks learn of it through
the collective (an abort message, a lost connection or a timeout) and end too. When one rank
has failed the launcher gives the others a few seconds to end, then stops the rest, and
prints one error: the failure that came first (not the others' reports of it), with that
rank's exit status. Ctrl-C, or SIGTERM to the launcher, stops every rank.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from .handshake import SECRET_ENV, new_secret
from .rendezvous import free_port

#: Environment variable naming the file where a launched rank records its error.
ERROR_FILE_ENV = "MINIDNN_ERROR_FILE"
#: Seconds the other ranks get to end by themselves after one failed, before they are stopped.
GRACE_S = 5.0


def launched() -> bool:
    """True in a rank that `launch` started (it records its error instead of printing it)."""
    return bool(os.environ.get(ERROR_FILE_ENV))


def record_rank_error(error, secondary: bool | None = None) -> bool:
    """Write this rank's error for the launcher; False when no launcher asked for it.

    secondary: the error only reports another rank's failure (default: True for collective
    errors), so the launcher prefers a primary one.
    """
    from ..errors import CollectiveError, MinidnnError
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return False
    if secondary is None:
        secondary = isinstance(error, CollectiveError)
    if isinstance(error, str) or isinstance(error, MinidnnError):
        message = str(error)
    else:
        message = f"{type(error).__name__}: {error}"
    try:
        with open(path, "w") as f:
            json.dump({"message": message, "secondary": bool(secondary), "time": time.time()}, f)
    except OSError:
        return False
    return True


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch(argv: list[str], ranks: int, log=None) -> int:
    """Run `minidnn <argv>` as `ranks` processes on this host; returns the exit status
    (0 when all succeed, else the first failure's), after printing that failure once."""
    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    port = free_port()
    secret = new_secret()   # this run's alone: only the ranks started here can join it
    folder = tempfile.mkdtemp(prefix="minidnn-ranks-")
    path = os.pathsep.join([_package_root()] + [p for p in
                                                os.environ.get("PYTHONPATH", "").split(
                                                    os.pathsep) if p])
    procs = []
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None   # ... and ranks
    try:
        for r in range(ranks):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       WORLD_SIZE=str(ranks), RANK=str(r), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(ranks), PYTHONPATH=path, **{SECRET_ENV: secret},
                       **{ERROR_FILE_ENV: os.path.join(folder, f"rank{r}.json")})
            env.pop("TORCHELASTIC_RUN_ID", None)   # we are the launcher here, not torchrun
            procs.append(subprocess.Popen([sys.executable, "-m", "minidnn"] + list(argv),
                                          env=env,
                                          stdout=None if r == 0 else subprocess.DEVNULL))
        return _supervise(procs, folder, log)
    except KeyboardInterrupt:
        _stop(procs)
        log("minidnn: interrupted")
        return 130
    finally:
        _stop(procs)
        if main:
            signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(folder, ignore_errors=True)


def _terminated(signum, frame):
    raise SystemExit(128 + signum)


def _supervise(procs: list, folder: str, log) -> int:
    while True:
        codes = [p.poll() for p in procs]
        if all(c == 0 for c in codes):
            return 0
        if any(c not in (None, 0) for c in codes):
            break
        time.sleep(0.05)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    stopped = [r for r, p in enumerate(procs) if p.poll() is None]
    _stop(procs)
    rank, message, code = _first_failure(procs, folder)
    extra = f" (ranks {stopped} were stopped)" if stopped else ""
    where = "" if message.startswith(f"rank {rank}: ") else f"rank {rank}: "
    log(f"minidnn: error: {where}{message}{extra}")
    return code


def _first_failure(procs: list, folder: str) -> tuple:
    """(rank, message, exit status) of the failure to report: the earliest primary error
    recorded, else the earliest error, else the first rank that exited with a status."""
    records = []
    for r in range(len(procs)):
        try:
            with open(os.path.join(folder, f"rank{r}.json")) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            continue
        records.append((bool(rec.get("secondary")), float(rec.get("time", 0)), r,
                        str(rec.get("message", ""))))
    failed = {r: p.returncode for r, p in enumerate(procs) if p.returncode not in (None, 0)}
    if records:
        _, _, r, message = min(records)
        code = failed.get(r) or 2
        return r, message, code if code > 0 else 1
    r = min(failed) if failed else 0
    code = failed.get(r, 1)
    how = f"exited with status {code}" if code > 0 else f"was killed by signal {-code}"
    return r, f"the process {how} without a message (see above)", code if code > 0 else 1


def _stop(procs: list) -> None:
    """Stop every rank still running: SIGTERM, then SIGKILL after a few seconds."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + 5.0
    for p in alive:
        try:
            p.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
