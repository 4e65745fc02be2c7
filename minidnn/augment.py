"""Data augmentation of training batches: random crops with padding, horizontal flips and
random erasing.

    augment = Augment.parse("crop,flip")          # or "crop:4,flip", "crop,flip,erase", "none"
    x = augment(x, np.random.default_rng([seed, AUGMENT_STREAM, step]), fill=-0.81)

Each image of a batch (N, C, H, W) is, independently:

* crop (padding p, default 4): padded by p pixels on every side with `fill` (the data set's
  black, normalised) and cut back to H x W at a random offset in 0..2p each way (the
  standard "RandomCrop(H, padding=p)");
* flip: mirrored left to right with probability 1/2;
* erase (probability P, default 0.5; Zhong et al. 2017, "Random Erasing Data Augmentation",
  with torchvision's RandomErasing ranges): a rectangle of area fraction s ~ U[0.02, 0.4] of
  the image and aspect ratio r log-uniform in [0.3, 3.3], h = round(sqrt(s H W r)) rows by
  w = round(sqrt(s H W / r)) columns (clipped to 1..H and 1..W, never drawn again), placed
  uniformly inside the image, set to 0 in every channel. The loaders normalise each channel
  to (pixel - the data set's mean) / its std, so 0 is the data set's mean pixel (its mean per
  channel for colour data), not black.

The draws for a whole batch come from the generator passed in, in a fixed order (offsets,
then flips, then the erasing's choices, each drawn only when its augmentation is on), so a
batch's augmentation is a pure function of that generator's seed: the batch loader seeds it
from (seed, step), and a run resumed at step k augments exactly as the uninterrupted run did.
Rows of a batch taken apart (a data-parallel rank's share) are cut after the draws for the
whole batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import ConfigError

#: Second word of the augmentation generator's seed, so its draws are not the permutation's.
AUGMENT_STREAM = 0xA06

#: Random erasing's ranges (torchvision's RandomErasing defaults): the erased area as a
#: fraction of the image, its aspect ratio (height / width, drawn log-uniformly), and the
#: probability `erase` alone means.
ERASE_AREA = (0.02, 0.4)
ERASE_RATIO = (0.3, 3.3)
ERASE_P = 0.5


@dataclass(frozen=True)
class Augment:
    """Which augmentations a training batch gets: crop padding in pixels (0: no crop),
    whether to flip, and the probability of erasing a rectangle of an image (0: never)."""
    crop_padding: int = 0
    flip: bool = False
    erase: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> "Augment":
        """'crop', 'crop:P', 'flip', 'erase', 'erase:P', comma-separated; '' / 'none' / None:
        nothing."""
        if text is None or str(text).strip() in ("", "none"):
            return cls()
        padding, flip, erase = 0, False, 0.0
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
            elif name == "erase":
                try:
                    erase = float(arg) if arg else ERASE_P
                except ValueError:
                    erase = -1.0
                if not 0.0 <= erase <= 1.0:     # also NaN
                    raise ConfigError(f"--augment {text!r}: erase:P needs a probability P in "
                                      f"0..1, got {arg!r}")
            else:
                raise ConfigError(f"--augment {text!r}: unknown augmentation {word!r} "
                                  f"(expected crop, crop:P, flip, erase, erase:P, "
                                  f"comma-separated, or none)")
        return cls(padding, flip, erase)

    def __bool__(self) -> bool:
        return bool(self.crop_padding or self.flip or self.erase)

    def __str__(self) -> str:
        parts = ([f"crop:{self.crop_padding}"] if self.crop_padding else []) + \
            (["flip"] if self.flip else [])
        if self.erase:
            parts.append("erase" if self.erase == ERASE_P else f"erase:{self.erase!r}")
        return ",".join(parts) or "none"

    def draw(self, rng: np.random.Generator, n: int) -> dict:
        """The random choices for a batch of n images: {'offsets': int (n, 2) (row, column)
        when cropping, 'flips': bool (n,) when flipping; when erasing, 'erases': bool (n,)
        (which images), 'erase_areas': float (n,) (s), 'erase_ratios': float (n,) (r) and
        'erase_places': float (n, 2) in [0, 1) (where the box goes, as a fraction of the room
        it has in rows and columns: the image's size is not known here)}. Every array's first
        axis is the image, so a rank's rows are cut from them after the whole batch's draws."""
        out = {}
        if self.crop_padding:
            out["offsets"] = rng.integers(0, 2 * self.crop_padding + 1, size=(n, 2))
        if self.flip:
            out["flips"] = rng.random(n) < 0.5
        if self.erase:
            out["erases"] = rng.random(n) < self.erase
            out["erase_areas"] = rng.uniform(*ERASE_AREA, size=n)
            out["erase_ratios"] = np.exp(rng.uniform(*np.log(ERASE_RATIO), size=n))
            out["erase_places"] = rng.random((n, 2))
        return out

    def apply(self, x: np.ndarray, draws: dict, fill=0.0) -> np.ndarray:
        """x float32 (n, C, H, W) augmented by `draws` (see draw; their rows match x's); a
        new array. fill: what a crop pads with, a float or one value per channel (C, 1, 1).
        Erasing comes last (after the crop and the flip) and writes 0, the normalised mean."""
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
        if self.erase:
            out[np.broadcast_to(erase_boxes(draws, h, w)[:, None], out.shape)] = 0.0
        return out


def erase_boxes(draws: dict, h: int, w: int) -> np.ndarray:
    """bool (n, h, w): True inside the rectangle each image erases (none where 'erases' is
    False), from draw's erase_* choices, for images of h x w pixels; the whole batch at once."""
    area = draws["erase_areas"] * (h * w)
    ratio = draws["erase_ratios"]
    rows = np.clip(np.rint(np.sqrt(area * ratio)), 1, h).astype(np.int64)
    cols = np.clip(np.rint(np.sqrt(area / ratio)), 1, w).astype(np.int64)
    places = np.asarray(draws["erase_places"])
    # a place in [0, 1) of the room left: top in 0..h - rows, left in 0..w - cols, uniformly
    top = (places[:, 0] * (h - rows + 1)).astype(np.int64)
    left = (places[:, 1] * (w - cols + 1)).astype(np.int64)
    in_rows = np.arange(h)[None, :] - top[:, None]           # (n, h)
    in_cols = np.arange(w)[None, :] - left[:, None]          # (n, w)
    inside = ((in_rows >= 0) & (in_rows < rows[:, None]))[:, :, None] & \
        ((in_cols >= 0) & (in_cols < cols[:, None]))[:, None, :]
    return inside & np.asarray(draws["erases"], bool)[:, None, None]
