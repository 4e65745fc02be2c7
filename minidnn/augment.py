"""Data augmentation of training batches: random crops with padding and horizontal flips.

    augment = Augment.parse("crop,flip")          # or "crop:4,flip", "none"
    x = augment(x, np.random.default_rng([seed, AUGMENT_STREAM, step]), fill=-0.81)

Each image of a batch (N, C, H, W) is, independently:

* crop (padding p, default 4): padded by p pixels on every side with `fill` (the data set's
  black, normalised) and cut back to H x W at a random offset in 0..2p each way (the
  standard "RandomCrop(H, padding=p)");
* flip: mirrored left to right with probability 1/2.

The draws for a whole batch come from the generator passed in, in a fixed order (offsets,
then flips), so a batch's augmentation is a pure function of that generator's seed: the batch
loader seeds it from (seed, step), and a run resumed at step k augments exactly as the
uninterrupted run did. Rows of a batch taken apart (a data-parallel rank's share) are cut
after the draws for the whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError

#: Second word of the augmentation generator's seed, so its draws are not the permutation's.
AUGMENT_STREAM = 0xA06


@dataclass(frozen=True)
class Augment:
    """Which augmentations a training batch gets: crop padding in pixels (0: no crop) and
    whether to flip."""
    crop_padding: int = 0
    flip: bool = False

    @classmethod
    def parse(cls, text: str | None) -> "Augment":
        """'crop', 'crop:P', 'flip', comma-separated; '' / 'none' / None: nothing."""
        if text is None or str(text).strip() in ("", "none"):
            return cls()
        padding, flip = 0, False
        for word in str(text).split(","):
            word = word.strip()
            name, _, arg = word.partition(":")
            if name == "crop":
                try:
                    padding = int(arg) if arg else 4
                except ValueError:
                    padding = -1
                if padding < 1:
                    raise ConfigError(f"--augment {text!r}: crop:P needs a padding P >= 1 "
                                      f"pixels, got {arg!r}")
            elif name == "flip" and not arg:
                flip = True
            else:
                raise ConfigError(f"--augment {text!r}: unknown augmentation {word!r} "
                                  f"(expected crop, crop:P, flip, comma-separated, or none)")
        return cls(padding, flip)

    def __bool__(self) -> bool:
        return bool(self.crop_padding or self.flip)

    def __str__(self) -> str:
        parts = ([f"crop:{self.crop_padding}"] if self.crop_padding else []) + \
            (["flip"] if self.flip else [])
        return ",".join(parts) or "none"

    def draw(self, rng: np.random.Generator, n: int) -> dict:
        """The random choices for a batch of n images: {'offsets': int (n, 2) (row, column)
        when cropping, 'flips': bool (n,) when flipping}."""
        out = {}
        if self.crop_padding:
            out["offsets"] = rng.integers(0, 2 * self.crop_padding + 1, size=(n, 2))
        if self.flip:
            out["flips"] = rng.random(n) < 0.5
        return out

    def apply(self, x: np.ndarray, draws: dict, fill=0.0) -> np.ndarray:
        """x float32 (n, C, H, W) augmented by `draws` (see draw; their rows match x's); a
        new array. fill: what a crop pads with, a float or one value per channel (C, 1, 1)."""
        out = np.array(x, copy=True)
        n, _, h, w = x.shape
        if self.crop_padding:
            p = self.crop_padding
            padded = np.empty(x.shape[:2] + (h + 2 * p, w + 2 * p), dtype=x.dtype)
            padded[...] = fill     # broadcast: a channel's value over its whole plane
            padded[:, :, p:p + h, p:p + w] = x
            for i, (top, left) in enumerate(draws["offsets"]):
                out[i] = padded[i, :, top:top + h, left:left + w]
        if self.flip:
            flips = draws["flips"]
            out[flips] = out[flips][..., ::-1]
        return out
