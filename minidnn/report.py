"""The run report: one JSON object describing a training run, written atomically.

Fields (DESIGN.md's run report; these names never change, new fields may be added):
    model, batch, image_size, device ('cpu' or 'gpu'), policy, memory_budget_bytes (null when
    none), steps (the step count reached), loss (one float per step of this run),
    step_time_s (one per step), images_per_s (steady state: the first `warmup_steps` steps
    are left out), peak_device_bytes, peak_feature_map_bytes, offloaded_bytes and
    prefetched_bytes (per step, last step), param_checksum (sha256 of all parameters after
    the run).
Also: start_step, device_name, math_mode, num_classes, num_params, data, seed, lr, momentum,
weight_decay, eval (held-out loss/accuracy at each evaluation), final_eval_accuracy,
memory (every figure the executor reports), wall_time_s, minidnn_version, created.
"""
from __future__ import annotations

import datetime
import json
import math

from .checkpoint import atomic_write

REQUIRED_FIELDS = ("model", "batch", "image_size", "device", "policy", "memory_budget_bytes",
                   "steps", "loss", "step_time_s", "images_per_s", "peak_device_bytes",
                   "peak_feature_map_bytes", "offloaded_bytes", "prefetched_bytes",
                   "param_checksum")


def steady_images_per_s(step_times: list[float], batch: int, warmup_steps: int = 2) -> float | None:
    """Images per second over the steps after the first `warmup_steps` (all steps when the run
    is too short to leave any out); None without steps."""
    times = step_times[warmup_steps:] if len(step_times) > warmup_steps else step_times
    total = sum(times)
    if not times or total <= 0:
        return None
    return batch * len(times) / total


def memory_figures(ex) -> dict:
    """The executor's memory statistics (Executor.memory_stats: per-step figures are of the
    last step), with the four the report names at its top level always present."""
    stats = dict(ex.memory_stats())
    for key in ("peak_device_bytes", "peak_feature_map_bytes", "offloaded_bytes",
                "prefetched_bytes"):
        stats.setdefault(key, None)
    return stats


def math_mode(ex) -> str:
    """How the device does float32 math: 'fp32' on the CPU; on a GPU the kernels' setting
    ('tf32' or 'fp32', with ' deterministic' when only deterministic algorithms run)."""
    if not ex.device.is_gpu:
        return "fp32"
    mode = getattr(ex.kernels, "math_mode", None)
    if not callable(mode):
        return "unknown"
    state = mode()
    if isinstance(state, dict):
        return str(state.get("math", "unknown")) + (" deterministic"
                                                    if state.get("deterministic") else "")
    return str(state)


def build_report(cfg, *, ex, net, image_size: int, num_classes: int, data: str,
                 start_step: int, losses: list[float], step_times: list[float],
                 evals: list[dict], memory: dict, wall_time_s: float) -> dict:
    """The report of a finished run (see the module docstring for the fields).

    memory: `memory_figures(ex)` taken right after the last training step.
    """
    from . import __version__
    mem = memory
    report = {
        "model": cfg.model,
        "batch": cfg.batch,
        "image_size": image_size,
        "device": ex.device.kind,
        "device_name": ex.device.name,
        "policy": cfg.policy,
        "memory_budget_bytes": cfg.memory_budget,
        "steps": start_step + len(losses),
        "start_step": start_step,
        "loss": [float(v) for v in losses],
        "step_time_s": [float(t) for t in step_times],
        "images_per_s": steady_images_per_s(step_times, cfg.batch, cfg.warmup_steps),
        "warmup_steps": cfg.warmup_steps,
        "peak_device_bytes": mem["peak_device_bytes"],
        "steady_peak_device_bytes": mem.get("steady_peak_device_bytes"),
        "peak_feature_map_bytes": mem["peak_feature_map_bytes"],
        "offloaded_bytes": mem["offloaded_bytes"],
        "prefetched_bytes": mem["prefetched_bytes"],
        "param_checksum": net.param_checksum(),
        "num_classes": num_classes,
        "num_params": net.num_params(),
        "data": data,
        "seed": cfg.seed,
        "lr": cfg.lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay,
        "math_mode": math_mode(ex),
        "eval": evals,
        "final_eval_accuracy": evals[-1]["accuracy"] if evals else None,
        "memory": mem,
        "wall_time_s": wall_time_s,
        "minidnn_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return report


def _json_safe(value):
    """NaN and infinities are not JSON: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # NumPy scalars
        return _json_safe(value.item())
    return value


def write_report(path: str, report: dict) -> None:
    """Write the report as indented JSON, atomically."""
    text = json.dumps(_json_safe(report), indent=1) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))
