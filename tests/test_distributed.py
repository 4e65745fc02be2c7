"""Data-parallel training on the CPU: N ranks (processes) at a global batch train what one
process trains at that batch; a rank's failure ends every rank with one error; the ranks'
environment is read as torchrun writes it."""
import json
import multiprocessing
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from minidnn import Executor, Network, SGD
from minidnn.distributed import DataParallel, World, resolve_world, world_from_env
from minidnn.decide import build_executor
from minidnn.distributed.buckets import GradientBuckets
from minidnn.distributed.cpu_collective import SocketGroup
from minidnn.distributed.rendezvous import parse_rendezvous
from minidnn.errors import CollectiveError, ConfigError
from minidnn.layers import Conv2d, Dropout, Flatten, Linear, MaxPool2d, ReLU, StepContext
from minidnn.memory.observer import StepObserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPAWN = multiprocessing.get_context("spawn")
GLOBAL_BATCH = 12   # divides over 2 and 3 ranks
STEPS = 3


# ---- torchrun's environment --------------------------------------------------------------------
def test_torchrun_variables_give_the_world():
    env = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "WORLD_SIZE": "8", "RANK": "5",
           "LOCAL_RANK": "1"}
    w = world_from_env(env)
    assert (w.size, w.rank, w.local_rank, w.rendezvous) == (8, 5, 1, "tcp://10.0.0.5:29500")
    assert not w.is_main
    # Under torchrun its agent's store holds MASTER_PORT: the ranks meet on the next port.
    assert world_from_env(dict(env, TORCHELASTIC_RUN_ID="x")).rendezvous == \
        "tcp://10.0.0.5:29501"
    assert world_from_env({"PATH": "/bin"}) is None          # not a rank
    assert world_from_env({k: v for k, v in env.items() if k != "LOCAL_RANK"}).local_rank == 5
    with pytest.raises(ConfigError, match="RANK"):
        world_from_env({"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        world_from_env({"WORLD_SIZE": "2", "RANK": "0"})
    with pytest.raises(ConfigError, match="rank must be in 0..7"):
        world_from_env(dict(env, RANK="8"))
    with pytest.raises(ConfigError, match="WORLD_SIZE must be an integer"):
        world_from_env(dict(env, WORLD_SIZE="two"))


def test_world_from_arguments():
    w = resolve_world(ranks=4, rank=2, rendezvous="file:/shared/run.addr", env={})
    assert (w.size, w.rank, w.local_rank) == (4, 2, 2)
    assert parse_rendezvous(w.rendezvous) == ("file", "/shared/run.addr", None)
    assert resolve_world(ranks=2, env={}) is None            # a launcher starts them
    with pytest.raises(ConfigError, match="--ranks 3 disagrees with WORLD_SIZE=2"):
        resolve_world(ranks=3, env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h",
                                    "MASTER_PORT": "1"})
    with pytest.raises(ConfigError, match="--rendezvous"):
        resolve_world(ranks=2, rank=1, env={})
    with pytest.raises(ConfigError, match="tcp://HOST:PORT or file:PATH"):
        parse_rendezvous("somewhere")


# ---- pieces ----------------------------------------------------------------------------------
def tiny_net(dtype=np.float64):
    """conv -> relu -> pool -> flatten -> fc -> relu -> dropout -> fc: every kind of layer a
    rank treats differently (parameters, per-row dropout draws)."""
    return Network.sequential((3, 8, 8), [
        Conv2d(4, 3, padding=1, name="conv1"), ReLU(name="relu1"),
        MaxPool2d(2, stride=2, name="pool1"), Flatten(name="flat"),
        Linear(16, name="fc1"), ReLU(name="relu2"), Dropout(0.5, name="drop"),
        Linear(5, name="fc2")], num_classes=5, name="tiny", dtype=dtype)


def batches(steps=STEPS, batch=GLOBAL_BATCH):
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((batch, 3, 8, 8)), rng.integers(0, 5, batch))
            for _ in range(steps)]


