"""minidnn: a small deep-learning framework whose memory manager virtualizes GPU memory."""
from . import import_interrupt

import_interrupt.begin()   # Ctrl-C while the command imports: one line, no traceback

import importlib.util  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def _checkout_models() -> None:
    """Make `minidnn.models` the top-level models/ folder of a source checkout.

    Installed, the folder is the package minidnn.models (pyproject.toml maps it there). Run
    from a checkout (`python3 -m ...` at its root, or an editable install of another one),
    the checkout's own folder must win, so it is loaded here by path.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = os.path.join(root, "models")
    init = os.path.join(folder, "__init__.py")
    if "minidnn.models" in sys.modules or not os.path.isfile(init) or \
            not os.path.isfile(os.path.join(root, "pyproject.toml")):
        return
    spec = importlib.util.spec_from_file_location("minidnn.models", init,
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["minidnn.models"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules["minidnn.models"]
        raise


_checkout_models()

from . import layers, models  # noqa: E402
from .backend import Device, select_device  # noqa: E402
from .errors import MinidnnError  # noqa: E402
from .executor import Executor  # noqa: E402
from .network import Network  # noqa: E402
from .optim import SGD  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = ["layers", "models", "Device", "select_device", "MinidnnError", "Executor", "Network", "SGD"]
