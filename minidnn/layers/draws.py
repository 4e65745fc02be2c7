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
* the draws themselves, after it: those of the call's own rows, no more. The step's
  generator gives the draws of the whole batch (over every rank and micro-batch) row after
  row; a call whose rows start at row `first` skips the draws before them (`skip_draws`)
  and makes only its own. So a micro-batch, a chunk's piece or a rank draws the numbers of
  its rows of the whole batch's draws, and its block is the size its layer declares,
  whatever the batch around it: a plan of a rank's step counts what the rank allocates.

The numbers are the ones the step's generator (StepContext.rng) gives without a block: only
where their bytes lie changes, so a seed gives the same masks with or without a block.
"""
from __future__ import annotations

import numpy as np

DRAW_DTYPE = np.dtype(np.float32)


def scratch_bytes(shape: tuple, generator_bytes: int) -> int:
    """Bytes of the scratch block for draws of `shape` (N, ...) on a device whose generator
    takes `generator_bytes`."""
    n = int(np.prod(tuple(int(d) for d in shape), dtype=np.int64))
    return int(generator_bytes) + n * DRAW_DTYPE.itemsize


def skip_draws(generator, count: int) -> None:
    """Move `generator` past `count` float32 draws, as if it had made them.

    A counter-based generator (kernels/cuda_random.CounterUniform) starts its next draw at
    a later index. NumPy's default generator (PCG64) makes a float32 from 32 bits: each
    64-bit output gives two draws, its low half first (the high half is kept for the next
    draw). So the bit generator advances count // 2 outputs (which forgets a kept half: the
    generator must be fresh, as every call's is), and an odd count draws one more number,
    leaving the next draw the high half, as a generator that made all `count` would."""
    count = int(count)
    if count <= 0:
        return
    if not isinstance(generator, np.random.Generator):
        generator.skip(count)        # counter-based
        return
    generator.bit_generator.advance(count // 2)
    if count % 2:
        generator.random(1, dtype=DRAW_DTYPE)


def uniform_rows_into(make_generator, shape: tuple, first: int, scratch, device):
    """Draws in [0, 1), float32, of `shape` (N, ...): rows [first, first + N) of the draws
    the generator `make_generator()` returns makes for the whole batch, row after row. Made
    inside `scratch` (the call's block; its last bytes hold the draws, the generator's state
    comes before them) when there is one, else wherever the array module allocates."""
    shape = tuple(int(d) for d in shape)
    row = int(np.prod(shape[1:], dtype=np.int64))
    if scratch is None:
        generator = make_generator()
        skip_draws(generator, int(first) * row)
        return generator.random(shape, dtype=DRAW_DTYPE)
    nbytes = int(np.prod(shape, dtype=np.int64)) * DRAW_DTYPE.itemsize
    start = int(scratch.nbytes) - nbytes
    out = scratch[start:].view(DRAW_DTYPE).reshape(shape)
    with device.allocating_from(scratch[:start]):
        generator = make_generator()
        skip_draws(generator, int(first) * row)
        generator.random(shape, dtype=DRAW_DTYPE, out=out)
    return out
