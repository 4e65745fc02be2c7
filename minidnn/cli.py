"""The `minidnn` command: train a network, plan its memory, or print its layers and memory.

    minidnn train                        the main job: AlexNet on drawn shapes (CPU or GPU)
    minidnn train --model vgg16 --data synthetic --batch 64 --policy all --memory-budget 12GiB
    minidnn train --model vgg16 --data synthetic --batch 256 --policy dyn --memory-budget 12GiB
    minidnn plan --model vgg16 --batch 256 --memory-budget 12GiB     (planner/command.py)
    minidnn summary --model alexnet --batch 128
    minidnn models

--policy dyn (vDNN_dyn) profiles the network on the device once, then lets the planner choose
what to offload or recompute and which convolution plan each convolution runs; `minidnn plan`
shows that plan, and its predicted memory and speed, before anything runs.

Every minidnn error (bad argument, missing data, corrupt checkpoint, memory budget, host
memory exhausted) prints as one line `minidnn: error: ...` and exits with status 2; so do
argument errors. SIGINT (Ctrl-C) and SIGTERM stop `train` after the step under way, write its
checkpoint and report, and exit 130 / 143; a second signal stops it at once, with a partial
report and one error line (minidnn/stopping.py). Output into a pipe that closes early
(`| head`) does not stop the training: the rest of the output is dropped and the status is 2;
`summary`, `models` and `plan` just end, quietly, with status 0.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import argtypes
from .applies import refuse_unused_flags
from .errors import ConfigError, MinidnnError, fmt_bytes
from .kernels.mapformat import LAYOUTS, PRECISIONS
from .kernels.math_mode import MATH_MODES
from .outputs import check_outputs, plot_formats
from .planner.planning import RELU_BITS_GAIN
from .recipe import AUTO, EVAL_BATCHES_OF_STEPS, EVAL_EVERY_OF_STEPS
from .train import Interrupted, TrainConfig


class UsageError(Exception):
    """An argument the parser rejected (printed like every other error: one line, status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the usage block and exit
        raise UsageError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    parser = _Parser(prog="minidnn", description="A small deep-learning framework whose memory "
                     "manager virtualizes GPU memory (vDNN).")
    from .version import __version__
    parser.add_argument("--version", action="version", version=f"minidnn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    t = sub.add_parser("train", help="train a network (no options: the main job)",
                       description="Train a network. With no options: the main job, AlexNet "
                       f"on drawn shapes at 64x64 pixels, batch {d.batch}, {d.steps} steps, on "
                       "the GPU when there is one, else on the CPU.")
    _add_run_arguments(t, d)
    _add_memory_arguments(t, d)
    _add_output_arguments(t, d)
    _add_recipe_arguments(t, d)
    _add_ranks_arguments(t, d)

    _add_summary_parser(sub)
    sub.add_parser("models", help="list the built-in models")
    from .planner import command as plan_command
    plan_command.add_parser(sub)
    return parser


def _add_run_arguments(t, d: TrainConfig) -> None:
    """`train`: the network, the data, the optimizer and the device."""
    t.add_argument("--model", default=d.model, metavar="NAME|PATH",
                   help=f"built-in model (see 'minidnn models') or a .py file defining "
                        f"build(num_classes, image_size) (default {d.model})")
    t.add_argument("--batch", type=argtypes.positive_int, default=d.batch, metavar="N",
                   help=f"images per step (default {d.batch})")
    t.add_argument("--image-size", type=argtypes.positive_int, default=None, metavar="S",
                   help="height = width of the input images (default: 64 for shapes, 32 for "
                        "CIFAR-10, each raised to the model's minimum; the model's native size "
                        "for synthetic data and image folders)")
    t.add_argument("--steps", type=argtypes.count, default=None, metavar="N",
                   help=f"train until this step (default {d.steps}; with --resume the total)")
    t.add_argument("--device", choices=("auto", "cpu", "gpu"), default=d.device,
                   help="auto: the GPU when CuPy sees one, else the CPU (default auto)")
    t.add_argument("--seed", type=argtypes.count, default=d.seed,
                   help=f"seeds initialisation, batch order and dropout (default {d.seed})")
    t.add_argument("--lr", type=argtypes.positive_float, default=d.lr,
                   help=f"SGD learning rate (default {d.lr})")
    t.add_argument("--momentum", type=argtypes.fraction, default=d.momentum,
                   help=f"SGD momentum (default {d.momentum})")
    t.add_argument("--weight-decay", type=argtypes.non_negative_float, default=d.weight_decay,
                   help=f"L2 weight decay (default {d.weight_decay})")
    t.add_argument("--data", default=d.data,
                   metavar="shapes|synthetic|PATH|cifar10:PATH|fashion-mnist[:DIR]|mnist:DIR",
                   help="shapes: drawn shapes, 10 classes (default); synthetic: random "
                        "ImageNet-shaped batches; PATH: an image folder with one subfolder per "
                        "class; cifar10:PATH: the CIFAR-10 python batches; fashion-mnist: the "
                        "IDX files where Debian's dataset-fashion-mnist puts them, or in DIR; "
                        "mnist:DIR: MNIST's IDX files (gzipped or not)")
    t.add_argument("--num-classes", type=argtypes.positive_int, default=None, metavar="K",
                   help="classes (default: what the data has; synthetic 1000)")


def _add_memory_arguments(t, d: TrainConfig) -> None:
    """`train`: the memory policy, its budget, the splits and the step's numerics."""
    from .decide import policy_names
    t.add_argument("--policy", default=d.policy, metavar="|".join(policy_names()),
                   help="which feature maps to offload to host memory: none; all (vDNN_all: "
                        "every map backward needs); conv (vDNN_conv: the inputs of conv "
                        "layers); dyn (vDNN_dyn: what the planner chooses for the memory "
                        "budget, with each convolution's plan; see 'minidnn plan') "
                        "(default none)")
    t.add_argument("--memory-budget", type=argtypes.size, default=None, metavar="SIZE",
                   help="device memory budget, e.g. 12GiB or 512MB: KiB, MiB, GiB are powers "
                        "of 1024, K/KB, M/MB, G/GB powers of 1000 (default: none)")
    t.add_argument("--prefetch-lookahead", type=argtypes.count, default=None,
                   metavar="N", help=f"layers ahead to prefetch offloaded maps in backward "
                        f"(default {d.prefetch_lookahead}; with --policy dyn the plan chooses "
                        f"it; refused under --policy none, which offloads nothing)")
    t.add_argument("--relu-bits", action="store_true",
                   help="ReLUs whose output no other layer keeps (before a max-pool or a "
                        "dropout) keep one bit per value for backward instead: lossless, and "
                        "those maps are free after forward. Under --policy dyn with a budget "
                        "the plan leaves them off where the step fits without them and is "
                        f"predicted at least {RELU_BITS_GAIN * 100:.0f}%% faster (a convolution then "
                        "applies its ReLU in its epilogue), and says so")
    t.add_argument("--micro-batches", type=argtypes.positive_int, default=None, metavar="K",
                   help="run each step as K passes over equal parts of the batch (K divides "
                        "it), gradients accumulated, one update, at about the speed of the "
                        "whole batch: feature maps of batch/K, while weights, their gradients "
                        "and momentum do not shrink, and each pass after the first sums a "
                        "convolution's weight gradients through a temporary as large as its "
                        "weights (a fully connected layer's are computed once a step from "
                        "the rows of its input and output gradient every pass keeps, where "
                        "those are smaller than its weight) (default: 1)")
    t.add_argument("--chunks", type=argtypes.layer_chunks, default=None,
                   metavar="FIRST:LAST:PIECES",
                   help="run the layers FIRST..LAST of each pass in PIECES pieces of its "
                        "batch, forward and backward (comma-separate several runs; 'none': "
                        "no chunks); needs --policy dyn, which otherwise weighs chunks "
                        "itself under a budget")
    t.add_argument("--split-batch-statistics", action="store_true",
                   help="allow --micro-batches in a network with BatchNorm, which then "
                        "normalizes each micro-batch with its own statistics (without it, "
                        "--policy dyn keeps such a network to one pass, and under a budget "
                        "where a split would be 1.2x faster or more, says how much in a note)")
    t.add_argument("--math", choices=MATH_MODES, default=None,
                   help="GPU float32 math: tf32 (the kernels' default, as PyTorch's convs) or "
                        "strict fp32")
    t.add_argument("--deterministic", action="store_true",
                   help="the same bits under every policy, budget and split: sums over the "
                        "batch run in fixed slices of batch/8 images (batch over its largest "
                        "power-of-two divisor up to 8), added in one order, so a step splits "
                        "into at most 8 parts, micro-batches times chunk pieces (dyn weighs "
                        "no finer split; a forced one is refused); with "
                        "--split-batch-statistics BatchNorm then normalizes each slice with "
                        "its own statistics, split or not. GPU: "
                        "also only deterministic algorithms, each convolution on its "
                        "memory-optimal plan (slower). Not promised across --ranks, "
                        "--precision or --layout")
    t.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (default) or bf16: mixed precision, bf16 feature maps and their "
                        "gradients, float32 weights, weight gradients, optimizer state and loss")
    t.add_argument("--no-graphs", action="store_true",
                   help="GPU: issue every step layer by layer from the host, none replayed "
                        "from a CUDA graph of an earlier step (the same bits either way)")
    t.add_argument("--no-fuse", action="store_true",
                   help="run every layer in its own passes: no convolution bias and ReLU "
                        "applied by the convolution (float32 maps: on the GPU in its cuDNN "
                        "graph, the same arithmetic on engines whose sums may be ordered "
                        "otherwise, so within TF32 tolerance of this), no bias added in the "
                        "ReLU after it, no ReLU applied (and its gradient masked) by the batch "
                        "norm or residual add before it, no residual add applied by the batch "
                        "norm before it, no ReLU gradient masked (nor ReLU applied) by the "
                        "max pool after it, whose ReLU then keeps its output for backward, "
                        "no gradient sum "
                        "taken over by the residual add before it (the same bits; "
                        "minidnn/fusion.py)")
    t.add_argument("--layout", choices=LAYOUTS, default=None,
                   help="feature maps nchw or nhwc: channels last, as cuDNN's NHWC "
                        "convolutions take them (default: nhwc on the GPU, nchw on the CPU, "
                        "which runs nhwc through its reference kernels); parameters keep "
                        "PyTorch's layouts in checkpoints")


