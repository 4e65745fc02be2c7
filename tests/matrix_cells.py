"""The combination matrix on the CPU: which cells there are, how one runs, what it must show.

A cell is one combination a user can ask for:

    family     a small member of each family (tests/matrix_models/): vgg (convolutions,
               max-pools, dropout), resnet (BatchNorm, residual joins), googlenet (LRN,
               an inception module's Concat)
    precision  fp32 | bf16            layout  nchw | nhwc
    policy     none | all | conv | dyn
    rung       a ladder of budgets: none (no budget), ample (the unconstrained peak of the
               reference run, or the least budget where that is more), mid (halfway
               between the least budget and the unconstrained peak), least (the least)
    split      whole | micro2 (--micro-batches 2; BatchNorm networks with
               --split-batch-statistics) | chunks (a forced layer chunk; dyn only)
    ranks      1 | 2 (the CPU socket collective; no layer chunks over ranks)
    encoding   maps | bits (--relu-bits: ReLUs before a max-pool or a dropout keep one bit
               per value for backward)
    fusion     fused | unfused (--no-fuse: every layer its own passes, minidnn/fusion.py)

Every cell runs through the public entry points only: `minidnn.train.train(TrainConfig)` (one
rank) or `python3 -m minidnn train ... --ranks 2` (two), the run report, and for the
predicted peak `minidnn.decide.decide` (dyn: the planner's `policy.result.best.peak_bytes`
of the decision the run makes) or `minidnn plan --json --policy none|all|conv` with this
CPU's measured profile (`--profile`).

What a cell asserts (check_cell):
- a budget at or above the least runs to the end, its measured peak within the budget;
- that peak equals the predicted one to the byte: on the CPU the arena is exact (NumPy
  memory, 256-byte blocks, no CUDA context, no allocator caching, temporaries of NumPy
  outside it), so any difference is an allocation the step's memory model does not count;
- the parameters after the run equal, bit for bit, those of the reference run (policy none,
  no budget, ReLU outputs kept, fused, the same micro-batches and layer chunks): offload,
  prefetch, recomputation, the ReLU bit masks and fusion change no bit; against the
  whole-batch reference (no split) they agree within SPLIT_RTOL / SPLIT_ATOL, where the
  weight-gradient sums run in another order (BatchNorm over split micro-batches computes
  other statistics, by the user's leave, and is compared with its own split only);
- a budget below the least does not train: dyn refuses it before step one (no step ran:
  train() raised before it logged the run's first line; over ranks, rank 0 did not print
  it), naming the least budget, which trains while 1% less is refused, and `minidnn
  plan` names the same least budget. The vDNN policies (none, all, conv) plan nothing: their
  least budget is the peak `plan` predicts for their one decision, and below it they are
  refused before step one too (decide.py weighs that decision against the budget).
Over two ranks the figures are rank 0's (its report), predicted for a rank's batch.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import math
import json
import os
import random
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "tests", "matrix_models")


@dataclass(frozen=True)
class Family:
    """A small network of one family: its model file and a run of layers to chunk."""
    path: str
    chunk: tuple
    batch_statistics: bool = False


FAMILIES = {
    "vgg": Family(os.path.join(MODELS, "tiny_vgg.py"), ("conv1_1", "pool1", 2)),
    "resnet": Family(os.path.join(MODELS, "tiny_resnet.py"), ("relu", "maxpool", 2),
                     batch_statistics=True),
    "googlenet": Family(os.path.join(MODELS, "tiny_googlenet.py"), ("conv1", "norm1", 2)),
}
PRECISIONS = ("fp32", "bf16")
LAYOUTS = ("nchw", "nhwc")
POLICIES = ("none", "all", "conv", "dyn")
RUNGS = ("none", "ample", "mid", "least")
SPLITS = ("whole", "micro2", "chunks")
RANKS = (1, 2)
ENCODINGS = ("maps", "bits")
FUSIONS = ("fused", "unfused")

IMAGE_SIZE = 16
BATCH = 8
STEPS = 2
#: Where the whole-batch reference and a split run may differ (weight-gradient sums over the
#: batch in another order, then two SGD steps): float32 rounding, amplified a little by
#: the second step; bf16 maps round each value to 8 bits, and a float32 difference can move
#: a value across a rounding boundary.
SPLIT_RTOL = {"fp32": 1e-5, "bf16": 2e-2}
SPLIT_ATOL = {"fp32": 1e-6, "bf16": 2e-3}
#: Two ranks sum the gradient in two halves, then average: float32 rounding again.
RANKS_RTOL, RANKS_ATOL = SPLIT_RTOL, SPLIT_ATOL


@dataclass(frozen=True)
class Cell:
    family: str
    precision: str
    layout: str
    policy: str
    rung: str
    split: str
    ranks: int
    encoding: str = "maps"
    fusion: str = "fused"

    @property
    def id(self) -> str:
        return (f"{self.family}-{self.precision}-{self.layout}-{self.policy}-{self.rung}-"
                f"{self.split}-{self.ranks}r" + ("-relubits" if self.encoding == "bits" else "")
                + ("-unfused" if self.fusion == "unfused" else ""))

    @property
    def valid(self) -> bool:
        """Layer chunks are planned (dyn only) and not run by data-parallel ranks."""
        return self.split != "chunks" or (self.policy == "dyn" and self.ranks == 1)


def all_cells() -> list[Cell]:
    """The whole product, less the combinations that cannot be asked for (Cell.valid)."""
    cells = (Cell(*c) for c in itertools.product(FAMILIES, PRECISIONS, LAYOUTS, POLICIES,
                                                 RUNGS, SPLITS, RANKS, ENCODINGS, FUSIONS))
    return [c for c in cells if c.valid]


def sample_cells(count: int, two_rank_count: int, seed: int = 0) -> list[Cell]:
    """`count` cells of one rank and `two_rank_count` of two, drawn with a fixed seed.

    The one-rank cells cover pairs: each is the cell that adds the most pairs of values of
    two dimensions (policy and rung, family and split, ...) not yet in the sample, ties
    broken by the seed, so a few dozen cells meet every value and most pairs. Two ranks
    start processes, so they are drawn apart and fewer, each of another family, in fp32
    (bf16 on the CPU costs each rank's process several times more; the whole product has
    both)."""
    rng = random.Random(seed)
    cells = all_cells()
    one = [c for c in cells if c.ranks == 1]
    rng.shuffle(one)
    covered: set = set()
    chosen = []
    for _ in range(count):
        best = max(one, key=lambda c: len(_pairs(c) - covered))
        chosen.append(best)
        covered |= _pairs(best)
        one.remove(best)
    families = rng.sample(sorted(FAMILIES), two_rank_count)
    two = [rng.choice([c for c in cells if c.ranks == 2 and c.family == f and
                       c.precision == "fp32"]) for f in families]
    return chosen + two


def _pairs(cell: Cell) -> set:
    """Every pair of (dimension, value) of a cell (ranks left out)."""
    values = [(k, getattr(cell, k)) for k in ("family", "precision", "layout", "policy",
                                              "rung", "split", "encoding", "fusion")]
    return set(itertools.combinations(values, 2))


# ---- running ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a run showed: its report (None when refused), the error (None when it ran), whether
    it was refused before step one, and its parameters (from its checkpoint)."""
    report: dict | None
    error: Exception | str | None
    before_step_one: bool
    params: dict | None


