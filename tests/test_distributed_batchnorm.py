"""Ranks with BatchNorm: by default rank 0's running statistics go to every rank after each
step (the ranks end with the same parameters and buffers); with synchronized statistics N
ranks at a global batch train what one process trains at that batch; and the gradient mean
divides by the number of ranks (two ranks at batch B against one process at B)."""
import json
import multiprocessing

import numpy as np
import pytest

from minidnn import Executor, Network, SGD
from minidnn.distributed import DataParallel, World
from minidnn.distributed.mean import divide_by_ranks
from minidnn.distributed.rendezvous import free_port
from minidnn.errors import ConfigError
from minidnn.layers import BatchNorm2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU

from test_distributed import minidnn

SPAWN = multiprocessing.get_context("spawn")
GLOBAL_BATCH = 8
SECRET = "b" * 64


def bn_net():
    """conv -> batch norm -> relu -> pool -> conv -> batch norm -> relu -> fc, in float64: a
    step's numbers show any difference in statistics or gradients well above rounding."""
    return Network.sequential((3, 6, 6), [
        Conv2d(4, 3, padding=1, name="conv1"), BatchNorm2d(name="bn1"), ReLU(name="relu1"),
        MaxPool2d(2, stride=2, name="pool1"), Conv2d(6, 3, padding=1, name="conv2"),
        BatchNorm2d(name="bn2"), ReLU(name="relu2"), Flatten(name="flat"),
        Linear(5, name="fc")], num_classes=5, name="bn_tiny", dtype=np.float64)


def batches(steps):
    rng = np.random.default_rng(11)
    # Channels with an offset and a scale of their own: statistics far from 0 and 1.
    return [(rng.standard_normal((GLOBAL_BATCH, 3, 6, 6)) * [[[2.0]], [[0.5]], [[1.0]]]
             + [[[3.0]], [[-1.0]], [[0.0]]], rng.integers(0, 5, GLOBAL_BATCH))
            for _ in range(steps)]


def sgd(net):
    return SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def _rank_main(rank, size, port, out, steps, sync):
    world = World(size, rank, rank, f"tcp://127.0.0.1:{port}", SECRET)
    net = bn_net()
    dp = DataParallel(world, GLOBAL_BATCH, timeout=20, check_every=0, sync_batchnorm=sync)
    dp.connect(dp.select_device("cpu"))
    ex = Executor(net, dp.local_batch, device="cpu", seed=5, batch_offset=dp.batch_offset,
                  global_batch=GLOBAL_BATCH)
    opt = dp.attach(ex, sgd(net))
    for step, (x, y) in enumerate(batches(steps), 1):
        ex.train_step(x[dp.rows], y[dp.rows], opt)
        dp.check_parameters(f"after step {step}")
        np.savez(f"{out}.rank{rank}.step{step}.npz", **net.state_dict())
    ex.close()
    dp.close()


