"""vDNN_dyn for minidnn: profile a network, plan its memory for a budget, and say how.

    from minidnn.planner import analytic_profile, get_profile, plan
    prof = analytic_profile(net, 256, "h200")           # or get_profile(net, 256, device)
    result = plan(net, 256, prof, budget=12 * 2**30)
    result.decision                                      # MemoryDecision(offload, conv_algo)
    result.best.step_time_s, result.best.required_bytes  # what the model predicts

Files: costs.py (the Profile: what each layer costs), gpus.py (analytic models of named GPUs),
profile.py (measuring a Profile on the device, and its disk cache), step_model.py (the real
memory manager's dry run, timed against a Profile: recording.py, the recording device and
its log; playback.py, the log played against the profile; recorded.py: one walk gives the
static layout too, replay.py: the later steps from the first's log, collector.py: the
cyclic collector paused meanwhile), search.py (the planner), split.py (micro-batch counts
and layer chunks weighed together; chunking.py: which chunks, and what their calls cost),
planning.py (the one planning road: where costs come from, and plan_step, which `plan` and
dyn both call), dyn.py (the `dyn` memory policy, and FixedDecision for a decision made
beforehand), command.py (`minidnn plan`: parse and format), timeline.py (its figures: the
stream timeline and the bytes per layer).
"""
from .costs import LayerCost, Profile
from .dyn import DynPolicy, FixedDecision
from .gpus import GpuModel, PRESETS, analytic_profile, get_gpu, gpu_names


def __getattr__(name):
    # The planner, the simulator and the profiler import the executor; load them on first use
    # so that registering the `dyn` policy (memory.policy imports this package) stays cheap.
    if name in ("Planner", "PlanResult", "InfeasibleBudgetError", "plan"):
        from . import search
        return getattr(search, name)
    if name in ("StepModel", "Evaluation"):
        from . import step_model
        return getattr(step_model, name)
    if name in ("get_profile", "measure_profile", "load_profile", "save_profile", "cache_dir"):
        from . import profile
        return getattr(profile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LayerCost", "Profile", "DynPolicy", "FixedDecision", "GpuModel", "PRESETS",
           "analytic_profile", "get_gpu", "gpu_names", "Planner", "PlanResult",
           "InfeasibleBudgetError", "plan", "StepModel", "Evaluation", "get_profile",
           "measure_profile", "load_profile", "save_profile", "cache_dir"]
