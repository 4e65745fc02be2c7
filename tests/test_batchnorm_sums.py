"""The GPU batch norm's partial sums, sized without CuPy (kernels/batchnorm_sums.py), and the
step model counting them (planner/costs.transient_bytes): the bound holds for every shape of
block grid the kernels may launch."""
import itertools

from minidnn.kernels.batchnorm_sums import SUM_BYTES, partial_sums_bytes, stage_one_parts
from minidnn.memory.allocator import aligned
from minidnn.planner.costs import batchnorm_transient_bytes


def test_the_bound_covers_every_launch_the_kernels_may_make():
    for n, c, pixels in itertools.product((1, 2, 8, 64, 256), (1, 3, 64, 512, 2048),
                                          (1, 49, 3136, 12544)):
        count = n * pixels
        bound = partial_sums_bytes(n, c, pixels)
        launches = [stage_one_parts(count, c)] + [stage_one_parts(count, c, blocks)
                                                  for blocks in (1, 2, 7, 64, 512)]
        assert max(launches) * c * SUM_BYTES == bound, (n, c, pixels)
        assert min(launches) >= 1


def test_resnet50_sized_sums_take_two_mib_channels_last_and_less_in_planes():
    # layer1's bn3 at batch 256: 256 channels of 256 * 56 * 56 values
    assert stage_one_parts(256 * 56 * 56, 256, 1) * 256 * SUM_BYTES <= 2 * 2**20
    assert stage_one_parts(256 * 56 * 56, 256) == 49      # NCHW: a part per 16384 values


def test_a_batch_norm_call_counts_its_sums_and_per_channel_arrays():
    c = 64
    counted = batchnorm_transient_bytes((32, c, 8, 8))
    assert counted == aligned(partial_sums_bytes(32, c, 64)) + 3 * aligned(8 * c) \
        + aligned(48 * c)
    assert batchnorm_transient_bytes((256, c, 56, 56)) > counted
