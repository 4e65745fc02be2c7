"""Uniform random draws of a layer call, made in a scratch block the memory manager owns.

A layer that draws random numbers (dropout: one float32 in [0, 1) per value of its mask)
declares their shape (`Layer.random_draws`), and the memory manager hands each such call a
scratch block of `scratch_bytes` (StepContext.scratch), planned like a cuDNN workspace: a
block of the step's layout that lives for the call alone. Everything the draw needs lies in
it, so a plan that fits counts it:

* the random generator's own state, at the block's start, for a generator that keeps one
  on the device (Device.generator_bytes). minidnn's keep none: NumPy's lives on the host, and
  the GPU's is counter-based (kernels/cuda_random.py; CuPy's cuRAND generator, used before,
  kept 12.4 MiB of state on an H200 and set it up at every draw);
* the draws themselves, after it: those of the whole batch (global_rows rows), of which a
  micro-batch uses its rows.

The numbers are the ones the step's generator (StepContext.rng) gives without a block: only
where their bytes lie changes, so a seed gives the same masks with or without a block.
"""
from __future__ import annotations

import numpy as np

DRAW_DTYPE = np.dtype(np.float32)


def draw_shape(shape: tuple, global_rows: int | None) -> tuple:
    """The shape of the draws made for a call of `shape` (N, ...): the whole batch's rows."""
    shape = tuple(int(d) for d in shape)
    total = shape[0] if global_rows is None else int(global_rows)
    return (total,) + shape[1:]


def scratch_bytes(shape: tuple, global_rows: int | None, generator_bytes: int) -> int:
    """Bytes of the scratch block for draws of `shape` (N, ...) out of a batch of
    `global_rows` rows (None: N), on a device whose generator takes `generator_bytes`."""
    n = int(np.prod(draw_shape(shape, global_rows), dtype=np.int64))
    return int(generator_bytes) + n * DRAW_DTYPE.itemsize


def uniform_into(make_generator, shape: tuple, scratch, device):
    """Draws of `shape` (the whole batch's, draw_shape) in [0, 1), float32, from the generator
    `make_generator()` returns: made inside `scratch` (the call's block; its last bytes hold
    the draws, the generator's state comes before them) when there is one, else wherever the
    array module allocates."""
    if scratch is None:
        return make_generator().random(shape, dtype=DRAW_DTYPE)
    nbytes = int(np.prod(shape, dtype=np.int64)) * DRAW_DTYPE.itemsize
    start = int(scratch.nbytes) - nbytes
    out = scratch[start:].view(DRAW_DTYPE).reshape(shape)
    with device.allocating_from(scratch[:start]):
        make_generator().random(shape, dtype=DRAW_DTYPE, out=out)
    return out
