"""Learning-rate schedules: the rate of every step, decided before the run and asked per step.

    schedule = LRSchedule("cosine", base_lr=0.1, total_steps=4680, warmup_steps=468)
    for step in range(total_steps):
        optimizer.set_lr(schedule.lr_at(step))     # step 0 is the first step
        ...

A schedule is a pure function of the step index, so a run resumed at step k continues with
exactly the rates the uninterrupted run used. Kinds:

    constant   base_lr
    cosine     base_lr * (1 + cos(pi * t)) / 2, t going from 0 at the first step after
               warm-up to (n - 1) / n at the last of the n steps after it (it never reaches 0)
    step       base_lr, times 0.1 from half of the steps after warm-up, times 0.01 from three
               quarters (the common "divide by 10 twice")

Warm-up: the first `warmup_steps` steps rise linearly, base_lr * (step + 1) / warmup_steps,
so the last warm-up step runs at base_lr; the decay starts after them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError

SCHEDULES = ("constant", "cosine", "step")
#: `step` decays by STEP_GAMMA at each of these fractions of the steps after warm-up.
STEP_MILESTONES = (0.5, 0.75)
STEP_GAMMA = 0.1


@dataclass(frozen=True)
class LRSchedule:
    """kind: one of SCHEDULES; base_lr > 0; total_steps: the run's last step (the total, also
    when resumed); warmup_steps: 0 .. total_steps."""
    kind: str
    base_lr: float
    total_steps: int
    warmup_steps: int = 0

    def __post_init__(self):
        if self.kind not in SCHEDULES:
            raise ConfigError(f"--lr-schedule must be one of {', '.join(SCHEDULES)}, got "
                              f"{self.kind!r}")
        if not self.base_lr > 0:
            raise ConfigError(f"lr must be positive, got {self.base_lr}")
        if self.warmup_steps < 0 or self.warmup_steps > self.total_steps:
            raise ConfigError(f"the learning-rate warm-up ({self.warmup_steps} steps) must lie "
                              f"within the run's {self.total_steps} steps")

    def lr_at(self, step: int) -> float:
        """The learning rate of step `step` (0-based: the run's first step is 0)."""
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        decay_steps = max(self.total_steps - self.warmup_steps, 1)
        t = (step - self.warmup_steps) / decay_steps
        if self.kind == "cosine":
            return self.base_lr * 0.5 * (1.0 + math.cos(math.pi * t))
        if self.kind == "step":
            return self.base_lr * STEP_GAMMA ** sum(t >= m for m in STEP_MILESTONES)
        return self.base_lr

    def describe(self) -> str:
        """'cosine from 0.1 over 4680 steps, 468 of warm-up', for the run's first lines."""
        text = f"{self.kind} from {self.base_lr:g}" if self.kind != "constant" else \
            f"constant {self.base_lr:g}"
        text += f" over {self.total_steps} steps"
        if self.warmup_steps:
            text += f", {self.warmup_steps} of warm-up"
        return text
