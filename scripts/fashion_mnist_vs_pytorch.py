"""Fashion-MNIST with minidnn and with PyTorch side by side: accuracy per epoch, time to accuracy.

For each network (--models, default resnet18 and tiny_cnn, built by minidnn for 28x28 grey
input), in one call:

  minidnn            `minidnn.train.train` with the recipe (epochs, SGD, learning-rate
                     schedule, warm-up, label smoothing, augmentation), the whole test set
                     scored after every epoch
  minidnn-F-budget   the same run under --memory-budget F x the first run's peak, --policy dyn
                     (--budget-fraction F, default 0.25; 0: not run), the whole recipe
  minidnn-least-budget
                     when that budget is refused before the first step (less than the
                     parameters, gradients, momentum and inputs with every feature map
                     offloaded), the refusal is recorded and the same run made at the least
                     budget the refusal names
  minidnn-deterministic, minidnn-deterministic-budget
                     with --budget-epochs N, also a pair of N-epoch --deterministic runs (the
                     recipe cut to N epochs): without a budget and with the full run's budget
                     (the least one when the fraction was refused); their bits are compared
                     epoch by epoch (the same bits for every step of N epochs: the budget
                     changes nothing the full run would compute either)
  pytorch-eager      the same network translated layer by layer into torch.nn
                     (bench_vs_pytorch.torch_copy),
                     channels_last, the same initial weights (minidnn's state_dict: PyTorch's
                     layouts), fed the very batches minidnn's loader makes (same order, same
                     augmentation), SGD with the same per-step learning rates and
                     cross_entropy with the same label smoothing
  pytorch-compiled   the same under torch.compile; the compilation (a warm-up step and an
                     evaluation on a copy of the weights, which are then put back) is timed
                     apart and left out of time to accuracy

--eager-epochs N stops PyTorch's eager run after the first N epochs of the same recipe (its
learning rates those of the full run): enough to show its speed beside the compiled run's when
the compiled one is the faster, without spending the whole run on it; --compiled-epochs N does
the same for the compiled run.

Training time is the time of the training steps only (evaluation left out), summed over the
epochs; "time to 94%" is the training time at the end of the first epoch whose test accuracy
reaches --target (0.94); images/s are training images per second of training time. Printed
per epoch for every run, then a table per model (final and best test accuracy, training time,
time to the target, compile time, images/s), minidnn's time to the target against PyTorch's
fastest run, the final accuracy of PyTorch's full runs and of the full budget run against
minidnn's (in points), a refused budget and the least one run instead, and whether each
deterministic budget run's per-epoch training losses and test accuracies are bit-identical to
its unconstrained run's (the --budget-epochs pair always; the full budget run with
--deterministic). Written to --out: results.json
(commit, command, device, every run's epochs) and curves_<model>.png (training loss and test
accuracy per epoch, every run of the model in one figure).

    python3 scripts/fashion_mnist_vs_pytorch.py --data fashion-mnist:/data/fashion-mnist
    python3 scripts/fashion_mnist_vs_pytorch.py --models tiny_cnn --epochs 2 --train-limit 6000
    python3 scripts/fashion_mnist_vs_pytorch.py --no-torch --device cpu --models tiny_cnn \\
        --epochs 1 --train-limit 256 --test-limit 64 --budget-fraction 0   # minidnn alone, CPU
    python3 scripts/fashion_mnist_vs_pytorch.py --models resnet18 --compiled-epochs 2 \\
        --budget-fraction 0                          # minidnn, PyTorch eager, 2 compiled epochs
    python3 scripts/fashion_mnist_vs_pytorch.py --models resnet18 --no-torch \\
        --budget-epochs 2            # minidnn, its 25% (or least) budget run, a 2-epoch pair

A run cut short (a SIGTERM, e.g. from a time limit, or an error) still writes results.json and
the figures with what ran: each PyTorch run's epochs as they ended, an unfinished run marked
"complete": false.

--train-limit / --test-limit: only the first N images of each split (written as IDX files into
the output folder, so that minidnn reads them like the full set). PyTorch is imported only in
the PyTorch part, and not at all with --no-torch.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from minidnn import models                                      # noqa: E402
from minidnn.augment import Augment                               # noqa: E402
from minidnn.data import BatchLoader, open_data                   # noqa: E402
from minidnn.errors import MinidnnError, fmt_bytes, parse_bytes  # noqa: E402
from minidnn.idx import read_split                                # noqa: E402
from minidnn.lr_schedule import LRSchedule                        # noqa: E402
from minidnn.planner import InfeasibleBudgetError                 # noqa: E402
from minidnn.planner.search import budget_to_give                 # noqa: E402
from minidnn.train import TrainConfig, train                      # noqa: E402

#: The recipe per network (the README's "Real data: Fashion-MNIST"); flags override it.
#: ResNet-18 as torchvision builds it halves the map twice in its stem (7x7 stride 2, then a
#: max-pool): from the 28x28 images resized to 56x56 its first residual stage sees 14x14 maps
#: and its last 2x2, where 28x28 gives 7x7 and 1x1 (--image-size 28 runs that). The crop's
#: padding is in pixels of the resized image.
RECIPES = {
    "resnet18": dict(image_size=56, epochs=40, batch=128, lr=0.1, lr_schedule="cosine",
                     warmup_epochs=1, label_smoothing=0.1, augment="crop:4,flip,erase",
                     weight_decay=5e-4),
    "vgg11": dict(image_size=32, epochs=15, batch=128, lr=0.02, lr_schedule="cosine",
                  warmup_epochs=1, label_smoothing=0.1, augment="crop:2,flip",
                  weight_decay=5e-4),
    "tiny_cnn": dict(image_size=28, epochs=2, batch=64, lr=0.02, lr_schedule="cosine",
                     warmup_epochs=0, label_smoothing=0.0, augment="none", weight_decay=5e-4),
}
RECIPE_KEYS = ("image_size", "epochs", "batch", "lr", "lr_schedule", "warmup_epochs",
               "label_smoothing", "augment", "weight_decay")


# ---- the data ----------------------------------------------------------------------------------
def limited_copy(spec: str, folder: str, train_limit: int | None, test_limit: int | None) -> str:
    """A --data spec for the first train_limit / test_limit images of `spec`'s data set,
    written as IDX files into `folder` (the spec itself when there is no limit)."""
    if not train_limit and not test_limit:
        return spec
    from minidnn.idx import parse_spec
    name, source = parse_spec(spec) or (None, None)
    if name is None:
        raise SystemExit(f"--data {spec!r}: expected fashion-mnist[:DIR] or mnist:DIR")
    os.makedirs(folder, exist_ok=True)
    for train_split, limit, prefix in ((True, train_limit, "train"), (False, test_limit, "t10k")):
        images, labels = read_split(source, train_split, name)
        if limit:
            images, labels = images[:limit], labels[:limit]
        for kind, array in (("images-idx3", images), ("labels-idx1", labels.astype("uint8"))):
            header = bytes((0, 0, 8, array.ndim)) + b"".join(
                int(d).to_bytes(4, "big") for d in array.shape)
            with open(os.path.join(folder, f"{prefix}-{kind}-ubyte"), "wb") as f:
                f.write(header + array.tobytes())
    return f"{name}:{folder}"


# ---- minidnn -----------------------------------------------------------------------------------
def minidnn_config(model: str, recipe: dict, args, data: str, **extra) -> TrainConfig:
    return TrainConfig(model=model, data=data, image_size=recipe["image_size"],
                       batch=recipe["batch"], epochs=extra.pop("epochs", recipe["epochs"]),
                       lr=recipe["lr"], momentum=args.momentum,
                       weight_decay=recipe["weight_decay"], lr_schedule=recipe["lr_schedule"],
                       lr_warmup_epochs=recipe["warmup_epochs"],
                       label_smoothing=recipe["label_smoothing"], augment=recipe["augment"],
                       device=args.device, seed=args.seed,
                       deterministic=extra.pop("deterministic", args.deterministic),
                       progress=False, **extra)    # a run in epochs: scored every epoch


def run_minidnn(label: str, cfg: TrainConfig, reference: str = "minidnn") -> dict:
    """One minidnn run: its epoch records and figures, or its error (a budget refused before
    the first step: also `least_budget`, the least budget in bytes the refusal names).
    reference: the unconstrained run a budget run is held to."""
    print(f"-- {label}: minidnn train --model {cfg.model} --epochs {cfg.epochs}"
          + (f" --memory-budget {cfg.memory_budget} --policy {cfg.policy}"
             if cfg.memory_budget else "") + (" --deterministic" if cfg.deterministic else ""),
          flush=True)
    try:
        report = train(cfg, log=lambda line: print(f"   {line}", flush=True))
    except MinidnnError as e:
        print(f"   {label}: error: {e}", flush=True)
        failed = {"label": label, "error": str(e), "memory_budget_bytes": cfg.memory_budget}
        if isinstance(e, InfeasibleBudgetError):
            # the budget the message suggests (rounded up), never below the exact least one
            failed["least_budget"] = max(parse_bytes(budget_to_give(e.minimum)), e.minimum)
        return failed
    return {"label": label, "epochs": report["epochs"], "deterministic": cfg.deterministic,
            "reference": reference,
            "images_per_s": images_per_s(report["epochs"], cfg.batch),
            "steady_images_per_s": report["images_per_s"], "step_graphs": report["step_graphs"],
            "peak_device_bytes": report["peak_device_bytes"],
            "param_checksum": report["param_checksum"], "device": report["device_name"],
            "memory_budget_bytes": cfg.memory_budget}


# ---- PyTorch -----------------------------------------------------------------------------------
def run_torch(label: str, model_name: str, recipe: dict, args, data: str, compiled: bool,
              epoch_limit: int | None = None, records: list | None = None) -> dict:
    """PyTorch on the batches minidnn's loader makes, channels_last, eager or compiled; with
    epoch_limit, only the recipe's first epoch_limit epochs (the full run's learning rates).
    records: the list each epoch's record is appended to as it ends (the caller's, so that a
    run cut short keeps its epochs)."""
    import torch
    import torch.nn.functional as F
    device = "cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True      # minidnn's GPU default: TF32 in convolutions
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"-- {label}: torch {torch.__version__} on {device}", flush=True)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    sources = open_data(data, recipe["image_size"])
    net = models.build(model_name, num_classes=10, image_size=recipe["image_size"],
                       in_channels=sources.train.image_shape[0])
    net.init_params(args.seed)             # what minidnn's executor does with the same seed
    from bench_vs_pytorch import torch_copy
    model = torch_copy(net).to(device).to(memory_format=torch.channels_last).train()
    batch = recipe["batch"]
    per_epoch = len(sources.train) // batch
    total = recipe["epochs"] * per_epoch
    schedule = LRSchedule(recipe["lr_schedule"], recipe["lr"], total,
                          recipe["warmup_epochs"] * per_epoch)
    opt = torch.optim.SGD(model.parameters(), lr=recipe["lr"], momentum=args.momentum,
                          weight_decay=recipe["weight_decay"])
    eps = recipe["label_smoothing"]

    def on_device(x, y):
        x = torch.from_numpy(x).to(device, non_blocking=True)
        return x.contiguous(memory_format=torch.channels_last), torch.from_numpy(y).to(device)

    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(runner(x), y, label_smoothing=eps)
        loss.backward()
        opt.step()
        return loss.detach()

    def evaluate():
        return torch_accuracy(model, runner, sources.eval, batch, on_device)

    runner, compile_s = model, None
    if compiled:
        runner = torch.compile(model)
        x, y = BatchLoader(sources.train, batch, args.seed).batch_at(0)
        compile_s = compile_warm_up(model, opt, lambda: (train_step(*on_device(x, y)),
                                                          evaluate(), sync(device)))
        print(f"   compiled in {compile_s:.1f} s (left out of the times below)", flush=True)

    records, train_s, losses = ([] if records is None else records), 0.0, []
    steps = total if not epoch_limit else min(total, epoch_limit * per_epoch)
    with BatchLoader(sources.train, batch, args.seed, steps=steps,
                     augment=Augment.parse(recipe["augment"])) as loader:
        started = time.perf_counter()
        for step, (x, y) in enumerate(loader):
            for group in opt.param_groups:
                group["lr"] = schedule.lr_at(step)
            losses.append(train_step(*on_device(x, y)))
            if (step + 1) % per_epoch == 0:
                sync(device)
                train_s += time.perf_counter() - started
                epoch = (step + 1) // per_epoch
                mean_loss = float(torch.stack(losses).float().mean())
                losses.clear()
                accuracy = evaluate()
                records.append({"epoch": epoch, "step": step + 1, "train_loss": mean_loss,
                                "accuracy": accuracy, "eval_images": len(sources.eval),
                                "lr": schedule.lr_at(step), "train_time_s": train_s})
                print(f"   epoch {epoch}/{recipe['epochs']}: training loss {mean_loss:.4f}, "
                      f"accuracy {accuracy:.4f} ({len(sources.eval)} images), "
                      f"{train_s:.1f} s of training", flush=True)
                started = time.perf_counter()
    peak = int(torch.cuda.max_memory_allocated()) if device == "cuda" else None
    return {"label": label, "epochs": records, "compile_s": compile_s,
            "images_per_s": images_per_s(records, batch),
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "peak_device_bytes": peak, "torch": torch.__version__}


def torch_accuracy(model, runner, dataset, batch: int, on_device) -> float:
    """Test accuracy of `runner` (the model, or its compiled form) over every image of
    `dataset`, the last batch filled up as minidnn fills it; the model is left training."""
    import torch
    model.eval()
    correct, n = 0, len(dataset)
    with torch.no_grad(), BatchLoader(dataset, batch, shuffle=False, drop_last=False,
                                      steps=-(-n // batch)) as loader:
        for x, y in loader:
            real = len(y)
            fill = [i % real for i in range(batch)]
            xd, yd = on_device(x[fill], y[fill])
            correct += int((runner(xd)[:real].argmax(1) == yd[:real]).sum())
    model.train()
    return correct / n


def compile_warm_up(model, opt, warm_up) -> float:
    """Seconds `warm_up()` takes (a compiled training step and evaluation: the compilation),
    after which the model's weights and the optimizer's state are put back as they were: the
    warm-up leaves no trace."""
    saved = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    started = time.perf_counter()
    warm_up()
    seconds = time.perf_counter() - started
    model.load_state_dict(saved)
    opt.load_state_dict(saved_opt)
    opt.state.clear()
    return seconds


def sync(device: str) -> None:
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


# ---- the comparison ----------------------------------------------------------------------------
def time_to(run: dict, target: float):
    """Training seconds at the end of the first epoch reaching `target` accuracy, or None."""
    for r in run.get("epochs", []):
        if r.get("accuracy") is not None and r["accuracy"] >= target:
            return r["train_time_s"]
    return None


def best_accuracy(run: dict):
    """The highest test accuracy of any epoch of `run`, or None."""
    scores = [r["accuracy"] for r in run.get("epochs", []) if r.get("accuracy") is not None]
    return max(scores) if scores else None


def images_per_s(epochs: list[dict], batch: int):
    """Training images per second of training time (evaluation left out) over `epochs`
    (records with `step` and `train_time_s`, the last one the run's end), or None."""
    if not epochs or not epochs[-1].get("train_time_s"):
        return None
    return epochs[-1]["step"] * batch / epochs[-1]["train_time_s"]


def fastest_torch(runs: list[dict], target: float):
    """(run, seconds) of the PyTorch run that reaches `target` first, or None."""
    reached = [(time_to(r, target), r) for r in runs
               if r["label"].startswith("pytorch") and "epochs" in r]
    reached = [(t, r) for t, r in reached if t is not None]
    if not reached:
        return None
    seconds, run = min(reached, key=lambda pair: pair[0])
    return run, seconds


def budget_reference(run: dict, runs: list[dict]) -> dict | None:
    """The unconstrained run of `runs` that budget run `run` is held to: the one its
    'reference' names (minidnn-deterministic for the --budget-epochs pair; minidnn by
    default), or None when that one did not train."""
    name = run.get("reference", "minidnn")
    return next((r for r in runs if r["label"] == name and "epochs" in r), None)


def bit_comparisons(runs: list[dict], deterministic: bool = False) -> list[tuple]:
    """(budget run, its reference, the first epoch that differs or None) for every budget run
    of `runs` that trained deterministically (its record says so, or `deterministic`)."""
    out = []
    for run in runs:
        if run["label"].endswith("-budget") and "epochs" in run and \
                (deterministic or run.get("deterministic")):
            reference = budget_reference(run, runs)
            if reference is not None:
                out.append((run, reference, first_difference(run, reference)))
    return out


def first_difference(run: dict, reference: dict):
    """The first epoch whose training loss or test accuracy differs, bit for bit, between
    `run` and `reference` (or whose count differs); None when every epoch is the same."""
    mine, theirs = run.get("epochs", []), reference.get("epochs", [])
    for a, b in zip(mine, theirs):
        if (a.get("train_loss"), a.get("accuracy")) != (b.get("train_loss"), b.get("accuracy")):
            return a["epoch"]
    if len(mine) != len(theirs):
        return min(len(mine), len(theirs)) + 1
    return None


def summary(model: str, runs: list[dict], target: float, deterministic: bool = False) -> list[str]:
    """The table of `runs` of one model (final and best test accuracy, training seconds,
    seconds to `target`, compile seconds, images/s), then minidnn's time to `target` against
    PyTorch's fastest run, the final accuracies' gaps (PyTorch's and the full-length budget
    runs' against minidnn's), a refused budget and the least one run instead, and whether each
    deterministic budget run's epochs (every one when `deterministic`) are bit-identical to
    its unconstrained run's."""
    dash = "-"
    width = max([22] + [len(run["label"]) for run in runs])    # the run column
    lines = [f"{model}: {'run':<{width}} {'final acc':>9} {'best acc':>9} {'training s':>10} "
             f"{'to ' + format(target, '.0%'):>8} {'compile s':>9} {'images/s':>9}"]

    def cell(value, spec, width):
        return format(dash if value is None else format(value, spec), f">{width}")
    for run in runs:
        if "error" in run:
            lines.append(f"{model}: {run['label']:<{width}} error: {run['error']}")
            continue
        last = run["epochs"][-1] if run["epochs"] else {}
        lines.append(f"{model}: {run['label']:<{width}} {cell(last.get('accuracy'), '.4f', 9)} "
                     f"{cell(best_accuracy(run), '.4f', 9)} "
                     f"{cell(last.get('train_time_s'), '.1f', 10)} "
                     f"{cell(time_to(run, target), '.1f', 8)} "
                     f"{cell(run.get('compile_s'), '.1f', 9)} "
                     f"{cell(run.get('images_per_s'), '.0f', 9)}")
    ours = next((r for r in runs if r["label"] == "minidnn" and "epochs" in r), None)
    if ours is None:
        return lines
    mine, best = time_to(ours, target), fastest_torch(runs, target)
    if best is not None:
        run, theirs = best
        if mine:
            lines.append(f"{model}: time to {target:.0%}: minidnn {mine:.1f} s, PyTorch's "
                         f"fastest ({run['label']}) {theirs:.1f} s: minidnn {theirs / mine:.2f}x "
                         f"as fast")
        else:
            lines.append(f"{model}: time to {target:.0%}: minidnn did not reach it; PyTorch's "
                         f"fastest ({run['label']}) {theirs:.1f} s")
    elif any(r["label"].startswith("pytorch") for r in runs):
        lines.append(f"{model}: time to {target:.0%}: no PyTorch run reached it")
    for run in runs:     # runs cut short (--eager-epochs) end at another epoch: no final gap
        if run["label"].startswith("pytorch") and ours["epochs"] and \
                len(run.get("epochs") or ()) == len(ours["epochs"]):
            gap = 100 * (ours["epochs"][-1]["accuracy"] - run["epochs"][-1]["accuracy"])
            lines.append(f"{model}: final accuracy minidnn - {run['label']}: {gap:+.2f} points")
    for run in runs:
        if "least_budget" in run:
            peak = ours.get("peak_device_bytes")
            share = f" ({run['least_budget'] / peak:.0%} of the unconstrained peak)" if peak else ""
            lines.append(f"{model}: {run['label']} refused before the first step; "
                         f"{run.get('fallback', 'the fallback')} ran at the least budget the "
                         f"refusal names, "
                         f"{fmt_bytes(run['least_budget'])}{share}")
    for run in runs:     # the full-length budget runs against the unconstrained one
        if run["label"].endswith("-budget") and run.get("epochs") and ours["epochs"] and \
                run.get("reference", "minidnn") == "minidnn" and \
                len(run["epochs"]) == len(ours["epochs"]):
            gap = 100 * (run["epochs"][-1]["accuracy"] - ours["epochs"][-1]["accuracy"])
            lines.append(f"{model}: final accuracy {run['label']} - minidnn: {gap:+.2f} points")
    for run, reference, differs in bit_comparisons(runs, deterministic):
        lines.append(f"{model}: {run['label']} vs {reference['label']}, per-epoch training "
                     f"loss and test accuracy: " + ("bit-identical" if differs is None else
                                                    f"NOT bit-identical (from epoch {differs})"))
    return lines


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="fashion-mnist", help="fashion-mnist[:DIR] or mnist:DIR")
    p.add_argument("--models", default="resnet18,tiny_cnn", help="comma-separated")
    p.add_argument("--out", default="runs/fashion_mnist_vs_pytorch", help="output folder")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--target", type=float, default=0.94, help="accuracy of 'time to'")
    p.add_argument("--train-limit", type=int, default=None, metavar="N",
                   help="train on the first N training images only")
    p.add_argument("--test-limit", type=int, default=None, metavar="N",
                   help="score the first N test images only")
    for key in RECIPE_KEYS:
        kind = str if key in ("lr_schedule", "augment") else \
            int if key in ("image_size", "epochs", "batch", "warmup_epochs") else float
        p.add_argument("--" + key.replace("_", "-"), type=kind, default=None,
                       help="override every model's recipe (see RECIPES)")
    p.add_argument("--budget-fraction", type=float, default=0.25, metavar="F",
                   help="also run minidnn under a memory budget of F x its unconstrained peak "
                        "with --policy dyn (default 0.25; 0: not)")
    p.add_argument("--deterministic", action="store_true",
                   help="minidnn: deterministic GPU algorithms (the budget run then gives the "
                        "same bits, which the summary checks epoch by epoch)")
    p.add_argument("--budget-epochs", type=int, default=None, metavar="N",
                   help="after the full budget run, a pair of N-epoch --deterministic runs "
                        "(without and with its budget), compared bit for bit")
    p.add_argument("--eager-epochs", type=int, default=None, metavar="N",
                   help="stop PyTorch's eager run after N epochs (its speed, not its accuracy)")
    p.add_argument("--compiled-epochs", type=int, default=None, metavar="N",
                   help="stop PyTorch's compiled run after N epochs (likewise)")
    p.add_argument("--no-torch", action="store_true", help="minidnn only (no PyTorch import)")
    p.add_argument("--no-compile", action="store_true", help="PyTorch eager only")
    return p.parse_args(argv)


