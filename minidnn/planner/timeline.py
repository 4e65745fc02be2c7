"""Pictures of a planned step: its stream timeline and the bytes each layer holds.

Both are drawn from what the step-time model (step_model.py) predicts for one decision, so they
need no GPU: `minidnn plan --timeline FILE.png` and `--bytes-chart FILE.png` draw them for any
plan, policy and GPU model.

* The stream timeline has one lane per stream: compute (forward, recompute and backward calls),
  offload (device -> host copies) and prefetch (host -> device copies). A red mark on the
  compute lane is a stall: the compute stream sat idle before a call, waiting for a copy (or
  for the host). vDNN_all on the K40 model hides almost every copy behind compute; on the
  H200 model the compute lane is mostly stalls.
* The bytes chart (as in the vDNN paper's per-layer figures) stacks, per layer, the bytes of
  the feature maps it writes that backward reads: kept on the device, offloaded to host,
  dropped and recomputed, or encoded (a ReLU that keeps one bit per value: its bar is the
  mask, 1/32 of the map).

The data are plain dicts (`timeline_data`, `bytes_by_layer`), which `minidnn plan --json`
prints too, so a figure can be drawn again from a saved plan.
"""
from __future__ import annotations

from ..memory.policy import FEATURE_KINDS

LANES = ("compute", "offload", "prefetch")
PHASE_COLOURS = {"forward": "tab:blue", "recompute": "tab:green", "backward": "tab:orange"}
HOLD_COLOURS = {"kept": "tab:blue", "offloaded": "tab:orange", "recomputed": "tab:green",
                "encoded": "tab:purple"}
# Stalls shorter than this fraction of the step are not drawn (they would be invisible).
MIN_STALL = 0.002


def timeline_data(model, ev) -> dict:
    """The last simulated step of evaluation `ev` (step_model.Evaluation) of `model`
    (step_model.StepModel): {'step_time_s', 'compute_s', 'calls': [{'phase', 'layer', 'start',
    'end', 'stall'}], 'copies': [{'stream', 'name', 'start', 'end'}]}, times in seconds from
    the step's start; a call's stall is the compute stream's idle time right before it."""
    calls = [{"phase": phase, "layer": model.nodes[i].name, "start": a, "end": b, "stall": st}
             for (phase, i), (a, b, st) in sorted(ev.calls.items(), key=lambda kv: kv[1][0])]
    copies = [{"stream": s, "name": name, "start": a, "end": b} for s, name, a, b in ev.copies]
    return {"step_time_s": ev.step_time_s, "compute_s": ev.compute_s, "calls": calls,
            "copies": copies}


def stall_seconds(timeline: dict) -> float:
    """Total time the compute stream sat idle before its calls in one step."""
    return sum(c["stall"] for c in timeline["calls"])


def bytes_by_layer(plan, ev) -> list[dict]:
    """Per layer (in order, the input first): the bytes of the feature maps it writes (its
    output, the maps it shares with in-place layers after it, and its aux buffers) that
    backward reads, split by what the decision does with them between forward and backward.

    plan: the LivenessPlan; ev: an Evaluation (offload and recompute sets). Returns
    [{'layer', 'kept', 'offloaded', 'recomputed', 'encoded'}] in bytes; 'encoded' is a ReLU's
    bit mask (kept on the device, 1/32 of the map it stands for).
    """
    rows = {"data": dict.fromkeys(("kept", "offloaded", "recomputed", "encoded"), 0)}
    order = ["data"] + [node.name for node in plan.nodes]
    for name in order[1:]:
        rows[name] = dict.fromkeys(("kept", "offloaded", "recomputed", "encoded"), 0)
    for s in plan.storages:
        if s.kind not in FEATURE_KINDS or not s.needed_in_backward:
            continue
        owner = "data" if s.producer < 0 else plan.nodes[s.producer].name
        if s.id in ev.offload:
            how = "offloaded"
        elif s.id in ev.recompute:
            how = "recomputed"
        elif s.kind == "aux" and plan.nodes[s.producer].layer.kind == "relu":   # bits
            how = "encoded"
        else:
            how = "kept"
        rows[owner][how] += int(s.nbytes)
    return [dict(layer=name, **rows[name]) for name in order]


