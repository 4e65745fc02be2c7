"""A run's training recipe: its length in epochs or steps, learning-rate schedule, label
smoothing and augmentation, resolved once the training set's size is known.

    recipe = Recipe.of(cfg, train_size=60_000)     # cfg: a train.TrainConfig
    recipe.total_steps, recipe.steps_per_epoch     # 936, 468 for 2 epochs of batch 128
    recipe.schedule.lr_at(step)                    # minidnn/lr_schedule.py

An epoch is floor(train_size / batch) steps: the batch loader draws a new permutation of the
training set every that many steps and leaves the remainder of each out (see data.BatchLoader),
so every epoch sees each image at most once. Warm-up given in epochs becomes steps the same way.

Evaluation follows the run's length unless told (`evaluation_defaults`, which `train` applies
to every TrainConfig, so the CLI and the Python API agree): a run in steps scores
EVAL_BATCHES_OF_STEPS held-out batches every EVAL_EVERY_OF_STEPS steps; a run in epochs
scores the whole held-out set at the end of every epoch and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass

from .augment import Augment
from .errors import ConfigError
from .layers.loss import SoftmaxCrossEntropy, check_label_smoothing
from .lr_schedule import SCHEDULES, LRSchedule


#: TrainConfig's eval_every and eval_batches when they follow the run's length.
AUTO = "auto"
#: The evaluation of a run counted in steps, unless told: every this many steps ...
EVAL_EVERY_OF_STEPS = 50
#: ... on this many held-out batches.
EVAL_BATCHES_OF_STEPS = 8


def evaluation_defaults(cfg) -> dict:
    """The TrainConfig fields eval_every and eval_batches of `cfg` with AUTO resolved by the
    run's length: EVAL_EVERY_OF_STEPS and EVAL_BATCHES_OF_STEPS for a run in steps; for one
    in epochs (cfg.epochs not None) 0 (no evaluation but the one that ends each epoch) and
    None (every held-out image). Values given are kept."""
    by_epochs = cfg.epochs is not None
    return {"eval_every": (0 if by_epochs else EVAL_EVERY_OF_STEPS)
            if cfg.eval_every == AUTO else cfg.eval_every,
            "eval_batches": (None if by_epochs else EVAL_BATCHES_OF_STEPS)
            if cfg.eval_batches == AUTO else cfg.eval_batches}


def check_recipe(cfg) -> None:
    """ConfigError for recipe settings of a TrainConfig that cannot work, before any data is
    read: epochs, the schedule's name, warm-up given twice, label smoothing, augmentation,
    and --curve without --epochs."""
    if cfg.epochs is not None and (isinstance(cfg.epochs, bool) or not isinstance(cfg.epochs, int)
                                   or cfg.epochs < 1):
        raise ConfigError(f"epochs must be an integer >= 1, got {cfg.epochs!r}")
    if cfg.lr_schedule not in SCHEDULES:
        raise ConfigError(f"--lr-schedule must be one of {', '.join(SCHEDULES)}, got "
                          f"{cfg.lr_schedule!r}")
    for name in ("lr_warmup_steps", "lr_warmup_epochs"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{name.replace('lr_', '--').replace('_', '-')} must be an "
                              f"integer >= 0, got {v!r}")
    if cfg.lr_warmup_steps and cfg.lr_warmup_epochs:
        raise ConfigError("give the learning-rate warm-up in steps or in epochs, not both "
                          "(--warmup-steps, --warmup-epochs)")
    check_label_smoothing(cfg.label_smoothing)
    Augment.parse(cfg.augment)
    if cfg.curve and cfg.epochs is None:
        raise ConfigError(f"--curve {cfg.curve!r} draws one point per epoch: it needs "
                          f"--epochs N")


@dataclass(frozen=True)
class Recipe:
    """total_steps: the run's last step; steps_per_epoch: None for a run counted in steps;
    epochs: None likewise; schedule, label_smoothing, augment: as the config gives them."""
    total_steps: int
    steps_per_epoch: int | None
    epochs: int | None
    schedule: LRSchedule
    label_smoothing: float
    augment: Augment

    @classmethod
    def of(cls, cfg, train_size: int) -> "Recipe":
        """The recipe of TrainConfig `cfg` for a training set of `train_size` images."""
        per_epoch = train_size // cfg.batch
        if (cfg.epochs or cfg.lr_warmup_epochs) and per_epoch < 1:
            raise ConfigError(f"an epoch needs at least one batch: the training set has "
                              f"{train_size} images, batch {cfg.batch}")
        total = cfg.epochs * per_epoch if cfg.epochs is not None else cfg.steps
        warmup = cfg.lr_warmup_epochs * per_epoch if cfg.lr_warmup_epochs else cfg.lr_warmup_steps
        schedule = LRSchedule(cfg.lr_schedule, cfg.lr, total, warmup)
        return cls(total, per_epoch if cfg.epochs is not None else None, cfg.epochs, schedule,
                   float(cfg.label_smoothing), Augment.parse(cfg.augment))

    @property
    def varies_lr(self) -> bool:
        """True when the learning rate changes during the run."""
        return self.schedule.kind != "constant" or self.schedule.warmup_steps > 0

    def epoch_of(self, done: int) -> int | None:
        """The epoch that `done` steps complete (1-based), or None when `done` ends none."""
        if self.steps_per_epoch is None or done % self.steps_per_epoch:
            return None
        return done // self.steps_per_epoch

    def apply_to(self, net) -> None:
        """Set the label smoothing of the network's loss layers."""
        for layer in net.layers():
            if isinstance(layer, SoftmaxCrossEntropy):
                layer.label_smoothing = self.label_smoothing

    def identity(self) -> dict:
        """What a resumed run must share (train.RUN_IDENTITY)."""
        return {"lr_schedule": self.schedule.kind, "lr_warmup": self.schedule.warmup_steps,
                "label_smoothing": self.label_smoothing, "augment": str(self.augment)}

    def describe(self) -> str:
        """One line for the start of a run; '' for a plain run (steps, constant rate, no
        smoothing or augmentation), whose output stays as it was."""
        parts = []
        if self.epochs is not None:
            parts.append(f"{self.epochs} epoch{'s' if self.epochs != 1 else ''} of "
                         f"{self.steps_per_epoch} steps")
        if self.varies_lr:
            parts.append(f"lr {self.schedule.describe()}")
        if self.label_smoothing:
            parts.append(f"label smoothing {self.label_smoothing:g}")
        if self.augment:
            parts.append(f"augmentation {self.augment}")
        return ("recipe: " + "; ".join(parts)) if parts else ""

    def report_fields(self) -> dict:
        """The run report's recipe fields."""
        return {"epoch_count": self.epochs, "steps_per_epoch": self.steps_per_epoch,
                "lr_schedule": self.schedule.kind, "lr_warmup_steps": self.schedule.warmup_steps,
                "label_smoothing": self.label_smoothing, "augment": str(self.augment)}
