"""Deterministic sums over the batch: fixed slices of S images, added in a fixed order.

A weight's gradient is a sum over the images of the batch. Floating-point addition is not
associative, so the bits of that sum depend on how it is grouped: one call over the whole
batch, two micro-batches of half the batch added together, the pieces of a layer chunk
(executor.py, chunks.py) each group it differently, and the same seed gives other bits under
another budget. Under deterministic mode (`--deterministic`) the grouping is fixed instead:

* the batch of B images is cut into slices of S = B / gcd(B, SLICES_PER_BATCH) images
  (`deterministic_slice`: S = B/8 when 8 divides B), the same for the whole run whatever the
  plan;
* every convolution and fully connected call runs slice by slice on views of S rows, so each
  product sees the same shapes in every plan (the GPU's cuDNN and cuBLAS choose their
  algorithm, and so their order of sums, by shape);
* a parameter gradient is the sum of the slices' gradients added one slice after the other,
  from the last slice of the batch to the first (`sum_in_slices`, `in_order`):
  g = ((g7 + g6) + g5) + ..., whether the slices arrive in one call, in several micro-batches
  or in chunk pieces. Last to first, because that is the order in which backward meets the
  pieces of a layer chunk (memory/schedule.py); the executor runs the micro-batches of a
  deterministic step last to first as well, so every plan meets the slices in one order;
* the loss is the mean of the slices' mean losses, summed as a balanced tree
  (`pairwise_sum`), in one pass or across passes alike;
* a BatchNorm that normalizes parts of the batch (split_batch_statistics) normalizes each
  slice with its own statistics in every plan, split or not, and moves its running
  estimates once per slice, in the same order (layers/batchnorm.py).

A micro-batch or chunk piece is then always a whole number of slices (`check_split`), so
splits are limited to SLICES_PER_BATCH parts: why S is the batch's eighth and not one image.
Slices as small as the smallest micro-batch the planner weighs (B/64) would leave every
split allowed, but run every convolution on 64 small slices; B/8 keeps the slices large
enough for a GPU (32 images of a batch of 256) at the price of splits of at most 8 parts,
which is what the planner then weighs (planner/split.py). Counts are powers of two, so each
pass's share of the loss gradient, 1/k, is exact, and an image's gradient has the same bits
in every pass.

What it costs: products of S rows instead of the pass's rows, which read their weights once
per slice (on a CPU a VGG-11 step at batch 32 took about twice as long at 32x32, whose late
maps are tiny, and 1.3 times as long at 64x64), and, in a layer with parameters, the
gradients of the slices after the first written into gradient-sized temporaries, as a later
micro-batch writes them (but those the layer's product adds in place: Layer.adds_in_place).

Layers learn S from the StepContext (batch_slice, statistics_slice, add_grads): without
deterministic mode those are None and False, and every layer runs its one call as before.
"""
from __future__ import annotations

import math

from ..errors import ConfigError

# The most slices a batch is cut into (a power of two): the most parts a deterministic step
# may run in, micro-batches times chunk pieces.
SLICES_PER_BATCH = 8


def deterministic_slice(batch: int) -> int:
    """S, the images in one slice of a batch of `batch` under deterministic mode: the batch
    divided by the largest power of two up to SLICES_PER_BATCH that divides it (256 -> 32,
    12 -> 3, 7 -> 7)."""
    batch = int(batch)
    return batch // math.gcd(batch, SLICES_PER_BATCH)


def whole_slices(rows: int, size: int) -> bool:
    """Is a part of `rows` images a whole number of slices of `size`?"""
    return int(rows) % int(size) == 0


def check_split(batch: int, micro_batches: int, chunks=()) -> None:
    """ConfigError unless each micro-batch of a step of `batch` images in `micro_batches`
    passes, and each piece of every layer chunk ((first, last, pieces), ...) of a pass, is a
    whole number of deterministic slices."""
    size = deterministic_slice(batch)
    parts = [(f"{micro_batches} micro-batches", micro_batches)]
    parts += [(f"{micro_batches} micro-batches with layer chunk {first}..{last} in {pieces} "
               f"pieces", micro_batches * pieces) for first, last, pieces in chunks]
    for what, count in parts:
        if batch % count or not whole_slices(batch // count, size):
            raise ConfigError(
                f"--deterministic sums over the batch of {batch} in slices of {size} images "
                f"(a batch splits into at most {batch // size} parts); {what} do not split it "
                f"into whole slices")


def row_slices(rows: int, size: int) -> list:
    """[slice(0, size), slice(size, 2 * size), ...] over `rows` rows (a multiple of size)."""
    if rows % size:
        raise ValueError(f"{rows} rows are not whole slices of {size}")
    return [slice(start, start + size) for start in range(0, rows, size)]


def pairwise_sum(values: list):
    """values[0] + ... + values[-1] as a balanced tree: (v0 + v1) + (v2 + v3), and so on. A
    step's loss is the mean of its slices' means summed this way (layers/loss.py,
    executor.mean_of_passes): passes of whole slices, a power of two of them, are subtrees,
    and each node's two terms add the same whichever comes first, so every split of a
    deterministic step reports the loss's bits (a sum in pass order would group them by
    the split)."""
    if len(values) == 1:
        return values[0]
    half = len(values) // 2
    return pairwise_sum(values[:half]) + pairwise_sum(values[half:])


def in_order(rows: int, size: int) -> list:
    """The slices of `rows` rows in the order a deterministic step adds them: last to first
    (see the module docstring)."""
    return row_slices(rows, size)[::-1]


def sum_in_slices(ctx, rows: int, grads: list, compute, size: int | None = None,
                  in_place: tuple = ()) -> None:
    """Parameter gradients summed slice by slice, in slice order.

    Args:
        ctx: the call's StepContext: ctx.add_grads says the gradients already hold the sum
            of earlier slices (a micro-batch or chunk piece after the first), to add to;
            ctx.kernels.add adds.
        rows: the rows of the call (a whole number of slices).
        grads: the Parameter gradients to write (arrays; None where none is wanted).
        compute: compute(part, outs) writes the gradients of the rows `part` (a slice) into
            outs (arrays like `grads`, None where grads has None), overwriting them; with
            `in_place`, compute(part, outs, adding).
        size: rows per slice (default ctx.batch_slice).
        in_place: the indices of `grads` that compute adds to itself where a slice adds
            (`adding` True; a fully connected layer's weight: Layer.adds_in_place): outs
            holds those gradients themselves, never a temporary.

    The slices go last to first (`in_order`). The first of a call that does not add writes
    `grads` themselves; every other slice writes temporaries of their size and layout, then
    added (or adds in place): so the sum is grouped as ((g7 + g6) + g5) + ... over the
    slices of the whole batch, whatever calls they come in, each slice added as in every
    other plan.
    """
    size = ctx.batch_slice if size is None else size
    call = compute if in_place else (lambda part, outs, adding: compute(part, outs))
    temps = None
    for n, part in enumerate(in_order(rows, size)):
        if n == 0 and not ctx.add_grads:
            call(part, grads, False)
            continue
        if temps is None:    # empty_like keeps the layout (channels-last weights on the GPU)
            temps = [g if i in in_place or g is None else ctx.xp.empty_like(g)
                     for i, g in enumerate(grads)]
        call(part, temps, True)
        for i, (g, t) in enumerate(zip(grads, temps)):
            if g is not None and i not in in_place:
                ctx.kernels.add(g, t, g)