def _title(plan: dict) -> str:
    if "title" in plan:       # a panel of its own (a measured trace: Tracer.timeline)
        return plan["title"]
    return (f"{plan['network']} b{plan['batch']}, {plan['policy']} on {plan['gpu']}: step "
            f"{plan['plan']['step_time_s'] * 1e3:.0f} ms, compute alone "
            f"{plan['plan']['compute_time_s'] * 1e3:.0f} ms")


def draw_timeline(plans: list[dict], path, caption: str = "") -> None:
    """PNG of the stream timelines of one or more plans (dicts of `minidnn plan`: make_plan),
    one panel each, stacked, each on its own time axis (a K40 step is ~20x an H200's). A
    panel may also be {'title': str, 'timeline': Tracer.timeline()}: a measured step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(len(plans), 1, figsize=(12, 1.9 + 1.5 * len(plans)),
                             squeeze=False)
    for ax, plan in zip(axes[:, 0], plans):
        t = plan["timeline"]
        step_ms = t["step_time_s"] * 1e3
        lane = {name: len(LANES) - 1 - k for k, name in enumerate(LANES)}
        for c in t["calls"]:
            a, b = c["start"] * 1e3, c["end"] * 1e3
            ax.broken_barh([(a, b - a)], (lane["compute"] - 0.4, 0.8),
                           color=PHASE_COLOURS[c["phase"]], lw=0)
            if c["stall"] > MIN_STALL * t["step_time_s"]:
                ax.broken_barh([(a - c["stall"] * 1e3, c["stall"] * 1e3)],
                               (lane["compute"] - 0.4, 0.8), color="tab:red", alpha=0.55,
                               lw=0)
        for c in t["copies"]:
            a, b = c["start"] * 1e3, c["end"] * 1e3
            ax.broken_barh([(a, b - a)], (lane[c["stream"]] - 0.35, 0.7),
                           color="0.35" if c["stream"] == "offload" else "0.6",
                           edgecolor="white", lw=0.4)
        ax.set_yticks([lane[n] for n in LANES])
        ax.set_yticklabels(LANES)
        ax.set_xlim(0, step_ms)
        ax.set_ylim(-0.6, len(LANES) - 0.4)
        ax.set_xlabel("ms since the step began")
        stalled = stall_seconds(t) * 1e3
        ax.set_title(f"{_title(plan)}, compute stalled {stalled:.0f} ms", fontsize=9)
    handles = [Patch(color=PHASE_COLOURS[p], label=p) for p in PHASE_COLOURS] + [
        Patch(color="tab:red", alpha=0.55, label="stall (compute waits)"),
        Patch(color="0.35", label="offload copy"), Patch(color="0.6", label="prefetch copy")]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.04 if caption else 0, 1, 0.95))
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, color="0.3")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_bytes_chart(plan: dict, path, caption: str = "") -> None:
    """PNG of `bytes_by_layer` of one plan (a make_plan dict): per layer, stacked bars of the
    bytes kept, offloaded, recomputed and encoded between forward and backward."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in plan["bytes_by_layer"]
            if any(r[k] for k in HOLD_COLOURS)]
    top = max((sum(r[k] for k in HOLD_COLOURS) for r in rows), default=1)
    unit, scale = ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)
    fig, ax = plt.subplots(figsize=(12, 4.2))
    xs = range(len(rows))
    bottom = [0.0] * len(rows)
    for how, colour in HOLD_COLOURS.items():
        vals = [r[how] / scale for r in rows]
        ax.bar(xs, vals, bottom=bottom, color=colour, label=how, width=0.75)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for x, r in zip(xs, rows):   # a mask is 1/32 of its map: name it, or it is not seen
        if r["encoded"]:
            ax.annotate("bits", (x, bottom[x]), ha="center", va="bottom", fontsize=6,
                        color=HOLD_COLOURS["encoded"])
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["layer"] for r in rows], rotation=90, fontsize=7)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{plan['network']} b{plan['batch']}, {plan['policy']}: what each layer's "
                 f"feature maps do between forward and backward", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if caption else 0, 1, 1))
    if caption:
        fig.text(0.01, 0.01, caption, fontsize=7, color="0.3")
    fig.savefig(path, dpi=120)
    plt.close(fig)
