"""How many partial sums the GPU batch norm's first stage writes, without CuPy.

The per-channel sums of kernels/cuda_batchnorm.py run in two stages: a grid of blocks writes
float64 partial sums, (C, parts, 2) of them, and one block per channel adds its parts. That
array is allocated inside the call, on the GPU out of the budget's arena, so the step's memory
model must count it (planner/costs.transient_bytes). Both read the number of parts from
`stage_one_parts` here, so the plan and the run cannot disagree.
"""
from __future__ import annotations

PER_BLOCK = 16384          # NCHW: values of one channel a block adds (the last part: fewer)
MAX_PARTS = 1024
TARGET_BLOCKS = 2048       # NHWC: blocks of a reduction, enough to fill the GPU
PARTIALS = 131072          # NHWC: most (channel, part) pairs of stage one (2 MiB of sums)
SUM_BYTES = 16             # a part's (a, b): two float64 sums


def stage_one_parts(count: int, channels: int, column_blocks: int | None = None) -> int:
    """Parts each channel's `count` values are cut into before the kernel evens them out
    (which never adds a part).

    Args:
        count: values of one channel (N * H * W).
        channels: C.
        column_blocks: channels last, the blocks across the channels; None: NCHW planes.
    Returns:
        the number of parts, at least 1.
    """
    if column_blocks is None:
        return max(1, min(MAX_PARTS, -(-count // PER_BLOCK)))
    return max(1, min(MAX_PARTS, -(-TARGET_BLOCKS // column_blocks), -(-count // 64),
                      PARTIALS // channels))


def partial_sums_bytes(n: int, channels: int, pixels: int) -> int:
    """The most bytes of stage one's (C, parts, 2) float64 sums over a map (n, C, pixels), in
    either layout (one block across the channels: the most parts channels last can take)."""
    count = n * pixels
    parts = max(stage_one_parts(count, channels, 1), stage_one_parts(count, channels))
    return channels * parts * SUM_BYTES
