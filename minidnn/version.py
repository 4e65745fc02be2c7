"""minidnn's version, written once: the package, pyproject.toml (its `dynamic` version),
checkpoints, run reports and measured profiles read it from here."""
__version__ = "0.3.0"