def _add_output_arguments(t, d: TrainConfig) -> None:
    """`train`: evaluation, checkpoints, the report and the other files a run writes."""
    t.add_argument("--eval-every", type=argtypes.count, default=None, metavar="N",
                   help=f"evaluate on held-out data every N steps and at the end; 0: only at "
                        f"the end (default {EVAL_EVERY_OF_STEPS}; with --epochs 0, as every "
                        f"epoch ends with one)")
    t.add_argument("--eval-batches", type=_eval_batches, default=None, metavar="N|all",
                   help=f"held-out batches per evaluation; all: every held-out image, the "
                        f"last partial batch too (default {EVAL_BATCHES_OF_STEPS}; with --epochs "
                        f"all)")
    t.add_argument("--checkpoint", default=None, metavar="PATH",
                   help="write a checkpoint here (atomically) at the end and every "
                        "--checkpoint-every steps")
    t.add_argument("--checkpoint-every", type=argtypes.count, default=d.checkpoint_every,
                   metavar="N", help="also write the checkpoint every N steps; 0: only at the "
                   f"end (default {d.checkpoint_every}; needs --checkpoint)")
    t.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint (bit-identical to an uninterrupted run)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the minidnn checkpoint at --checkpoint with this run's (without "
                        "it an existing checkpoint is only continued, by --resume; a file that "
                        "is not a minidnn checkpoint is never replaced)")
    t.add_argument("--report", default=None, metavar="PATH",
                   help="write the run report (JSON) here")
    t.add_argument("--trace", default=None, metavar="PATH",
                   help="write a Chrome trace (JSON, opens in Perfetto) of compute and copies")
    t.add_argument("--trace-held", action="store_true",
                   help="with --trace, on a GPU: hold the compute stream before each traced "
                        "layer call so that its span is the device's time for the call, not "
                        "the host's to issue it (passes of a few images); the traced step "
                        "runs slower by the holds")
    t.add_argument("--plot", default=None, metavar="PATH",
                   help="write a PNG of device memory over a step")
    t.add_argument("--log-every", type=argtypes.positive_int, default=d.log_every, metavar="N",
                   help=f"read the loss back from the device every N steps (default "
                        f"{d.log_every})")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--force", action="store_true",
                   help="train on the CPU even when the estimate (3 x the forward FLOPs a "
                        "step, at this CPU's measured rate) says the run takes over an hour "
                        "or a step over 5 minutes; a run that needs more RAM than is "
                        "available is refused regardless")