def budget_runs(model: str, recipe: dict, args, data: str, unconstrained: dict,
                runs: list) -> None:
    """The full-length budget run (F x the unconstrained run's peak, --policy dyn) appended to
    `runs` (a budget refused before the first step: the refusal, then the same run at the
    least budget it names, minidnn-least-budget). With --budget-epochs N, then the pair of
    N-epoch --deterministic runs without and with the budget the full run trained in
    (minidnn-deterministic, minidnn-deterministic-budget), to be compared bit for bit."""
    budget = int(args.budget_fraction * unconstrained["peak_device_bytes"])
    budget = budget_run(f"minidnn-{args.budget_fraction:g}-budget", "minidnn-least-budget",
                        budget, runs, lambda b: minidnn_config(
                            model, recipe, args, data, memory_budget=b, policy="dyn"))
    if args.budget_epochs:
        cut = dict(epochs=args.budget_epochs, deterministic=True)
        runs.append(run_minidnn("minidnn-deterministic",
                                minidnn_config(model, recipe, args, data, **cut)))
        budget_run("minidnn-deterministic-budget", "minidnn-deterministic-least-budget", budget,
                   runs, lambda b: minidnn_config(model, recipe, args, data, memory_budget=b,
                                                  policy="dyn", **cut),
                   reference="minidnn-deterministic")