class Runner:
    """Runs cells in `folder` (a fresh folder), remembering the reference runs, the least
    budgets and the CPU profiles it made. The profiles dyn measures are cached where
    $MINIDNN_CACHE says (the tests point it into a folder of their own)."""

    def __init__(self, folder):
        self.folder = str(folder)
        self._runs = 0
        self._memo: dict = {}

    # -- one run -----------------------------------------------------------------------------
    def config_args(self, cell: Cell, policy: str, budget: int | None,
                    split: str | None = None, encoding: str | None = None,
                    fusion: str | None = None) -> list[str]:
        """`minidnn train` arguments of `cell` under `policy` and `budget` (split, encoding
        and fusion: the cell's unless given)."""
        fam = FAMILIES[cell.family]
        micro_batches, chunks = forced_split(cell, cell.split if split is None else split)
        args = ["--model", fam.path, "--image-size", str(IMAGE_SIZE), "--batch", str(BATCH),
                "--steps", str(STEPS), "--device", "cpu", "--eval-every", "0",
                "--eval-batches", "1", "--no-progress", "--precision", cell.precision,
                "--layout", cell.layout, "--policy", policy]
        if budget is not None:
            args += ["--memory-budget", str(int(budget))]
        if micro_batches is not None:
            args += ["--micro-batches", str(micro_batches)]
            if fam.batch_statistics and micro_batches > 1:
                args += ["--split-batch-statistics"]
        if chunks is not None:
            args += ["--chunks", ",".join(":".join(map(str, c)) for c in chunks) or "none"]
        if (cell.encoding if encoding is None else encoding) == "bits":
            args += ["--relu-bits"]
        if (cell.fusion if fusion is None else fusion) == "unfused":
            args += ["--no-fuse"]
        return args

    def run(self, cell: Cell, policy: str, budget: int | None, split: str | None = None,
            ranks: int | None = None, encoding: str | None = None,
            fusion: str | None = None) -> Outcome:
        """Train `cell` under `policy` and `budget` (ranks, split, encoding and fusion: the
        cell's unless given)."""
        ranks = cell.ranks if ranks is None else ranks
        self._runs += 1
        stem = os.path.join(self.folder, f"run{self._runs}")
        args = self.config_args(cell, policy, budget, split, encoding, fusion) + [
            "--report", stem + ".json", "--checkpoint", stem + ".npz"]
        if ranks > 1:
            return self._run_ranks(args, ranks, stem)
        from minidnn.cli import build_parser
        from minidnn.train import TrainConfig, train
        parsed = build_parser().parse_args(["train", *args])
        cfg = TrainConfig(
            model=parsed.model, image_size=parsed.image_size, batch=parsed.batch,
            steps=parsed.steps, device="cpu", eval_every=0, eval_batches=1, progress=False,
            precision=parsed.precision, layout=parsed.layout, policy=parsed.policy,
            memory_budget=parsed.memory_budget, micro_batches=parsed.micro_batches,
            split_batch_statistics=parsed.split_batch_statistics, chunks=parsed.chunks,
            relu_bits=parsed.relu_bits, fuse=not parsed.no_fuse, report=parsed.report,
            checkpoint=parsed.checkpoint)
        logged = []
        try:
            report = train(cfg, log=logged.append)
        except Exception as e:  # a refusal (or a failure mid-run): the cell says which
            return Outcome(None, e, not logged, None)
        return Outcome(report, None, False, _params(stem + ".npz"))

    def _run_ranks(self, args: list[str], ranks: int, stem: str) -> Outcome:
        """`python3 -m minidnn train ... --ranks N` (it starts the ranks' processes). Refused
        before step one: it failed before rank 0 printed the run's first line, which it
        prints once its executor and optimizer hold their memory."""
        path = os.environ.get("PYTHONPATH")
        env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + path if path else ""))
        proc = subprocess.run([sys.executable, "-m", "minidnn", "train", *args, "--ranks",
                               str(ranks)], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=300)
        if proc.returncode != 0:
            started = " parameters, " in proc.stdout
            return Outcome(None, proc.stderr.strip().splitlines()[-1], not started, None)
        with open(stem + ".json") as f:
            report = json.load(f)
        return Outcome(report, None, False, _params(stem + ".npz"))

    # -- what cells compare with ---------------------------------------------------------------
    def reference(self, cell: Cell, split=None) -> Outcome:
        """The run whose bits a cell must give: no budget, no offload, ReLU outputs kept as
        maps, fused, the same split (a cell's split name, or (micro-batches, layer chunks) as a run
        ran them; layer chunks are planned, so a chunked reference runs dyn without a
        budget: nothing offloaded, every convolution on its fastest plan)."""
        split = cell.split if split is None else split
        key = ("reference", cell.family, cell.precision, cell.layout, split, cell.ranks)
        if key not in self._memo:
            policy = "dyn" if forced_split(cell, split)[1] else "none"
            out = self.run(cell, policy, None, split, encoding="maps", fusion="fused")
            assert out.error is None, f"reference run of {cell.id} failed: {out.error}"
            self._memo[key] = out
        return self._memo[key]

    def least_budget(self, cell: Cell) -> int:
        """The least budget of the cell's policy and split. dyn: the figure its refusal
        names (InfeasibleBudgetError.minimum, or the least budget in its one-line error over
        ranks). none/all/conv: the peak `minidnn plan` predicts for the policy's one
        decision with the planner's reserve on top (these policies do not plan, so their
        least budget is what they need and the reserve every budget keeps)."""
        key = ("least", cell.family, cell.precision, cell.layout, cell.policy, cell.split,
               cell.ranks, cell.encoding, cell.fusion)
        if key not in self._memo:
            if cell.policy == "dyn":
                out = self.run(cell, "dyn", 4096)
                assert out.error is not None and out.before_step_one, \
                    f"{cell.id}: 4 KiB was not refused before step one ({out.error})"
                # Over ranks the error arrives as its line, whose figure is rounded: the
                # bytes are those a rank's own planning names (decide, as the rank calls it).
                self._memo[key] = least_named(out.error) if cell.ranks == 1 else \
                    self._dyn_least(cell)
                assert least_named(str(out.error)) >= self._memo[key]
            else:
                self._memo[key] = with_reserve(self.predicted_peak(cell, None))
        return self._memo[key]

    def least_from_plan(self, cell: Cell) -> int:
        """The least budget `minidnn plan --json` names for the cell's dyn run (its
        `minimum_budget_bytes`, planned at an ample budget from this CPU's profile)."""
        args = self.plan_args(cell, "dyn") + ["--memory-budget", str(2**30)]
        if cell.ranks > 1 and cell.split != "chunks":
            args += ["--chunks", "none"]      # a rank runs no layer chunks
        return int(plan_json(args)["minimum_budget_bytes"])

    def plan_args(self, cell: Cell, policy: str) -> list[str]:
        """`minidnn plan --json` arguments for a rank's step of the cell under `policy`,
        from this CPU's profile, with what the cell forces (as config_args)."""
        fam = FAMILIES[cell.family]
        args = ["plan", "--json", "--model", fam.path, "--image-size", str(IMAGE_SIZE),
                "--num-classes", "10", "--batch", str(BATCH // cell.ranks), "--policy", policy,
                "--precision", cell.precision, "--layout", cell.layout,
                "--profile", self.cpu_profile(cell)]
        train_args = self.config_args(cell, policy, None)
        for flag in ("--micro-batches", "--chunks"):
            if flag in train_args:
                args += [flag, train_args[train_args.index(flag) + 1]]
        for flag in ("--split-batch-statistics", "--relu-bits", "--no-fuse"):
            if flag in train_args:
                args.append(flag)
        return args

    def budget(self, cell: Cell) -> int | None:
        """The cell's rung as bytes (None: no budget)."""
        if cell.rung == "none":
            return None
        ample = self.reference(cell).report["peak_device_bytes"]
        least = self.least_budget(cell)
        if cell.rung == "ample":
            return max(ample, least)
        if cell.rung == "mid":
            return (least + ample) // 2
        return least

    def cpu_profile(self, cell: Cell) -> str:
        """A file of this CPU's measured profile of the cell's network at a rank's batch
        (minidnn.planner.get_profile), for `plan --profile`."""
        from minidnn import models
        from minidnn.kernels.mapformat import MapFormat
        from minidnn.memory.policy import relu_bits_for
        from minidnn.planner import get_profile, save_profile
        batch = BATCH // cell.ranks     # a step's (plan scales it to its micro-batches)
        path = os.path.join(self.folder, f"profile-{cell.family}-{cell.precision}-"
                                         f"{cell.layout}-{cell.encoding}-b{batch}.json")
        if not os.path.exists(path):
            net = models.build(FAMILIES[cell.family].path, num_classes=10,
                               image_size=IMAGE_SIZE)
            bits = relu_bits_for(net) if cell.encoding == "bits" else frozenset()
            prof = get_profile(net, batch, "cpu", maps=MapFormat(cell.layout, cell.precision),
                               relu_bits=bits, log=lambda *_: None)
            save_profile(prof, path)
        return path

    def predicted_peak(self, cell: Cell, budget: int | None) -> int:
        """The peak the step's memory model predicts for the decision the cell's run makes.

        dyn: `decide(...)` with the policy a run makes (DynPolicy with the run's input
        batches; chunks=() over ranks), `policy.result.best.peak_bytes` (no budget: dyn plans
        nothing, then predicted as policy none). none/all/conv: `minidnn plan --json --policy
        P` from this CPU's profile, the run's micro-batches forced; its plan's
        `peak_device_bytes`."""
        if cell.policy == "dyn" and budget is not None:
            return self._dyn_peak(cell, budget)
        args = self.plan_args(cell, "none" if cell.policy == "dyn" else cell.policy)
        args += ["--prefetch-lookahead", "1"]
        if budget is not None:
            args += ["--memory-budget", str(budget)]
        return plan_json(args)["plan"]["peak_device_bytes"]

    def _dyn_least(self, cell: Cell) -> int:
        """The least budget a rank's dyn planning names (InfeasibleBudgetError.minimum)."""
        from minidnn.planner import InfeasibleBudgetError
        try:
            self._dyn_peak(cell, 4096)
        except InfeasibleBudgetError as e:
            return int(e.minimum)
        raise AssertionError(f"{cell.id}: dyn planned a step in 4 KiB")

    def _dyn_peak(self, cell: Cell, budget: int) -> int:
        from minidnn import models
        from minidnn.decide import decide
        from minidnn.planner.dyn import RUN_INPUT_BATCHES, DynPolicy
        fam = FAMILIES[cell.family]
        net = models.build(fam.path, num_classes=10, image_size=IMAGE_SIZE)
        micro_batches, chunks = forced_split(cell, cell.split)
        policy = DynPolicy(input_batches=RUN_INPUT_BATCHES)
        if cell.ranks > 1 and chunks is None:
            chunks = ()     # data parallel runs no layer chunks
        decide(net, BATCH // cell.ranks, policy=policy, memory_budget=budget, device="cpu",
               precision=cell.precision, layout=cell.layout,
               relu_bits=cell.encoding == "bits", micro_batches=micro_batches,
               split_batch_statistics=fam.batch_statistics and micro_batches is not None,
               chunks=chunks, fuse=cell.fusion == "fused")
        return int(policy.result.best.peak_bytes)


def with_reserve(need: int) -> int:
    """The least budget of a step that needs `need` bytes: the planner's reserve kept free on
    top (planner/planning.plan_policy)."""
    from minidnn.planner.step_model import DEFAULT_RESERVE
    return math.ceil(need / (1 - DEFAULT_RESERVE))


def least_named(error) -> int:
    """The least budget a refusal names: InfeasibleBudgetError.minimum (bytes), or, for a
    one-line message (the error of a run over ranks, or a str), the size after 'the least it
    can train in is', as the line prints it."""
    minimum = getattr(error, "minimum", None)
    if minimum is not None:
        return int(minimum)
    from minidnn.errors import parse_bytes
    text = str(error)
    marker = "the least it can train in is "
    assert marker in text, f"the refusal names no least budget: {text}"
    return parse_bytes(text.split(marker, 1)[1].split()[0])


def plan_json(args: list[str]) -> dict:
    """`minidnn plan ... --json` through the CLI's main, as a dict."""
    from minidnn.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(args)
    assert code == 0, f"minidnn {' '.join(args)} failed: {err.getvalue()}"
    return json.loads(out.getvalue())


def _params(path: str) -> dict:
    from minidnn.checkpoint import load_checkpoint
    return dict(load_checkpoint(path).params)


# ---- the checks ---------------------------------------------------------------------------------
def check_cell(runner: Runner, cell: Cell) -> None:
    """Run `cell` and assert what the module docstring says it must show."""
    budget = runner.budget(cell)
    least = None if budget is None else runner.least_budget(cell)
    out = runner.run(cell, cell.policy, budget)
    if budget is not None and budget < least:
        assert_refused(out, cell, budget)
        return
    assert out.error is None, f"{cell.id}: a budget of {budget} B (least {least} B) failed: " \
                              f"{out.error}"
    report = out.report
    assert report["steps"] == STEPS
    peak = report["peak_device_bytes"]
    if budget is not None:
        assert peak <= budget, f"{cell.id}: peak {peak} B over the budget {budget} B"
        predicted = runner.predicted_peak(cell, budget)
        assert peak == predicted, f"{cell.id}: measured peak {peak} B, predicted {predicted} B " \
                                  f"({peak - predicted:+d} B)"
    ran = (report["micro_batches"], tuple(tuple(c) for c in report["chunks"]))
    assert_same_bits(out, runner.reference(cell, ran), cell)
    if not (ran[0] > 1 and FAMILIES[cell.family].batch_statistics):
        # (BatchNorm over split micro-batches normalizes each with its own statistics: it
        # computes something else, by the user's leave, and is compared with itself only.)
        whole = runner.reference(cell, "whole")
        assert_close(out.params, whole.params, cell.precision, cell.id)
    if cell.rung == "least" and budget is not None:
        assert_refused(runner.run(cell, cell.policy, int(budget * 0.99)), cell,
                       int(budget * 0.99))
        if cell.policy == "dyn":
            assert runner.least_from_plan(cell) == least, \
                f"{cell.id}: minidnn plan names another least budget than train"


def assert_refused(out: Outcome, cell: Cell, budget: int) -> None:
    """A budget below the least must not train: every policy refuses it before step one
    (dyn plans for it; a vDNN policy's one decision is weighed against it by decide.py), a
    MemoryBudgetError (over ranks: its one line)."""
    from minidnn.errors import MemoryBudgetError
    assert out.error is not None, f"{cell.id}: {budget} B is below the least budget, yet " \
                                  f"the run trained"
    assert out.before_step_one, f"{cell.id}: {budget} B failed mid-run, not refused " \
                                f"before step one: {out.error}"
    if cell.ranks == 1:
        assert isinstance(out.error, MemoryBudgetError), f"{cell.id}: {out.error!r}"
    else:
        assert "memory budget" in str(out.error), f"{cell.id}: {out.error}"


def forced_split(cell: Cell, split) -> tuple:
    """(micro-batches, layer chunks) a run is told, None where dyn chooses: from a cell's
    split name ('whole': nothing forced, 'micro2': 2 micro-batches, 'chunks': the family's
    layer chunk), or a (micro-batches, chunks) pair a run reported, both forced."""
    if split == "whole":
        return None, None
    if split == "micro2":
        return 2, None
    if split == "chunks":
        return None, (FAMILIES[cell.family].chunk,)
    return split


def assert_same_bits(out: Outcome, reference: Outcome, cell: Cell) -> None:
    assert out.report["param_checksum"] == reference.report["param_checksum"], \
        f"{cell.id}: parameters differ from the reference (policy none, no budget, the same " \
        f"split): {_worst(out.params, reference.params)}"


def assert_close(params: dict, reference: dict, precision: str, what: str) -> None:
    for name, value in reference.items():
        np.testing.assert_allclose(params[name], value, rtol=SPLIT_RTOL[precision],
                                   atol=SPLIT_ATOL[precision],
                                   err_msg=f"{what}: {name} against the whole-batch reference")


def _worst(params: dict, reference: dict) -> str:
    diffs = {n: float(np.max(np.abs(params[n] - v))) for n, v in reference.items()}
    name = max(diffs, key=diffs.get)
    return f"largest difference {diffs[name]:.3g} in {name}"
