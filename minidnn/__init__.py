"""minidnn: a small deep-learning framework whose memory manager virtualizes GPU memory."""
from . import layers, models
from .backend import Device, select_device
from .errors import MinidnnError
from .executor import Executor
from .network import Network
from .optim import SGD

__version__ = "0.2.0"
__all__ = ["layers", "models", "Device", "select_device", "MinidnnError", "Executor", "Network", "SGD"]
