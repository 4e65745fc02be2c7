"""Where a run writes, checked before step one, so that no output and no earlier file is lost.

    check_outputs({"--report": "r.json", "--checkpoint": "c.npz"})  # ConfigError if unusable
    check_checkpoint_target("c.npz", resume=False, overwrite=False)  # CheckpointError if taken
    write_output("--report", "runs/r.json", lambda path: write_report(path, report))

The rules:
- every output path names a file that can be created (its folders may not exist yet);
- no two outputs of a run are the same file (`--report` equal to `--checkpoint` would turn the
  checkpoint into JSON), nor an input of the run (the model's .py file);
- an existing file at `--checkpoint` is replaced only when it is minidnn's own checkpoint and the
  run continues it (`--resume`) or is told to replace it (`--overwrite`); a file that is not a
  minidnn checkpoint is never replaced, and no other output replaces a checkpoint;
- a run never writes a checkpoint of an earlier step over a later one unless `--overwrite`.
"""
from __future__ import annotations

import os
import tempfile

from .checkpoint import peek_checkpoint
from .errors import CheckpointError, ConfigError


def check_output_path(option: str, path: str, formats: tuple = ()) -> None:
    """Raise a ConfigError naming `option` unless `write_output` can write `path`.

    Refused: a name that is a folder or ends in a separator, a file where one of the folders
    above it should be, a folder where no file can be created, and (when `formats` are given)
    a file extension that is not one of them. Folders that do not exist yet are fine (they
    are created when the file is written). Writes nothing but a probe file, removed at once.
    """
    text = os.fspath(path)
    if not text or text.endswith(("/", os.sep)) or os.path.isdir(text):
        raise ConfigError(f"{option} {text!r} names a folder; give the path of a file in it")
    if formats:
        ext = os.path.splitext(text)[1].lower().lstrip(".")
        if ext not in formats:
            raise ConfigError(f"{option} {text!r}: the file name must end in one of "
                              f"{', '.join('.' + f for f in formats)} (it says the format); "
                              f"got {'.' + ext if ext else 'no extension'}")
    existing = os.path.dirname(os.path.abspath(text))
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{option}: cannot write {text!r}: {existing!r} is a file, not a "
                          f"folder")
    try:  # os.access is not enough: root, read-only file systems, network mounts
        fd, probe = tempfile.mkstemp(prefix=".minidnn-probe.", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"{option}: cannot write {text!r}: cannot create files in "
                          f"{existing!r}: {e.strerror or e}") from None


def plot_formats() -> tuple:
    """The file extensions matplotlib can write ('png', 'pdf', 'svg', ...)."""
    from matplotlib.backend_bases import FigureCanvasBase
    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))


def same_file(a: str, b: str) -> bool:
    """Do two paths name one file (after '..', symbolic links and hard links)?"""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:   # one of them does not exist yet: only the resolved names can tell
        return False


def check_outputs(outputs: dict, inputs: dict | None = None, formats: dict | None = None) -> None:
    """Check a run's outputs before it starts. Raises ConfigError.

    outputs: {option: path or None}, e.g. {'--report': 'r.json', '--trace': None}; inputs:
    {option: path} the run reads (an output must not replace one); formats: {option: the
    extensions that option may end in}.
    """
    given = [(option, path) for option, path in outputs.items() if path]
    for option, path in given:
        check_output_path(option, path, (formats or {}).get(option, ()))
    for i, (option, path) in enumerate(given):
        for other, other_path in given[i + 1:]:
            if same_file(path, other_path):
                raise ConfigError(f"{option} and {other} both name {path!r}: one file would "
                                  f"overwrite the other; give each its own path")
        for source, source_path in (inputs or {}).items():
            if source_path and same_file(path, source_path):
                raise ConfigError(f"{option} {path!r} is the file {source} reads; writing it "
                                  f"would destroy it")
        if option != "--checkpoint" and peek_checkpoint(path) is not None:
            raise ConfigError(f"{option} {path!r} is a minidnn checkpoint; it is not "
                              f"overwritten with a {option[2:]} (give another path)")


def check_checkpoint_target(path: str, resume: bool, overwrite: bool) -> None:
    """May a run write its checkpoint at `path`? Raises CheckpointError if not.

    A new path: yes. A minidnn checkpoint: only to continue it (resume) or when told to
    (overwrite). Any other file: never.
    """
    if not os.path.lexists(path):
        return
    meta = peek_checkpoint(path)
    if meta is None:
        raise CheckpointError(f"--checkpoint {path!r} is an existing file that is not a "
                              f"minidnn checkpoint; it is never overwritten (give a new path)")
    if not resume and not overwrite:
        raise CheckpointError(f"checkpoint {path!r} already holds step {meta.get('step')} of "
                              f"model {meta.get('model')!r}; continue it with --resume or "
                              f"replace it with --overwrite")


def check_not_backward(path: str, step: int) -> None:
    """Refuse to write the checkpoint of `step` over a checkpoint of a later step at `path`
    (a run that restarted, or diverged early, must not replace more training with less).
    Raises CheckpointError."""
    meta = peek_checkpoint(path)
    if meta is not None and int(meta.get("step", 0)) > step:
        raise CheckpointError(f"checkpoint {path!r} holds step {meta['step']}, later than this "
                              f"run's step {step}; it is kept (--overwrite replaces it)")


def write_output(option: str, path: str, write) -> None:
    """`write(path)` after creating the folders above `path`; a failure (no permission, a
    full disk, a file where a folder should be, no matplotlib) is a ConfigError naming the
    option."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write(path)
    except OSError as e:
        raise ConfigError(f"{option}: cannot write {path!r}: {e.strerror or e}") from e
    except ImportError as e:
        raise ConfigError(f"{option}: cannot write {path!r}: {e}; install the 'plot' extra: "
                          f"pip install 'minidnn[plot]'") from e
