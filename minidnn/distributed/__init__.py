"""Data-parallel training: N processes ("ranks"), one per GPU, each with its own executor,
memory budget and memory manager, training one model on shares of each global batch.

    rendezvous.py      who this rank is (arguments or torchrun's environment), how ranks meet
    handshake.py       how a rank proves it belongs to the run (an HMAC under its secret)
    frames.py          the messages between ranks: a JSON header and raw arrays, checked
    cpu_collective.py  all-reduce, broadcast and gather over TCP sockets, with timeouts
    nccl.py            the gradient all-reduce between GPUs (CuPy's NCCL bindings)
    mean.py            the mean over ranks from the sum: the division both reducers make
    buckets.py         gradients in buckets, each reduced as soon as backward produced it
    sync_batchnorm.py  BatchNorm with the whole global batch's statistics (--sync-batchnorm)
    data_parallel.py   one rank's part in a training run (batch share, device, checks)
    launch.py          `minidnn train --ranks N`: start N ranks and watch over them

The training loop (train.py) takes a rendezvous.World and does the rest through
data_parallel.DataParallel.
"""
from .data_parallel import DataParallel
from .rendezvous import World, resolve_world, world_from_env

__all__ = ["DataParallel", "World", "resolve_world", "world_from_env"]
