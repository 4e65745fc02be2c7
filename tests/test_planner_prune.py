"""The planner's answer cannot be made faster by its own pruning: run() prunes the fastest
feasible decision it has seen, the vDNN_dyn floor's included, so an offload of the floor is
traded for a recomputation on the convolution plan the floor chose (AlexNet on the K40 model:
the floor runs its convolutions memory-optimal and offloads everything)."""
from minidnn import models
from minidnn.planner import analytic_profile
from minidnn.planner.search import Planner


def test_the_answer_is_a_fixed_point_of_pruning():
    net = models.build("alexnet", num_classes=10, image_size=64)
    prof = analytic_profile(net, 32, "k40")
    unbudgeted = Planner(net, 32, prof)
    least = unbudgeted.minimum_budget()
    needs = unbudgeted.baseline("none", "fastest").required_bytes
    planner = Planner(net, 32, prof, budget=least + (needs - least) // 20, prefetch_lookahead=1)
    result = planner.run()
    assert result.best.fits
    assert result.best.step_time_s < result.floor.step_time_s
    again = planner.prune(result.best)
    assert again.step_time_s >= result.best.step_time_s * (1 - 1e-9)
