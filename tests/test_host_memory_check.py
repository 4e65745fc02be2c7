"""On the CPU the device arena and the host slab are both RAM: a budget plus offloaded maps that
the machine cannot hold is refused before anything is allocated, with one clear line."""
import pytest

from minidnn import models
from minidnn.cli import main
from minidnn.decide import build_executor
from minidnn.errors import HostMemoryError
from minidnn.memory import host


def test_available_host_bytes_reads_the_machine():
    n = host.available_host_bytes()
    assert n is None or n > 0


def test_a_budget_and_slab_over_the_available_ram_are_refused(monkeypatch):
    net = models.build("tiny_cnn", num_classes=10, image_size=16)
    with build_executor(net, 8, device="cpu", policy="all", memory_budget="4MiB") as ex:
        offloaded = ex.decision.offload_bytes(ex.plan)
    assert offloaded > 0
    need = 4 * 2**20 + offloaded
    monkeypatch.setattr(host, "available_host_bytes", lambda: need - 1)
    with pytest.raises(HostMemoryError, match="only 4.*is available"):
        build_executor(net, 8, device="cpu", policy="all", memory_budget="4MiB")
    monkeypatch.setattr(host, "available_host_bytes", lambda: need)
    build_executor(net, 8, device="cpu", policy="all", memory_budget="4MiB").close()
    # Nothing offloaded: the arena alone is checked.
    monkeypatch.setattr(host, "available_host_bytes", lambda: 4 * 2**20)
    build_executor(net, 8, device="cpu", policy="none", memory_budget="4MiB").close()


def test_the_cli_refuses_it_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(host, "available_host_bytes", lambda: 2**20)
    code = main(["train", "--model", "tiny_cnn", "--image-size", "16", "--batch", "8",
                 "--steps", "1", "--policy", "all", "--memory-budget", "64MiB",
                 "--device", "cpu", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("minidnn: error: on the CPU the memory budget and the host slab")
