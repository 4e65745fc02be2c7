"""The GPU extra's runtime libraries are found in their pip packages, without PyTorch."""
import sys
import types

import pytest

from minidnn.kernels import nvidia_libraries as libs


def fake_package(root, package, filename):
    folder = root / "nvidia" / package / "lib"
    folder.mkdir(parents=True)
    (folder / filename).write_bytes(b"")
    return str(folder / filename)


@pytest.fixture
def loads(monkeypatch):
    """Record what would be dlopened; nothing found without help; a clean preload cache."""
    opened = []
    monkeypatch.setattr(libs.ctypes, "CDLL", lambda path, mode=0: opened.append((path, mode)))
    monkeypatch.setattr(libs, "_preloaded", {})
    monkeypatch.setattr(libs, "found_without_help", lambda name: False)
    return opened


def test_the_library_is_found_in_its_package_anywhere_on_the_path(tmp_path, loads):
    where = fake_package(tmp_path / "site", "cudnn", "libcudnn.so.9")
    paths = [str(tmp_path / "elsewhere"), str(tmp_path / "site")]
    assert libs.package_library("cudnn", paths) == where
    assert libs.package_library("nccl", paths) is None
    assert libs.preload("cudnn", paths) == where
    assert loads == [(where, libs.ctypes.RTLD_GLOBAL)]
    assert libs.preload("cudnn", paths) == where and len(loads) == 1      # once per process
    assert libs.preload("nccl", paths) is None and len(loads) == 1        # no package: none


def test_nothing_is_preloaded_where_the_loader_finds_the_library_itself(tmp_path, monkeypatch,
                                                                          loads):
    fake_package(tmp_path / "site", "nccl", "libnccl.so.2")
    monkeypatch.setattr(libs, "found_without_help", lambda name: True)
    assert libs.preload("nccl", [str(tmp_path / "site")]) is None and loads == []


def test_ld_library_path_counts_as_found(tmp_path, monkeypatch):
    (tmp_path / "libnccl.so.2").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{tmp_path}")
    assert libs.found_without_help("nccl")
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    monkeypatch.setattr(libs.sysconfig, "get_path", lambda name: str(tmp_path / "none"))
    assert not libs.found_without_help("nccl")


def test_load_cudnn_preloads_cudnn_before_the_frontend_imports(tmp_path, monkeypatch, loads):
    from minidnn.kernels.cudnn_conv import load_cudnn
    where = fake_package(tmp_path, "cudnn", "libcudnn.so.9")
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)
    order = []
    frontend = types.ModuleType("cudnn")
    monkeypatch.setitem(sys.modules, "cudnn", frontend)
    monkeypatch.setattr(libs.ctypes, "CDLL", lambda path, mode=0: order.append(path))
    assert load_cudnn() is frontend
    assert order == [where]


def test_the_gpu_extra_brings_cudnn_and_nccl():
    import os
    text = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "pyproject.toml")).read()
    gpu = text.split("gpu = [", 1)[1].split("]", 1)[0]
    for package in ("cupy-cuda13x", "nvidia-cudnn-frontend", "nvidia-cudnn-cu13",
                    "nvidia-nccl-cu13"):
        assert f'"{package}' in gpu, package
    assert "torch" not in gpu