def run_ranks(folder, steps, sync, size=2) -> list:
    """[[every rank's state dict] after step 1, ... after step `steps`] at GLOBAL_BATCH."""
    port, out = free_port(), str(folder / "run")
    procs = [SPAWN.Process(target=_rank_main, args=(r, size, port, out, steps, sync))
             for r in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * size
    return [[dict(np.load(f"{out}.rank{r}.step{k}.npz")) for r in range(size)]
            for k in range(1, steps + 1)]


@pytest.fixture(scope="module")
def synchronized(tmp_path_factory):
    """Two ranks, two steps, synchronized statistics."""
    return run_ranks(tmp_path_factory.mktemp("sync"), 2, sync=True)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Two ranks, one step, each rank's own statistics."""
    return run_ranks(tmp_path_factory.mktemp("plain"), 1, sync=False)


def one_process(steps) -> dict:
    net = bn_net()
    ex = Executor(net, GLOBAL_BATCH, device="cpu", seed=5)
    opt = sgd(net)
    for x, y in batches(steps):
        ex.train_step(x, y, opt)
    ex.close()
    return net.state_dict()


def test_synchronized_statistics_train_what_one_process_trains_at_the_global_batch(
        synchronized):
    """Tolerance 1e-12 in float64: only the order of the sums differs (each rank sums its
    half, the halves are then added). Per-rank statistics differ by far more (below)."""
    ranks = synchronized[-1]
    one = one_process(2)
    for name, value in one.items():
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
        np.testing.assert_allclose(ranks[0][name], value, rtol=0, atol=1e-12, err_msg=name)
    assert int(ranks[0]["bn1.num_batches_tracked"]) == 2


def test_without_synchronized_statistics_every_rank_ends_with_rank_0s_buffers(plain):
    ranks = plain[0]
    for name in ranks[0]:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
    # Rank 0's own statistics: the running mean one process moves with rows 0..3 alone.
    x, y = batches(1)[0]
    net = bn_net()
    ex = Executor(net, GLOBAL_BATCH // 2, device="cpu", seed=5)
    ex.forward(x[:GLOBAL_BATCH // 2], y[:GLOBAL_BATCH // 2])
    ex.close()
    np.testing.assert_allclose(ranks[0]["bn1.running_mean"],
                               net.state_dict()["bn1.running_mean"], rtol=1e-12)
    # Each rank's statistics make another step than one process's at the global batch.
    one = one_process(1)
    assert max(np.abs(ranks[0][n] - one[n]).max() for n in one) > 1e-4


def test_two_ranks_step_as_one_process_at_the_global_batch_so_the_mean_divides_by_ranks(
        synchronized):
    """No BatchNorm statistics in the way (synchronized): after one step the parameters are
    one process's within 1e-12. A gradient mean that forgot to divide by the number of ranks
    would step twice as far."""
    ranks = synchronized[0]
    one = one_process(1)
    initial = bn_net()
    initial.init_params(5)
    start = initial.state_dict()
    for name in ("conv1.weight", "conv2.weight", "fc.weight", "bn1.bias"):
        np.testing.assert_allclose(ranks[1][name], one[name], rtol=0, atol=1e-12)
        assert np.abs(one[name] - start[name]).max() > 1e-3   # the step moved it


def test_divide_by_ranks_turns_a_sum_into_the_mean_in_place():
    a, b = np.array([2.0, 4.0, 6.0]), np.array([3.0], np.float32)
    divide_by_ranks([a, b], 2)
    np.testing.assert_array_equal(a, [1.0, 2.0, 3.0])
    assert b.dtype == np.float32 and b[0] == 1.5


@pytest.mark.slow
def test_the_ranks_command_with_batchnorm_ends_with_equal_checksums(tmp_path):
    """resnet18 on 2 CPU ranks of 2 images: each rank's own statistics, rank 0's buffers."""
    report = tmp_path / "run.json"
    r = minidnn("train", "--model", "resnet18", "--image-size", "16", "--batch", "4",
                "--steps", "2", "--device", "cpu", "--ranks", "2", "--no-progress",
                "--eval-every", "0", "--eval-batches", "1", "--report", str(report))
    assert r.returncode == 0, r.stderr
    b = json.loads(report.read_text())
    assert b["ranks_agree"] and not b["sync_batchnorm"]
    assert b["rank_param_checksums"] == [b["param_checksum"]] * 2


def test_sync_batchnorm_needs_ranks_and_a_batchnorm():
    r = minidnn("train", "--model", "tiny_cnn", "--steps", "1", "--device", "cpu",
                "--sync-batchnorm")
    assert r.returncode == 2
    assert r.stderr.strip() == ("minidnn: error: --sync-batchnorm needs --ranks N with N > 1 "
                                "(one process normalizes with its whole batch already)")


def test_sync_batchnorm_refuses_a_network_without_batchnorm():
    from test_distributed import tiny_net
    net = tiny_net()
    dp = DataParallel(World(1, 0, 0, "tcp://127.0.0.1:1"), 4, sync_batchnorm=True)
    dp.connect(dp.select_device("cpu"))
    ex = Executor(net, 4, device="cpu")
    with pytest.raises(ConfigError, match="--sync-batchnorm: network 'tiny' has no BatchNorm "
                                          "layer to synchronize"):
        dp.attach(ex, sgd(net))
    ex.close()
    dp.close()
