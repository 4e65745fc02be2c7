"""Random erasing in minidnn/augment.py: drawn from the generator after the crop's and the
flip's draws, a rectangle of every chosen image set to 0 (the normalised mean), and parsed
and printed like the other augmentations."""
import numpy as np
import pytest

from minidnn.augment import ERASE_AREA, Augment, erase_boxes
from minidnn.errors import ConfigError


def batch(n=16, c=3, h=32, w=32):
    """Images with no zero pixel, so that the erased ones are exactly the zeros."""
    return np.random.default_rng(7).uniform(0.5, 1.5, (n, c, h, w)).astype(np.float32)


def augmented(text, x, seed=(1, 2)):
    aug = Augment.parse(text)
    return aug.apply(x, aug.draw(np.random.default_rng(list(seed)), len(x)), fill=-1.0)


def test_erasing_depends_only_on_the_seed():
    x = batch()
    out = augmented("crop,flip,erase", x)
    assert np.array_equal(out, augmented("crop,flip,erase", x))
    assert not np.array_equal(out, augmented("crop,flip,erase", x, seed=(1, 3)))


def test_erasing_leaves_the_crop_and_the_flip_as_they_were():
    """Its draws come after theirs: the same seed crops and flips the same with erasing on,
    and with P = 0 nothing else changes."""
    x = batch()
    plain = augmented("crop:3,flip", x)
    with_erase = augmented("crop:3,flip,erase:1", x)
    kept = with_erase != 0
    assert np.array_equal(with_erase[kept], plain[kept]) and (~kept).any()
    assert np.array_equal(augmented("crop:3,flip,erase:0", x), plain)
    aug = Augment.parse("crop:3,flip,erase")
    draws = aug.draw(np.random.default_rng([1, 2]), len(x))
    draws["erases"][:] = False                         # drawn, but no image chosen
    assert np.array_equal(aug.apply(x, draws, fill=-1.0), plain)
    assert np.array_equal(Augment.parse("crop:3,flip").draw(np.random.default_rng([1, 2]), 16)
                          ["offsets"], draws["offsets"])


def test_erasing_every_image_erases_one_rectangle_of_the_drawn_size_in_every_channel():
    x = batch(n=64, h=32, w=24)
    out = augmented("erase:1", x)
    lo, hi = ERASE_AREA
    for image in out:
        zeros = image == 0
        assert (zeros == zeros[0]).all()               # the same pixels in every channel
        rows, cols = np.nonzero(zeros[0])
        box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert box == len(rows)                        # one filled rectangle
        # the drawn fraction in [0.02, 0.4], rounded to whole rows and columns, clipped
        assert 0.5 * lo <= len(rows) / (32 * 24) <= hi * 1.25
    half = augmented("erase", batch(n=200, h=16, w=16))
    erased = (half == 0).any(axis=(1, 2, 3)).mean()
    assert 0.35 < erased < 0.65                        # P = 0.5 by default


def test_the_box_stays_inside_and_a_ranks_rows_are_cut_after_the_draws():
    aug = Augment.parse("erase:1")
    draws = aug.draw(np.random.default_rng(5), 8)
    boxes = erase_boxes(draws, 10, 10)
    assert boxes.shape == (8, 10, 10) and boxes.any(axis=(1, 2)).all()
    share = {k: v[4:8] for k, v in draws.items()}
    assert np.array_equal(erase_boxes(share, 10, 10), boxes[4:8])


def test_erase_parses_prints_and_round_trips():
    assert Augment.parse("erase").erase == 0.5 and Augment.parse("erase:0.25").erase == 0.25
    for text in ("crop:4,flip,erase", "erase:0.3", "flip,erase:1.0"):
        aug = Augment.parse(text)
        assert Augment.parse(str(aug)) == aug
    assert str(Augment.parse("crop:4,flip,erase")) == "crop:4,flip,erase"
    assert Augment.parse("erase") and not Augment.parse("erase:0")


@pytest.mark.parametrize("text, message", [
    ("erase:2", "erase:P needs a probability P in 0..1, got '2'"),
    ("erase:x", "erase:P needs a probability P in 0..1, got 'x'"),
    ("crop,rase", "(expected crop, crop:P, flip, erase, erase:P, comma-separated, or none)")])
def test_a_bad_erase_is_a_one_line_error(text, message):
    with pytest.raises(ConfigError) as info:
        Augment.parse(text)
    assert message in str(info.value) and "\n" not in str(info.value)