def _add_summary_parser(sub) -> None:
    """`summary`: a network's layers, parameters and memory."""
    s = sub.add_parser("summary", help="print a network's layers, parameters and memory",
                       description="Print every layer of a network with its output shape, "
                       "parameters, feature-map size and FLOPs, and the memory a training "
                       "step needs.")
    s.add_argument("--model", required=True, metavar="NAME|PATH",
                   help="built-in model (see 'minidnn models') or a .py model file")
    s.add_argument("--batch", type=argtypes.positive_int, default=1, metavar="N",
                   help="images per step, for the shapes and memory (default 1)")
    s.add_argument("--image-size", type=argtypes.positive_int, default=None, metavar="S",
                   help="height = width of the images (default: the model's native size)")
    s.add_argument("--num-classes", type=argtypes.positive_int, default=1000, metavar="K",
                   help="classes of the last layer (default 1000)")


def _eval_batches(text: str):
    """--eval-batches: a positive integer, or 'all' (the whole held-out set)."""
    return "all" if text == "all" else argtypes.positive_int(text)


def _add_recipe_arguments(t, d: TrainConfig) -> None:
    """Training recipes (minidnn/recipe.py): epochs, learning-rate schedule, label smoothing,
    augmentation and the per-epoch curve."""
    from .lr_schedule import SCHEDULES
    g = t.add_argument_group("training recipe")
    g.add_argument("--epochs", type=argtypes.positive_int, default=None, metavar="N",
                   help="train N passes over the training set instead of --steps (an epoch is "
                        "floor(training images / batch) steps); evaluates the whole held-out "
                        "set after every epoch")
    g.add_argument("--lr-schedule", choices=SCHEDULES, default=d.lr_schedule,
                   help="the learning rate over the run: constant; cosine decay towards 0; step: "
                        "x0.1 at half and again at three quarters of the steps after warm-up "
                        f"(default {d.lr_schedule})")
    g.add_argument("--warmup-steps", type=argtypes.count, default=d.lr_warmup_steps,
                   metavar="N", help="learning-rate warm-up: rise linearly to --lr over the "
                                     "first N steps")
    g.add_argument("--warmup-epochs", type=argtypes.count, default=d.lr_warmup_epochs,
                   metavar="N", help="the warm-up in epochs instead")
    g.add_argument("--label-smoothing", type=argtypes.fraction, default=d.label_smoothing,
                   metavar="EPS", help="cross-entropy against (1 - EPS) one-hot + EPS / classes "
                                       "(default 0)")
    g.add_argument("--augment", default=d.augment, metavar="crop[:P],flip,erase[:P]|none",
                   help="augment training batches in the loader: random crop after padding "
                        "P pixels (default 4), horizontal flip, random erasing of a rectangle "
                        "with probability P (default 0.5) (default none)")
    g.add_argument("--curve", default=None, metavar="FILE.png",
                   help="with --epochs: draw the training loss and held-out accuracy per "
                        "epoch (needs matplotlib)")


