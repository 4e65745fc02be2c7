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