def test_a_share_of_the_batch_draws_its_rows_of_the_whole_batchs_dropout_mask():
    layer = Dropout(0.5, name="drop")
    layer.index = 3
    layer.setup([(8, 6)])
    x = np.ones((8, 6), np.float32)
    whole_y, whole_mask = np.empty_like(x), np.empty((8, 6), bool)
    layer.forward([x], whole_y, {"mask": whole_mask}, StepContext(np, step=4, seed=1))
    for offset in (0, 4):
        layer.setup([(4, 6)])
        y, mask = np.empty((4, 6), np.float32), np.empty((4, 6), bool)
        ctx = StepContext(np, step=4, seed=1, batch_offset=offset, global_batch=8)
        layer.forward([x[:4]], y, {"mask": mask}, ctx)
        np.testing.assert_array_equal(mask, whole_mask[offset:offset + 4])
    assert 0 < whole_mask.sum() < whole_mask.size


class RecordingReducer:
    def __init__(self):
        self.started = []

    def start(self, arrays, trace=None):
        self.started.append([id(a) for a in arrays])

    def finish(self):
        self.started.append("finish")


def test_buckets_start_in_reverse_layer_order_once_backward_made_their_gradients():
    net = tiny_net()
    ex = Executor(net, 4, device="cpu")
    reducer = RecordingReducer()
    # Bytes in float64: fc2 weight 640 + bias 40; fc1 8192 + 128; conv1 864 + 32.
    buckets = GradientBuckets(net, reducer, bucket_bytes=8330, first_bucket_bytes=700)
    names = [[n for n, _ in b] for b in buckets.buckets]
    assert names == [["fc2.bias", "fc2.weight"], ["fc1.bias", "fc1.weight"],
                     ["conv1.bias", "conv1.weight"]]
    done = []

    class Recorder(StepObserver):
        def layer(self, phase, name, index, start, end):
            if phase == "backward":
                done.append((name, len(reducer.started)))

    ex.add_observer(Recorder())
    ex.add_observer(buckets)
    x, y = batches(1, 4)[0]
    ex.forward(x, y)
    ex.backward()
    # Observers hear of every layer's backward, last layer first; a bucket starts right after
    # the backward that made its last gradient, while earlier layers still compute.
    assert [n for n, _ in done] == [n.name for n in reversed(net.nodes)]
    started_before = dict(done)
    assert [started_before[n] for n in ("fc2", "drop", "fc1", "flat", "conv1")] == \
        [0, 1, 1, 2, 2]
    assert len(reducer.started) == 3
    grads = {id(p.grad): n for n, p in net.parameters()}
    assert [[grads[i] for i in b] for b in reducer.started] == names
    buckets.finish()
    assert reducer.started[-1] == "finish" and len(reducer.started) == 4
    ex.close()


def test_with_micro_batches_buckets_start_only_in_the_last_pass():
    """Two passes: a gradient is final after the second pass's backward, not the first's."""
    net = tiny_net()
    ex = build_executor(net, 4, device="cpu", micro_batches=2)
    reducer = RecordingReducer()
    buckets = GradientBuckets(net, reducer, bucket_bytes=8330, first_bucket_bytes=700,
                              passes=ex.micro_batches)
    ex.add_observer(buckets)
    passes = []

    class Pass(StepObserver):
        def layer(self, phase, name, index, start, end):
            if phase == "backward" and name == net.nodes[0].name:  # a pass's last backward
                passes.append(len(reducer.started))

    ex.add_observer(Pass())
    x, y = batches(1, 4)[0]
    ex.accumulate_gradients(x, y)
    assert passes == [0, 3]   # nothing after the first pass; every bucket by the second's end
    buckets.finish()
    assert reducer.started[-1] == "finish" and len(reducer.started) == 4
    ex.close()


# ---- N ranks against one process -------------------------------------------------------------
def _train_steps(ex, opt, data, rows):
    for x, y in data:
        ex.train_step(x[rows], y[rows], opt)