def _recipe_settings(args, d: TrainConfig) -> dict:
    """TrainConfig fields of the recipe flags; --epochs and --steps exclude each other.
    Evaluation not given follows the run's length in TrainConfig (recipe.evaluation_defaults:
    --epochs evaluates every epoch on the whole held-out set)."""
    if args.epochs is not None and args.steps is not None:
        raise UsageError(f"--epochs {args.epochs} and --steps {args.steps}: give one of them")
    eval_batches = AUTO if args.eval_batches is None else args.eval_batches
    return dict(
        steps=d.steps if args.steps is None else args.steps, epochs=args.epochs,
        eval_every=AUTO if args.eval_every is None else args.eval_every,
        eval_batches=None if eval_batches == "all" else eval_batches,
        lr_schedule=args.lr_schedule, lr_warmup_steps=args.warmup_steps,
        lr_warmup_epochs=args.warmup_epochs, label_smoothing=args.label_smoothing,
        augment=args.augment, curve=args.curve)


def _add_ranks_arguments(t, d: TrainConfig) -> None:
    """Data-parallel training (minidnn/distributed): several ranks, one per GPU."""
    g = t.add_argument_group("several GPUs (data parallel)")
    g.add_argument("--ranks", type=argtypes.positive_int, default=None, metavar="N",
                   help="train on N ranks, one process per GPU; --batch stays the global batch, "
                        "split evenly. Alone: starts N ranks on this host. Under torchrun "
                        "(WORLD_SIZE set) or with --rank: must equal the number of ranks")
    g.add_argument("--rank", type=argtypes.count, default=None, metavar="R",
                   help="this process is rank R of --ranks N started by hand on each host "
                        "(torchrun sets RANK instead)")
    g.add_argument("--local-rank", type=argtypes.count, default=None, metavar="L",
                   help="this rank's GPU on its host (default: the rank; torchrun sets "
                        "LOCAL_RANK)")
    g.add_argument("--rendezvous", default=None, metavar="tcp://HOST:PORT|file:PATH",
                   help="where the ranks meet: rank 0's address and a free port, or a file "
                        "every host sees (default: MASTER_ADDR and MASTER_PORT). Ranks prove "
                        "they belong to the run with the secret in MINIDNN_RUN_SECRET, the same "
                        "on every rank (--ranks N alone draws one; a file rendezvous carries "
                        "rank 0's)")
    g.add_argument("--sync-batchnorm", action="store_true",
                   help="BatchNorm normalizes with the mean and variance of the whole global "
                        "batch, summed over the ranks in forward and backward, so N ranks "
                        "train what one process trains at --batch (costs 3 small exchanges "
                        "per BatchNorm layer and step; not with --precision bf16 on GPUs yet). "
                        "Default: each rank normalizes with its own rows, and rank 0's running "
                        "mean and variance go to every rank after each step, as PyTorch's "
                        "DistributedDataParallel does")
    g.add_argument("--collective-timeout", type=argtypes.positive_float,
                   default=d.collective_timeout, metavar="S",
                   help=f"seconds a rank waits for the others before it gives up (default "
                        f"{d.collective_timeout:g})")
    g.add_argument("--host-link-gbps", type=argtypes.positive_float, default=None,
                   metavar="GB/S", help="--policy dyn plans with pinned copies at most this "
                   "fast each way: what each GPU gets with all ranks offloading at once "
                   "(scripts/bench_host_link.py measures it)")


