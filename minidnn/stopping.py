"""How a training run stops early without losing what it did: signals, divergence, a full disk,
exhausted memory.

    with StopSignals() as stop:
        ...                  # set-up: a signal stops it at once (nothing trained yet)
        stop.arm()           # the steps: a signal stops the run after the step under way
        try:
            loop()
        except BaseException as e:
            raise stopped_run(e, cfg, run, report_now, stop)   # writes the partial report

Whatever stops a run part-way, `stopped_run` writes the report of the steps done, marked
`"partial": true` with `"partial_reason"`, and returns the exception that ends the run: one
line for the CLI (`minidnn: error: ...`) that says where the report is, or, for a bug, the
original exception with its traceback.
"""
from __future__ import annotations

import contextlib
import signal
import threading

from .errors import ConfigError, HostMemoryError, MinidnnError


class DivergenceError(MinidnnError):
    """The loss (or a parameter) became NaN or infinite.

    step: the step at which it did; report: the run report of the steps before it (also
    written to --report), set by train().
    """

    def __init__(self, message: str, step: int | None = None):
        super().__init__(message)
        self.step = step
        self.report = None


class Interrupted(MinidnnError):
    """SIGINT or SIGTERM stopped the run.

    signum: the signal; status: the exit status a shell gives a process that signal ends
    (130 for SIGINT, 143 for SIGTERM); step: the steps done; report: the run report of those
    steps (set by train()). The checkpoint (when the run has one) holds that step. hard: a
    second SIGINT stopped the run at once, in the middle of a step or of its shutdown (the
    CLI prints it as an error); detail: the message, when not the usual one.
    """

    def __init__(self, signum: int, step: int, checkpoint: str | None, hard: bool = False,
                 detail: str | None = None):
        self.signum, self.step, self.checkpoint = int(signum), int(step), checkpoint
        self.status = 128 + self.signum
        self.hard = hard
        self.report = None
        saved = f"; checkpoint {checkpoint!r} holds step {step}" if checkpoint else ""
        super().__init__(detail or f"{signal.Signals(self.signum).name} after step {step}{saved}")


class RunError(MinidnnError):
    """The system stopped a run part-way (a file it could not read, ...): one line."""


class StopSignals:
    """While entered (in the main thread), SIGINT and SIGTERM stop the run cleanly.

    Before `arm()` (set-up: reading data, building the network, profiling it) a signal raises
    KeyboardInterrupt at once (train() turns it into `set_up_interrupted()`): nothing is
    trained yet, so there is nothing to wait for. After it, a signal asks the run to stop
    after the step under way: `signum` holds the first signal received (None until then),
    and a second signal (SIGINT or SIGTERM) raises KeyboardInterrupt at once, for a user who
    does not want to wait for the step (`second`). `shielded()` holds signals off while the
    last files are written. Outside the main thread (where Python allows no handlers) it does
    nothing, and a signal the process ignores (SIGINT of a background job) stays ignored.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self.second: int | None = None   # a second signal, which stopped the run at once
        self.armed = False
        self._old: dict = {}

    def arm(self) -> None:
        self.armed = True

    def _handle(self, signum, frame) -> None:
        if not self.armed:   # a BaseException: no `except Exception` of the set-up keeps it
            self.signum = signum
            raise KeyboardInterrupt
        if self.signum is not None:   # a second signal: the user will not wait for the step
            self.second = signum
            raise KeyboardInterrupt
        self.signum = signum

    def set_up_interrupted(self) -> "Interrupted":
        """What a signal during set-up ends the run with (train() raises it)."""
        signum = self.signum or signal.SIGINT
        return Interrupted(signum, 0, None, detail=(
            f"{signal.Signals(signum).name} before the first step, while the run was being "
            f"set up; nothing was trained or written"))

    @contextlib.contextmanager
    def shielded(self):
        """Signals wait (ignored) while the block runs: the report is written whole."""
        for sig in self._old:
            signal.signal(sig, signal.SIG_IGN)
        try:
            yield
        finally:
            for sig in self._old:
                signal.signal(sig, self._handle)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue   # ignored on purpose (nohup, a background job): leave it so
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        return False


def stopped_run(error: BaseException, cfg, run, report_now, stop: StopSignals) -> BaseException:
    """Write the report of the steps done after `error` stopped the run; return what to raise.

    cfg: the TrainConfig; run: the run's _Loop (losses, saved_step); report_now(): the report
    of the steps done so far; stop: the run's StopSignals. The report gets `partial: true`,
    `partial_reason`, and `diverged_at_step` or `interrupted_by` where they apply; it is set
    as `.report` on the returned exception. A second SIGINT becomes a hard Interrupted, host
    memory exhausted a HostMemoryError, an OSError a RunError, each naming where the report
    is; DivergenceError and Interrupted keep their message; a bug comes back unchanged.
    """
    if not isinstance(error, (Exception, KeyboardInterrupt)):
        return error   # SystemExit, GeneratorExit: not a stop of the run
    with stop.shielded():
        run.read_pending_losses()
        done = run.start + len(run.losses)
        if isinstance(error, KeyboardInterrupt):
            saved, signum = run.saved_step, stop.second or signal.SIGINT
            error = Interrupted(signum, done, cfg.checkpoint, hard=True, detail=(
                f"a second {signal.Signals(signum).name} stopped the run at once after step "
                f"{done}"
                + (f"; checkpoint {cfg.checkpoint!r} holds step {saved}" if saved is not None
                   else "")))
        try:
            report = report_now()
        except Exception:   # the executor stopped mid-step may not say everything
            report = {"model": cfg.model, "steps": done, "loss": list(run.losses)}
        report.update(partial=True, partial_reason=_reason(error))
        if isinstance(error, DivergenceError):
            report["diverged_at_step"] = error.step
        elif isinstance(error, Interrupted):
            report["interrupted_by"] = signal.Signals(error.signum).name
        note = _write_report(cfg, report, done)
    with contextlib.suppress(AttributeError):
        error.report = report
    if isinstance(error, (DivergenceError, Interrupted)) and not getattr(error, "hard", False):
        return error   # their messages say what happened; the report is where asked
    if _out_of_host_memory(error):
        return _with_cause(HostMemoryError(
            f"out of host memory after step {done}: {error or 'an allocation failed'}; try a "
            f"smaller --batch or --image-size{note}"), error)
    if isinstance(error, OSError):
        return _with_cause(RunError(f"{error} after step {done}{note}"), error)
    if isinstance(error, MinidnnError):
        error.args = (f"{error}{note}",)
    return error


def _reason(error: BaseException) -> str:
    if isinstance(error, Interrupted):
        return str(error)
    if _out_of_host_memory(error):
        return f"out of host memory: {error or 'an allocation failed'}"
    return f"{type(error).__name__}: {error}"


def _out_of_host_memory(error: BaseException) -> bool:
    """Python's own MemoryError (an allocation failed), not minidnn's memory errors built on
    it, which say what ran out themselves."""
    return isinstance(error, MemoryError) and not isinstance(error, MinidnnError)


def _write_report(cfg, report: dict, done: int) -> str:
    """Write a partial report where the run was told to; returns what to add to the error."""
    if not cfg.report:
        return ""
    from .outputs import write_output
    from .report import write_report
    try:
        write_output("--report", cfg.report, lambda path: write_report(path, report))
    except ConfigError as e:
        return f"; the partial report could not be written either ({e})"
    return f"; the report of the {done} steps done is in {cfg.report!r} (partial)"


def _with_cause(new: BaseException, cause: BaseException) -> BaseException:
    new.__cause__ = cause
    return new