def _rank_main(rank, size, rendezvous, out, fail_at=None, failing_rank=1):
    """One rank: the tiny net in float64 on its rows of each global batch."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"   # rank 0 of a file rendezvous: loopback only
    world = World(size, rank, rank, rendezvous)
    net = tiny_net()
    dp = DataParallel(world, GLOBAL_BATCH, timeout=20, check_every=1)
    try:
        dp.connect(dp.select_device("cpu"))
        ex = Executor(net, dp.local_batch, device="cpu", seed=3, batch_offset=dp.batch_offset,
                      global_batch=GLOBAL_BATCH)
        opt = dp.attach(ex, SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3))
        for step, (x, y) in enumerate(batches()):
            if step == fail_at and rank == failing_rank:
                raise ValueError(f"rank {rank} cannot go on")
            ex.train_step(x[dp.rows], y[dp.rows], opt)
        ex.close()
    except BaseException as e:
        dp.abort(e)
        with open(f"{out}.rank{rank}.err", "w") as f:
            f.write(f"{type(e).__name__}: {e}")
        raise SystemExit(2)
    dp.close()
    np.savez(f"{out}.rank{rank}.npz", **net.state_dict())


def _run_ranks(size, tmp_path, fail_at=None, failing_rank=1):
    rendezvous = f"file:{tmp_path / 'rendezvous'}"
    out = str(tmp_path / "run")
    procs = [SPAWN.Process(target=_rank_main,
                           args=(r, size, rendezvous, out, fail_at, failing_rank))
             for r in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode is not None for p in procs), "a rank hangs"
    return out, [p.exitcode for p in procs]


def test_two_ranks_train_the_parameters_of_one_process_at_the_global_batch(tmp_path):
    out, codes = _run_ranks(2, tmp_path)
    assert codes == [0, 0]
    ranks = [dict(np.load(f"{out}.rank{r}.npz")) for r in range(2)]
    net = tiny_net()
    ex = Executor(net, GLOBAL_BATCH, device="cpu", seed=3)
    _train_steps(ex, SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3),
                 batches(), slice(None))
    ex.close()
    one = net.state_dict()
    for name, value in one.items():
        # Every rank holds the same bits; they match one process up to float64 rounding
        # (the mean over the batch is summed in two halves).
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
        np.testing.assert_allclose(ranks[0][name], value, rtol=0, atol=1e-12)
    initial = tiny_net()
    initial.init_params(3)
    assert any(np.abs(one[n] - p).max() > 1e-3 for n, p in initial.state_dict().items())


def test_a_rank_that_raises_ends_the_other_with_its_error(tmp_path):
    started = time.monotonic()
    out, codes = _run_ranks(2, tmp_path, fail_at=1)
    assert codes == [2, 2]
    assert time.monotonic() - started < 20          # well within the 20 s collective timeout
    with open(f"{out}.rank0.err") as f:
        assert f.read() == "RankFailedError: rank 1 failed: ValueError: rank 1 cannot go on"


def _silent_rank(rendezvous):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    group = SocketGroup(World(2, 1, 1, rendezvous), timeout=10)
    time.sleep(8)          # connected, but never takes part
    group.close()


def test_a_collective_gives_up_after_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")   # rank 0 listens on loopback only
    rendezvous = f"file:{tmp_path / 'rendezvous'}"
    peer = SPAWN.Process(target=_silent_rank, args=(rendezvous,))
    peer.start()
    try:
        group = SocketGroup(World(2, 0, 0, rendezvous), timeout=0.5, connect_timeout=10)
        t0 = time.monotonic()
        with pytest.raises(CollectiveError, match="rank 1 sent nothing for 0.5 s"):
            group.all_reduce_sum([np.ones(3)])
        assert time.monotonic() - t0 < 3
        group.close()
    finally:
        peer.terminate()
        peer.join()


def test_every_rank_names_the_rank_where_the_failure_started(tmp_path):
    # Rank 2 talks to rank 0 only; rank 0 passes the abort on to rank 1.
    out, codes = _run_ranks(3, tmp_path, fail_at=2, failing_rank=2)
    assert codes == [2, 2, 2]
    for r in (0, 1):
        with open(f"{out}.rank{r}.err") as f:
            assert f.read() == "RankFailedError: rank 2 failed: ValueError: rank 2 cannot go on"


# ---- the command line ------------------------------------------------------------------------
def minidnn(*args, timeout=90):
    path = os.environ.get("PYTHONPATH")   # what the machine needs on it (its GPU packages)
    env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + path if path else ""))
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return subprocess.run([sys.executable, "-m", "minidnn", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


SMALL = ["train", "--model", "tiny_cnn", "--image-size", "16", "--batch", "16", "--device",
         "cpu", "--eval-every", "0", "--eval-batches", "2", "--no-progress", "--log-every", "2"]


def test_ranks_on_the_command_line_train_what_one_process_trains(tmp_path):
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    r1 = minidnn(*SMALL, "--steps", "4", "--report", str(one))
    trace = tmp_path / "trace.json"
    r2 = minidnn(*SMALL, "--steps", "4", "--report", str(two), "--ranks", "2", "--trace",
                 str(trace))
    assert r1.returncode == 0, r1.stderr
    assert r2.returncode == 0, r2.stderr
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
    assert b["world_size"] == 2 and b["batch"] == 16 and b["batch_per_rank"] == 8
    assert b["ranks_agree"] and len(set(b["rank_param_checksums"])) == 1
    assert b["param_checksum"] == b["rank_param_checksums"][0]
    assert b["eval"][-1]["images"] == a["eval"][-1]["images"]
    assert r2.stdout.count("images/s") == 1            # rank 0 alone speaks
    # The trace of rank 0's last step shows the bucket's all-reduce on a track of its own.
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    reduces = [e for e in events if e.get("cat") == "allreduce"]
    assert [e["name"] for e in reduces] == ["all-reduce bucket 0"]
    assert reduces[0]["tid"] == tracks["allreduce stream"]
    assert reduces[0]["args"]["bytes"] == 38570 * 4


class _OneWayGroup:
    """Stands in for a rank's socket group in broadcast_object: rank 0 leaves its value in
    `sent`, the other rank takes it from there."""
    def __init__(self, sent: list):
        self.sent = sent

    def broadcast_object(self, obj=None, what=""):
        if obj is not None:
            self.sent.append(json.loads(json.dumps(obj)))   # as a JSON message carries it
            return obj
        return self.sent[-1]


class _Rank:
    def __init__(self, is_main, sent):
        self.is_main, self.group = is_main, _OneWayGroup(sent)


def test_ranks_under_dyn_plan_from_rank_zeros_profiles(tmp_path, monkeypatch):
    """Rank 0 measures and plans; rank 1 plans the same step from rank 0's profiles and
    measures nothing (each measuring its own, they could plan different steps)."""
    from minidnn import models
    from minidnn.planner import profile as profile_module
    from minidnn.planner.dyn import DynPolicy
    from minidnn.spec import StepSpec
    from minidnn.train import plan_from_rank_zero
    from minidnn.decide import decide
    from minidnn.planner import InfeasibleBudgetError
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "cache"))
    sent: list = []

    def spec_of(policy, budget):
        return StepSpec(batch=8, policy=policy, memory_budget=budget, micro_batches=2,
                        chunks=())

    # The least budget: a step that must move or rebuild maps to fit.
    with pytest.raises(InfeasibleBudgetError) as refused:
        decide(models.build("tiny_cnn", num_classes=10, image_size=16),
               spec_of(DynPolicy(log=lambda *_: None), 4096), device="cpu")
    least = int(refused.value.minimum)

    def plan(is_main):
        net = models.build("tiny_cnn", num_classes=10, image_size=16)
        policy = DynPolicy(log=lambda *_: None)
        return plan_from_rank_zero(_Rank(is_main, sent), net, spec_of(policy, least), "cpu",
                                   policy)

    first = plan(True)
    assert sent and sent[0], "rank 0 sent no profiles"

    def measure_nothing(*args, **kwargs):
        raise AssertionError("rank 1 measured a profile of its own")
    monkeypatch.setattr(profile_module, "measure_profile", measure_nothing)
    monkeypatch.setenv("MINIDNN_CACHE", str(tmp_path / "another cache"))   # none to read
    second = plan(False)
    assert (second.offload, second.recompute, second.micro_batches, second.conv_algo) == \
        (first.offload, first.recompute, first.micro_batches, first.conv_algo)
    assert first.offload or first.recompute     # a step the budget made the planner plan


def test_resume_needs_the_same_number_of_ranks_and_continues_bit_for_bit(tmp_path):
    straight, resumed = tmp_path / "straight.json", tmp_path / "resumed.json"
    ckpt = str(tmp_path / "run.npz")
    r = minidnn(*SMALL, "--steps", "4", "--ranks", "2", "--report", str(straight))
    assert r.returncode == 0, r.stderr
    b = json.loads(straight.read_text())
    r = minidnn(*SMALL, "--steps", "2", "--ranks", "2", "--checkpoint", ckpt)
    assert r.returncode == 0, r.stderr
    r = minidnn(*SMALL, "--steps", "4", "--checkpoint", ckpt, "--resume")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"minidnn: error: checkpoint {ckpt!r} was written by a run "
                                f"of 2 rank(s); resume it with --ranks 2, not 1")
    r = minidnn(*SMALL, "--steps", "4", "--ranks", "2", "--checkpoint", ckpt, "--resume",
                "--report", str(resumed))
    assert r.returncode == 0, r.stderr
    c = json.loads(resumed.read_text())
    assert c["loss"] == b["loss"][2:]
    assert c["param_checksum"] == b["param_checksum"]


FAILING_MODEL = '''
import os
from minidnn import Network
from minidnn.errors import DataError
from minidnn.layers import Flatten, Layer, Linear

class FailsOnRank1(Layer):
    def infer(self, in_shapes):
        return in_shapes[0]
    def forward(self, xs, y, aux, ctx):
        if os.environ.get("RANK") == "1" and ctx.step == 2:
            raise DataError("rank 1 cannot read its batch")
        y[...] = xs[0]
    def backward(self, xs, y, gy, gxs, aux, ctx):
        gxs[0][...] = gy

def build(num_classes, image_size):
    return Network.sequential((3, image_size, image_size), [
        Flatten(name="flat"), FailsOnRank1(name="fail"), Linear(num_classes, name="fc")],
        num_classes=num_classes, name="failing")
'''


def test_a_failing_rank_ends_the_run_with_one_error(tmp_path):
    model = tmp_path / "failing.py"
    model.write_text(FAILING_MODEL)
    t0 = time.monotonic()
    r = minidnn(*SMALL, "--steps", "6", "--ranks", "2", "--collective-timeout", "15",
                "--model", str(model))
    assert time.monotonic() - t0 < 30
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert errors == ["minidnn: error: rank 1: rank 1 cannot read its batch"], r.stderr
    assert r.returncode == 2


def test_the_global_batch_must_divide_over_the_ranks():
    r = minidnn(*SMALL, "--steps", "1", "--ranks", "3")
    assert r.returncode == 2
    assert "must divide evenly over 3 ranks" in r.stderr
    assert r.stderr.count("minidnn: error:") == 1


@pytest.mark.gpu
def test_two_gpus_train_alike_over_nccl(tmp_path):
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    out = tmp_path / "two.json"
    r = minidnn("train", "--model", "tiny_cnn", "--image-size", "32", "--batch", "64",
                "--steps", "20", "--device", "gpu", "--no-progress", "--ranks", "2",
                "--eval-every", "0", "--report", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["collective"] == "nccl" and report["ranks_agree"]


def one_step_on_one_and_two_gpus(tmp_path, model, image_size, batch, *two_gpu_flags):
    """({name: array} after one step on one GPU, the same on two GPUs at the same global
    batch, the initial values); float32 without TF32, no momentum."""
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    from minidnn import models
    from minidnn.checkpoint import load_checkpoint
    common = ["train", "--model", model, "--image-size", str(image_size), "--batch", str(batch),
              "--steps", "1", "--device", "gpu", "--no-progress", "--eval-every", "0",
              "--math", "fp32", "--deterministic", "--momentum", "0", "--lr", "0.05"]
    ckpt = {n: str(tmp_path / f"{n}.npz") for n in ("one", "two")}
    r = minidnn(*common, "--checkpoint", ckpt["one"], timeout=300)
    assert r.returncode == 0, r.stderr
    r = minidnn(*common, "--ranks", "2", *two_gpu_flags, "--checkpoint", ckpt["two"],
                timeout=300)
    assert r.returncode == 0, r.stderr
    net = models.build(model, num_classes=10, image_size=image_size)
    net.init_params(0)
    one, two = (load_checkpoint(ckpt[n]).params for n in ("one", "two"))
    return one, two, net.state_dict()


def assert_the_same_step(one, two, start):
    """Every parameter and buffer of `two` is `one`'s within 1e-3 of the step's size and two
    float32 spacings near the values (a BatchNorm weight near 1 moves by 1e-4: one rounding
    is 1e-3 of that step; on the CPU the largest difference is one such rounding)."""
    for name, value in one.items():
        if name.endswith("num_batches_tracked"):
            continue
        step = np.abs(value - start[name]).max()
        spacing = np.finfo(np.float32).eps * np.abs(value).max()
        assert np.abs(two[name] - value).max() <= 1e-3 * step + 2 * spacing, name


@pytest.mark.gpu
def test_two_gpus_step_as_one_gpu_at_the_global_batch_over_nccl(tmp_path):
    """The NCCL path's mean (sum, then mean.divide_by_ranks on its stream): after one step
    two GPUs hold one GPU's parameters at the same global batch. Without the division the
    two-GPU step would be twice as long: a difference as large as the step itself."""
    one, two, start = one_step_on_one_and_two_gpus(tmp_path, "tiny_cnn", 32, 64)
    assert all(np.abs(one[n] - start[n]).max() > 0 for n in one)
    assert_the_same_step(one, two, start)


@pytest.mark.gpu
def test_two_gpus_with_synchronized_batchnorm_step_as_one_gpu(tmp_path):
    """--sync-batchnorm over NCCL: a ResNet's step on two GPUs is one GPU's at the global
    batch. Each GPU's own statistics make another step (on the CPU: 1.8 times the step's
    size apart)."""
    one, two, start = one_step_on_one_and_two_gpus(tmp_path, "resnet18", 32, 16,
                                                   "--sync-batchnorm")
    assert_the_same_step(one, two, start)


WATCHDOG = """
import time
from minidnn.distributed.data_parallel import _Watchdog

class Reducer:
    def abort(self):
        print("communicator aborted", flush=True)

dog = _Watchdog(rank=1, timeout=0.5, reducer=Reducer())
for _ in range(3):          # steps that finish keep it quiet
    time.sleep(0.2)
    dog.beat()
time.sleep(10)              # a step that never ends (an all-reduce whose peer died)
print("not reached")
"""


def test_a_gpu_rank_whose_step_never_ends_is_ended_by_its_watchdog():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", WATCHDOG], capture_output=True, text=True,
                       cwd=ROOT, timeout=30)
    assert r.returncode == 2
    assert time.monotonic() - t0 < 8
    assert r.stdout == "communicator aborted\n"
    assert r.stderr.strip() == ("minidnn: error: rank 1: no training step finished for 0.5 s "
                                "(collective timeout): a peer failed or hangs")
