"""Stand-ins shared by the allocator tests (arena and host slab)."""

KiB = 1024


class FakeEvent:
    """An event that completes only when the test says so, or when waited on."""

    def __init__(self):
        self._done = False
        self.waits = 0

    @property
    def done(self):
        return self._done

    def complete(self):
        self._done = True

    def synchronize(self):
        self.waits += 1
        self._done = True


def addr(buf):
    """The address of a NumPy array's first byte."""
    return buf.__array_interface__["data"][0]


class WaitingStream:
    """A stream that notes the events it was made to wait for."""

    def __init__(self):
        self.waited = []

    def wait_event(self, event):
        self.waited.append(event)