def _world(args):
    """(this process's distributed.World or None, whether to start --ranks processes)."""
    from .distributed import resolve_world
    _check_rendezvous_file(args.rendezvous)
    world = resolve_world(args.ranks, args.rank, args.local_rank, args.rendezvous)
    start = world is None and (args.ranks or 1) > 1
    if args.sync_batchnorm and world is None and not start:
        raise ConfigError("--sync-batchnorm needs --ranks N with N > 1 (one process "
                          "normalizes with its whole batch already)")
    return world, start


def _check_rendezvous_file(spec) -> None:
    """--rendezvous file:PATH: rank 0 writes PATH, the others read it, so its folder must
    exist (shared by every host): one line now rather than a traceback from rank 0."""
    if not spec or not str(spec).startswith("file:") or not spec[len("file:"):]:
        return
    folder = os.path.dirname(os.path.abspath(spec[len("file:"):]))
    if not os.path.isdir(folder):
        raise UsageError(f"--rendezvous {spec}: the folder {folder!r} does not exist; give a "
                         f"file in a folder that every host of the run sees")


class _PipeSafeOutput:
    """sys.stdout for a run: when the reader of a pipe goes away (`minidnn train | head`), the
    rest of the output is dropped instead of a BrokenPipeError ending the training. `broken`
    says whether it happened."""

    def __init__(self, stream):
        self.stream = stream
        self.broken = False

    def write(self, text):
        if not self.broken:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self):
        if not self.broken:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.broken = True
        try:  # the interpreter flushes stdout at exit too: point the descriptor at /dev/null
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):  # isatty, encoding, fileno...: the stream's own
        return getattr(self.stream, name)


