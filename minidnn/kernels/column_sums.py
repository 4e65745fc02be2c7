"""How many partial sums the GPU's per-channel sums of a map write, without CuPy.

A convolution's bias gradient (alone, or in the backward of the ReLU that added the bias:
minidnn/fusion.py) is the sum of a map over all but its channels. On channels-last maps
kernels/cuda_pointwise.py sums in two stages: a grid of SUM_BLOCKS blocks along the rows
(pixels), each adding a share of them, writes (blocks, C) partial sums, and one sum over the
blocks adds them; on NCHW maps each (n, c) plane is summed first, (N, C) partial sums. Those
arrays are allocated inside the call, on the GPU out of the budget's arena, so the step's
memory model counts them (planner/costs.transient_bytes). Both read the blocks from here, so
the plan and the run cannot disagree.
"""
from __future__ import annotations

import math

#: Blocks of a column pass along its rows (each a share of the rows, every channel's partial
#: sum): enough to fill the GPU, few enough that their partial sums are a small temporary.
#: The order of every sum follows from it, so it is fixed.
SUM_BLOCKS = 2048


def column_blocks(rows: int) -> tuple[int, int]:
    """(rows per block, blocks) of a column pass over `rows` rows (the map's pixels, N*H*W)."""
    per_block = max(-(-rows // SUM_BLOCKS), 1)
    return per_block, max(-(-rows // per_block), 1)


def channel_sums_bytes(shape, layout: str, itemsize: int) -> int:
    """Bytes of the partial sums a per-channel sum over a map of logical `shape` (N, C, ...)
    stored in `layout` ('nchw' or 'nhwc') writes, each sum `itemsize` bytes (the maps'
    accumulation type: 4 for float32 and bf16 maps, 8 for float64)."""
    n, c = int(shape[0]), int(shape[1])
    if layout == "nhwc" and len(shape) == 4:
        return column_blocks(n * math.prod(int(d) for d in shape[2:]))[1] * c * itemsize
    return n * c * itemsize
