"""Ctrl-C while the `minidnn` command is still importing (NumPy, the models: a second or two on
a laptop) ends it with one line and status 130, not an import traceback.

minidnn/__init__.py calls `begin()` first; the command's `main()` calls `end()` once everything
is imported, and Ctrl-C from then on is the command's own (minidnn/cli.py, minidnn/stopping.py).
A program that imports minidnn as a library keeps its own handler: nothing changes for it.
"""
import os
import signal
import sys
import threading

_installed = False


def _quiet(signum, frame):
    sys.stderr.write("minidnn: interrupted\n")
    raise SystemExit(128 + signum)


def _is_the_command() -> bool:
    """This process is `minidnn ...` or `python -m minidnn ...` (while -m looks for the
    module, sys.argv[0] is '-m')."""
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name in ("minidnn", "-m")


def begin() -> None:
    """Install the quiet handler, when this process is the command and SIGINT is Python's."""
    global _installed
    if (_is_the_command() and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
        signal.signal(signal.SIGINT, _quiet)
        _installed = True


def end() -> None:
    """Put Python's handler back (if `begin` replaced it)."""
    global _installed
    if _installed and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _installed = False