def _train(args, argv: list[str]) -> int:
    out = _PipeSafeOutput(sys.stdout)
    sys.stdout = out
    try:
        code = _run_training(args, argv)
        out.flush()
    finally:
        sys.stdout = out.stream
    if out.broken:
        print("minidnn: error: standard output was closed before the run ended (a pipe such "
              "as '| head'); the training went on to the end and wrote its files",
              file=sys.stderr)
        return 2
    return code


def _run_training(args, argv: list[str]) -> int:
    from .train import summary_lines, train
    world, start_ranks = _world(args)
    if start_ranks:
        from .distributed.data_parallel import split_batch
        from .distributed.launch import launch
        split_batch(args.batch, args.ranks)   # before starting any rank
        return launch(argv, args.ranks)
    cfg = TrainConfig(
        model=args.model, batch=args.batch, image_size=args.image_size,
        device=args.device, seed=args.seed, lr=args.lr, momentum=args.momentum,
        weight_decay=args.weight_decay, data=args.data, num_classes=args.num_classes,
        policy=args.policy, memory_budget=args.memory_budget,
        prefetch_lookahead=(TrainConfig.prefetch_lookahead if args.prefetch_lookahead is None
                            else args.prefetch_lookahead), relu_bits=args.relu_bits, math=args.math,
        micro_batches=args.micro_batches, split_batch_statistics=args.split_batch_statistics,
        chunks=args.chunks,
        deterministic=args.deterministic, precision=args.precision, layout=args.layout,
        graphs=not args.no_graphs, fuse=not args.no_fuse, checkpoint=args.checkpoint,
        checkpoint_every=args.checkpoint_every, resume=args.resume, overwrite=args.overwrite,
        report=args.report, trace=args.trace, trace_held=args.trace_held, plot=args.plot,
        progress=not args.no_progress,
        log_every=args.log_every, force=args.force, collective_timeout=args.collective_timeout,
        sync_batchnorm=args.sync_batchnorm, host_link_gbps=args.host_link_gbps,
        **_recipe_settings(args, TrainConfig()))
    refuse_unused_flags(cfg, given={"--prefetch-lookahead"}
                        if args.prefetch_lookahead is not None else ())
    report = train(cfg, world=world)
    if world is not None and not world.is_main:
        return 0   # rank 0 speaks for the run
    for line in summary_lines(report):
        print(line)
    for what, path in (("report", cfg.report), ("checkpoint", cfg.checkpoint),
                       ("trace", cfg.trace), ("memory plot", cfg.plot),
                       ("training curve", cfg.curve)):
        if path:
            print(f"{what}: {path}")
    return 0


