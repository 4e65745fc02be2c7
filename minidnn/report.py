"""The run report: one JSON object describing a training run, written atomically.

Fields (these names never change; new fields may be added):
    model, batch, image_size, device ('cpu' or 'gpu'), policy, memory_budget_bytes (null when
    none), steps (the step count reached), loss (one float per step of this run),
    step_time_s (one per step), images_per_s (steady state: the first `warmup_steps` steps
    and the steps captured as CUDA graphs are left out), peak_device_bytes,
    peak_feature_map_bytes, offloaded_bytes and prefetched_bytes (per step, last step),
    param_checksum (sha256 of all parameters after the run).
Also: start_step, device_name, micro_batches (passes per step), split_batch_statistics
(whether BatchNorm may normalize each pass with its own statistics), chunks (layer chunks,
[first, last, pieces] each), math_mode, num_classes, num_params, data, seed, lr, momentum,
weight_decay, eval (held-out loss/accuracy at each evaluation), final_eval_accuracy,
memory (every figure the executor reports), wall_time_s, minidnn_version, created,
step_graphs (null where no step can be replayed from a CUDA graph, else {captured,
captured_at, replayed_steps, given_up}: Executor.graph_stats), traced_steps (the indices of
the steps traced for --trace or --plot, left out of images_per_s too), steady_steps (how many
steps images_per_s is of; 0: none was steady, and it is of every step).
A run stopped part-way (a signal, divergence, a full disk, memory exhausted) writes the report
of the steps done with partial (true) and partial_reason (what stopped it), and
diverged_at_step or interrupted_by where they apply (minidnn/stopping.py).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
import json

from .checkpoint import atomic_write
from .jsonsafe import json_safe
from .kernels.math_mode import describe as describe_math
from .version import __version__

REQUIRED_FIELDS = ("model", "batch", "image_size", "device", "policy", "memory_budget_bytes",
                   "steps", "loss", "step_time_s", "images_per_s", "peak_device_bytes",
                   "peak_feature_map_bytes", "offloaded_bytes", "prefetched_bytes",
                   "param_checksum")


def steady_steps(steps: int, warmup_steps: int = 2, skip=()) -> list[int]:
    """Indices of a run's steady steps among its `steps`: after the first `warmup_steps`, and
    not at the indices `skip` (the steps captured as CUDA graphs, a capture paid once as a
    warm-up is; a traced step)."""
    left_out = set(skip)
    return [i for i in range(steps) if i >= warmup_steps and i not in left_out]


def steady_step_times(report: dict) -> list[float]:
    """The step times of a run report's steady steps (steady_steps, by the report's own
    warmup_steps, its steps captured as CUDA graphs and its traced steps); a report without
    warmup_steps had the default 2."""
    times = report.get("step_time_s") or []
    start = int(report.get("start_step") or 0)
    skip = [s - start for s in (report.get("step_graphs") or {}).get("captured_at") or ()]
    skip += list(report.get("traced_steps") or ())
    warmup = report.get("warmup_steps")
    return [times[i] for i in steady_steps(len(times), 2 if warmup is None else int(warmup),
                                           skip)]


def steady_images_per_s(step_times: list[float], batch: int, warmup_steps: int = 2,
                        skip=()) -> float | None:
    """Images per second over the steady steps (steady_steps); over all steps when there is
    none (the report says so: steady_steps 0). None without steps."""
    steady = steady_steps(len(step_times), warmup_steps, skip)
    times = [step_times[i] for i in steady] or step_times
    total = sum(times)
    if not times or total <= 0:
        return None
    return batch * len(times) / total


def capture_steps(ex, start_step: int = 0) -> list[int]:
    """Indices, among a run's steps (the first at `start_step`), of the steps that were
    captured as CUDA graphs."""
    graphs = ex.graph_stats() or {}
    return [s - start_step for s in graphs.get("captured_at", ())]


def traced_steps(cfg, step_times: list) -> list[int]:
    """Indices of the steps that were traced (the last, for --trace or --plot): issued call by
    call with events around each (held ones slower still), not the run's steady step."""
    return [len(step_times) - 1] if (cfg.trace or cfg.plot) and step_times else []


def memory_figures(ex) -> dict:
    """The executor's memory statistics (Executor.memory_stats: per-step figures are of the
    last step; the four the report names at its top level are among them)."""
    return dict(ex.memory_stats())


@dataclass(frozen=True)
class RunProgress:
    """What a run has done so far, as its report says it. start_step: the step it resumed
    from (0: none); losses and step_times: one per step of this run; evals: the held-out
    evaluations; memory: `memory_figures(ex)` taken right after the last training step;
    wall_time_s: since the run began."""
    start_step: int
    losses: list
    step_times: list
    evals: list
    memory: dict
    wall_time_s: float


def build_report(cfg, *, ex, net, image_size: int, num_classes: int, data: str,
                 progress: RunProgress) -> dict:
    """The report of a run (see the module docstring for the fields): its config `cfg`, its
    executor and network, the data it read (images of `image_size`, `num_classes`, the
    data's description) and what it has done (`progress`)."""
    mem, start_step, losses = progress.memory, progress.start_step, progress.losses
    step_times, evals, wall_time_s = progress.step_times, progress.evals, progress.wall_time_s
    traced = traced_steps(cfg, step_times)
    skip = capture_steps(ex, start_step) + traced
    report = {
        "model": cfg.model,
        "batch": cfg.batch,
        "image_size": image_size,
        "device": ex.device.kind,
        "device_name": ex.device.name,
        "policy": cfg.policy,
        "relu_bits": cfg.relu_bits,
        # the ReLUs that kept bit masks (under a budget dyn may leave those asked for off)
        "relu_bits_kept": sorted(ex.decision.relu_bits),
        # the fully connected layers whose gradients a split step computed once (gathered.py)
        "gathered": sorted(ex.decision.gathered),
        "fuse": cfg.fuse,
        "precision": ex.maps.precision,
        "layout": ex.maps.layout,
        "micro_batches": ex.micro_batches,
        "split_batch_statistics": cfg.split_batch_statistics,
        "chunks": [list(c) for c in ex.decision.chunks],
        "memory_budget_bytes": cfg.memory_budget,
        "steps": start_step + len(losses),
        "start_step": start_step,
        "loss": [float(v) for v in losses],
        "step_time_s": [float(t) for t in step_times],
        "images_per_s": steady_images_per_s(step_times, cfg.batch, cfg.warmup_steps, skip),
        "steady_steps": len(steady_steps(len(step_times), cfg.warmup_steps, skip)),
        "traced_steps": traced,
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
        "math_mode": describe_math(ex.kernels, ex.device.is_gpu),
        "eval": evals,
        "final_eval_accuracy": evals[-1]["accuracy"] if evals else None,
        "memory": mem,
        "step_graphs": ex.graph_stats(),
        "wall_time_s": wall_time_s,
        "minidnn_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return report


def write_report(path: str, report: dict) -> None:
    """Write the report as indented JSON, atomically."""
    text = json.dumps(json_safe(report), indent=1) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))
