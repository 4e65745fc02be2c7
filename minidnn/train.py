"""The training loop: data -> executor -> SGD, with progress, evaluation, checkpoints and a report.

    from minidnn.train import TrainConfig, train
    report = train(TrainConfig(model="alexnet", steps=200, report="runs/alexnet.json"))

The defaults of TrainConfig are the main job that `minidnn train` runs with no arguments:
AlexNet at a reduced image size on the procedurally drawn Shapes data (minidnn.data.Shapes),
small enough for a CPU and learnable within a few hundred steps.

Reproducibility: parameters are initialised from `seed`, the batch order is a pure function
of (seed, step) and dropout draws from (seed, step, layer), so `--resume` from a checkpoint at
step k continues bit for bit as if the run had never stopped.

Nothing lost: every output path is checked before the first step (minidnn/outputs.py: no two
outputs the same file, an existing checkpoint replaced only by --resume or --overwrite); the
loss of every step is checked before a checkpoint is written (a diverged run never overwrites a
good checkpoint, and its report says where it diverged); SIGINT (Ctrl-C) and SIGTERM stop the
run at the end of the step under way, write the checkpoint and the report of the steps done,
and raise Interrupted (the CLI exits 130 / 143); a second SIGINT, a full disk or exhausted
memory still leave a report of the steps done, marked partial (minidnn/stopping.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import models
from .augment import Augment
from .backend import select_device
from .checkpoint import (CheckpointLock, load_checkpoint, restore, restore_optimizer,
                         save_checkpoint)
from .chunks import describe
from .cpu_check import check_cpu_run
from .data import BatchLoader, Dataset, SyntheticImages, open_data
from .decide import build_executor, decide
from .errors import CheckpointError, ConfigError, DataError, fmt_bytes
from .executor import Executor
from .applies import check_resume_precision, device_warnings, refuse_unused_flags
from .idx import parse_spec as parse_idx_spec
from .kernels.math_mode import MATH_MODES
from .memory.policy import MemoryDecision, Policy
from .layers.loss import example_losses
from .optim import SGD
from .outputs import (check_checkpoint_target, check_not_backward, check_outputs, plot_formats,
                      write_output)
from .recipe import AUTO, Recipe, check_recipe, evaluation_defaults
from .stopping import DivergenceError, Interrupted, StopSignals, stopped_run  # noqa: F401
from .report import RunProgress, build_report, capture_steps, memory_figures, \
    steady_images_per_s, write_report
from .spec import StepSpec
from .step_graph import DeviceInputs

#: Shapes are drawn at this size unless the model needs more (AlexNet: 55 at least).
SHAPES_IMAGE_SIZE = 64

# Settings a resumed run must share with the run that wrote the checkpoint, or it would not
# continue the same run.
RUN_IDENTITY = ("model", "batch", "image_size", "seed", "data", "num_classes", "lr", "momentum",
                "weight_decay", "lr_schedule", "lr_warmup", "label_smoothing", "augment")
# What a checkpoint written before a setting existed ran with.
IDENTITY_DEFAULTS = {"lr_schedule": "constant", "lr_warmup": 0, "label_smoothing": 0.0,
                     "augment": "none"}


@dataclass
class TrainConfig:
    """Everything a training run needs. The defaults are the main job (see the module doc).

    image_size None: Shapes at SHAPES_IMAGE_SIZE (or the model's minimum, if larger), CIFAR-10
    at 32 (or the minimum), synthetic data and image folders at the model's native size.
    num_classes None: what the data has (Shapes 10, CIFAR-10 10, a folder its class count,
    synthetic 1000). memory_budget: bytes (None: no budget). micro_batches: run each step as
    this many passes over equal parts of the batch (None: one); split_batch_statistics: allow
    that for networks with BatchNorm (see Executor). chunks: layer chunks each pass runs
    (MemoryDecision.chunks; None: none, or what --policy dyn weighs under a budget; ():
    none); data-parallel runs take none. math: 'tf32' or 'fp32' for the GPU
    kernels (None: their default, tf32); deterministic: GPU algorithms that give the same bits
    every run. precision: 'fp32' or 'bf16' (mixed: bf16 feature maps, float32 weights and
    optimizer state; kernels/mapformat.py); layout: 'nchw' or 'nhwc' (GPU feature maps; None:
    the device's default). eval_every / checkpoint_every 0: only at the end (eval_every
    'auto': by the run's length, recipe.evaluation_defaults). overwrite: the
    run may replace an existing checkpoint at `checkpoint` (else only resume continues one).
    force: a CPU run that the estimate says takes hours runs anyway (minidnn/cpu_check.py).
    log_every: how often the loss is read back from the device. collective_timeout: seconds
    a rank of a data-parallel run waits for the others in any exchange before it gives up;
    sync_batchnorm: its BatchNorm layers normalize with the whole global batch's
    statistics. host_link_gbps: --policy dyn
    plans with pinned copies at most this fast (GB/s each way; what each GPU gets when several
    offload at once, scripts/bench_host_link.py).

    Training recipes (minidnn/recipe.py): epochs: train for this many passes over the
    training set instead of `steps` (an epoch is floor(training images / batch) steps, the
    batch loader's; the held-out set is evaluated after every epoch, and the report's
    `epochs` holds one record per epoch). lr_schedule: 'constant', 'cosine' or 'step'
    (minidnn/lr_schedule.py), after lr_warmup_steps (or lr_warmup_epochs) of linear warm-up.
    label_smoothing: the loss's eps. augment: 'none' or e.g. 'crop,flip' (minidnn/augment.py).
    eval_batches None: the whole held-out set, its last partial batch included ('auto': the
    whole set for a run in epochs, 8 batches for one in steps). curve: a PNG
    of the training loss and held-out accuracy per epoch (needs epochs).
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
    micro_batches: int | None = None
    split_batch_statistics: bool = False
    chunks: tuple | None = None
    math: str | None = None
    deterministic: bool = False
    precision: str = "fp32"
    layout: str | None = None
    graphs: bool = True
    fuse: bool = True   # False (--no-fuse): every layer its own passes (minidnn/fusion.py)
    eval_every: int | str = AUTO
    eval_batches: int | str | None = AUTO
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    overwrite: bool = False
    force: bool = False
    report: str | None = None
    trace: str | None = None
    trace_held: bool = False   # each traced call's span the device's time for it (trace.py)
    plot: str | None = None
    progress: bool = True
    log_every: int = 10
    warmup_steps: int = 2
    collective_timeout: float = 600.0
    sync_batchnorm: bool = False
    host_link_gbps: float | None = None
    epochs: int | None = None
    lr_schedule: str = "constant"
    lr_warmup_steps: int = 0
    lr_warmup_epochs: int = 0
    label_smoothing: float = 0.0
    augment: str = "none"
    curve: str | None = None


def _check_config(cfg: TrainConfig) -> None:
    def positive(name, minimum=1):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ConfigError(f"{name.replace('_', '-')} must be an integer >= {minimum}, "
                              f"got {v!r}")
    positive("batch")
    positive("seed", 0)
    positive("steps", 0)
    positive("eval_every", 0)
    if cfg.eval_batches is not None:
        positive("eval_batches")
    positive("checkpoint_every", 0)
    positive("log_every")
    positive("warmup_steps", 0)
    positive("prefetch_lookahead", 0)
    if cfg.micro_batches is not None:
        positive("micro_batches")
    if cfg.image_size is not None:
        positive("image_size")
    if cfg.num_classes is not None:
        positive("num_classes")
    if cfg.memory_budget is not None:
        positive("memory_budget")
    check_recipe(cfg)
    if not 0 < cfg.lr < math.inf:
        raise ConfigError(f"lr must be a positive finite number, got {cfg.lr}")
    if not 0 <= cfg.momentum < 1:
        raise ConfigError(f"momentum must be in [0, 1), got {cfg.momentum}")
    if not 0 <= cfg.weight_decay < math.inf:
        raise ConfigError(f"weight-decay must be >= 0, got {cfg.weight_decay}")
    if cfg.math is not None and cfg.math not in MATH_MODES:
        raise ConfigError(f"math must be one of {', '.join(MATH_MODES)}, got {cfg.math!r}")
    if cfg.resume and not cfg.checkpoint:
        raise ConfigError("--resume needs --checkpoint PATH (the checkpoint to continue from)")
    if cfg.checkpoint_every and not cfg.checkpoint:
        raise ConfigError(f"--checkpoint-every {cfg.checkpoint_every} needs --checkpoint PATH "
                          f"(where to write the checkpoints)")
    if cfg.trace_held and not cfg.trace:
        raise ConfigError("--trace-held holds the steps that --trace records; give --trace PATH")
    figures = {"--plot": cfg.plot, "--curve": cfg.curve}
    for option, path in figures.items():
        if path:
            # Checked now, not when the figure is drawn after the whole run.
            try:
                import matplotlib  # noqa: F401 (imported to see that it imports)
            except ImportError as e:
                raise ConfigError(f"{option} {path!r} needs matplotlib, which does not import "
                                  f"({e}); install the 'plot' extra: pip install "
                                  f"'minidnn[plot]'") from None
    # Every output path now, so that a run is never lost to a path that cannot be written,
    # and no output replaces another output, an input or a checkpoint it should not.
    formats = plot_formats() if any(figures.values()) else ()
    check_outputs({"--report": cfg.report, "--trace": cfg.trace, "--checkpoint": cfg.checkpoint,
                   **figures},
                  inputs={"--model": cfg.model if str(cfg.model).endswith(".py") else None},
                  formats={k: formats for k, v in figures.items() if v})
    if cfg.checkpoint:
        check_checkpoint_target(cfg.checkpoint, cfg.resume, cfg.overwrite)
    refuse_unused_flags(cfg)


def resolve_image_size(cfg: TrainConfig) -> int:
    """The image size a run uses (see TrainConfig for the rule when it is None)."""
    if cfg.image_size is not None:
        return cfg.image_size
    if cfg.data == "shapes":
        return max(SHAPES_IMAGE_SIZE, models.min_image_size(cfg.model))
    if str(cfg.data).startswith("cifar10:"):
        return max(32, models.min_image_size(cfg.model))
    if parse_idx_spec(str(cfg.data)) is not None:
        return max(28, models.min_image_size(cfg.model))
    return models.native_image_size(cfg.model)


def make_executor(cfg: TrainConfig, net, device=None, dp=None) -> Executor:
    """The executor a run trains on (on `device`, a backend.Device, or on cfg.device); with
    `dp` (a distributed.DataParallel), on this rank's share of the batch."""
    share = dict(batch_offset=dp.batch_offset, global_batch=cfg.batch, ranks=dp.size) \
        if dp else {}
    policy, chunks = cfg.policy, cfg.chunks
    if policy == "dyn":
        from .planner.dyn import RUN_INPUT_BATCHES, DynPolicy
        policy = DynPolicy(host_link_gbps=cfg.host_link_gbps, input_batches=RUN_INPUT_BATCHES)
        # A data-parallel step does not run layer chunks (distributed/data_parallel.py).
        chunks = () if dp and chunks is None else chunks
    spec = StepSpec(batch=dp.local_batch if dp else cfg.batch, memory_budget=cfg.memory_budget,
                    policy=policy, prefetch_lookahead=cfg.prefetch_lookahead, math=cfg.math,
                    deterministic=cfg.deterministic or None, relu_bits=cfg.relu_bits,
                    micro_batches=cfg.micro_batches, chunks=chunks,
                    split_batch_statistics=cfg.split_batch_statistics,
                    precision=cfg.precision, layout=cfg.layout, graphs=cfg.graphs,
                    fuse=cfg.fuse, **share)
    device = device or cfg.device
    if cfg.policy == "dyn" and dp and dp.size > 1:   # a DynPolicy that measures
        return Executor(net, spec, plan_from_rank_zero(dp, net, spec, device, policy),
                        device=device, seed=cfg.seed)
    return build_executor(net, spec, device=device, seed=cfg.seed)


def plan_from_rank_zero(dp, net, spec: StepSpec, device, policy) -> MemoryDecision:
    """The decision of `spec` on this rank, planned from the profiles rank 0 measured: rank
    0 plans first, then hands its profiles to the others, which plan from them. Each rank
    measuring its own would time the same kernels a little differently, and the ranks
    could plan different steps (other offloads, other convolution plans, other peaks)."""
    if not dp.is_main:
        policy.source.adopt(net, dp.group.broadcast_object(None, "the planner's profiles"))
    decision = decide(net, spec, device=device)
    if dp.is_main:
        dp.group.broadcast_object(policy.source.made(), "the planner's profiles")
    return decision


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


def evaluate(ex: Executor, dataset: Dataset, batch: int, max_batches: int | None,
             seed: int = 0, rows: slice | None = None) -> dict:
    """Held-out loss and accuracy over the first `max_batches` full batches of `dataset`
    (over `rows` of each batch only, when given: one rank's share).

    max_batches None: every image. The last, partial batch is filled up with repeats of its
    own images (evaluation normalises with running statistics and drops nothing, so the
    repeats change no other row's logits) and only its real images are scored, their loss
    computed on the host from the logits (layers.loss.example_losses, with the network's
    label smoothing). With `rows`, only full batches.
    """
    full = len(dataset) // batch
    whole = max_batches is None and rows is None
    steps = -(-len(dataset) // batch) if whole else \
        min(full if max_batches is None else max_batches, full)
    if steps < 1:
        raise DataError(f"evaluation needs at least one full batch: the held-out set has "
                        f"{len(dataset)} images, batch {batch}, max_batches {max_batches}")
    correct = total = 0
    loss_sum = 0.0
    with BatchLoader(dataset, batch, seed, shuffle=False, drop_last=not whole, steps=steps,
                     rows=rows, layout=ex.maps.layout) as loader:
        for x, y in loader:
            n = len(y)
            partial = whole and n < batch
            if partial:
                fill = np.arange(batch) % n
                loss, logits = ex.evaluate(x[fill], y[fill])
                logits = logits[:n]
                eps = ex.net.nodes[-1].layer.label_smoothing   # the loss layer's
                loss_sum += float(example_losses(logits, y, eps).sum())
            else:
                loss, logits = ex.evaluate(x, y)
                loss_sum += loss * n
            correct += int((logits.argmax(axis=1) == y).sum())
            total += n
    return {"loss": loss_sum / total, "accuracy": correct / total, "images": total}


def _identity(cfg: TrainConfig, image_size: int, num_classes: int, recipe: Recipe) -> dict:
    d = {k: getattr(cfg, k) for k in RUN_IDENTITY if hasattr(cfg, k)}
    d.update(image_size=image_size, num_classes=num_classes, **recipe.identity())
    return d


def _check_resumable(ckpt, identity: dict) -> None:
    saved = ckpt.meta.get("config", {}).get("identity")
    if saved is None:
        raise CheckpointError(f"checkpoint {ckpt.path!r} does not record the run it belongs to "
                              f"(written outside `minidnn train`); cannot resume from it")
    if saved["model"] != identity["model"]:
        raise CheckpointError(f"checkpoint {ckpt.path!r} is for model {saved['model']!r}, not "
                              f"{identity['model']!r}")
    diffs = [f"{k}={saved.get(k, IDENTITY_DEFAULTS.get(k))!r} (now {identity[k]!r})"
             for k in RUN_IDENTITY if saved.get(k, IDENTITY_DEFAULTS.get(k)) != identity[k]]
    if diffs:
        raise CheckpointError(f"checkpoint {ckpt.path!r} was written by a run with "
                              f"{', '.join(diffs)}; resume with the same settings")


def _batches(sources, cfg: TrainConfig, start: int, pool=None, rows=None, layout="nchw"):
    """Iterator of (x, y) for steps start .. cfg.steps - 1, and the loader to close (or None).

    pool: batches already on the device (synthetic data on a GPU), used in turn. rows: this
    rank's rows of each batch (data-parallel), or None. layout: the executor's maps' (the
    loader hands it each batch in their memory order).
    """
    if pool is not None:
        return (pool[s % len(pool)] for s in range(start, cfg.steps)), None
    loader = BatchLoader(sources.train, cfg.batch, cfg.seed, shuffle=True, start_step=start,
                         steps=cfg.steps - start, rows=rows, augment=Augment.parse(cfg.augment),
                         layout=layout)
    return iter(loader), loader


def train(config: TrainConfig | None = None, log=print, world=None) -> dict:
    """Run training as configured; returns the run report (and writes it when config.report).

    log: where progress messages go (one string per call); the progress bar goes to stderr
    when config.progress. The executor is closed at the end: the network's parameters are
    NumPy arrays again and the device memory is released.

    Raises DivergenceError when the loss or a parameter becomes NaN or infinite, and
    Interrupted after SIGINT or SIGTERM (in the main thread); both carry the report of the
    steps done in `.report` and have written it to config.report, and an interrupted run has
    written its checkpoint.

    world: a distributed.World when this process is one rank of a data-parallel run of more
    than one rank; config.batch is then the global batch (see _rank).
    """
    cfg = config if config is not None else TrainConfig()
    cfg = dataclasses.replace(cfg, **evaluation_defaults(cfg))
    _check_config(cfg)
    cfg, log, dp = _rank(cfg, log, world)
    try:
        with contextlib.ExitStack() as stack:
            # One writer per checkpoint (rank 0 of several); also clears a killed writer's
            # temp files.
            if cfg.checkpoint and (dp is None or dp.is_main):
                stack.enter_context(CheckpointLock(cfg.checkpoint))
            stop = stack.enter_context(StopSignals())
            try:
                report = _train(cfg, log, stop, dp)
            except KeyboardInterrupt:
                if stop.armed:
                    raise
                raise stop.set_up_interrupted() from None
    except BaseException as e:
        if dp is not None:
            dp.abort(e)   # every other rank ends too, with this error
        raise
    if dp is not None:
        dp.close()
    return report


def _rank(cfg: TrainConfig, log, world):
    """(cfg, log, distributed.DataParallel or None) of this process. One rank of several
    connects to the others now; only rank 0 prints, and writes checkpoints, the report, the
    trace and the plot."""
    if world is None or world.size == 1:
        return cfg, log, None
    from .distributed import DataParallel
    dp = DataParallel(world, cfg.batch, timeout=cfg.collective_timeout,
                      sync_batchnorm=cfg.sync_batchnorm)
    if not dp.is_main:
        cfg = dataclasses.replace(cfg, progress=False, report=None, trace=None, plot=None)
        log = _silent
    return cfg, log, dp


def _silent(*_):
    pass


def _train(cfg: TrainConfig, log, stop: "StopSignals", dp=None) -> dict:
    """The run itself (dp: this rank's distributed.DataParallel, or None)."""
    started = time.perf_counter()
    image_size = resolve_image_size(cfg)
    sources = open_data(cfg.data, image_size, cfg.seed, cfg.num_classes)
    net = models.build(cfg.model, num_classes=sources.num_classes, image_size=image_size,
                       in_channels=sources.train.image_shape[0])
    recipe = Recipe.of(cfg, len(sources.train))
    cfg = dataclasses.replace(cfg, steps=recipe.total_steps)
    recipe.apply_to(net)
    identity = _identity(cfg, image_size, sources.num_classes, recipe)
    ckpt, start = _resumed(cfg, net, identity)
    _check_world_size(ckpt, dp.size if dp else 1)
    device = dp.select_device(cfg.device) if dp else select_device(cfg.device)
    if dp is None or dp.is_main:
        for line in device_warnings(cfg, device):
            print(f"minidnn: warning: {line}", file=sys.stderr)
    if cfg.trace_held and not device.is_gpu:
        raise ConfigError("--trace-held holds a GPU stream so that each traced call measures "
                          "the device; on the CPU a trace already times each call (drop the "
                          "flag)")
    if dp:
        dp.connect(device)   # NCCL's buffers before the executor's arena
    pool, inputs = _device_batches(cfg, sources, device, dp)
    if not device.is_gpu:   # hours of compute or more RAM than there is: refused now
        check_cpu_run(net, dp.local_batch if dp else cfg.batch, cfg.steps - start, cfg.policy,
                      cfg.memory_budget, cfg.micro_batches, force=cfg.force)
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
        _announce(cfg, net, ex, sources, recipe, image_size, start, dp, log)
        run = _Loop(LoopParts(cfg, ex, opt, sources, recipe, start, pool, inputs, dp),
                    dict(dataclasses.asdict(cfg), identity=identity,
                         world_size=dp.size if dp else 1), log, stop)

        def report_now() -> dict:
            report = build_report(
                cfg, ex=ex, net=net, image_size=image_size, num_classes=sources.num_classes,
                data=sources.description, progress=RunProgress(
                    start_step=start, losses=run.losses,
                    step_times=run.timer.times[:len(run.losses)], evals=run.evals,
                    memory=run.memory or memory_figures(ex),
                    wall_time_s=time.perf_counter() - started))
            report.update(recipe.report_fields(), epochs=run.epoch_records)
            return report
        stop.arm()   # from here a signal stops the run after the step under way
        try:
            with np.errstate(all="ignore"):   # a loss gone NaN is reported as divergence
                run.loop()
        except BaseException as stopped:
            # The steps done are not lost: their report is written, marked partial.
            raise stopped_run(stopped, cfg, run, report_now, stop)
        if dp:
            dp.check_parameters("at the end")
        report = report_now()
        if dp:
            report.update(dp.report_fields())
        _write_outputs(cfg, run, report)
    finally:
        ex.close()
    return report


def _resumed(cfg: TrainConfig, net, identity: dict) -> tuple:
    """(the checkpoint, its step) of a --resume run, its parameters restored into `net`;
    (None, 0) otherwise."""
    if not cfg.resume:
        return None, 0
    ckpt = load_checkpoint(cfg.checkpoint)
    _check_resumable(ckpt, identity)
    check_resume_precision(ckpt, cfg.precision)
    if cfg.steps <= ckpt.step:
        raise ConfigError(f"--steps {cfg.steps} is not past the checkpoint {cfg.checkpoint!r}, "
                          f"which is at step {ckpt.step}: nothing to train (--steps is the "
                          f"total; give more than {ckpt.step})")
    restore(ckpt, net, model=cfg.model)  # parameters first: the executor then keeps them
    return ckpt, ckpt.step


def _device_batches(cfg: TrainConfig, sources, device, dp) -> tuple:
    """(pool, inputs) for LoopParts, both made before the executor so that they stay outside
    its arena: synthetic batches made on the GPU (no host copy or RNG work timed), or the
    fixed device buffers the loader's batches are copied into, so that the steps can be
    replayed from a CUDA graph (minidnn/step_graph.py); None where neither applies."""
    if isinstance(sources.train, SyntheticImages) and device.is_gpu:
        return sources.train.device_batches(dp.local_batch if dp else cfg.batch, device), None
    if device.is_gpu and dp is None and cfg.graphs:
        return None, DeviceInputs(device, (cfg.batch,) + tuple(sources.train.image_shape))
    return None, None


def _announce(cfg: TrainConfig, net, ex, sources, recipe, image_size: int, start: int, dp,
              log) -> None:
    """The run's first lines: network, device and data; the budget; how a step is split;
    the recipe; a held-out set too small to score."""
    log(f"{cfg.model}: {net.num_params():,} parameters, {image_size}x{image_size} images, "
        f"batch {cfg.batch}, on {ex.device.kind}"
        + (f" ({ex.device.name})" if ex.device.name != ex.device.kind else "")
        + f"; data: {sources.description}"
        + (f"; resuming at step {start}" if start else "")
        + (f"; {dp.size} ranks of {dp.local_batch} images" if dp else ""))
    if cfg.memory_budget is not None:
        # Say what the number means: '12G' and '12GB' are 10^9 bytes, '12GiB' 2^30.
        log(f"memory budget {fmt_bytes(cfg.memory_budget)} ({cfg.memory_budget:,} bytes)")
    if ex.micro_batches > 1 or ex.decision.chunks:
        log("each step: " + ", ".join(
            ([f"{ex.micro_batches} micro-batches of {ex.micro_batch}"]
             if ex.micro_batches > 1 else [])
            + ([f"layers {describe(ex.decision.chunks)}"] if ex.decision.chunks else [])))
    policy = ex.spec.policy
    for note in policy.notes if isinstance(policy, Policy) else ():
        log(f"note: {note}")
    if recipe.describe():
        log(recipe.describe())
    if sources.eval is not None and len(sources.eval) < cfg.batch:
        log(f"no held-out evaluation: the held-out set has {len(sources.eval)} images, "
            f"fewer than one batch of {cfg.batch}")


def _write_outputs(cfg: TrainConfig, run, report: dict) -> None:
    """The report first: a trace, plot or curve that cannot be written must not lose it."""
    if cfg.report:
        write_output("--report", cfg.report, lambda path: write_report(path, report))
    if run.tracer is not None and cfg.trace:
        write_output("--trace", cfg.trace, run.tracer.write_chrome_trace)
    if run.tracer is not None and cfg.plot:
        write_output("--plot", cfg.plot, run.tracer.plot_memory)
    if cfg.curve:
        from .curves import plot_curves
        write_output("--curve", cfg.curve, lambda path: plot_curves(
            path, {"minidnn": run.epoch_records}, title=f"{cfg.model} on {cfg.data}"))


def _check_world_size(ckpt, size: int) -> None:
    """A run resumes with the number of ranks that wrote its checkpoint (the batch order and
    dropout masks are per rank share)."""
    if ckpt is None:
        return
    saved = ckpt.meta.get("config", {}).get("world_size", 1)
    if saved != size:
        raise CheckpointError(f"checkpoint {ckpt.path!r} was written by a run of {saved} "
                              f"rank(s); resume it with --ranks {saved}, not {size}")


@dataclass
class LoopParts:
    """What the training loop of a run works with.

    cfg: the run's TrainConfig (steps resolved from the recipe); ex: its Executor; opt: its
    optimizer (SGD, or a rank's data-parallel one); sources: data.DataSources (train and
    held-out sets); recipe: its recipe.Recipe; start: the step it starts at (a resumed run's
    checkpoint step); pool: batches already on the device, used in turn (synthetic data on a
    GPU), or None; inputs: a step_graph.DeviceInputs the loader's batches are copied into, or
    None; dp: this rank's distributed.DataParallel, or None.
    """
    cfg: TrainConfig
    ex: Executor
    opt: object
    sources: object
    recipe: Recipe
    start: int = 0
    pool: list | None = None
    inputs: object = None
    dp: object = None


class _Loop:
    """The steps of one run: train, read the loss now and then, evaluate, checkpoint.

    After loop(): losses and timer.times (one per step), evals, memory (the executor's
    figures right after the last training step, before evaluation overwrites the per-step
    ones) and tracer (the trace of the last training step, when asked for). stop: the
    StopSignals of the run; a signal ends the loop between two steps (Interrupted).
    """

    def __init__(self, parts: LoopParts, run_config: dict, log,
                 stop: StopSignals | None = None):
        self.cfg, self.ex, self.net, self.opt = parts.cfg, parts.ex, parts.ex.net, parts.opt
        self.sources, self.start, self.pool = parts.sources, parts.start, parts.pool
        self.inputs = parts.inputs
        self.run_config, self.log = run_config, log
        self.stop = stop
        self.dp = parts.dp               # distributed.DataParallel of a rank, or None
        self.saved_step: int | None = None   # the step of the last checkpoint written
        self.losses: list[float] = []
        self.pending: list = []          # loss values still on the device
        self.evals: list[dict] = []
        self.memory: dict | None = None
        self.tracer = None
        self.timer = StepTimer(parts.ex.device)
        self.bar = None
        self.recipe = parts.recipe
        self.epoch_records: list[dict] = []   # one per epoch ended (runs in epochs)
        self.started = time.perf_counter()

    def loop(self) -> None:
        cfg, ex = self.cfg, self.ex
        eval_ok = self.sources.eval is not None and len(self.sources.eval) >= cfg.batch
        batches, loader = _batches(self.sources, cfg, self.start, self.pool,
                                   self.dp.rows if self.dp else None,
                                   layout=ex.maps.layout)
        self.bar = _progress_bar(cfg, self.start)
        try:
            for step in range(self.start, cfg.steps):
                if self.stop is not None and self.stop.signum is not None:
                    self.interrupted(step)
                done = step + 1
                last = done == cfg.steps
                x, y = next(batches)
                if self.inputs is not None:
                    x, y = self.inputs(x, y)   # at fixed device addresses: a graph replays
                if self.recipe.varies_lr:
                    self.opt.set_lr(self.recipe.schedule.lr_at(step))
                if last and (cfg.trace or cfg.plot):
                    ex.enable_trace(True, max_steps=1, hold=cfg.trace_held)
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
                epoch = self.recipe.epoch_of(done)
                if eval_ok and ((cfg.eval_every and done % cfg.eval_every == 0) or last
                                or epoch is not None):
                    self.evaluate(done)
                    pause = True
                if epoch is not None:
                    self.end_epoch(epoch, done)
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

    def interrupted(self, done: int) -> None:
        """Stop after `done` steps: checkpoint them (when the run has a checkpoint) and raise
        Interrupted."""
        self.read_losses(done)
        if self.cfg.checkpoint and self.saved_step != done:
            self.checkpoint(done)
        raise Interrupted(self.stop.signum, done, self.cfg.checkpoint)

    def read_pending_losses(self) -> None:
        """Keep the losses of the steps done before the run stopped part-way (a one-process
        run only: ranks would have to meet). Their values, not a new error, are wanted."""
        if self.dp is None:
            with contextlib.suppress(Exception):
                self.read_losses(self.start + len(self.losses) + len(self.pending))

    def read_losses(self, step: int) -> None:
        """Bring pending losses to the host (this waits for the device) and update the bar.

        Raises DivergenceError at the first loss that is not finite (those before it are kept).
        """
        cfg = self.cfg
        self.timer.resolve()
        values = [float(value) for value in self.pending]
        if self.dp:
            values = self.dp.mean(values)   # every rank's loss: the global batch's
        for v in values:
            if not math.isfinite(v):
                at = self.start + len(self.losses) + 1
                self.pending.clear()
                raise DivergenceError(f"loss became {v} at step {at}: training diverged "
                                      f"(try a smaller --lr, now {cfg.lr})", step=at)
            self.losses.append(v)
        self.pending.clear()
        if self.bar is not None and self.losses:
            ips = steady_images_per_s(self.timer.times, cfg.batch, cfg.warmup_steps,
                                      capture_steps(self.ex, self.start))
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
        epoch = self.recipe.epoch_of(step)
        if epoch is not None:
            # The epoch's line (end_epoch records it) says the epoch and the whole epoch's loss.
            return
        recent = np.mean(self.losses[-cfg.log_every:]) if self.losses else float("nan")
        _write(self.bar, self.log, f"step {step}/{cfg.steps}: training loss {recent:.4f}, "
                                   f"held-out loss {result['loss']:.4f}, accuracy "
                                   f"{result['accuracy']:.3f} ({result['images']} images)")

    def end_epoch(self, epoch: int, step: int) -> None:
        """Record epoch `epoch`, which `step` ends: its mean training loss (over the steps of
        it this run made), learning rate at its last step, held-out figures when evaluated,
        training time so far (step times only: evaluation and checkpoints left out) and wall
        time; and print it."""
        self.read_losses(step)
        first = max(step - self.recipe.steps_per_epoch, self.start)
        losses = self.losses[first - self.start:step - self.start]
        record = {"epoch": epoch, "step": step,
                  "train_loss": float(np.mean(losses)) if losses else None,
                  "lr": self.recipe.schedule.lr_at(step - 1),
                  "train_time_s": float(sum(self.timer.times[:step - self.start])),
                  "wall_time_s": time.perf_counter() - self.started}
        held_out = self.evals[-1] if self.evals and self.evals[-1]["step"] == step else None
        if held_out is not None:
            record.update(accuracy=held_out["accuracy"], eval_loss=held_out["loss"],
                          eval_images=held_out["images"])
        self.epoch_records.append(record)
        line = (f"epoch {epoch}/{self.recipe.epochs} (step {step}/{self.cfg.steps}): training "
                f"loss {record['train_loss']:.4f}")
        if held_out is not None:
            line += (f", held-out loss {held_out['loss']:.4f}, accuracy "
                     f"{held_out['accuracy']:.4f} ({held_out['images']} images)")
        line += f", lr {record['lr']:.4g}, {record['wall_time_s']:.1f} s"
        _write(self.bar, self.log, line)

    def checkpoint(self, step: int) -> None:
        """Write the checkpoint of `step`, after checking every loss up to it and every
        parameter: a diverged run must not overwrite the last good checkpoint."""
        self.read_losses(step)
        xp = self.ex.xp
        for name, p in self.net.parameters():
            if not bool(xp.isfinite(p.data).all()):
                raise DivergenceError(f"parameter {name} became NaN or infinite at step {step}: "
                                      f"training diverged (try a smaller --lr, now "
                                      f"{self.cfg.lr}); the checkpoint was not overwritten",
                                      step=step)
        if self.dp and not self.dp.is_main:
            return   # rank 0 writes it; every rank holds the same parameters
        if not self.cfg.overwrite:
            check_not_backward(self.cfg.checkpoint, step)
        save_checkpoint(self.cfg.checkpoint, self.net, self.opt, step=step, model=self.cfg.model,
                        seed=self.cfg.seed, config=self.run_config)
        self.saved_step = step


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
    over = "steady state" if report.get("steady_steps", 1) else \
        (f"over all {len(report['step_time_s'])} steps: none was steady, each a warm-up, "
         f"captured or traced step")
    lines.append(f"{ips:.1f} images/s ({over}), peak device memory {fmt_bytes(peak)}, "
                 f"wall time {report['wall_time_s']:.1f} s" if ips else
                 f"wall time {report['wall_time_s']:.1f} s")
    return lines
