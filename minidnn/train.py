"""The training loop: data -> executor -> SGD, with progress, evaluation, checkpoints and a report.

    from minidnn.train import TrainConfig, train
    report = train(TrainConfig(model="alexnet", steps=200, report="runs/alexnet.json"))

The defaults of TrainConfig are the main job that `minidnn train` runs with no arguments:
AlexNet at a reduced image size on the procedurally drawn Shapes data (minidnn.data.Shapes),
small enough for a CPU and learnable within a few hundred steps.

Reproducibility: parameters are initialised from `seed`, the batch order is a pure function
of (seed, step) and dropout draws from (seed, step, layer), so `--resume` from a checkpoint at
step k continues bit for bit as if the run had never stopped.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from . import models
from .backend import select_device
from .checkpoint import load_checkpoint, restore, restore_optimizer, save_checkpoint
from .data import BatchLoader, Dataset, SyntheticImages, open_data
from .errors import CheckpointError, ConfigError, DataError, MinidnnError
from .executor import Executor
from .optim import SGD
from .report import MATH_MODES, build_report, memory_figures, steady_images_per_s, write_report

#: Shapes are drawn at this size unless the model needs more (AlexNet: 55 at least).
SHAPES_IMAGE_SIZE = 64

# Settings a resumed run must share with the run that wrote the checkpoint, or it would not
# continue the same run.
RUN_IDENTITY = ("model", "batch", "image_size", "seed", "data", "num_classes", "lr", "momentum",
                "weight_decay")


class DivergenceError(MinidnnError):
    """The loss became NaN or infinite."""


@dataclass
class TrainConfig:
    """Everything a training run needs. The defaults are the main job (see the module doc).

    image_size None: Shapes at SHAPES_IMAGE_SIZE (or the model's minimum, if larger), CIFAR-10
    at 32 (or the minimum), synthetic data and image folders at the model's native size.
    num_classes None: what the data has (Shapes 10, CIFAR-10 10, a folder its class count,
    synthetic 1000). memory_budget: bytes (None: no budget). math: 'tf32' or 'fp32' for the GPU
    kernels (None: their default, tf32); deterministic: GPU algorithms that give the same bits
    every run. eval_every / checkpoint_every 0: only at the end. log_every: how often the loss
    is read back from the device. collective_timeout: seconds a rank of a data-parallel run
    waits for the others in any exchange before it gives up. host_link_gbps: --policy dyn
    plans with pinned copies at most this fast (GB/s each way; what each GPU gets when several
    offload at once, scripts/bench_host_link.py).
    """
    model: str = "alexnet"
    batch: int = 32
    image_size: int | None = None
    steps: int = 200
    device: str = "auto"
    seed: int = 0
    lr: float = 0.005
    momentum: float = 0.9
    weight_decay: float = 5e-4
    data: str = "shapes"
    num_classes: int | None = None
    policy: str = "none"
    memory_budget: int | None = None
    prefetch_lookahead: int = 1
    relu_bits: bool = False
    math: str | None = None
    deterministic: bool = False
    eval_every: int = 50
    eval_batches: int = 8
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    report: str | None = None
    trace: str | None = None
    plot: str | None = None
    progress: bool = True
    log_every: int = 10
    warmup_steps: int = 2
    collective_timeout: float = 600.0
    host_link_gbps: float | None = None


def _check_config(cfg: TrainConfig) -> None:
    def positive(name, minimum=1):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(f"{name.replace('_', '-')} must be an integer >= {minimum}, "
                              f"got {v!r}")
    positive("batch")
    positive("steps", 0)
    positive("eval_every", 0)
    positive("eval_batches")
    positive("checkpoint_every", 0)
    positive("log_every")
    positive("warmup_steps", 0)
    positive("prefetch_lookahead", 0)
    if cfg.image_size is not None:
        positive("image_size")
    if cfg.num_classes is not None:
        positive("num_classes")
    if cfg.memory_budget is not None:
        positive("memory_budget")
    if not cfg.lr > 0:
        raise ConfigError(f"lr must be positive, got {cfg.lr}")
    if not 0 <= cfg.momentum < 1:
        raise ConfigError(f"momentum must be in [0, 1), got {cfg.momentum}")
    if not cfg.weight_decay >= 0:
        raise ConfigError(f"weight-decay must be >= 0, got {cfg.weight_decay}")
    if cfg.math is not None and cfg.math not in MATH_MODES:
        raise ConfigError(f"math must be one of {', '.join(MATH_MODES)}, got {cfg.math!r}")
    if cfg.resume and not cfg.checkpoint:
        raise ConfigError("--resume needs --checkpoint PATH (the checkpoint to continue from)")
    if cfg.plot:
        # Checked now, not when the plot is drawn after the whole run.
        try:
            import matplotlib  # noqa: F401 (imported to see that it imports)
        except ImportError as e:
            raise ConfigError(f"--plot {cfg.plot!r} needs matplotlib, which does not import "
                              f"({e}); install the 'plot' extra: pip install 'minidnn[plot]'"
                              ) from None


def resolve_image_size(cfg: TrainConfig) -> int:
    """The image size a run uses (see TrainConfig for the rule when it is None)."""
    if cfg.image_size is not None:
        return cfg.image_size
    if cfg.data == "shapes":
        return max(SHAPES_IMAGE_SIZE, models.min_image_size(cfg.model))
    if str(cfg.data).startswith("cifar10:"):
        return max(32, models.min_image_size(cfg.model))
    return models.native_image_size(cfg.model)


def make_executor(cfg: TrainConfig, net, device=None, dp=None) -> Executor:
    """The executor a run trains on (on `device`, a backend.Device, or on cfg.device); with
    `dp` (a distributed.DataParallel), on this rank's share of the batch."""
    share = dict(batch_offset=dp.batch_offset, global_batch=cfg.batch) if dp else {}
    policy = cfg.policy
    if cfg.host_link_gbps and policy == "dyn":
        from .planner.dyn import DynPolicy
        policy = DynPolicy(host_link_gbps=cfg.host_link_gbps)
    return Executor(net, dp.local_batch if dp else cfg.batch, device=device or cfg.device,
                    seed=cfg.seed, memory_budget=cfg.memory_budget, policy=policy,
                    prefetch_lookahead=cfg.prefetch_lookahead, math=cfg.math,
                    deterministic=cfg.deterministic or None, relu_bits=cfg.relu_bits, **share)


class StepTimer:
    """Wall time of every step without synchronizing the device each step.

    On a GPU an event is recorded on the compute stream at each step boundary and the times
    between them are read only when `resolve()` is called (the caller does so when it reads the
    loss anyway); on the CPU it is perf_counter. `restart()` leaves a pause (evaluation,
    checkpoint) out of the next step's time.
    """

    def __init__(self, device):
        self.device = device
        self.times: list[float] = []
        self._pending: list = []
        self._last = self._stamp()

    def _stamp(self):
        if self.device.is_gpu:
            event = self.device.timing_event()
            event.record(self.device.compute)
            return event
        return time.perf_counter()

    def lap(self) -> None:
        self._pending.append(self._stamp())

    def resolve(self) -> None:
        for stamp in self._pending:
            if self.device.is_gpu:
                stamp.synchronize()
                dt = self.device.xp.cuda.get_elapsed_time(self._last, stamp) / 1000.0
            else:
                dt = stamp - self._last
            self.times.append(dt)
            self._last = stamp
        self._pending.clear()

    def restart(self) -> None:
        self.resolve()
        self._last = self._stamp()


def evaluate(ex: Executor, dataset: Dataset, batch: int, max_batches: int, seed: int = 0,
             rows: slice | None = None) -> dict:
    """Held-out loss and accuracy over the first `max_batches` full batches of `dataset`
    (over `rows` of each batch only, when given: one rank's share)."""
    steps = min(max_batches, len(dataset) // batch)
    if steps < 1:
        raise DataError(f"evaluation needs at least one full batch: the held-out set has "
                        f"{len(dataset)} images, batch {batch}, max_batches {max_batches}")
    correct = total = 0
    loss_sum = 0.0
    with BatchLoader(dataset, batch, seed, shuffle=False, steps=steps, rows=rows) as loader:
        for x, y in loader:
            loss, logits = ex.evaluate(x, y)
            correct += int((logits.argmax(axis=1) == y).sum())
            total += len(y)
            loss_sum += loss * len(y)
    return {"loss": loss_sum / total, "accuracy": correct / total, "images": total}


def _identity(cfg: TrainConfig, image_size: int, num_classes: int) -> dict:
    d = {k: getattr(cfg, k) for k in RUN_IDENTITY}
    d.update(image_size=image_size, num_classes=num_classes)
    return d


def _check_resumable(ckpt, identity: dict) -> None:
    saved = ckpt.meta.get("config", {}).get("identity")
    if saved is None:
        raise CheckpointError(f"checkpoint {ckpt.path!r} does not record the run it belongs to "
                              f"(written outside `minidnn train`); cannot resume from it")
    if saved["model"] != identity["model"]:
        raise CheckpointError(f"checkpoint {ckpt.path!r} is for model {saved['model']!r}, not "
                              f"{identity['model']!r}")
    diffs = [f"{k}={saved.get(k)!r} (now {identity[k]!r})" for k in RUN_IDENTITY
             if saved.get(k) != identity[k]]
    if diffs:
        raise CheckpointError(f"checkpoint {ckpt.path!r} was written by a run with "
                              f"{', '.join(diffs)}; resume with the same settings")


def _batches(sources, cfg: TrainConfig, start: int, pool=None, rows=None):
    """Iterator of (x, y) for steps start .. cfg.steps - 1, and the loader to close (or None).

    pool: batches already on the device (synthetic data on a GPU), used in turn. rows: this
    rank's rows of each batch (data-parallel), or None.
    """
    if pool is not None:
        return (pool[s % len(pool)] for s in range(start, cfg.steps)), None
    loader = BatchLoader(sources.train, cfg.batch, cfg.seed, shuffle=True, start_step=start,
                         steps=cfg.steps - start, rows=rows)
    return iter(loader), loader


def train(config: TrainConfig | None = None, log=print, world=None) -> dict:
    """Run training as configured; returns the run report (and writes it when config.report).

    log: where progress messages go (one string per call); the progress bar goes to stderr
    when config.progress. The executor is closed at the end: the network's parameters are
    NumPy arrays again and the device memory is released.

    world: a distributed.World when this process is one rank of a data-parallel run of more
    than one rank (see _train_rank); config.batch is then the global batch.
    """
    cfg = dataclasses.replace(config) if config is not None else TrainConfig()
    _check_config(cfg)
    if world is not None and world.size > 1:
        return _train_rank(cfg, log, world)
    return _train(cfg, log)


def _train_rank(cfg: TrainConfig, log, world) -> dict:
    """One rank of a data-parallel run: connects to the others, trains on its share of each
    batch with the gradients all-reduced, and ends every rank if it fails. Only rank 0
    prints, and writes checkpoints, the report, the trace and the plot."""
    from .distributed import DataParallel
    dp = DataParallel(world, cfg.batch, timeout=cfg.collective_timeout)
    if not dp.is_main:
        cfg = dataclasses.replace(cfg, progress=False, report=None, trace=None, plot=None)
        log = _silent
    try:
        report = _train(cfg, log, dp)
    except BaseException as e:
        dp.abort(e)
        raise
    dp.close()
    return report


def _silent(*_):
    pass


def _train(cfg: TrainConfig, log, dp=None) -> dict:
    """The run itself (dp: this rank's distributed.DataParallel, or None)."""
    started = time.perf_counter()
    image_size = resolve_image_size(cfg)
    sources = open_data(cfg.data, image_size, cfg.seed, cfg.num_classes)
    net = models.build(cfg.model, num_classes=sources.num_classes, image_size=image_size)
    identity = _identity(cfg, image_size, sources.num_classes)

    ckpt, start = None, 0
    if cfg.resume:
        ckpt = load_checkpoint(cfg.checkpoint)
        _check_resumable(ckpt, identity)
        restore(ckpt, net, model=cfg.model)  # parameters first: the executor then keeps them
        start = ckpt.step
    _check_world_size(ckpt, dp.size if dp else 1)
    device = dp.select_device(cfg.device) if dp else select_device(cfg.device)
    if dp:
        dp.connect(device)   # NCCL's buffers before the executor's arena
    pool = None
    if isinstance(sources.train, SyntheticImages) and device.is_gpu:
        # Made on the device before the executor exists, so that, like a data loader's
        # buffers, they stay outside its arena and no host copy or RNG work is timed.
        pool = sources.train.device_batches(dp.local_batch if dp else cfg.batch, device)
    ex = make_executor(cfg, net, device, dp)
    try:
        ex.step = start  # dropout draws from (seed, step, layer): a resumed run replays them
        opt = SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                  weight_decay=cfg.weight_decay,
                  allocator=ex.allocator)  # momentum counts against the memory budget too
        if ckpt is not None:
            restore_optimizer(ckpt, opt)
        if dp:
            opt = dp.attach(ex, opt)   # gradients all-reduced in buckets during backward
        log(f"{cfg.model}: {net.num_params():,} parameters, {image_size}x{image_size} images, "
            f"batch {cfg.batch}, on {ex.device.kind}"
            + (f" ({ex.device.name})" if ex.device.name != ex.device.kind else "")
            + f"; data: {sources.description}"
            + (f"; resuming at step {start}" if start else "")
            + (f"; {dp.size} ranks of {dp.local_batch} images" if dp else ""))
        if sources.eval is not None and len(sources.eval) < cfg.batch:
            log(f"no held-out evaluation: the held-out set has {len(sources.eval)} images, "
                f"fewer than one batch of {cfg.batch}")
        run = _Loop(cfg, ex, net, opt, sources, start, pool,
                    dict(dataclasses.asdict(cfg), identity=identity,
                         world_size=dp.size if dp else 1), log, dp)
        run.loop()
        if dp:
            dp.check_parameters("at the end")
        report = build_report(cfg, ex=ex, net=net, image_size=image_size,
                              num_classes=sources.num_classes, data=sources.description,
                              start_step=start, losses=run.losses, step_times=run.timer.times,
                              evals=run.evals, memory=run.memory or memory_figures(ex),
                              wall_time_s=time.perf_counter() - started)
        if dp:
            report.update(dp.report_fields())
        # The report first: a trace or plot that cannot be written must not lose it.
        if cfg.report:
            write_output("--report", cfg.report, lambda path: write_report(path, report))
        if run.tracer is not None and cfg.trace:
            write_output("--trace", cfg.trace, run.tracer.write_chrome_trace)
        if run.tracer is not None and cfg.plot:
            write_output("--plot", cfg.plot, run.tracer.plot_memory)
    finally:
        ex.close()
    return report


def write_output(option: str, path: str, write) -> None:
    """`write(path)` after creating the folders above `path`; a failure (no permission, a
    file where a folder should be, no matplotlib) is a ConfigError naming the option."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write(path)
    except OSError as e:
        raise ConfigError(f"{option}: cannot write {path!r}: {e.strerror or e}") from e
    except ImportError as e:
        raise ConfigError(f"{option}: cannot write {path!r}: {e}; install the 'plot' extra: "
                          f"pip install 'minidnn[plot]'") from e


def _check_world_size(ckpt, size: int) -> None:
    """A run resumes with the number of ranks that wrote its checkpoint (the batch order and
    dropout masks are per rank share)."""
    if ckpt is None:
        return
    saved = ckpt.meta.get("config", {}).get("world_size", 1)
    if saved != size:
        raise CheckpointError(f"checkpoint {ckpt.path!r} was written by a run of {saved} "
                              f"rank(s); resume it with --ranks {saved}, not {size}")


class _Loop:
    """The steps of one run: train, read the loss now and then, evaluate, checkpoint.

    After loop(): losses and timer.times (one per step), evals, memory (the executor's
    figures right after the last training step, before evaluation overwrites the per-step
    ones) and tracer (the trace of the last training step, when asked for).
    """

    def __init__(self, cfg: TrainConfig, ex: Executor, net, opt, sources, start: int, pool,
                 run_config: dict, log, dp=None):
        self.cfg, self.ex, self.net, self.opt = cfg, ex, net, opt
        self.sources, self.start, self.pool = sources, start, pool
        self.run_config, self.log = run_config, log
        self.dp = dp                     # distributed.DataParallel of a rank, or None
        self.losses: list[float] = []
        self.pending: list = []          # loss values still on the device
        self.evals: list[dict] = []
        self.memory: dict | None = None
        self.tracer = None
        self.timer = StepTimer(ex.device)
        self.bar = None

    def loop(self) -> None:
        cfg, ex = self.cfg, self.ex
        eval_ok = self.sources.eval is not None and len(self.sources.eval) >= cfg.batch
        batches, loader = _batches(self.sources, cfg, self.start, self.pool,
                                   self.dp.rows if self.dp else None)
        self.bar = _progress_bar(cfg, self.start)
        try:
            for step in range(self.start, cfg.steps):
                done = step + 1
                last = done == cfg.steps
                x, y = next(batches)
                if last and (cfg.trace or cfg.plot):
                    ex.enable_trace(True, max_steps=1)
                self.pending.append(ex.train_step(x, y, self.opt))
                self.timer.lap()
                if last:
                    self.memory = memory_figures(ex)
                    if ex.tracer is not None:
                        self.tracer = ex.tracer
                        ex.enable_trace(False)
                if done % cfg.log_every == 0 or last:
                    self.read_losses(done)
                if self.bar is not None:
                    self.bar.update(1)
                pause = False
                if eval_ok and ((cfg.eval_every and done % cfg.eval_every == 0) or last):
                    self.evaluate(done)
                    pause = True
                if cfg.checkpoint and ((cfg.checkpoint_every and done % cfg.checkpoint_every == 0)
                                       or last):
                    self.checkpoint(done)
                    pause = True
                if pause:
                    self.timer.restart()   # evaluation and checkpoints are not step time
            self.read_losses(cfg.steps)
            if cfg.checkpoint and self.start >= cfg.steps and not cfg.resume:
                self.checkpoint(self.start)
        finally:
            if loader is not None:
                loader.close()
            if self.bar is not None:
                self.bar.close()
        ex.device.synchronize()

    def read_losses(self, step: int) -> None:
        """Bring pending losses to the host (this waits for the device) and update the bar."""
        cfg = self.cfg
        self.timer.resolve()
        values = [float(value) for value in self.pending]
        if self.dp:
            values = self.dp.mean(values)   # every rank's loss: the global batch's
        for v in values:
            if not math.isfinite(v):
                raise DivergenceError(f"loss became {v} by step {step}: training diverged "
                                      f"(try a smaller --lr, now {cfg.lr})")
            self.losses.append(v)
        self.pending.clear()
        if self.bar is not None and self.losses:
            ips = steady_images_per_s(self.timer.times, cfg.batch, cfg.warmup_steps)
            self.bar.set_postfix({"loss": f"{np.mean(self.losses[-cfg.log_every:]):.3f}",
                                  "img/s": f"{ips:.0f}" if ips else "-"}, refresh=False)

    def evaluate(self, step: int) -> None:
        cfg = self.cfg
        self.read_losses(step)
        result = evaluate(self.ex, self.sources.eval, cfg.batch, cfg.eval_batches, cfg.seed,
                          self.dp.rows if self.dp else None)
        if self.dp:
            result = self.dp.combine_eval(result)
        result = dict(step=step, **result)
        self.evals.append(result)
        recent = np.mean(self.losses[-cfg.log_every:]) if self.losses else float("nan")
        _write(self.bar, self.log, f"step {step}/{cfg.steps}: training loss {recent:.4f}, "
                                   f"held-out loss {result['loss']:.4f}, accuracy "
                                   f"{result['accuracy']:.3f} ({result['images']} images)")

    def checkpoint(self, step: int) -> None:
        if self.dp and not self.dp.is_main:
            return   # rank 0 writes it; every rank holds the same parameters
        save_checkpoint(self.cfg.checkpoint, self.net, self.opt, step=step, model=self.cfg.model,
                        seed=self.cfg.seed, config=self.run_config)


def _progress_bar(cfg: TrainConfig, start: int):
    if not cfg.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=cfg.steps, initial=start, unit="step", desc=cfg.model, dynamic_ncols=True)


def _write(bar, log, message: str) -> None:
    """A message that does not break the progress bar."""
    if bar is not None:
        bar.write(message)
    else:
        log(message)


def summary_lines(report: dict) -> list[str]:
    """A few lines that say how a run went (the CLI prints them at the end)."""
    from .errors import fmt_bytes
    loss = report["loss"]
    lines = []
    if loss:
        k = max(1, min(10, len(loss) // 4))
        lines.append(f"loss {np.mean(loss[:k]):.4f} (first {k} steps) -> "
                     f"{np.mean(loss[-k:]):.4f} (last {k} steps) over steps "
                     f"{report['start_step'] + 1}..{report['steps']}")
    if report.get("final_eval_accuracy") is not None:
        last = report["eval"][-1]
        lines.append(f"held-out accuracy {last['accuracy']:.3f} on {last['images']} images "
                     f"(chance {1 / report['num_classes']:.3f})")
    ips = report.get("images_per_s")
    peak = report.get("peak_device_bytes")
    lines.append(f"{ips:.1f} images/s (steady state), peak device memory {fmt_bytes(peak)}, "
                 f"wall time {report['wall_time_s']:.1f} s" if ips else
                 f"wall time {report['wall_time_s']:.1f} s")
    return lines
