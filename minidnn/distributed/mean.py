"""The mean over ranks of a gradient, from its sum: the one division every reducer makes.

Each rank's loss is the mean over its own rows, so its gradients are the mean over its rows.
The all-reduce sums them over the ranks (NCCL_SUM between GPUs, the socket collective between
CPUs); dividing that sum by the number of ranks gives the mean over the whole global batch,
which is what one process at the global batch computes. Both reducers call `divide_by_ranks`,
so the test that compares two CPU ranks with one process checks the GPU's division too.
"""
from __future__ import annotations


def divide_by_ranks(arrays: list, ranks: int) -> None:
    """Divide each array (NumPy or CuPy, any shape) by `ranks`, in place, in its own dtype.

    Args:
        arrays: the summed gradients of a bucket. On a GPU the caller makes the
            communication stream current, so the division runs behind the all-reduce.
        ranks: the number of ranks that were summed (>= 1).
    """
    for a in arrays:
        a /= a.dtype.type(ranks)
