"""An allocation named by nothing (made between layer calls, outside the optimizer and the
executor's named buffers: on the GPU, a CuPy temporary of code the step's memory model may not
count) that the budget cannot meet says where it was asked for: the code's file, line and
function, so the failure names what to count."""
import pytest

from minidnn.backend import Device
from minidnn.errors import MemoryBudgetError
from minidnn.memory.arena import Arena


def ask_for_too_much(arena):
    return arena.alloc(8192)


def test_an_unnamed_allocation_over_the_budget_names_the_code_that_asked():
    arena = Arena(Device("cpu"), 4096)
    with pytest.raises(MemoryBudgetError) as err:
        ask_for_too_much(arena)
    message = str(err.value)
    assert "test_budget_arena.py:" in message and "(ask_for_too_much)" in message, message
    assert err.value.requested == 8192
    arena.current_where = "backward of conv2"       # a layer call's name comes first
    with pytest.raises(MemoryBudgetError, match="in backward of conv2: requested"):
        ask_for_too_much(arena)
    with pytest.raises(MemoryBudgetError, match="in momentum of w: requested"):
        arena.alloc(8192, "momentum of w")


def test_the_order_a_channels_last_array_lies_in():
    """backend.memory_order: the axes in the order the bytes lie, which a copy to the host
    follows so that it needs no C-ordered copy on the device (backend.to_numpy)."""
    import numpy as np
    from minidnn.backend import memory_order
    w = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 4, 5, 3).transpose(0, 3, 1, 2)
    order = memory_order(w)
    assert order == (0, 2, 3, 1) and w.transpose(order).flags.c_contiguous
    assert np.array_equal(w.transpose(order).transpose(np.argsort(order)), w)
    assert memory_order(np.ascontiguousarray(w)) is None     # C order already
    assert memory_order(w[:, :2]) is None                    # a slice: no order is contiguous
