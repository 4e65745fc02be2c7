"""The errors minidnn raises. Each names what was expected, what was given, and where.

The CLI prints these as one line (`minidnn: error: ...`) instead of a traceback; anything that
is not a MinidnnError is a bug and keeps its traceback.
"""


class MinidnnError(Exception):
    """Base of every error that is the user's input, not a bug."""


class ShapeError(MinidnnError, ValueError):
    """A tensor's shape does not fit a layer (names the layer, expected and actual shape)."""


class ConfigError(MinidnnError, ValueError):
    """A bad argument: unknown model, malformed size string, bad option value."""


class DataError(MinidnnError, ValueError):
    """Bad data: empty image folder, unreadable file, label out of range."""


class CheckpointError(MinidnnError, ValueError):
    """A checkpoint that is corrupt or does not match the network."""


class DeviceError(MinidnnError, RuntimeError):
    """The asked-for device is not there."""


class MemoryBudgetError(MinidnnError, MemoryError):
    """A device allocation that the memory budget cannot meet.

    Carries the numbers so that callers (the planner, tests) can read them.
    """

    def __init__(self, requested: int, in_use: int, budget: int, where: str = "", detail: str = ""):
        self.requested, self.in_use, self.budget, self.where = requested, in_use, budget, where
        msg = (f"memory budget exceeded{' in ' + where if where else ''}: requested "
               f"{fmt_bytes(requested)}, in use {fmt_bytes(in_use)}, budget {fmt_bytes(budget)}")
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class HostMemoryError(MinidnnError, MemoryError):
    """Pinned host memory for offloaded feature maps could not be had."""


class CollectiveError(MinidnnError, RuntimeError):
    """Ranks of a data-parallel run could not meet or exchange data (timeout, lost peer)."""


class RankFailedError(CollectiveError):
    """Another rank failed; carries that rank and its message, so every rank reports the cause."""

    def __init__(self, rank: int, message: str):
        self.rank, self.message = int(rank), str(message)
        super().__init__(f"rank {rank} failed: {message}")


def fmt_bytes(n: int | float | None) -> str:
    """1536 -> '1.50 KiB'. Binary units, as budgets are given (12GiB)."""
    if n is None:
        return "none"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # unreachable; keeps type checkers calm


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3, "tib": 1024**4}


def parse_bytes(text: str) -> int:
    """'12GiB' -> 12884901888, '512MB' -> 512000000, '1000' -> 1000. Raises ConfigError."""
    import re
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot read a memory size from {text!r}; expected a number with an "
                          f"optional unit such as 512MiB, 12GiB or 8GB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return int(value)