def _summary(args) -> int:
    from . import models
    from .memory.plan import LivenessPlan
    net = models.build(args.model, num_classes=args.num_classes, image_size=args.image_size)
    print(net.summary(args.batch))
    plan = LivenessPlan(net, args.batch)
    param_bytes = net.num_params() * net.dtype.itemsize
    print(f"parameters: {fmt_bytes(param_bytes)} (three times that with gradients and "
          f"momentum)")
    print(f"feature, aux and gradient maps of one training step: "
          f"{fmt_bytes(plan.network_wide_bytes())} allocated network-wide, "
          f"{fmt_bytes(plan.liveness_peak_bytes())} at the liveness peak")
    return 0


def _models() -> int:
    from . import models
    for name in models.names():
        s = models.spec(name)
        print(f"{name:<10} {s.native_image_size:>4}px  min {models.min_image_size(name):>3}px  "
              f"{s.description}")
    print("any vgg<depth> with depth 11, 13 or >= 16 also builds; or give a .py file")
    return 0


def _printing(args) -> int:
    """summary, models and plan: commands that only print. A reader that stops early
    (`| head -1`) ends them quietly with status 0: it has what it wanted."""
    try:
        if args.command == "summary":
            return _summary(args)
        if args.command == "plan":
            from .planner import command as plan_command
            _check_figure_paths(args)
            code = plan_command.run(args)
            sys.stdout.flush()   # a closed pipe shows here, not at the interpreter's exit
            return code
        return _models()
    except BrokenPipeError:
        _PipeSafeOutput(sys.stdout)._drop()   # the exit's flush must not fail either
        return 0


def _check_figure_paths(args) -> None:
    """plan's figures (--timeline, --bytes-chart) before the planning: a path matplotlib cannot
    write is one line now, not a traceback after the plan."""
    figures = {option: getattr(args, name, None) for option, name in
               (("--timeline", "timeline"), ("--bytes-chart", "bytes_chart"))}
    if not any(figures.values()):
        return
    try:
        formats = plot_formats()
    except ImportError as e:
        raise UsageError(f"--timeline and --bytes-chart need matplotlib, which does not import "
                         f"({e}); install the 'plot' extra: pip install 'minidnn[plot]'") from e
    check_outputs(figures, formats=dict.fromkeys(figures, formats))


def _record_rank_error(error) -> bool:
    """In a rank started by `--ranks N`: hand the error to the launcher, which prints one
    error for the whole run (True); elsewhere False."""
    from .distributed.launch import launched, record_rank_error
    return launched() and record_rank_error(error)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 error)."""
    from . import import_interrupt
    try:
        import_interrupt.end()   # Ctrl-C is the command's own from here (see below)
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        if args.command == "train":
            return _train(args, list(sys.argv[1:] if argv is None else argv))
        return _printing(args)
    except Interrupted as e:
        print(f"minidnn: error: {e}" if e.hard else f"minidnn: interrupted by {e}",
              file=sys.stderr)
        return e.status
    except (MinidnnError, UsageError) as e:
        if not _record_rank_error(e):
            print(f"minidnn: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # NumPy could not allocate host memory (not a device budget)
        message = f"out of host memory: {e}; try a smaller --batch or --image-size"
        if not _record_rank_error(message):
            print(f"minidnn: error: {message}", file=sys.stderr)
        return 2
    except Exception as e:   # a bug: its traceback follows; a launcher learns of it too
        _record_rank_error(e)
        raise
    except SystemExit as e:  # --help and --version
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        print("minidnn: interrupted", file=sys.stderr)
        return 130