def budget_run(label: str, fallback: str, budget: int, runs: list, config,
               reference: str = "minidnn") -> int:
    """Run config(budget) as `label`, appended to `runs`; if that budget is refused, the
    refusal stays in `runs` and config(the least budget it names) runs as `fallback`.
    Returns the budget the run trained in (or tried last)."""
    runs.append(run_minidnn(label, config(budget), reference))
    least = runs[-1].get("least_budget")
    if least is None:
        return budget
    runs[-1]["fallback"] = fallback
    print(f"   {label}: {fmt_bytes(budget)} is refused; the same run at the least budget the "
          f"refusal names, {fmt_bytes(least)}", flush=True)
    runs.append(run_minidnn(fallback, config(least), reference))
    return least


def write_results(results: dict, out: str, title: str) -> None:
    """results.json and every model's curves_<model>.png in `out`, from what ran so far."""
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    from minidnn.curves import plot_curves
    for model, entry in results["models"].items():
        curves = {r["label"]: r["epochs"] for r in entry["runs"] if r.get("epochs")}
        if curves:
            plot_curves(os.path.join(out, f"curves_{model}.png"), curves,
                        title=f"{model} on {title}")


def torch_runs(model: str, recipe: dict, args, data: str, runs: list) -> None:
    """PyTorch's eager and compiled runs, each appended to `runs` as it starts (its epochs
    filled in as they end) and completed when it returns."""
    configs = [("pytorch-eager", False, args.eager_epochs)]
    if not args.no_compile:
        configs.append(("pytorch-compiled", True, args.compiled_epochs))
    for label, compiled, limit in configs:
        partial = {"label": label, "epochs": [], "complete": False}
        runs.append(partial)
        done = run_torch(label, model, recipe, args, data, compiled=compiled,
                         epoch_limit=limit, records=partial["epochs"])
        runs[runs.index(partial)] = done


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    data = limited_copy(args.data, os.path.join(args.out, "data"), args.train_limit,
                        args.test_limit)
    results = {"commit": commit(), "command": " ".join([os.path.basename(sys.argv[0])] +
                                                        list(sys.argv[1:] if argv is None
                                                             else argv)),
               "data": data, "target": args.target, "models": {}}
    # A time limit's SIGTERM ends the run through the `finally` below, which writes what ran.
    before = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        lines = compare_models(args, data, results)
    finally:
        signal.signal(signal.SIGTERM, before)
        write_results(results, args.out, args.data)
    print("\n".join(lines))
    print(f"results: {os.path.join(args.out, 'results.json')}; figures: "
          f"{os.path.join(args.out, 'curves_<model>.png')}")
    return results


def compare_models(args, data: str, results: dict) -> list[str]:
    """Every model's runs into results["models"] (each run there as soon as it starts);
    returns the summary lines."""
    lines = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        recipe = dict(RECIPES.get(model) or RECIPES["vgg11" if model.startswith("vgg")
                                                    else "resnet18"])
        recipe.update({k: getattr(args, k) for k in RECIPE_KEYS if getattr(args, k) is not None})
        recipe["image_size"] = max(recipe["image_size"], models.min_image_size(model))
        runs = []
        results["models"][model] = {"recipe": recipe, "runs": runs}
        runs.append(run_minidnn("minidnn", minidnn_config(model, recipe, args, data)))
        if args.budget_fraction and "error" not in runs[0]:
            budget_runs(model, recipe, args, data, runs[0], runs)
        if not args.no_torch:
            torch_runs(model, recipe, args, data, runs)
        compared = bit_comparisons(runs, args.deterministic)
        if compared:     # {budget run: the same bits as its unconstrained run}
            results["models"][model]["budget_bit_identical"] = {
                run["label"]: differs is None for run, _, differs in compared}
        results["device"] = runs[0].get("device")
        lines += summary(model, runs, args.target, args.deterministic)
    return lines


if __name__ == "__main__":
    main()
