"""Where a small bf16 network's step at its least budget runs out: every arena allocation and
free of the run (size, offset, what asked, bytes in use), the failure, and the decision.

    python3 benchmarks/runs/wave14/arena_log.py OUT_DIR
"""
import json
import os
import sys
import traceback

sys.path.insert(0, os.getcwd())
from minidnn.memory import arena as arena_module   # noqa: E402
from minidnn.train import TrainConfig, train        # noqa: E402
from minidnn.planner import InfeasibleBudgetError   # noqa: E402

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
MODELS = os.path.join("tests", "matrix_models")
CASES = {
    "resnet-split": ("tiny_resnet.py", dict(micro_batches=8, split_batch_statistics=True)),
    "vgg-chunks": ("tiny_vgg.py", dict(micro_batches=4, chunks=(("conv1_1", "pool1", 2),))),
    "googlenet": ("tiny_googlenet.py", {}),
}
log = []
take, release = arena_module.Arena._take, arena_module.Arena._release


def logged_take(self, nbytes, where):
    try:
        offset, size = take(self, nbytes, where)
    except Exception as e:
        log.append(("fail", nbytes, where or self.current_where or arena_module.caller(),
                    int(self._blocks.used), str(e)[:200]))
        raise
    log.append(("take", size, where or self.current_where or arena_module.caller(), offset,
                int(self._blocks.used)))
    return offset, size


def logged_release(self, offset):
    release(self, offset)
    log.append(("free", offset, int(self._blocks.used)))


arena_module.Arena._take, arena_module.Arena._release = logged_take, logged_release


def run(model, budget, **settings):
    cfg = TrainConfig(model=os.path.join(MODELS, model), image_size=32, batch=32, steps=4,
                      device="gpu", data="synthetic", eval_every=0, eval_batches=1,
                      progress=False, precision="bf16", policy="dyn", relu_bits=True,
                      memory_budget=budget, report=os.path.join(OUT, f"r{budget}.json"),
                      **settings)
    return train(cfg, log=lambda *_: None)


for name, (model, settings) in CASES.items():
    os.environ["MINIDNN_CACHE"] = os.path.join(OUT, "cache-" + name)
    try:
        run(model, 4096, **settings)
        least = None
    except InfeasibleBudgetError as e:
        least = int(e.minimum)
    del log[:]
    result = {"least": least}
    try:
        report = run(model, least, **settings)
        result["ran"] = {k: report.get(k) for k in ("steps", "peak_device_bytes",
                                                      "micro_batches", "chunks")}
    except Exception as e:
        result["error"] = str(e)
        result["traceback"] = traceback.format_exc()[-3000:]
    result["log"] = log[:]
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(result, f)
    print(name, least, result.get("error", result.get("ran")), flush=True)
