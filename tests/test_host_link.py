"""The planner with a shared host link: a per-GPU copy bandwidth (measured with several GPUs
copying at once) replaces the profile's own, and plans see the slower copies."""
import pytest

from minidnn import models
from minidnn.cli import main
from minidnn.errors import ConfigError
from minidnn.planner.gpus import analytic_profile
from minidnn.planner.search import Planner


def test_a_host_link_figure_limits_each_direction_and_the_duplex_in_proportion():
    net = models.build("vgg16", num_classes=1000, image_size=64)
    prof = analytic_profile(net, 32, "h200")
    shared = prof.with_host_link(27.5)
    assert shared.d2h_bw == shared.h2d_bw == 27.5e9
    assert shared.duplex_bw == pytest.approx(prof.duplex_bw * 27.5e9 / prof.d2h_bw)
    assert shared.layers is prof.layers and prof.d2h_bw == 55e9     # the original is kept
    assert prof.with_host_link(None) is prof
    assert prof.with_host_link(500).d2h_bw == prof.d2h_bw           # never faster than alone
    with pytest.raises(ConfigError, match="positive"):
        prof.with_host_link(0)


def test_a_slower_host_link_never_predicts_a_faster_step():
    net = models.build("vgg16", num_classes=1000, image_size=32)
    prof = analytic_profile(net, 32, "h200")
    unlimited = Planner(net, 32, prof, budget=None)
    budget = (unlimited.run().best.peak_bytes + unlimited.minimum_budget()) // 2
    # offload only: recomputation could find a plan that moves nothing at either speed
    alone = Planner(net, 32, prof, budget=budget, recompute=False).run().best
    shared = Planner(net, 32, prof.with_host_link(5), budget=budget, recompute=False).run().best
    assert alone.fits and shared.fits
    assert shared.step_time_s > alone.step_time_s * 1.01   # at 5 GB/s the copies show


def test_plan_takes_the_host_link_figure(capsys):
    assert main(["plan", "--model", "vgg16", "--image-size", "64", "--batch", "32", "--gpu",
                 "h200", "--memory-budget", "1GiB", "--host-link-gbps", "20"]) == 0
    out = capsys.readouterr().out
    assert "host link 20 GB/s each way" in out
