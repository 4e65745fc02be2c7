"""The NVIDIA runtime libraries minidnn loads, found in the pip packages of the 'gpu' extra.

`pip install ".[gpu]"` brings cuDNN (nvidia-cudnn-cu13: nvidia/cudnn/lib/libcudnn.so.9) and
NCCL (nvidia-nccl-cu13: nvidia/nccl/lib/libnccl.so.2) as Python packages. The cuDNN frontend
looks for cuDNN only on LD_LIBRARY_PATH and in the interpreter's main site-packages, then asks
the dynamic loader for `libcudnn.so.9` by name, which succeeds only where something loaded it
before (PyTorch does, from its own wheels). Installed anywhere else (`pip install --target`,
a user site, a virtual environment beside the system one), cuDNN was found only when PyTorch
had been imported.

`preload(name)` closes that gap: when the library's usual places do not have it, it loads it
from its pip package wherever that is on sys.path, with RTLD_GLOBAL, before the frontend (or
CuPy, for NCCL) asks for it by name; the loader then hands out this copy.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import sysconfig

#: name -> (the package directory under nvidia/, the library's file name)
LIBRARIES = {"cudnn": ("cudnn", "libcudnn.so.9"), "nccl": ("nccl", "libnccl.so.2")}

_preloaded: dict[str, str | None] = {}


def package_library(name: str, paths=None) -> str | None:
    """The library file of `name` ('cudnn' or 'nccl') in its pip package, searched along
    `paths` (default sys.path); None when no such package is installed."""
    package, filename = LIBRARIES[name]
    for base in (sys.path if paths is None else paths):
        candidate = os.path.join(base or os.curdir, "nvidia", package, "lib", filename)
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    return None


def found_without_help(name: str) -> bool:
    """Would the library be found where its loader looks on its own: a folder of
    LD_LIBRARY_PATH, or the nvidia package in the interpreter's main site-packages?"""
    package, filename = LIBRARIES[name]
    for folder in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if folder and os.path.exists(os.path.join(folder, filename)):
            return True
    purelib = sysconfig.get_path("purelib")
    return bool(glob.glob(os.path.join(purelib, "nvidia", package, "lib", filename + "*")))


def preload(name: str, paths=None) -> str | None:
    """Load library `name` from its pip package when its loader would not find it on its own;
    returns the path loaded, or None (found without help, or no package: the system's copy,
    if any, is used). Once per process."""
    if name in _preloaded:
        return _preloaded[name]
    path = None
    if not found_without_help(name):
        path = package_library(name, paths)
        if path is not None:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    _preloaded[name] = path
    return path
