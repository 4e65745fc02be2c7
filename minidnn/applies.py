"""Flags that would do nothing in a run are refused (or, where harmless, warned about) with one
line, instead of being ignored silently.

    refuse_unused_flags(cfg, given={"--prefetch-lookahead"})   # ConfigError under --policy none
    for line in device_warnings(cfg, device): print("minidnn: warning: " + line)
    check_resume_precision(ckpt, cfg.precision)                 # CheckpointError on a mismatch
"""
from __future__ import annotations

from .errors import CheckpointError, ConfigError


def refuse_unused_flags(cfg, given=()) -> None:
    """Raise ConfigError for a flag the run's policy never reads.

    cfg: a TrainConfig; given: the options the user typed (a default is not a choice, so
    only a typed --prefetch-lookahead is refused).
    """
    if cfg.policy == "none" and "--prefetch-lookahead" in given:
        raise ConfigError("--prefetch-lookahead applies to feature maps offloaded to host "
                          "memory; --policy none offloads nothing (choose --policy all, conv "
                          "or dyn, or drop the flag)")
    if cfg.host_link_gbps is not None and cfg.policy != "dyn":
        raise ConfigError(f"--host-link-gbps is the copy speed --policy dyn plans with; "
                          f"--policy {cfg.policy} makes no plan (use --policy dyn or drop the "
                          f"flag)")
    if cfg.data == "synthetic" and str(cfg.augment or "none").strip() not in ("", "none"):
        raise ConfigError(f"--augment {cfg.augment}: synthetic data is random pixels, drawn on "
                          f"the GPU where there is one, past the loader that augments (drop the "
                          f"flag, or train on a data set)")


def device_warnings(cfg, device) -> list[str]:
    """One line for each flag that changes nothing on `device` (a backend.Device)."""
    if device.is_gpu:
        return []
    lines = []
    if cfg.math is not None:
        lines.append(f"--math {cfg.math} changes nothing on the CPU: its float32 math is "
                     f"always strict fp32 (TF32 exists only on the GPU)")
    return lines   # --deterministic does apply: the sums over the batch in fixed slices


def check_resume_precision(ckpt, precision: str) -> None:
    """A run resumes in the precision that wrote its checkpoint: its feature maps were rounded
    to that precision, so another one would not continue the same run. Raises
    CheckpointError. (Checkpoints older than --precision were all fp32.)"""
    saved = (ckpt.meta.get("config") or {}).get("precision") or "fp32"
    if saved != precision:
        raise CheckpointError(f"checkpoint {ckpt.path!r} was written by a --precision {saved} "
                              f"run; resume it with --precision {saved}, not {precision} "
                              f"(the weights stay float32 either way: to switch, start a new "
                              f"run from its weights)")
